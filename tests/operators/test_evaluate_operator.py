"""EvaluateModelOperator: what it logs to the challenger's MLflow run and what it returns.

The evaluation subprocess is replaced by a fake that writes what ``python -m sparktune.jobs.evaluate``
writes (the result JSON and, through the real drawing code, the confusion matrix PNG), so the test
needs no trained model; the CLI itself is tested in tests/unit/test_evaluation.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store

LABELS = ["billing", "login"]


@dataclass
class FakeTaskInstance:
    dag_id: str = "llm_finetune"
    run_id: str = "manual__2026-11-23"
    task_id: str = "evaluate"
    try_number: int = 1


@dataclass
class RecordingTaskInstance(FakeTaskInstance):
    pushed: dict = field(default_factory=dict)

    def xcom_push(self, key: str, value) -> None:
        self.pushed[key] = value


def _result(model_uri: str, n: int = 200):
    import numpy as np
    from sparktune.release.metrics import (
        INVALID_PREDICTION,
        EvalResult,
        classification_cis,
        macro_f1_statistic,
    )

    classes = [*LABELS, INVALID_PREDICTION]
    y_true = [i % 2 for i in range(n)]
    # The champion is right 3 times in 4, the challenger 9 times in 10; a few invalid generations.
    every = 4 if "/1" in model_uri else 10
    y_pred = [(t + 1) % 2 if i % every == 0 else t for i, t in enumerate(y_true)]
    y_pred[1] = 2
    confusion: dict[str, dict[str, int]] = {}
    for t, p in zip(y_true, y_pred, strict=True):
        row = confusion.setdefault(classes[t], {})
        row[classes[p]] = row.get(classes[p], 0) + 1
    cis = classification_cis(y_true, y_pred, 2, [0.4] * n, [2] * n)
    return EvalResult(
        eval_loss=0.2,
        perplexity=math.exp(0.2),
        eval_accuracy=sum(t == p for t, p in zip(y_true, y_pred, strict=True)) / n,
        eval_macro_f1=float(macro_f1_statistic(y_true, y_pred, 2)(np.arange(n)[None])[0]),
        per_class_f1=dict.fromkeys(LABELS, 0.8),
        per_class_recall=dict.fromkeys(LABELS, 0.9 if every == 10 else 0.7),
        n_examples=n,
        confusion=confusion,
        seconds=1.0,
        model_uri=model_uri,
        split="test",
        n_invalid=1,
        labels=LABELS,
        ci={name: list(ci) for name, ci in cis.items()},
        ci_resamples=1000,
        classes=classes,
        y_true=y_true,
        y_pred=y_pred,
        example_loss=[0.4] * n,
        example_tokens=[2] * n,
        example_ids=[f"row-{i}" for i in range(n)],
        scores=[0.9] * n,
    )


class FakeSubprocessHook:
    commands: list[list[str]] = []
    # The labels the champion's evaluation records as its model's (None: none recorded).
    champion_labels: list[str] | None = None
    # What the job writes for the base model: its result, or (a classifier) not applicable.
    base_model_applicable: bool = True

    def run_command(self, command, env=None):
        from sparktune.release.evaluation import confusion_matrix_figure, write_predictions_csv

        FakeSubprocessHook.commands.append(command)
        args = dict(zip(command[3::2], command[4::2], strict=True))
        for prefix in ("--", "--champion-"):
            if f"{prefix}model-uri" not in args:
                continue
            result = _result(args[f"{prefix}model-uri"])
            if prefix == "--champion-" and FakeSubprocessHook.champion_labels is not None:
                result.model_labels = list(FakeSubprocessHook.champion_labels)
            Path(args[f"{prefix}output"]).write_text(result.to_json())
            confusion_matrix_figure(result, args[f"{prefix}confusion-matrix"])
            write_predictions_csv(result, args[f"{prefix}predictions"])
        if "--baseline-output" in args:
            Path(args["--baseline-output"]).write_text(_baseline_result().to_json())
        if "--base-model-output" in args:
            _write_base_model(args)
        return SimpleNamespace(exit_code=0, output="sparktune-evaluate ok")


def _write_base_model(args: dict[str, str]) -> None:
    """What the job writes for the base model: right on half the rows (chance on 2 labels), or
    why a sequence classifier's base is not scored."""
    from sparktune.release import base_model_eval
    from sparktune.release.evaluation import confusion_matrix_figure, label_result, write_predictions_csv

    if not FakeSubprocessHook.base_model_applicable:
        reason = base_model_eval.not_applicable_reason("sequence_classification")
        outcome = base_model_eval.BaseModelOutcome(
            base_model_eval.NOT_APPLICABLE, args["--base-model"], reason
        )
        base_model_eval.write_outcome(outcome, args["--base-model-output"])
        return
    truth = [LABELS[i % 2] for i in range(200)]
    predicted = [LABELS[0]] * 200
    result = label_result(
        truth, predicted, LABELS, example_loss=[9.0] * 200, example_tokens=[2] * 200,
        model_uri=args["--base-model"], split="test", example_ids=[f"row-{i}" for i in range(200)],
        scores=[0.5] * 200,
    )  # fmt: skip
    Path(args["--base-model-output"]).write_text(result.to_json())
    confusion_matrix_figure(result, args["--base-model-confusion-matrix"])
    write_predictions_csv(result, args["--base-model-predictions"])


