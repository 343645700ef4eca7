"""Challenger against champion on the same test rows: paired bootstrap intervals of the differences.

Both models are scored on the same frozen split, so their per-row outcomes pair up. Each resample
draws row indices once and applies them to both models' outcomes; what the two models share (a
row hard for both, a row easy for both) then cancels out of the difference, and its interval
reflects only the rows on which they disagree. That interval, not the two models' separate ones,
says whether a drop in accuracy is noise.

The resamples are :func:`sparktune.release.metrics.bootstrap_cis`'s: percentile bootstrap, fixed seed.

When the two models were trained on different label sets (a label added or removed since the
champion), a row of a label only one of them knows is no contest: the other cannot be right on
it. :func:`label_change` names the labels added and removed, and the comparison keeps only the rows
whose true label both models know (macro F1 averages over those labels); ``n_examples`` counts them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sparktune.release.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    INVALID_PREDICTION,
    EvalResult,
    Statistic,
    accuracy_statistic,
    bootstrap_cis,
    macro_f1_statistic,
)

# Prefix of the flat metric names on the challenger's run: vs_champion_accuracy_diff, ..._ci_low.
METRIC_PREFIX = "vs_champion_"


class ComparisonInputError(ValueError):
    """The two results cannot be paired row by row; the message says why and how to fix it."""


@dataclass(frozen=True)
class PairedDifference:
    """``challenger - champion`` for one metric, with its paired bootstrap interval."""

    challenger: float
    champion: float
    difference: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class PairedComparison:
    n_examples: int
    confidence: float
    n_resamples: int
    seed: int
    accuracy: PairedDifference
    macro_f1: PairedDifference

    def differences(self) -> dict[str, PairedDifference]:
        return {"accuracy": self.accuracy, "macro_f1": self.macro_f1}

    def metrics(self, prefix: str = METRIC_PREFIX) -> dict[str, float]:
        """Flat MLflow metrics: ``vs_champion_<metric>_diff``, ``..._ci_low``, ``..._ci_high``
        (``prefix`` names what the challenger was compared with)."""
        out: dict[str, float] = {}
        for name, diff in self.differences().items():
            out[f"{prefix}{name}_diff"] = diff.difference
            out[f"{prefix}{name}_ci_low"] = diff.ci_low
            out[f"{prefix}{name}_ci_high"] = diff.ci_high
        return out

    def to_summary(self) -> dict[str, Any]:
        """A few hundred bytes of JSON-able numbers (no per-row data): what goes into XCom."""
        return asdict(self)

    @classmethod
    def from_summary(cls, raw: dict[str, Any]) -> PairedComparison:
        return cls(
            n_examples=int(raw["n_examples"]),
            confidence=float(raw["confidence"]),
            n_resamples=int(raw["n_resamples"]),
            seed=int(raw["seed"]),
            accuracy=PairedDifference(**raw["accuracy"]),
            macro_f1=PairedDifference(**raw["macro_f1"]),
        )


@dataclass(frozen=True)
class LabelChange:
    """How the challenger's label set differs from the champion's, and how many test rows have a
    true label both know (the rows the two are compared on)."""

    added: list[str]  # the challenger's labels the champion was not trained on
    removed: list[str]  # the champion's labels the challenger was not trained on
    n_rows: int
    n_shared_rows: int

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)

    def to_summary(self) -> dict[str, Any]:
        """JSON-able, for XCom: label names and two counts."""
        return asdict(self)

    @classmethod
    def from_summary(cls, raw: dict[str, Any]) -> LabelChange:
        return cls(
            added=[str(v) for v in raw["added"]],
            removed=[str(v) for v in raw["removed"]],
            n_rows=int(raw["n_rows"]),
            n_shared_rows=int(raw["n_shared_rows"]),
        )


def model_label_set(result: EvalResult) -> list[str]:
    """The labels the model answers with: its recorded ``model_labels``, else the split's labels it
    was scored against (a result that did not record them: no change can be seen)."""
    return list(result.model_labels or result.labels)


def _shared_labels(challenger: EvalResult, champion: EvalResult) -> set[str]:
    return set(model_label_set(challenger)) & set(model_label_set(champion))


def label_change(challenger: EvalResult, champion: EvalResult) -> LabelChange:
    """The labels the challenger added and removed against the champion, and how many of the
    challenger's test rows have a true label both know."""
    ours, theirs = model_label_set(challenger), model_label_set(champion)
    shared = set(ours) & set(theirs)
    truth = _names(challenger, challenger.y_true, "challenger", "y_true")
    return LabelChange(
        added=sorted(set(ours) - set(theirs)),
        removed=sorted(set(theirs) - set(ours)),
        n_rows=len(truth),
        n_shared_rows=sum(t in shared for t in truth),
    )


