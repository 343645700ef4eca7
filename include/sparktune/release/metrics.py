"""The numbers a model is judged by: :class:`EvalResult`, and how label predictions become them.

Accuracy, macro and per-class F1 and recall of predicted labels against the true ones, the
confusion counts, and 95% confidence intervals: a percentile bootstrap over the examples (1,000
resamples with a fixed seed: the same seed and split give the challenger, the champion and the
baseline the same resamples). The loss interval resamples whole examples and recomputes the
per-token mean, as the point estimate is computed.

Scoring a model (:mod:`sparktune.release.evaluation`), the TF-IDF baseline
(:mod:`sparktune.release.baseline`), the paired comparison (:mod:`sparktune.release.comparison`)
and the gate (:mod:`sparktune.release.gate`) all read and write these; this module imports none of
them. numpy here, scikit-learn when a result is computed; no torch, no model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

INVALID_PREDICTION = "<invalid>"
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
# Metrics that get a confidence interval, in the order they are logged.
CI_METRICS = ("eval_accuracy", "eval_macro_f1", "eval_loss")


@dataclass
class EvalResult:
    eval_loss: float
    perplexity: float
    eval_accuracy: float
    eval_macro_f1: float
    per_class_f1: dict[str, float]
    n_examples: int
    # confusion[true_label][predicted_label] = count; predictions that are no label count as "<invalid>".
    confusion: dict[str, dict[str, int]]
    seconds: float
    model_uri: str = ""
    split: str = ""
    n_invalid: int = 0
    labels: list[str] = field(default_factory=list)
    # The labels the model itself answers with (a classifier's head, a causal LM's candidates):
    # after a label-set change the champion's differ from the split's ``labels``, and only rows of
    # labels both models know compare like for like (sparktune.release.comparison). Empty: not recorded.
    model_labels: list[str] = field(default_factory=list)
    # A few generations that matched no label, to see why (no eos learned, a misspelt label...).
    invalid_samples: list[str] = field(default_factory=list)
    # label -> share of its examples predicted as it (0 for a label the split lacks).
    per_class_recall: dict[str, float] = field(default_factory=dict)
    # metric -> [low, high]: percentile bootstrap interval at ``ci_level`` over ``ci_resamples``.
    ci: dict[str, list[float]] = field(default_factory=dict)
    ci_level: float = CONFIDENCE
    ci_resamples: int = 0
    # Per example, in split order: indices into ``classes`` (``labels`` first, then predicted
    # classes that are no label of the split: a classifier's other classes, "<invalid>"), the
    # summed completion loss and how many tokens it covers (0: left out of the loss).
    classes: list[str] = field(default_factory=list)
    y_true: list[int] = field(default_factory=list)
    y_pred: list[int] = field(default_factory=list)
    example_loss: list[float] = field(default_factory=list)
    example_tokens: list[int] = field(default_factory=list)
    # Per example, in split order: its id (the dataset's example_id) and the predicted label's
    # probability, as the served model gives it.
    example_ids: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Flat metric names for MLflow and the gate; small (no per-example values)."""
        out = {
            "eval_loss": self.eval_loss,
            "eval_perplexity": self.perplexity,
            "eval_accuracy": self.eval_accuracy,
            "eval_macro_f1": self.eval_macro_f1,
        }
        for name, (low, high) in self.ci.items():
            out[f"{name}_ci_low"] = float(low)
            out[f"{name}_ci_high"] = float(high)
        for label, value in self.per_class_f1.items():
            out[f"eval_f1_{metric_safe(label)}"] = value
        for label, value in self.per_class_recall.items():
            out[f"eval_recall_{metric_safe(label)}"] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field plus the flat ``metrics`` a reader without torch can use as they are."""
        return {**asdict(self), "metrics": self.metrics()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EvalResult:
        return cls(**{k: v for k, v in raw.items() if k != "metrics"})


def metric_safe(label: str) -> str:
    """A label as MLflow accepts it in a metric name (alphanumerics, _ - . / and space)."""
    return re.sub(r"[^0-9A-Za-z_\-./ ]", "_", label)


# --------------------------------------------------------------------------------------------
# Bootstrap confidence intervals

# A statistic maps a (resamples, n) matrix of example indices to one value per resample.
Statistic = Callable[[npt.NDArray[np.integer]], npt.NDArray[np.float64]]


def accuracy_statistic(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> Statistic:
    """Share of correct predictions in each resample."""
    correct = np.asarray(y_true) == np.asarray(y_pred)
    return lambda idx: correct[idx].mean(axis=1)


def macro_f1_statistic(y_true: npt.ArrayLike, y_pred: npt.ArrayLike, n_labels: int) -> Statistic:
    """Macro F1 over classes ``0..n_labels-1`` in each resample, as sklearn's
    ``f1_score(labels=range(n_labels), average="macro", zero_division=0)`` computes it:
    a prediction of a class outside that range (``<invalid>``) is a miss for the true class and a
    false positive for none; a class neither present nor predicted in a resample scores 0."""
    truth = np.asarray(y_true, dtype=np.int64)
    predicted = np.minimum(np.asarray(y_pred, dtype=np.int64), n_labels)  # one column for "no label"
    width = n_labels + 1
    cells = n_labels * width
    # One gather and one bincount per chunk: each resample's whole confusion matrix at once.
    code = (truth * width + predicted).astype(np.int32)

    # Resamples per bincount, so that their confusion matrices stay small with many classes.
    step = max(1, 4_000_000 // cells)

    def statistic(idx: npt.NDArray[np.integer]) -> npt.NDArray[np.float64]:
        return np.concatenate([_macro_f1_of(idx[begin : begin + step]) for begin in range(0, len(idx), step)])

    def _macro_f1_of(idx: npt.NDArray[np.integer]) -> npt.NDArray[np.float64]:
        rows = idx.shape[0]
        offsets = (np.arange(rows, dtype=np.int64) * cells)[:, None]
        confusion = np.bincount((code[idx] + offsets).ravel(), minlength=rows * cells)
        confusion = confusion.reshape(rows, n_labels, width)
        tp = np.einsum("bii->bi", confusion[:, :, :n_labels])
        denominator = confusion.sum(axis=2) + confusion[:, :, :n_labels].sum(axis=1)  # 2 TP + FP + FN
        f1 = np.divide(2.0 * tp, denominator, out=np.zeros((rows, n_labels)), where=denominator > 0)
        return f1.mean(axis=1)

    return statistic


def ratio_statistic(numerator: npt.ArrayLike, denominator: npt.ArrayLike) -> Statistic:
    """sum(numerator) / sum(denominator) over each resample (a per-token mean loss); NaN if 0."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)

    def statistic(idx: npt.NDArray[np.integer]) -> npt.NDArray[np.float64]:
        totals = den[idx].sum(axis=1)
        return np.divide(num[idx].sum(axis=1), totals, out=np.full(len(totals), np.nan), where=totals > 0)

    return statistic


