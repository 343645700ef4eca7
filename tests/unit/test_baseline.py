"""The TF-IDF + logistic regression baseline, on the demo data's labelled tickets, paired with a model."""

from __future__ import annotations

import math

import pytest
from sparktune.model.builtin_corpus import generate_support_tickets
from sparktune.release.baseline import BASELINE_URI, baseline_metrics, evaluate_baseline, fit_predict
from sparktune.release.comparison import paired_comparison
from sparktune.release.evaluation import EvalResult


@pytest.fixture(scope="module")
def tickets() -> dict[str, list[str]]:
    table = generate_support_tickets(1200, seed=3).to_pydict()
    rows = [
        (m, label)
        for m, label in zip(table["message"], table["intent_label"], strict=True)
        if m and label and m.strip()
    ]
    train, test = rows[:900], rows[900:]
    return {
        "train_texts": [m for m, _ in train],
        "train_labels": [lab for _, lab in train],
        "texts": [m for m, _ in test],
        "truth": [lab for _, lab in test],
        "labels": sorted({lab for _, lab in rows}),
    }


def test_the_baseline_learns_the_tickets_and_carries_intervals_but_no_loss(tickets):
    result = evaluate_baseline(**tickets, bootstrap_resamples=200)
    assert result.model_uri == BASELINE_URI and result.n_examples == len(tickets["truth"])
    assert result.eval_accuracy > 0.9, result.eval_accuracy  # word n-grams separate the intents
    low, high = result.ci["eval_accuracy"]
    assert low <= result.eval_accuracy <= high < 1.0 + 1e-9
    assert "eval_loss" not in result.ci and math.isnan(result.eval_loss)
    assert set(result.per_class_recall) == set(tickets["labels"])


def test_a_train_split_with_one_label_predicts_it_and_a_train_only_label_counts_as_a_miss():
    assert fit_predict(["a", "b"], ["x", "x"], ["c", "d", "e"]) == ["x", "x", "x"]
    # "refund" is only in the train split: predicted for the refund-like test text, it is no test
    # label, so it is a class of its own and a miss.
    result = evaluate_baseline(
        ["money back please", "money back now", "where is my parcel", "parcel is late"],
        ["refund", "refund", "shipping", "shipping"],
        ["give my money back", "my parcel is late"],
        ["billing", "shipping"],
        ["billing", "shipping"],
        bootstrap_resamples=0,
    )
    assert result.classes == ["billing", "shipping", "refund"]
    assert result.eval_accuracy == 0.5 and result.ci == {}


def _model_result(baseline: EvalResult, wrong_rows: int) -> EvalResult:
    """A model's result on the baseline's rows that gets ``wrong_rows`` more rows wrong."""
    y_pred = list(baseline.y_true)
    for i in range(wrong_rows):
        y_pred[i] = (y_pred[i] + 1) % len(baseline.labels)
    return EvalResult(
        eval_loss=0.5,
        perplexity=math.exp(0.5),
        eval_accuracy=sum(a == b for a, b in zip(baseline.y_true, y_pred, strict=True)) / baseline.n_examples,
        eval_macro_f1=0.0,
        per_class_f1={},
        n_examples=baseline.n_examples,
        confusion={},
        seconds=0.0,
        model_uri="models:/m/1",
        labels=baseline.labels,
        classes=baseline.classes,
        y_true=baseline.y_true,
        y_pred=y_pred,
    )


def test_a_model_worse_than_the_baseline_shows_it_in_the_paired_metrics(tickets):
    baseline = evaluate_baseline(**tickets, bootstrap_resamples=200)
    worse = _model_result(baseline, wrong_rows=60)
    metrics = baseline_metrics(baseline, paired_comparison(worse, baseline, n_resamples=500))
    assert metrics["baseline_accuracy"] == baseline.eval_accuracy
    assert metrics["baseline_accuracy_ci_low"] <= baseline.eval_accuracy
    assert metrics["vs_baseline_accuracy_diff"] == pytest.approx(worse.eval_accuracy - baseline.eval_accuracy)
    assert metrics["vs_baseline_accuracy_ci_low"] < metrics["vs_baseline_accuracy_diff"] < 0
    assert {"vs_baseline_macro_f1_diff", "vs_baseline_macro_f1_ci_low", "baseline_macro_f1"} <= set(metrics)