@dataclass(frozen=True)
class PairedOutcomes:
    """Both models' predictions on the same rows, as indices into one shared class list whose
    first ``len(labels)`` entries are the split's labels both models know (what macro F1 averages
    over)."""

    labels: list[str]
    y_true: npt.NDArray[np.int64]
    challenger_pred: npt.NDArray[np.int64]
    champion_pred: npt.NDArray[np.int64]


def _names(result: EvalResult, indices: list[int], role: str, field_name: str) -> list[str]:
    try:
        return [result.classes[i] for i in indices]
    except IndexError:
        raise ComparisonInputError(
            f"The {role} result ({result.model_uri or 'no model URI'}) has {field_name} indices outside "
            f"its {len(result.classes)} classes: the result JSON is damaged; evaluate the model again."
        ) from None


def paired_outcomes(challenger: EvalResult, champion: EvalResult) -> PairedOutcomes:
    """Line up both results' per-row outcomes by class *name* (each result numbers its classes
    itself: one may have ``<invalid>`` or a class the other never predicted).

    When the two models' label sets differ (:func:`label_change`), only the rows whose true label
    both know are kept, and only those labels are averaged over; a prediction of a label the other
    model lacks is then a miss like any wrong label.

    Raises :class:`ComparisonInputError` listing every problem when the two were not scored on the
    same rows in the same order, or when no row has a label both models know.
    """
    problems: list[str] = []
    for role, result in (("challenger", challenger), ("champion", champion)):
        if not (len(result.y_true) == len(result.y_pred) == result.n_examples > 0):
            problems.append(
                f"the {role} result ({result.model_uri or 'no model URI'}) has no per-example outcomes "
                f"(y_true {len(result.y_true)}, y_pred {len(result.y_pred)}, n_examples "
                f"{result.n_examples}): evaluate it with this version of sparktune "
                "(python -m sparktune.jobs.evaluate)"
            )
    if problems:
        raise ComparisonInputError("Cannot pair challenger and champion row by row: " + "; ".join(problems))
    if challenger.n_examples != champion.n_examples:
        problems.append(
            f"the challenger was scored on {challenger.n_examples} rows and the champion on "
            f"{champion.n_examples}: not the same split"
        )
    truth = _names(challenger, challenger.y_true, "challenger", "y_true")
    champion_truth = _names(champion, champion.y_true, "champion", "y_true")
    if not problems and truth != champion_truth:
        differing = [i for i, (a, b) in enumerate(zip(truth, champion_truth, strict=True)) if a != b]
        first = differing[0]
        problems.append(
            f"the true labels differ on {len(differing)} of {len(truth)} rows (first at row {first}: "
            f"{truth[first]!r} for the challenger, {champion_truth[first]!r} for the champion): "
            "not the same rows in the same order"
        )
    if problems:
        raise ComparisonInputError(
            "Cannot pair challenger and champion row by row: "
            + "; ".join(problems)
            + ". Evaluate both on the same dataset_path and split, with the same max_examples."
        )

    shared = _shared_labels(challenger, champion)
    # A row of a label one model was never trained on says nothing about which model is better.
    keep = [i for i, name in enumerate(truth) if name in shared]
    if not keep:
        change = label_change(challenger, champion)
        raise ComparisonInputError(
            f"Cannot pair challenger and champion row by row: none of the {len(truth)} rows has a label "
            f"both models know (the challenger added {change.added}, removed {change.removed}); "
            "compare models trained on overlapping label sets."
        )
    labels = [name for name in (list(challenger.labels) or sorted(set(truth))) if name in shared]
    challenger_names = _names(challenger, challenger.y_pred, "challenger", "y_pred")
    champion_names = _names(champion, champion.y_pred, "champion", "y_pred")
    truth, challenger_names, champion_names = (
        [names[i] for i in keep] for names in (truth, challenger_names, champion_names)
    )
    # Predictions that are no label (another class of a classifier's head, "<invalid>") come after
    # the labels: macro F1 counts them as misses of the true class and as no class's hit.
    others = sorted((set(challenger_names) | set(champion_names)) - set(labels) - {INVALID_PREDICTION})
    index = {name: i for i, name in enumerate([*labels, *others, INVALID_PREDICTION])}

    def indices(names: list[str]) -> npt.NDArray[np.int64]:
        return np.array([index[name] for name in names], dtype=np.int64)

    return PairedOutcomes(labels, indices(truth), indices(challenger_names), indices(champion_names))


