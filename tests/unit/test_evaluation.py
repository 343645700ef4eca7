"""Evaluation of logged models (runs:/, models:/ and a local folder) on the tiny intent dataset."""

from __future__ import annotations

import json
import math

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@pytest.fixture(scope="module")
def full_run(root):
    return tiny_model.trained(root, "full")


@pytest.fixture(scope="module")
def test_result(root, full_run):
    from sparktune.evaluation import evaluate_model

    return evaluate_model(
        full_run.model_uri, str(root / "data"), tracking_uri=tiny_model.tracking_uri(root), batch_size=16
    )


def test_trained_model_beats_chance(test_result):
    # 4 balanced labels: chance is 0.25; the full fine-tune measured 0.94 here.
    assert test_result.n_examples == 48
    assert test_result.eval_accuracy >= 0.6
    assert test_result.eval_macro_f1 >= 0.5
    assert set(test_result.per_class_f1) == set(tiny_model.LABELS)
    assert all(0.0 <= v <= 1.0 for v in test_result.per_class_f1.values())
    assert test_result.perplexity == pytest.approx(math.exp(test_result.eval_loss))
    assert sum(sum(row.values()) for row in test_result.confusion.values()) == 48
    correct = sum(test_result.confusion[label].get(label, 0) for label in tiny_model.LABELS)
    assert correct / 48 == pytest.approx(test_result.eval_accuracy)
    assert test_result.seconds > 0


def test_metric_names(test_result):
    metrics = test_result.metrics()
    assert {"eval_loss", "eval_perplexity", "eval_accuracy", "eval_macro_f1"} <= set(metrics)
    assert {f"eval_f1_{label}" for label in tiny_model.LABELS} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert json.loads(test_result.to_json())["eval_accuracy"] == test_result.eval_accuracy


def test_eval_loss_is_the_completion_loss_training_reported(root, full_run):
    from sparktune.evaluation import evaluate_model

    # Every completion is two tokens (label, eos), so the trainer's per-batch means average to the
    # same per-token mean this computes over the validation split.
    result = evaluate_model(
        full_run.model_uri, str(root / "data"), split="validation", tracking_uri=tiny_model.tracking_uri(root)
    )
    assert result.eval_loss == pytest.approx(full_run.val_loss, abs=1e-3)


def test_registered_model_uri_gives_the_same_deterministic_result(root, full_run, test_result):
    import mlflow
    from sparktune.evaluation import evaluate_model
    from sparktune.training import using_tracking_uri

    uri = tiny_model.tracking_uri(root)
    with using_tracking_uri(uri):
        version = mlflow.register_model(full_run.model_uri, "tiny-intent-eval").version
    result = evaluate_model(
        f"models:/tiny-intent-eval/{version}", str(root / "data"), tracking_uri=uri, batch_size=7
    )
    # Another batch size, another padding: the same predictions and (to float noise) the same loss.
    assert result.confusion == test_result.confusion
    assert result.eval_accuracy == test_result.eval_accuracy
    assert result.eval_loss == pytest.approx(test_result.eval_loss, abs=1e-5)


def test_streaming_mode_evaluates_the_prepared_parquet_alike(root, full_run, test_result, tmp_path):
    from sparktune.evaluation import evaluate_model

    # dataset_mode=streaming hands evaluation the prepared Parquet (string labels), not a dataset.
    prepared = tiny_model.build_prepared_parquet(tmp_path / "prepared")
    result = evaluate_model(full_run.model_uri, str(prepared), tracking_uri=tiny_model.tracking_uri(root))
    assert result.n_examples == test_result.n_examples == 48
    assert result.confusion == test_result.confusion
    assert result.eval_accuracy == test_result.eval_accuracy


def test_untrained_local_folder_scores_lower(root, test_result):
    from sparktune.evaluation import evaluate_model

    result = evaluate_model(str(root / "model"), str(root / "data"), max_examples=8)
    assert result.n_examples == 8
    # A random model spreads its probability over the whole vocabulary.
    assert result.eval_loss > 3.0 > test_result.eval_loss
    assert result.eval_accuracy <= 0.5


def test_cli_writes_the_result(root, full_run, tmp_path, capsys):
    from sparktune.evaluation import main

    output = tmp_path / "eval" / "result.json"
    code = main(
        [
            "--model-uri",
            full_run.model_uri,
            "--dataset-path",
            str(root / "data"),
            "--split",
            "validation",
            "--max-examples",
            "8",
            "--tracking-uri",
            tiny_model.tracking_uri(root),
            "--output",
            str(output),
        ]
    )
    assert code == 0
    written = json.loads(output.read_text())
    assert written["n_examples"] == 8 and written["split"] == "validation"
    assert "sparktune.evaluation" in capsys.readouterr().out


def test_bad_inputs_are_reported(root, tmp_path):
    from sparktune.evaluation import EvaluationInputError, evaluate_model, main

    with pytest.raises(EvaluationInputError, match="no split 'holdout'"):
        evaluate_model(str(root / "model"), str(root / "data"), split="holdout")
    with pytest.raises(EvaluationInputError, match="neither an MLflow model"):
        evaluate_model(str(tmp_path), str(root / "data"))
    code = main(["--model-uri", str(tmp_path), "--dataset-path", str(root / "data"), "--output", "x.json"])
    assert code == 2


def test_metric_names_are_safe_for_mlflow():
    from sparktune.evaluation import EvalResult

    result = EvalResult(
        eval_loss=0.5,
        perplexity=math.exp(0.5),
        eval_accuracy=1.0,
        eval_macro_f1=1.0,
        per_class_f1={"card/lost & stolen": 1.0},
        n_examples=1,
        confusion={},
        seconds=0.1,
    )
    assert "eval_f1_card/lost _ stolen" in result.metrics()