def _baseline_result(n: int = 200):
    """The TF-IDF baseline on the same rows: right 19 times in 20, better than the challenger."""
    from sparktune.release.baseline import BASELINE_URI
    from sparktune.release.evaluation import label_result

    truth = [LABELS[i % 2] for i in range(n)]
    predicted = [LABELS[(i + 1) % 2] if i % 20 == 0 else t for i, t in enumerate(truth)]
    return label_result(truth, predicted, LABELS, model_uri=BASELINE_URI, split="test")


@pytest.fixture
def registry(tmp_path, monkeypatch):
    from sparktune_airflow.core import domain_cli
    from sparktune_airflow.core.mlflow import MLflowHook

    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path / "mlflow.db"))
    monkeypatch.setattr(domain_cli, "SubprocessHook", FakeSubprocessHook)
    FakeSubprocessHook.commands = []
    FakeSubprocessHook.champion_labels = None
    FakeSubprocessHook.base_model_applicable = True
    client = MLflowHook(mlflow_conn_id=None).get_conn()
    experiment = client.create_experiment("sparktune-eval-op", artifact_location=str(tmp_path / "artifacts"))
    runs = [client.create_run(experiment).info.run_id for _ in range(2)]
    client.create_registered_model("eval-op")
    for run_id in runs:
        client.create_model_version("eval-op", source=str(tmp_path / "model"), run_id=run_id)
    return SimpleNamespace(client=client, runs=runs)


def _operator(registry, version: str, **kwargs):
    from sparktune_airflow import EvaluateModelOperator

    return EvaluateModelOperator(
        task_id="evaluate",
        model_name="eval-op",
        version=version,
        dataset_uri="/datasets/fp1",
        run_id=registry.runs[int(version) - 1],
        **kwargs,
    )


def _artifacts(client, run_id: str) -> dict[str, int]:
    return {a.path: a.file_size for a in client.list_artifacts(run_id, "evaluation")}