def _difference(challenger: Statistic, champion: Statistic) -> Statistic:
    """The challenger's statistic minus the champion's on the very same resampled rows."""
    return lambda idx: challenger(idx) - champion(idx)


def paired_comparison(
    challenger: EvalResult,
    champion: EvalResult,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> PairedComparison:
    """Accuracy and macro F1 of ``challenger - champion`` with paired percentile bootstrap intervals.

    Both differences come from the same ``n_resamples`` resamples of row indices (seeded: the same
    results give the same intervals), each applied to both models' outcomes. Models trained on
    different label sets are compared on the rows whose label both know (:func:`paired_outcomes`).
    """
    outcomes = paired_outcomes(challenger, champion)
    n_labels = len(outcomes.labels)
    statistics: dict[str, tuple[Statistic, Statistic]] = {
        "accuracy": (
            accuracy_statistic(outcomes.y_true, outcomes.challenger_pred),
            accuracy_statistic(outcomes.y_true, outcomes.champion_pred),
        ),
        "macro_f1": (
            macro_f1_statistic(outcomes.y_true, outcomes.challenger_pred, n_labels),
            macro_f1_statistic(outcomes.y_true, outcomes.champion_pred, n_labels),
        ),
    }
    n = len(outcomes.y_true)
    intervals = bootstrap_cis(
        {name: _difference(*pair) for name, pair in statistics.items()},
        n,
        n_resamples=n_resamples,
        confidence=confidence,
        seed=seed,
    )
    every_row = np.arange(n)[None, :]
    differences: dict[str, PairedDifference] = {}
    for name, (of_challenger, of_champion) in statistics.items():
        point_challenger = float(of_challenger(every_row)[0])
        point_champion = float(of_champion(every_row)[0])
        low, high = intervals[name]
        differences[name] = PairedDifference(
            challenger=point_challenger,
            champion=point_champion,
            difference=point_challenger - point_champion,
            ci_low=low,
            ci_high=high,
        )
    return PairedComparison(
        n_examples=n,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        accuracy=differences["accuracy"],
        macro_f1=differences["macro_f1"],
    )


def reference_metrics(reference: EvalResult, comparison: PairedComparison, *, name: str) -> dict[str, float]:
    """Flat MLflow metrics of a model the challenger is measured against on the same rows (the
    TF-IDF baseline, the base model before fine-tuning), named after it: ``<name>_accuracy``,
    ``<name>_macro_f1``, ``<name>_loss`` when it has one, their interval bounds
    (``<name>_accuracy_ci_low``, ...), and the paired ``vs_<name>_accuracy_diff`` (challenger minus
    it), ``..._ci_low``, ``..._ci_high``, same for macro F1 (``comparison``: challenger first)."""
    out = {f"{name}_accuracy": reference.eval_accuracy, f"{name}_macro_f1": reference.eval_macro_f1}
    if math.isfinite(reference.eval_loss):
        out[f"{name}_loss"] = reference.eval_loss
    for metric, (low, high) in reference.ci.items():
        short = metric.removeprefix("eval_")
        out[f"{name}_{short}_ci_low"] = float(low)
        out[f"{name}_{short}_ci_high"] = float(high)
    return {**out, **comparison.metrics(prefix=f"vs_{name}_")}


def compare_result_files(challenger_json: str | Path, champion_json: str | Path) -> PairedComparison:
    """:func:`paired_comparison` of two result JSONs written by ``python -m sparktune.jobs.evaluate``."""

    def load(path: str | Path) -> EvalResult:
        return EvalResult.from_dict(json.loads(Path(path).read_text()))

    return paired_comparison(load(challenger_json), load(champion_json))
