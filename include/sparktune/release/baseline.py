"""The cheap model every fine-tuned one must beat: TF-IDF + logistic regression (scikit-learn).

Trained on the run's own train split and scored on its test split, the same rows the fine-tuned
model is scored on, so the two pair up row by row (:func:`sparktune.release.comparison.paired_comparison`):
a fine-tuned model that loses to a classifier that trains in a second is not worth serving, however
its own numbers look. Its result is an :class:`~sparktune.release.metrics.EvalResult` without a loss
(a linear model has no completion loss to compare).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sparktune.release.metrics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, EvalResult, label_result

if TYPE_CHECKING:
    from sklearn.pipeline import Pipeline
    from sparktune.release.comparison import PairedComparison

BASELINE_URI = "baseline:tfidf-logistic-regression"
# What the baseline is called where people read it (the gate's reasons, the task log).
BASELINE_NAME = "TF-IDF + logistic regression"
# Prefix of the paired (model - baseline) metrics: vs_baseline_accuracy_diff, ..._ci_low, ...
VS_BASELINE_PREFIX = "vs_baseline_"


def baseline_model(seed: int = 0) -> Pipeline:
    """The baseline, unfitted: TF-IDF (word unigrams and bigrams, sublinear term frequency) + logistic
    regression. Shared with the label-issue finder (:mod:`sparktune.serve.label_issues`), whose
    out-of-sample probabilities should come from the same classifier the gate compares against."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    return make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
        LogisticRegression(max_iter=1000, random_state=seed),
    )


def fit_predict(
    train_texts: Sequence[str], train_labels: Sequence[str], texts: Sequence[str], *, seed: int = 0
) -> list[str]:
    """Fit TF-IDF (word unigrams and bigrams, sublinear term frequency) + logistic regression on the
    train rows and predict a label for each of ``texts``.

    A train split with one label predicts that label: logistic regression needs two classes.
    """
    if len(train_texts) != len(train_labels):
        raise ValueError(f"{len(train_texts)} train texts but {len(train_labels)} labels")
    if not train_texts:
        raise ValueError("the baseline needs at least one train row")
    classes = sorted(set(train_labels))
    if len(classes) == 1:
        return [classes[0]] * len(texts)
    model = baseline_model(seed)
    model.fit(list(train_texts), list(train_labels))
    return [str(p) for p in model.predict(list(texts))]


def evaluate_baseline(
    train_texts: Sequence[str],
    train_labels: Sequence[str],
    texts: Sequence[str],
    truth: Sequence[str],
    labels: Sequence[str],
    *,
    example_ids: Sequence[str] | None = None,
    split: str = "test",
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
) -> EvalResult:
    """The baseline's accuracy, macro and per-class F1 and recall on ``texts`` (true labels
    ``truth``, label order ``labels``, as the fine-tuned model's evaluation has them), with the same
    bootstrap intervals; ``eval_loss`` and ``perplexity`` are NaN."""
    if len(texts) != len(truth) or not texts:
        raise ValueError(f"{len(texts)} texts and {len(truth)} true labels: need as many, at least one")
    started = time.perf_counter()
    predicted = fit_predict(train_texts, train_labels, texts, seed=bootstrap_seed)
    return label_result(
        truth,
        predicted,
        labels,
        bootstrap_resamples=bootstrap_resamples,
        bootstrap_seed=bootstrap_seed,
        seconds=time.perf_counter() - started,
        model_uri=BASELINE_URI,
        split=split,
        example_ids=list(example_ids) if example_ids is not None else [str(i) for i in range(len(truth))],
    )


def baseline_metrics(baseline: EvalResult, comparison: PairedComparison) -> dict[str, float]:
    """Flat MLflow metrics of the baseline beside the model's: ``baseline_accuracy``,
    ``baseline_macro_f1`` and their interval bounds, and the paired ``vs_baseline_accuracy_diff``
    (model minus baseline on the same rows), ``..._ci_low``, ``..._ci_high``, same for macro F1."""
    from sparktune.release.comparison import reference_metrics

    # No baseline_loss: a linear model has no completion loss (NaN), so none is reported.
    return reference_metrics(baseline, comparison, name="baseline")
