"""The smoke test before champion: the model loaded as users load it, answering with labels."""

from __future__ import annotations

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_the_share_of_answers_outside_the_labels_is_a_threshold():
    from sparktune.release.smoke import smoke_passed

    assert smoke_passed(0, 16, 0.0) and not smoke_passed(1, 16, 0.0)
    assert smoke_passed(2, 16, 0.125) and not smoke_passed(3, 16, 0.125)


def test_a_trained_model_passes_and_its_latency_is_recorded(root):
    from sparktune.model.process_setup import using_tracking_uri
    from sparktune.release.smoke import smoke_test

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
    """A model whose logged scoring answers something that is no label stops before champion: the
    trained weights, logged with a scoring module broken to answer "no_such_label" for every text."""
    import inspect
    import json

    import mlflow
    from sparktune.core import label_scoring
    from sparktune.core.model_safety import local_model_dir
    from sparktune.jobs.smoke_test import main
    from sparktune.model.logged_model import label_model_kwargs
    from sparktune.model.process_setup import using_tracking_uri

    full = tiny_model.trained(root, "full")
    # main() configures the process as a CLI does and turns MLflow's progress bars off in the
    # environment (if unset): set here, so that monkeypatch takes it back after the test.
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with using_tracking_uri(tiny_model.tracking_uri(root)):
        logged = local_model_dir(full.model_uri)
    source = inspect.getsource(label_scoring)
    answer = "return [spec.labels[int(i)] for i in best]"
    assert answer in source
    broken = tmp_path / "label_scoring.py"
    broken.write_text(source.replace(answer, 'return ["no_such_label" for _ in best]'))
    config = dict(mlflow.models.Model.load(str(logged)).flavors["python_function"]["config"])
    kwargs = label_model_kwargs({"model": logged / "artifacts" / "merged"}, config)
    kwargs["artifacts"]["scoring_code"] = str(broken)
    saved = tmp_path / "broken-model"
    mlflow.pyfunc.save_model(path=str(saved), **kwargs)

    output = tmp_path / "smoke.json"
    code = main(
        [
            *("--model-uri", str(saved), "--dataset-path", str(root / "data")),
            *("--split", "validation", "--rows", "4", "--output", str(output)),
        ]
    )
    assert code == 2
    written = json.loads(output.read_text())
    assert not written["passed"] and written["n_bad"] == 4
    assert "'no_such_label'" in written["bad_answers"][0][1] and "not a label" in written["bad_answers"][0][1]
