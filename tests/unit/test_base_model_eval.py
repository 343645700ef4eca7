"""The base model's part of an evaluation (sparktune.release.base_model_eval): what the evaluate job
writes when it has no score, and the sentence people read. Scoring itself: tests/unit/test_evaluation.py."""

from __future__ import annotations

import pytest
from sparktune.release import base_model_eval
from sparktune.release.base_model_eval import BaseModelOutcome


def test_only_a_sequence_classifier_is_not_applicable():
    assert base_model_eval.not_applicable_reason("causal_lm") is None
    reason = base_model_eval.not_applicable_reason("sequence_classification")
    assert reason and "no trained classification head" in reason


def test_an_outcome_round_trips_through_its_file_and_an_eval_result_reads_as_one(tmp_path):
    from sparktune.release.metrics import EvalResult, label_result

    outcome = BaseModelOutcome(base_model_eval.NOT_SCORED, "/gone", "OSError: no such folder")
    path = base_model_eval.write_outcome(outcome, tmp_path / "out" / "base.json")
    assert base_model_eval.read_output(path) == outcome
    assert outcome.tags() == {
        "sparktune.base_model_eval": "not_scored",
        "sparktune.base_model_eval.reason": "OSError: no such folder",
    }
    assert BaseModelOutcome(base_model_eval.SCORED).tags() == {"sparktune.base_model_eval": "scored"}

    result = label_result(["a", "b"], ["a", "a"], ["a", "b"], bootstrap_resamples=0, model_uri="/base")
    (tmp_path / "scored.json").write_text(result.to_json())
    assert isinstance(base_model_eval.read_output(tmp_path / "scored.json"), EvalResult)
    with pytest.raises(ValueError, match="must be one of"):
        BaseModelOutcome("maybe")


def test_the_sentence_says_why_there_are_no_numbers():
    skipped = BaseModelOutcome(base_model_eval.SKIPPED, reason="evaluate_base_model=false")
    assert base_model_eval.describe(skipped) == (
        "Base model before fine-tuning: skipped: evaluate_base_model=false."
    )
    # Scored but without intervals (bootstrap_resamples=0): the numbers alone.
    scored = BaseModelOutcome(
        base_model_eval.SCORED,
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        metrics={"base_model_accuracy": 0.25, "base_model_macro_f1": 0.1, "vs_base_model_accuracy_diff": 0.7},
    )
    assert base_model_eval.describe(scored) == (
        "Base model before fine-tuning (HuggingFaceTB/SmolLM2-135M-Instruct), same prompt, labels and test "
        "rows: accuracy 0.250, macro F1 0.100; challenger minus base model: accuracy +0.700."
    )
