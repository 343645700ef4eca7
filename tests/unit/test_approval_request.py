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
}
LINKS = {"MLflow run": "http://mlflow:5000/#/runs/abc", "Data Docs": ""}


def _request(gate: dict) -> tuple[str, str]:
    return approval_request(
        model_name="support-intent",
        version="4",
        evaluation=EVALUATION,
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
