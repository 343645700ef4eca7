"""The paired bootstrap of challenger - champion on the same test rows (sparktune.release.comparison)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sparktune.release.comparison import (
    ComparisonInputError,
    LabelChange,
    PairedComparison,
    compare_result_files,
    label_change,
    paired_comparison,
)
from sparktune.release.evaluation import INVALID_PREDICTION, EvalResult

LABELS = ["billing", "login", "refund"]


def _result(truth: list[str], predicted: list[str], *, classes: list[str] | None = None) -> EvalResult:
    """An EvalResult as evaluate_model writes it: ``classes`` are the labels, then any other
    predicted class, then ``<invalid>``; unless ``classes`` says another numbering."""
    if classes is None:
        others = sorted(set(predicted) - set(LABELS) - {INVALID_PREDICTION})
        classes = LABELS + others + ([INVALID_PREDICTION] if INVALID_PREDICTION in predicted else [])
    index = {name: i for i, name in enumerate(classes)}
    n = len(truth)
    return EvalResult(
        eval_loss=0.5,
        perplexity=math.exp(0.5),
        eval_accuracy=sum(t == p for t, p in zip(truth, predicted, strict=True)) / n,
        eval_macro_f1=0.0,  # not read: the comparison recomputes every number from the rows
        per_class_f1={},
        n_examples=n,
        confusion={},
        seconds=0.1,
        model_uri="models:/m/1",
        split="test",
        labels=list(LABELS),
        classes=classes,
        y_true=[index[t] for t in truth],
        y_pred=[index[p] for p in predicted],
    )


def _rows(n: int, seed: int = 0, accuracy: float = 0.8) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    truth = [LABELS[i] for i in rng.integers(0, 3, n)]
    predicted = [t if rng.random() < accuracy else LABELS[rng.integers(0, 3)] for t in truth]
    return truth, predicted


def test_identical_models_differ_by_exactly_zero_with_a_zero_interval():
    truth, predicted = _rows(300)
    comparison = paired_comparison(_result(truth, predicted), _result(truth, predicted))
    for diff in (comparison.accuracy, comparison.macro_f1):
        assert diff.difference == 0.0
        assert (diff.ci_low, diff.ci_high) == (0.0, 0.0)
    assert comparison.accuracy.challenger == pytest.approx(_result(truth, predicted).eval_accuracy)


def test_a_challenger_better_on_k_rows_and_worse_on_none():
    n, k = 200, 12
    truth = [LABELS[i % 3] for i in range(n)]
    champion = list(truth)
    for i in range(k):  # the champion misses the first k rows, the challenger gets them right
        champion[i] = LABELS[(LABELS.index(truth[i]) + 1) % 3]
    comparison = paired_comparison(_result(truth, truth), _result(truth, champion))
    assert comparison.accuracy.difference == pytest.approx(k / n)
    assert (comparison.accuracy.challenger, comparison.accuracy.champion) == (1.0, pytest.approx(1 - k / n))
    # Every resample holds the challenger at least as right as the champion: no negative difference.
    assert 0.0 <= comparison.accuracy.ci_low < k / n < comparison.accuracy.ci_high
    # 12 discordant rows of 200: the interval is about k/n +- 2 sqrt(k)/n, not a rounding error.
    assert comparison.accuracy.ci_high - comparison.accuracy.ci_low == pytest.approx(
        2 * 1.96 * math.sqrt(k) / n, rel=0.25
    )
    assert comparison.macro_f1.difference > 0 and comparison.macro_f1.ci_low >= 0.0


def test_better_on_k_rows_and_worse_on_k_others_is_a_zero_difference_that_could_go_either_way():
    n, k = 200, 10
    truth = [LABELS[i % 3] for i in range(n)]
    wrong = {t: LABELS[(LABELS.index(t) + 1) % 3] for t in LABELS}
    challenger = [wrong[t] if n - k <= i else t for i, t in enumerate(truth)]
    champion = [wrong[t] if i < k else t for i, t in enumerate(truth)]
    comparison = paired_comparison(_result(truth, challenger), _result(truth, champion))
    assert comparison.accuracy.difference == pytest.approx(0.0)
    assert comparison.accuracy.ci_low < 0.0 < comparison.accuracy.ci_high


def test_pairing_is_much_tighter_than_the_two_separate_intervals():
    # Both models share most of their errors: the separate intervals overlap widely, while the
    # paired one sees only the rows where they disagree.
    truth, champion = _rows(500, seed=1, accuracy=0.7)
    challenger = list(champion)
    fixed = [i for i, (t, p) in enumerate(zip(truth, champion, strict=True)) if t != p][:15]
    for i in fixed:
        challenger[i] = truth[i]
    comparison = paired_comparison(_result(truth, challenger), _result(truth, champion))
    assert comparison.accuracy.difference == pytest.approx(15 / 500)
    assert comparison.accuracy.ci_low > 0.0  # separately, 0.70 and 0.73 on 500 rows overlap
    assert comparison.accuracy.ci_high - comparison.accuracy.ci_low < 0.035


def test_the_intervals_are_a_direct_numpy_paired_bootstrap():
    from sklearn.metrics import f1_score

    n, resamples, seed = 150, 200, 5
    truth, champion = _rows(n, seed=2, accuracy=0.7)
    _, challenger = _rows(n, seed=3, accuracy=0.75)
    challenger = [t if i % 4 else c for i, (t, c) in enumerate(zip(truth, challenger, strict=True))]
    challenger[7] = INVALID_PREDICTION  # counted a miss, and a false positive of no label
    comparison = paired_comparison(
        _result(truth, challenger), _result(truth, champion), n_resamples=resamples, seed=seed
    )

    # The same draws as sparktune.release.metrics.bootstrap_cis: one matrix of row indices, seeded.
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n), dtype=np.int32)
    t, a, b = np.array(truth), np.array(challenger), np.array(champion)
    accuracy = (a[idx] == t[idx]).mean(axis=1) - (b[idx] == t[idx]).mean(axis=1)
    macro = [
        f1_score(t[i], a[i], labels=LABELS, average="macro", zero_division=0)
        - f1_score(t[i], b[i], labels=LABELS, average="macro", zero_division=0)
        for i in idx
    ]
    for diff, samples in ((comparison.accuracy, accuracy), (comparison.macro_f1, macro)):
        assert (diff.ci_low, diff.ci_high) == pytest.approx(tuple(np.quantile(samples, [0.025, 0.975])))
    assert comparison.accuracy.difference == pytest.approx((a == t).mean() - (b == t).mean())
    assert comparison.macro_f1.difference == pytest.approx(
        f1_score(t, a, labels=LABELS, average="macro", zero_division=0)
        - f1_score(t, b, labels=LABELS, average="macro", zero_division=0)
    )


def test_classes_are_matched_by_name_across_the_two_numberings():
    truth, predicted = _rows(120, seed=4)
    predicted[0] = INVALID_PREDICTION
    predicted[1] = "other_head_class"  # a classifier's class that is no label of the split
    challenger = _result(truth, predicted)
    # The champion numbers the same classes another way round; its outcomes are the same rows.
    champion = _result(
        truth, predicted, classes=[INVALID_PREDICTION, "refund", "other_head_class", *LABELS[:2]]
    )
    assert challenger.y_pred != champion.y_pred
    comparison = paired_comparison(challenger, champion)
    assert (comparison.accuracy.difference, comparison.macro_f1.difference) == (0.0, 0.0)
    assert (comparison.accuracy.ci_low, comparison.accuracy.ci_high) == (0.0, 0.0)


def test_results_of_other_rows_are_refused_with_the_cause_and_the_fix():
    truth, predicted = _rows(100)
    with pytest.raises(ComparisonInputError, match="100 rows and the champion on 99") as info:
        paired_comparison(_result(truth, predicted), _result(truth[:99], predicted[:99]))
    assert "same dataset_path and split" in str(info.value)

    shuffled = truth[1:] + truth[:1]
    with pytest.raises(ComparisonInputError, match=r"true labels differ on \d+ of 100 rows \(first at row"):
        paired_comparison(_result(truth, predicted), _result(shuffled, predicted))

    no_rows = _result(truth, predicted)
    no_rows.y_true, no_rows.y_pred = [], []
    with pytest.raises(ComparisonInputError, match="champion result .* has no per-example outcomes"):
        paired_comparison(_result(truth, predicted), no_rows)


def test_summary_round_trips_and_flat_metrics_are_named_for_mlflow(tmp_path):
    truth, champion = _rows(200, seed=6, accuracy=0.7)
    _, challenger = _rows(200, seed=7, accuracy=0.8)
    (tmp_path / "challenger.json").write_text(_result(truth, challenger).to_json())
    (tmp_path / "champion.json").write_text(_result(truth, champion).to_json())
    comparison = compare_result_files(tmp_path / "challenger.json", tmp_path / "champion.json")

    assert comparison == paired_comparison(_result(truth, challenger), _result(truth, champion))
    assert PairedComparison.from_summary(comparison.to_summary()) == comparison
    metrics = comparison.metrics()
    assert set(metrics) == {
        f"vs_champion_{name}_{part}"
        for name in ("accuracy", "macro_f1")
        for part in ("diff", "ci_low", "ci_high")
    }
    assert metrics["vs_champion_accuracy_diff"] == comparison.accuracy.difference
    assert comparison.accuracy.ci_low <= comparison.accuracy.difference <= comparison.accuracy.ci_high
    assert (comparison.n_examples, comparison.n_resamples, comparison.confidence) == (200, 1000, 0.95)


# --------------------------------------------------------------------------------------------
# Label sets that differ: a champion trained before a label was added or removed


def _trained_on(result: EvalResult, labels: list[str]) -> EvalResult:
    result.model_labels = list(labels)
    return result


def test_models_trained_on_other_label_sets_are_compared_on_the_rows_of_labels_both_know():
    from sklearn.metrics import f1_score

    # The champion was trained on billing, login and "account" (since dropped); the challenger on
    # billing, login and refund (new). Refund rows are no contest: the champion never learned refund.
    truth, challenger_pred = _rows(300, seed=8, accuracy=0.85)
    champion_pred = [
        "account" if i % 7 == 0 else ("login" if t == "refund" else t) for i, t in enumerate(truth)
    ]
    challenger = _trained_on(_result(truth, challenger_pred), LABELS)
    champion = _trained_on(_result(truth, champion_pred), ["account", "billing", "login"])

    change = label_change(challenger, champion)
    shared = [i for i, t in enumerate(truth) if t in ("billing", "login")]
    assert change == LabelChange(["refund"], ["account"], 300, len(shared)) and change.changed
    assert LabelChange.from_summary(change.to_summary()) == change

    comparison = paired_comparison(challenger, champion)
    assert comparison.n_examples == len(shared) < 300
    t, a, b = (np.array(v)[shared] for v in (truth, challenger_pred, champion_pred))
    assert comparison.accuracy.challenger == pytest.approx((a == t).mean())
    assert comparison.accuracy.champion == pytest.approx((b == t).mean())  # "account" is a miss
    # Macro F1 averages over the labels both know; a prediction of refund (or account) is a miss.
    shared_labels = ["billing", "login"]
    assert comparison.macro_f1.difference == pytest.approx(
        f1_score(t, a, labels=shared_labels, average="macro", zero_division=0)
        - f1_score(t, b, labels=shared_labels, average="macro", zero_division=0)
    )
    # On every row, the champion would have lost all refund rows: a drop that is not the model's.
    everywhere = np.mean(np.array(challenger_pred) == np.array(truth)) - np.mean(
        np.array(champion_pred) == np.array(truth)
    )
    assert comparison.accuracy.difference < everywhere


def test_label_sets_are_the_recorded_model_labels_else_the_split_labels():
    truth, predicted = _rows(90, seed=9)
    unrecorded = label_change(_result(truth, predicted), _result(truth, predicted))
    assert unrecorded == LabelChange([], [], 90, 90) and not unrecorded.changed
    # The split's labels disagreeing used to refuse the pair; now they are label sets like any other.
    champion = _result(truth, predicted)
    champion.labels = ["billing", "login"]
    comparison = paired_comparison(_result(truth, predicted), champion)
    assert comparison.n_examples == sum(t != "refund" for t in truth)


def test_no_row_of_a_label_both_know_is_refused_with_the_labels():
    truth, predicted = _rows(60, seed=10)
    challenger = _trained_on(_result(truth, predicted), LABELS)
    champion = _trained_on(_result(truth, ["cancel"] * 60), ["cancel", "upgrade"])
    assert label_change(challenger, champion).n_shared_rows == 0
    with pytest.raises(ComparisonInputError, match=r"none of the 60 rows has a label both models know"):
        paired_comparison(challenger, champion)
