from __future__ import annotations

from sparktune_dev.report import format_summary


def test_summary_shows_counts_fingerprint_aliases_gate_and_metrics():
    text = format_summary(
        {
            "model_name": "support-intent",
            "version": "3",
            "version_aliases": ["candidate", "champion"],
            "all_aliases": {"champion": "3", "previous_champion": "2"},
            "mlflow_run_id": "abc123",
            "data_fingerprint": "f00d",
            "gate_decision": "promote",
            "gate_reasons": "min_accuracy: pass\nmax_regression: pass",
            "metrics": {"eval_accuracy": 0.95, "eval_loss": 0.2, "eval_macro_f1": 0.94},
            "prepare_steps": [{"step": "dedupe", "rows_in": 100, "rows_out": 90, "skipped": False}],
            "split_counts": {"train": 72, "validation": 9, "test": 9},
        }
    )
    for expected in (
        "version 3",
        "dedupe",
        "100 ->",
        "f00d",
        "abc123",
        "candidate, champion",
        "min_accuracy: pass",
        "eval_accuracy",
        "0.9500",
        "make mlflow-ui",
    ):
        assert expected in text, expected


def test_summary_says_what_corrections_changed_and_how_many_texts_conflicted():
    base = {
        "model_name": "m",
        "version": "4",
        "version_aliases": [],
        "all_aliases": {},
        "mlflow_run_id": "r",
        "data_fingerprint": "f",
        "gate_decision": "promote",
        "gate_reasons": "",
        "metrics": {},
        "prepare_steps": [],
        "split_counts": {},
    }
    text = format_summary(
        {
            **base,
            "label_conflicts": {"policy": "keep_newest", "texts": 3, "rows": 4, "examples": []},
            "feedback": {"labels_changed": 12, "added_rows": 21, "overrides_uri": "/lake/sources/v/x.csv"},
        }
    )
    assert "3 text(s) labelled differently, 4 row(s) set aside (label_conflicts=keep_newest)" in text
    assert "corrections relabelled 12 source row(s) and added 21 text(s); list: /lake/sources/v/x.csv" in text
    assert "Feedback" not in format_summary(base) and "Label conflicts" not in format_summary(base)


def _with_metrics(metrics: dict, base_model_eval: dict | None = None) -> dict:
    return {
        "model_name": "m", "version": "2", "version_aliases": [], "all_aliases": {}, "mlflow_run_id": "r",
        "data_fingerprint": "f", "gate_decision": "promote", "gate_reasons": "", "metrics": metrics,
        "prepare_steps": [], "split_counts": {}, "base_model_eval": base_model_eval or {},
    }  # fmt: skip


def test_summary_shows_the_challenger_beside_the_baseline_and_the_base_model_before_fine_tuning():
    metrics = {
        "eval_accuracy": 0.958, "eval_accuracy_ci_low": 0.896, "eval_accuracy_ci_high": 1.0,
        "baseline_accuracy": 1.0, "baseline_accuracy_ci_low": 1.0, "baseline_accuracy_ci_high": 1.0,
        "vs_baseline_accuracy_diff": -0.042, "vs_baseline_accuracy_ci_low": -0.104,
        "vs_baseline_accuracy_ci_high": 0.0,
        "base_model_accuracy": 0.25, "base_model_accuracy_ci_low": 0.125,
        "base_model_accuracy_ci_high": 0.375,
        "vs_base_model_accuracy_diff": 0.708, "vs_base_model_accuracy_ci_low": 0.563,
        "vs_base_model_accuracy_ci_high": 0.833,
    }  # fmt: skip
    text = format_summary(_with_metrics(metrics, {"status": "scored", "reason": "", "base_model": "/b"}))
    lines = text.splitlines()
    start = lines.index("Test accuracy [95% interval], and challenger minus each on the same rows:")
    assert lines[start + 1 : start + 4] == [
        "  challenger (fine-tuned)        0.958 [0.896, 1.000]",
        "  TF-IDF baseline                1.000 [1.000, 1.000]    diff -0.042 [-0.104, +0.000]",
        "  base model (not fine-tuned)    0.250 [0.125, 0.375]    diff +0.708 [+0.563, +0.833]",
    ]


def test_summary_says_why_a_classifiers_base_model_has_no_numbers():
    reason = (
        "task=sequence_classification: the base model has no trained classification head for these labels"
    )
    text = format_summary(
        _with_metrics(
            {"eval_accuracy": 0.9}, {"status": "not_applicable", "reason": reason, "base_model": "/b"}
        )
    )
    assert f"  base model (not fine-tuned)    not applicable: {reason}" in text.splitlines()
    # A run from before the base model was scored: no line about it.
    assert "base model" not in format_summary(_with_metrics({"eval_accuracy": 0.9}))
