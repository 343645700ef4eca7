"""The smoke test before champion: the model loaded as users load it, answering with labels."""

from __future__ import annotations

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

# Training, evaluation and model loading run in this process and set MLflow's globals
# (sparktune.training.using_tracking_uri leaves the tracking URI set): put back after each test.
pytestmark = pytest.mark.usefixtures("torch_single_thread", "restore_mlflow_globals")


def test_answers_of_every_flavour_become_one_string_per_row():
    import pandas as pd
    from sparktune.smoke import answers_as_text, label_of

    assert answers_as_text(["a", "b"]) == ["a", "b"]
    assert answers_as_text(pd.DataFrame({"label": ["x", "y"], "score": [0.9, 0.8]})) == ["x", "y"]
    assert answers_as_text(pd.DataFrame({0: ["gen one"]})) == ["gen one"]
    labels = ["billing", "login"]
    assert label_of(" billing", "prompt", labels) == "billing"
    assert label_of("prompt billing extra", "prompt", labels) == "billing"  # the prompt echoed back
    assert label_of("nonsense", "prompt", labels) is None
    assert label_of("", "prompt", labels) is None
    # The echoed prompt does not come back byte for byte (decomposed ë): found by its end.
    prompt = "Best, Zo\u00eb [/INST]"
    assert label_of("Best, Zoe\u0308 [/INST] login", prompt, labels) == "login"
    assert label_of("Best,  Zo? [/INST] billing", prompt, labels) == "billing"


def test_the_share_of_answers_outside_the_labels_is_a_threshold():
    from sparktune.smoke import smoke_passed

    assert smoke_passed(0, 16, 0.0) and not smoke_passed(1, 16, 0.0)
    assert smoke_passed(2, 16, 0.125) and not smoke_passed(3, 16, 0.125)


def test_a_trained_model_passes_and_its_latency_is_recorded(root):
    from sparktune.smoke import smoke_test
    from sparktune.training import using_tracking_uri

    full = tiny_model.trained(root, "full")
    with using_tracking_uri(tiny_model.tracking_uri(root)):
        result = smoke_test(full.model_uri, str(root / "data"), split="validation", rows=6)
    assert result.passed and result.n_bad == 0 and result.rows == 6
    assert result.load_seconds > 0 and 0 < result.latency_p50_ms <= result.latency_p95_ms
    assert result.batch_rows_per_s > 0
    assert set(result.metrics()) == {
        "smoke_rows",
        "smoke_load_seconds",
        "smoke_latency_p50_ms",
        "smoke_latency_p95_ms",
        "smoke_batch_rows_per_s",
    }


def test_answers_outside_the_label_set_fail_the_smoke_test_with_examples(root, tmp_path, monkeypatch):
    import json

    from datasets import ClassLabel, load_from_disk
    from sparktune.smoke import main
    from sparktune.training import using_tracking_uri

    full = tiny_model.trained(root, "full")
    # main() configures the process as a CLI does and turns MLflow's progress bars off in the
    # environment (if unset): set here, so that monkeypatch takes it back after the test.
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # The same rows under label names the model never learned: every answer is "no label".
    dataset = load_from_disk(str(root / "data"))
    renamed = ClassLabel(names=[f"other_{name}" for name in dataset["validation"].features["label"].names])
    dataset["validation"].cast_column("label", renamed).select(range(4)).save_to_disk(
        str(tmp_path / "renamed" / "validation")
    )
    (tmp_path / "renamed" / "dataset_dict.json").write_text(json.dumps({"splits": ["validation"]}))
    output = tmp_path / "smoke.json"
    with using_tracking_uri(tiny_model.tracking_uri(root)):
        code = main(
            [
                "--model-uri",
                full.model_uri,
                "--dataset-path",
                str(tmp_path / "renamed"),
                "--split",
                "validation",
                "--rows",
                "4",
                "--output",
                str(output),
            ]
        )
    assert code == 2
    written = json.loads(output.read_text())
    assert not written["passed"] and written["n_bad"] == 4 and written["bad_answers"]