def bootstrap_cis(
    statistics: Mapping[str, Statistic],
    n: int,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
    max_chunk_elements: int = 4_000_000,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals of several statistics of ``n`` examples, on shared resamples.

    Each resample draws ``n`` example indices with replacement (``numpy.random.default_rng(seed)``,
    so the same seed and ``n`` give the same resamples); resamples are drawn in chunks of at most
    ``max_chunk_elements`` indices, so memory stays bounded for large splits. A statistic that is
    NaN in every resample gets no interval.
    """
    if n < 1:
        raise ValueError(f"bootstrap needs at least one example, got n={n}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    chunk = max(1, max_chunk_elements // n)
    index_type = np.int32 if n < 2**31 else np.int64
    values: dict[str, list[npt.NDArray[np.float64]]] = {name: [] for name in statistics}
    for begin in range(0, n_resamples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_resamples - begin), n), dtype=index_type)
        for name, statistic in statistics.items():
            values[name].append(statistic(idx))
    tail = (1.0 - confidence) / 2.0
    out: dict[str, tuple[float, float]] = {}
    for name, parts in values.items():
        samples = np.concatenate(parts)
        samples = samples[~np.isnan(samples)]
        if samples.size:
            low, high = np.quantile(samples, [tail, 1.0 - tail])
            out[name] = (float(low), float(high))
    return out


def bootstrap_ci(
    statistic: Statistic,
    n: int,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """Percentile bootstrap interval of one statistic of ``n`` examples (see :func:`bootstrap_cis`)."""
    cis = bootstrap_cis({"value": statistic}, n, n_resamples=n_resamples, confidence=confidence, seed=seed)
    if "value" not in cis:
        raise ValueError("the statistic is undefined (NaN) in every resample")
    return cis["value"]


def classification_cis(
    y_true: npt.ArrayLike,
    y_pred: npt.ArrayLike,
    n_labels: int,
    example_loss: npt.ArrayLike | None = None,
    example_tokens: npt.ArrayLike | None = None,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, tuple[float, float]]:
    """Intervals of ``eval_accuracy``, ``eval_macro_f1`` and (given per-example losses and token
    counts) ``eval_loss``, all from the same resamples of the examples."""
    statistics: dict[str, Statistic] = {
        "eval_accuracy": accuracy_statistic(y_true, y_pred),
        "eval_macro_f1": macro_f1_statistic(y_true, y_pred, n_labels),
    }
    if example_loss is not None and example_tokens is not None:
        statistics["eval_loss"] = ratio_statistic(example_loss, example_tokens)
    return bootstrap_cis(
        statistics, len(np.asarray(y_true)), n_resamples=n_resamples, confidence=confidence, seed=seed
    )


def label_result(
    truth: Sequence[str],
    predicted: Sequence[str],
    names: Sequence[str],
    *,
    example_loss: Sequence[float] | None = None,
    example_tokens: Sequence[int] | None = None,
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
    seconds: float = 0.0,
    **fields: Any,
) -> EvalResult:
    """The :class:`EvalResult` of label predictions against the truth, labels in ``names`` order:
    accuracy, macro and per-class F1 and recall, the confusion counts, per-example class indices
    and the bootstrap intervals; the loss from per-example losses and token counts when given
    (NaN without). ``fields`` fill in the rest (``model_uri``, ``split``, ``scores``, ...).

    A prediction that is no label of ``names`` is a class of its own after them (a classifier's
    other class, ``<invalid>`` last): a miss for the true class and no class's hit.
    """
    from sklearn.metrics import f1_score, recall_score

    names = list(names)
    per_class = f1_score(truth, predicted, labels=names, average=None, zero_division=0)
    macro = f1_score(truth, predicted, labels=names, average="macro", zero_division=0)
    recall = recall_score(truth, predicted, labels=names, average=None, zero_division=0)
    confusion: dict[str, dict[str, int]] = {}
    for t, p in zip(truth, predicted, strict=True):
        row = confusion.setdefault(t, {})
        row[p] = row.get(p, 0) + 1
    others = sorted(set(predicted) - set(names) - {INVALID_PREDICTION})
    classes = names + others + ([INVALID_PREDICTION] if INVALID_PREDICTION in predicted else [])
    index = {name: i for i, name in enumerate(classes)}
    y_true = [index[t] for t in truth]
    y_pred = [index[p] for p in predicted]
    losses = [float(v) for v in example_loss] if example_loss is not None else []
    tokens = [int(v) for v in example_tokens] if example_tokens is not None else []
    has_loss = example_loss is not None and example_tokens is not None
    eval_loss = math.fsum(losses) / max(sum(tokens), 1) if has_loss else math.nan
    ci: dict[str, list[float]] = {}
    if bootstrap_resamples:
        intervals = classification_cis(
            y_true,
            y_pred,
            len(names),
            losses if has_loss else None,
            tokens if has_loss else None,
            n_resamples=bootstrap_resamples,
            seed=bootstrap_seed,
        )
        ci = {name: list(intervals[name]) for name in CI_METRICS if name in intervals}
    return EvalResult(
        eval_loss=eval_loss,
        perplexity=math.exp(min(eval_loss, 700.0)) if has_loss else math.nan,
        eval_accuracy=sum(t == p for t, p in zip(truth, predicted, strict=True)) / len(truth),
        eval_macro_f1=float(macro),
        per_class_f1={name: float(v) for name, v in zip(names, per_class, strict=True)},
        per_class_recall={name: float(v) for name, v in zip(names, recall, strict=True)},
        n_examples=len(truth),
        confusion=confusion,
        n_invalid=sum(p == INVALID_PREDICTION for p in predicted),
        labels=names,
        ci=ci,
        ci_level=CONFIDENCE,
        ci_resamples=bootstrap_resamples,
        classes=classes,
        y_true=y_true,
        y_pred=y_pred,
        example_loss=losses if has_loss else [],
        example_tokens=tokens if has_loss else [],
        seconds=seconds,
        **fields,
    )