def test_challenger_and_champion_intervals_and_figures_land_in_the_challengers_run(registry):
    client = registry.client
    client.set_registered_model_alias("eval-op", "champion", "1")

    summary = _operator(registry, "2").execute({"ti": FakeTaskInstance()})

    # Both models in one process (the imports are paid once), the challenger first.
    [command] = FakeSubprocessHook.commands
    assert command[command.index("--model-uri") + 1] == "models:/eval-op/2"
    assert command[command.index("--champion-model-uri") + 1] == "models:/eval-op/1"
    challenger_run = registry.runs[1]
    metrics = client.get_run(challenger_run).data.metrics
    for prefix in ("", "champion_"):
        for name in ("eval_accuracy", "eval_macro_f1", "eval_loss"):
            low, high = metrics[f"{prefix}{name}_ci_low"], metrics[f"{prefix}{name}_ci_high"]
            assert low <= metrics[f"{prefix}{name}"] <= high
    assert metrics["eval_accuracy"] == pytest.approx(0.895)
    assert metrics["champion_eval_accuracy"] == pytest.approx(0.745)
    assert metrics["champion_eval_accuracy_ci_high"] < metrics["eval_accuracy_ci_low"]

    artifacts = _artifacts(client, challenger_run)
    assert set(artifacts) == {
        "evaluation/confusion_matrix.png",
        "evaluation/champion_confusion_matrix.png",
        "evaluation/eval_challenger.json",
        "evaluation/eval_champion.json",
        "evaluation/eval_baseline.json",
        "evaluation/predictions.csv",
        "evaluation/champion_predictions.csv",
    }
    rows = (
        Path(client.download_artifacts(challenger_run, "evaluation/predictions.csv")).read_text().splitlines()
    )
    assert rows[0] == "example_id,label,prediction,score" and len(rows) == 201
    png = Path(client.download_artifacts(challenger_run, "evaluation/confusion_matrix.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    logged = json.loads(
        Path(client.download_artifacts(challenger_run, "evaluation/eval_champion.json")).read_text()
    )
    assert len(logged["y_pred"]) == 200  # per-example outcomes live in the artifact...
    assert _artifacts(client, registry.runs[0]) == {}  # ...of the challenger's run only

    # The paired comparison on the same rows: differences and their intervals, on the run and in XCom.
    comparison = summary["comparison"]
    assert comparison["accuracy"]["difference"] == pytest.approx(0.895 - 0.745)
    assert 0.0 < comparison["accuracy"]["ci_low"] < 0.15 < comparison["accuracy"]["ci_high"]
    for name in ("accuracy", "macro_f1"):
        assert metrics[f"vs_champion_{name}_diff"] == pytest.approx(comparison[name]["difference"])
        assert metrics[f"vs_champion_{name}_ci_low"] == pytest.approx(comparison[name]["ci_low"])
        assert metrics[f"vs_champion_{name}_ci_high"] == pytest.approx(comparison[name]["ci_high"])
    assert metrics["eval_recall_login"] == 0.9 and metrics["champion_eval_recall_login"] == 0.7

    # ...and never in XCom: flat metrics and intervals, a few hundred bytes.
    assert summary["challenger"]["eval_accuracy_ci_low"] == metrics["eval_accuracy_ci_low"]
    assert summary["champion"]["eval_accuracy_ci_high"] == metrics["champion_eval_accuracy_ci_high"]
    assert all(isinstance(v, float) for v in summary["challenger"].values())
    assert len(json.dumps(summary)) < 2_500


def test_the_baseline_is_scored_on_the_same_rows_and_logged_beside_the_model(registry):
    summary = _operator(registry, "2").execute({"ti": FakeTaskInstance()})  # no champion: one model

    [command] = FakeSubprocessHook.commands
    assert command[command.index("--baseline-output") + 1].endswith("eval_baseline.json")
    metrics = registry.client.get_run(registry.runs[1]).data.metrics
    assert metrics["baseline_accuracy"] == pytest.approx(0.95)
    assert metrics["baseline_accuracy_ci_low"] < 0.95 < metrics["baseline_accuracy_ci_high"]
    assert "baseline_macro_f1" in metrics and "baseline_loss_ci_low" not in metrics  # no loss: not an LM
    # Paired on the same rows: the challenger (0.895) trails the baseline (0.95) by 0.055.
    assert metrics["vs_baseline_accuracy_diff"] == pytest.approx(0.895 - 0.95)
    assert metrics["vs_baseline_accuracy_ci_low"] < -0.055 < metrics["vs_baseline_accuracy_ci_high"]
    assert summary["baseline"] == {k: v for k, v in metrics.items() if "baseline" in k}


def test_the_base_model_the_run_trained_from_is_scored_and_logged_as_information(registry):
    client = registry.client
    # Training tags its run with the base model it fine-tuned (resolved: a folder or a hub id).
    client.set_tag(registry.runs[1], "sparktune.base_model", "/models/base/tiny-llama")

    summary = _operator(registry, "2").execute({"ti": FakeTaskInstance()})

    [command] = FakeSubprocessHook.commands
    assert command[command.index("--base-model") + 1] == "/models/base/tiny-llama"
    assert command[command.index("--base-model-output") + 1].endswith("eval_base_model.json")
    run = client.get_run(registry.runs[1]).data
    metrics = run.metrics
    assert metrics["base_model_accuracy"] == 0.5 and metrics["base_model_loss"] == pytest.approx(4.5)
    assert metrics["base_model_accuracy_ci_low"] < 0.5 < metrics["base_model_accuracy_ci_high"]
    assert {"base_model_macro_f1", "base_model_macro_f1_ci_low", "base_model_macro_f1_ci_high"} <= set(
        metrics
    )
    # Paired as the baseline is: the challenger (0.895) is 0.395 ahead of its base on the same rows.
    assert metrics["vs_base_model_accuracy_diff"] == pytest.approx(0.895 - 0.5)
    assert 0 < metrics["vs_base_model_accuracy_ci_low"] < 0.395 < metrics["vs_base_model_accuracy_ci_high"]
    assert "vs_base_model_macro_f1_ci_low" in metrics
    assert run.tags["sparktune.base_model_eval"] == "scored"
    assert summary["base_model"] == {
        "status": "scored",
        "base_model": "/models/base/tiny-llama",
        "reason": "",
        "metrics": {k: v for k, v in metrics.items() if "base_model" in k},
    }
    assert {
        "evaluation/eval_base_model.json",
        "evaluation/base_model_predictions.csv",
        "evaluation/base_model_confusion_matrix.png",
    } <= set(_artifacts(client, registry.runs[1]))

    # The gate reads none of it: the same decision with or without the base model's numbers.
    decision = _gate(registry, summary, min_accuracy=0.7, min_margin_over_baseline=-0.2).execute({})
    without = _gate(
        registry, {**summary, "base_model": None}, min_accuracy=0.7, min_margin_over_baseline=-0.2
    )
    assert decision == without.execute({})
    assert not any("base_model" in reason or "base model" in reason for reason in decision["reasons"])


def test_a_classifiers_base_model_is_reported_not_applicable(registry):
    FakeSubprocessHook.base_model_applicable = False

    summary = _operator(registry, "1", base_model="/models/base/minilm").execute({"ti": FakeTaskInstance()})

    assert summary["base_model"]["status"] == "not_applicable"
    assert summary["base_model"]["reason"].startswith("task=sequence_classification: the base model has no")
    run = registry.client.get_run(registry.runs[0]).data
    assert not any("base_model" in name for name in run.metrics)
    assert run.tags["sparktune.base_model_eval"] == "not_applicable"
    assert run.tags["sparktune.base_model_eval.reason"] == summary["base_model"]["reason"]
    artifacts = set(_artifacts(registry.client, registry.runs[0]))
    assert "evaluation/eval_base_model.json" in artifacts  # why, for whoever opens the run
    assert "evaluation/base_model_predictions.csv" not in artifacts


def test_a_run_can_skip_the_base_model_and_one_without_a_recorded_base_says_why(registry):
    skipped = _operator(registry, "1", evaluate_base_model=False).execute({"ti": FakeTaskInstance()})
    assert "--base-model" not in FakeSubprocessHook.commands[-1]
    assert skipped["base_model"]["status"] == "skipped"
    assert skipped["base_model"]["reason"] == "evaluate_base_model=false"

    unknown = _operator(registry, "1").execute({"ti": FakeTaskInstance()})  # no sparktune.base_model tag
    assert "--base-model" not in FakeSubprocessHook.commands[-1]
    assert unknown["base_model"]["status"] == "not_scored"
    assert "records no base model (tag sparktune.base_model)" in unknown["base_model"]["reason"]
    assert registry.client.get_run(registry.runs[0]).data.tags["sparktune.base_model_eval"] == "not_scored"


def test_without_a_champion_only_the_challenger_is_evaluated_and_logged(registry):
    summary = _operator(registry, "1").execute({"ti": FakeTaskInstance(task_id="evaluate-first")})

    assert len(FakeSubprocessHook.commands) == 1
    assert summary["champion"] is None and summary["champion_version"] is None
    assert set(_artifacts(registry.client, registry.runs[0])) == {
        "evaluation/confusion_matrix.png",
        "evaluation/eval_challenger.json",
        "evaluation/eval_baseline.json",
        "evaluation/predictions.csv",
    }
    assert "eval_macro_f1_ci_low" in registry.client.get_run(registry.runs[0]).data.metrics
    assert summary["comparison"] is None
    assert not any(
        m.startswith("vs_champion_") for m in registry.client.get_run(registry.runs[0]).data.metrics
    )


def _gate(registry, evaluation: dict, **params):
    from sparktune_airflow import PromotionGateOperator

    # The per-class rule is on by default; these evaluations carry recalls only where a test sets it.
    params = {"max_class_regression": 1.0, **params}
    return PromotionGateOperator(task_id="gate", evaluation=evaluation, run_id=registry.runs[1], rules=params)


def test_the_gate_decides_on_the_paired_interval_and_says_so(registry, monkeypatch):

    client = registry.client
    client.set_registered_model_alias("eval-op", "champion", "1")
    evaluation = _operator(registry, "2").execute({"ti": FakeTaskInstance()})

    # The TF-IDF baseline is 5.5 points ahead: allow up to 20 here (the default, 5, blocks it).
    decision = _gate(
        registry, evaluation, min_accuracy=0.7, max_class_regression=0.1, min_margin_over_baseline=-0.2
    ).execute({})
    assert decision["promote"] and decision["failed_rules"] == []
    assert (decision["model_name"], decision["challenger_version"], decision["champion_version"]) == (
        "eval-op",
        "2",
        "1",
    )
    low, high = (
        evaluation["comparison"]["accuracy"]["ci_low"],
        evaluation["comparison"]["accuracy"]["ci_high"],
    )
    assert (
        f"max_regression: pass, accuracy vs champion v1: +0.150 [95% CI {low:+.3f}, {high:+.3f}]"
        in (decision["reasons"][2])
    )
    assert (
        decision["reasons"][3]
        == "max_class_regression: pass, no class's recall fell vs champion v1, allowed drop 0.100"
    )
    baseline = evaluation["baseline"]
    assert decision["reasons"][4] == (
        "min_margin_over_baseline: pass, accuracy vs baseline (TF-IDF + logistic regression, 0.950 "
        f"[95% CI {baseline['baseline_accuracy_ci_low']:.3f}, {baseline['baseline_accuracy_ci_high']:.3f}]): "
        f"-0.055 [95% CI {baseline['vs_baseline_accuracy_ci_low']:+.3f}, "
        f"{baseline['vs_baseline_accuracy_ci_high']:+.3f}]: lower bound "
        f"{baseline['vs_baseline_accuracy_ci_low']:+.3f} >= -0.200"
    )
    assert decision["reasons"][5] == "label_set_unchanged: pass, the challenger's labels are champion v1's"
    assert decision["reasons"][-1].startswith("macro_f1 (information, no rule): macro_f1 vs champion v1: +")

    # 0.895 on 200 rows clears 0.88, but the interval's lower bound does not: blocked, promotion skipped.
    # False makes the short-circuit skip the rest, whose skip raises to end the task: the decision
    # must reach XCom before it, for make run (tests/e2e: a blocked run in a real DAG run).
    ti = RecordingTaskInstance(task_id="gate")
    assert _gate(registry, evaluation, min_accuracy=0.88, min_margin_over_baseline=-1).decide(ti) is False
    blocked = ti.pushed["return_value"]
    assert not blocked["promote"] and blocked["failed_rules"] == ["min_accuracy"]
    assert (blocked["model_name"], blocked["challenger_version"]) == ("eval-op", "2")
    assert blocked["reasons"][0].startswith("min_accuracy: FAIL, eval_accuracy 0.895 [95% CI ")
    tags = client.get_run(registry.runs[1]).data.tags
    assert tags["sparktune.gate.decision"] == "blocked" and "lower bound" in tags["sparktune.gate.reasons"]
    assert client.get_model_version("eval-op", "2").tags["gate_decision"] == "blocked"


@pytest.mark.parametrize("source", ["evaluation", "version tag"])
def test_a_champion_of_another_label_set_is_compared_on_shared_label_rows_and_blocked(
    registry, monkeypatch, source
):

    client = registry.client
    client.set_registered_model_alias("eval-op", "champion", "1")
    # The champion knew billing and shipping: login is new, shipping gone. Its evaluation says so,
    # or (a result that did not record it) the labels tag registration put on its version.
    if source == "evaluation":
        FakeSubprocessHook.champion_labels = ["billing", "shipping"]
    else:
        client.set_model_version_tag("eval-op", "1", "labels", json.dumps(["billing", "shipping"]))

    evaluation = _operator(registry, "2").execute({"ti": FakeTaskInstance()})  # no error: scored and paired

    assert evaluation["label_change"] == {
        "added": ["login"],
        "removed": ["shipping"],
        "n_rows": 200,
        "n_shared_rows": 100,  # the billing rows
    }
    # Paired on the billing rows only (the even ones): the challenger misses every 10th row, all of
    # them billing rows, the champion every 4th.
    assert evaluation["comparison"]["n_examples"] == 100
    assert evaluation["comparison"]["accuracy"]["challenger"] == pytest.approx(0.8)
    assert evaluation["comparison"]["accuracy"]["champion"] == pytest.approx(0.5)
    metrics = client.get_run(registry.runs[1]).data.metrics
    assert metrics["vs_champion_accuracy_diff"] == pytest.approx(0.3)

    params = {"min_accuracy": 0.7, "max_class_regression": 0.1, "min_margin_over_baseline": -1}
    ti = RecordingTaskInstance(task_id="gate")
    assert _gate(registry, evaluation, **params).decide(ti) is False
    blocked = ti.pushed["return_value"]
    assert not blocked["promote"] and blocked["failed_rules"] == ["label_set_unchanged"]
    assert blocked["reasons"][4] == (
        "label_set_unchanged: FAIL, the challenger's labels differ from champion v1's: added ['login'], "
        "removed ['shipping']; set allow_label_change=true to promote a new label set under this model name"
    )
    assert blocked["reasons"][2].startswith(
        "max_regression: pass, accuracy vs champion v1 on 100 shared-label rows: +0.300"
    )
    # Recall is compared on billing alone, the one label both know (tests/unit/test_gate.py: which).
    assert blocked["reasons"][3] == (
        "max_class_regression: pass, no class's recall fell vs champion v1 on 100 shared-label rows, "
        "allowed drop 0.100"
    )

    allowed = _gate(registry, evaluation, **params, allow_label_change=True).execute({})
    assert allowed["promote"] and allowed["failed_rules"] == []
    assert "the change was allowed (allow_label_change=true)" in allowed["reasons"][4]
