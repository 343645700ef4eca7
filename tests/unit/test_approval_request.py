"""The approval request a reviewer reads: the evidence, and a verdict that does not say "passed" for
a challenger a dry-run gate let through."""

from __future__ import annotations

from sparktune.release.approval import approval_request

EVALUATION = {
    "champion_version": "3",
    "challenger": {"eval_accuracy": 0.948, "eval_accuracy_ci_low": 0.913, "eval_accuracy_ci_high": 0.972},
    "champion": {"eval_accuracy": 0.931, "eval_accuracy_ci_low": 0.893, "eval_accuracy_ci_high": 0.958},
    "comparison": {"n_examples": 186, "accuracy": {"difference": 0.017, "ci_low": -0.011, "ci_high": 0.043}},
    "baseline": {"baseline_accuracy": 0.966},
    "base_model": {
        "status": "scored",
        "base_model": "/models/base/smollm2-135m-instruct",
        "reason": "",
        "metrics": {
            "base_model_accuracy": 0.151,
            "base_model_accuracy_ci_low": 0.102,
            "base_model_accuracy_ci_high": 0.204,
            "base_model_macro_f1": 0.072,
            "base_model_macro_f1_ci_low": 0.049,
            "base_model_macro_f1_ci_high": 0.101,
            "vs_base_model_accuracy_diff": 0.797,
            "vs_base_model_accuracy_ci_low": 0.737,
            "vs_base_model_accuracy_ci_high": 0.855,
            "vs_base_model_macro_f1_diff": 0.871,
            "vs_base_model_macro_f1_ci_low": 0.817,
            "vs_base_model_macro_f1_ci_high": 0.919,
        },
    },
}
LINKS = {"MLflow run": "http://mlflow:5000/#/runs/abc", "Data Docs": ""}


def _request(gate: dict, evaluation: dict = EVALUATION) -> tuple[str, str]:
    return approval_request(
        model_name="support-intent",
        version="4",
        evaluation=evaluation,
        gate=gate,
        smoke={"model_uri": "models:/support-intent@staging", "smoke_rows": 16},
        data_fingerprint="ccce44165fe9c735ed33",
        links=LINKS,
    )


def test_the_request_shows_metrics_with_intervals_the_gate_the_smoke_test_and_the_links():
    subject, body = _request({"mode": "enabled", "passed": True, "reasons": ["min_accuracy: pass"]})
    assert subject == "Make support-intent v4 the champion?"
    assert body.startswith(
        "**support-intent v4** passed the gate and passed the smoke test, against champion v3."
    )
    assert "| eval_accuracy | 0.948 [0.913, 0.972] | 0.931 [0.893, 0.958] |" in body
    assert "| eval_loss | - | - |" in body  # not measured: shown as missing, not as zero
    assert "Challenger minus champion on the same 186 test rows: accuracy +0.017 [-0.011, +0.043]." in body
    assert "baseline accuracy: 0.966" in body
    assert "- min_accuracy: pass" in body
    assert "**Smoke test** of `models:/support-intent@staging`: passed (smoke_rows 16.000)." in body
    assert "`ccce44165fe9c735ed33`" in body
    assert "Links: [MLflow run](http://mlflow:5000/#/runs/abc)" in body and "Data Docs" not in body


def test_a_challenger_a_dry_run_gate_let_through_is_not_called_passed():
    _, body = _request({"mode": "dry_run", "passed": False, "reasons": ["min_accuracy: FAIL"]})
    assert body.startswith("**support-intent v4** FAILED the gate (dry run lets it through)")
    assert "**Gate** (dry_run mode):" in body


def test_the_request_shows_what_fine_tuning_added_over_the_base_model():
    _, body = _request({"mode": "enabled", "passed": True, "reasons": []})
    assert (
        "Base model before fine-tuning (/models/base/smollm2-135m-instruct), same prompt, labels and test "
        "rows: accuracy 0.151 [0.102, 0.204], macro F1 0.072 [0.049, 0.101]; challenger minus base model: "
        "accuracy +0.797 [+0.737, +0.855], macro F1 +0.871 [+0.817, +0.919]."
    ) in body
    # Beside the baseline, before the gate's reasons: evidence, not a rule.
    assert body.index("baseline accuracy") < body.index("Base model before") < body.index("**Gate**")


def test_a_classifiers_base_model_is_shown_as_not_applicable_with_the_reason():
    from sparktune.release.base_model_eval import NOT_APPLICABLE, not_applicable_reason

    reason = not_applicable_reason("sequence_classification")
    evaluation = {
        **EVALUATION,
        "base_model": {"status": NOT_APPLICABLE, "base_model": "/m/minilm", "reason": reason},
    }
    _, body = _request({"mode": "enabled", "passed": True, "reasons": []}, evaluation)
    assert f"Base model before fine-tuning (/m/minilm): not applicable: {reason}." in body
    assert "task=sequence_classification: the base model has no trained classification head" in body
    # An evaluation from before the base model was scored shows nothing about it.
    _, older = _request(
        {"mode": "enabled", "passed": True, "reasons": []}, {**EVALUATION, "base_model": None}
    )
    assert "Base model" not in older
