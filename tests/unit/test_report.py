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
