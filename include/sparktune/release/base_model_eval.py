"""What fine-tuning added: the base model before fine-tuning, scored as its challenger is.

A causal LM challenger answers by constrained scoring over its label set with the prompt template
it was trained with (:mod:`sparktune.core.label_scoring`). Its base model (the folder or hub id the
training run started from), given the same label set, the same template (the challenger's logged
``prompt_template``, however training chose it), the same tokenizer and the same test rows, shows
what the model could do before training. The paired (challenger - base model) interval, computed
as the baseline's is (:func:`sparktune.release.comparison.paired_comparison`), says what fine-tuning
bought: a pretrained model that already answers well zero-shot needed little training, one that
answers at chance shows the run did the work.

Information only: no gate rule reads these numbers (the baseline rule already holds the
challenger to a floor). They go to the challenger's MLflow run (``base_model_accuracy``,
``base_model_macro_f1``, ``base_model_loss``, their interval bounds, ``vs_base_model_accuracy_diff``
and its bounds, same for macro F1), ``evaluate``'s XCom, the approval request and ``make run``'s
summary.

A sequence classifier (``task=sequence_classification``) is not scored this way: its base model has
no trained head for these labels (a new head starts at random, so its "accuracy" would measure the
seed, not the model). It is reported as not applicable, with that reason, in the same places.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.release.metrics import EvalResult

if TYPE_CHECKING:
    from sparktune.release.comparison import PairedComparison

# The metric names' stem: base_model_accuracy, vs_base_model_accuracy_diff, ... (as the baseline's).
METRIC_NAME = "base_model"
VS_BASE_MODEL_PREFIX = f"vs_{METRIC_NAME}_"
# The challenger's run tag saying whether the base model was scored, and why not.
RUN_TAG = "sparktune.base_model_eval"
RUN_REASON_TAG = "sparktune.base_model_eval.reason"
# The tag training puts on its run: the base model folder or hub id it fine-tuned (resolved).
TRAINED_FROM_TAG = "sparktune.base_model"

SCORED = "scored"
NOT_APPLICABLE = "not_applicable"
# Asked for, but could not be scored here (a folder missing on this machine, a hub id offline...).
NOT_SCORED = "not_scored"
# The run asked for no base model score (evaluate_base_model=false).
SKIPPED = "skipped"
STATUSES = (SCORED, NOT_APPLICABLE, NOT_SCORED, SKIPPED)

SKIP_HINT = "set evaluate_base_model=false to skip it"


def not_applicable_reason(task: str) -> str | None:
    """Why a challenger of ``task`` has no base model score to compare with; None when it has one."""
    if task == "sequence_classification":
        return (
            "task=sequence_classification: the base model has no trained classification head for these "
            "labels (a new head starts at random), so its score would measure the random head, not the model"
        )
    return None


@dataclass(frozen=True)
class BaseModelOutcome:
    """The base model's part of an evaluation: ``status`` (:data:`STATUSES`), the base model it
    concerns, why it was not scored (``reason``) or its flat metrics (``metrics``, when scored)."""

    status: str
    base_model: str = ""
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"base model status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    def to_summary(self) -> dict[str, Any]:
        """JSON-able, for XCom and the evaluate job's output: a status, two strings and numbers."""
        return asdict(self)

    @classmethod
    def from_summary(cls, raw: Mapping[str, Any]) -> BaseModelOutcome:
        return cls(
            status=str(raw["status"]),
            base_model=str(raw.get("base_model") or ""),
            reason=str(raw.get("reason") or ""),
            metrics={str(k): float(v) for k, v in (raw.get("metrics") or {}).items()},
        )

    def tags(self) -> dict[str, str]:
        """The challenger's run tags: the status, and the reason when it was not scored."""
        return {RUN_TAG: self.status, **({RUN_REASON_TAG: self.reason[:5000]} if self.reason else {})}


def scored(base_model: str, result: EvalResult, comparison: PairedComparison) -> BaseModelOutcome:
    """The outcome of a scored base model: ``result`` beside the challenger, ``comparison`` the
    paired (challenger - base model) comparison on the same rows."""
    from sparktune.release.comparison import reference_metrics

    return BaseModelOutcome(
        SCORED, base_model, metrics=reference_metrics(result, comparison, name=METRIC_NAME)
    )


def write_outcome(outcome: BaseModelOutcome, path: str | Path) -> Path:
    """Write an outcome that is no score (not applicable, not scored) where the score would go."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(outcome.to_summary(), indent=2, sort_keys=True))
    return target


def read_output(path: str | Path) -> EvalResult | BaseModelOutcome:
    """What the evaluate job wrote for the base model: its :class:`EvalResult`, or the outcome that
    says why there is none (:func:`write_outcome`)."""
    raw = json.loads(Path(path).read_text())
    if "status" in raw:
        return BaseModelOutcome.from_summary(raw)
    return EvalResult.from_dict(raw)


def _number(value: Any, sign: str = "") -> str:
    return f"{value:{sign}.3f}" if isinstance(value, int | float) and math.isfinite(value) else "-"


def _with_interval(value: Any, low: Any, high: Any, sign: str = "") -> str:
    interval = (
        f" [{_number(low, sign)}, {_number(high, sign)}]" if low is not None and high is not None else ""
    )
    return f"{_number(value, sign)}{interval}"


_SHOWN = (("accuracy", "accuracy"), ("macro F1", "macro_f1"))
_STATUS_WORDS = {
    SCORED: "scored",
    NOT_APPLICABLE: "not applicable",
    NOT_SCORED: "not scored",
    SKIPPED: "skipped",
}


def status_text(outcome: BaseModelOutcome) -> str:
    """``not applicable: task=sequence_classification: ...``: the status in words, and its reason."""
    words = _STATUS_WORDS[outcome.status]
    return f"{words}: {outcome.reason}" if outcome.reason else words


def describe(outcome: BaseModelOutcome) -> str:
    """One sentence for people (the approval request, the task log): the base model's accuracy and
    macro F1 with their 95% intervals and challenger minus base model, or why there are none."""
    subject = f"Base model before fine-tuning{f' ({outcome.base_model})' if outcome.base_model else ''}"
    if outcome.status != SCORED:
        return f"{subject}: {status_text(outcome)}."
    m = outcome.metrics
    own = ", ".join(
        f"{label} "
        + _with_interval(
            m.get(f"{METRIC_NAME}_{name}"),
            m.get(f"{METRIC_NAME}_{name}_ci_low"),
            m.get(f"{METRIC_NAME}_{name}_ci_high"),
        )
        for label, name in _SHOWN
    )
    vs = VS_BASE_MODEL_PREFIX
    paired = ", ".join(
        f"{label} "
        + _with_interval(
            m[f"{vs}{name}_diff"], m.get(f"{vs}{name}_ci_low"), m.get(f"{vs}{name}_ci_high"), "+"
        )
        for label, name in _SHOWN
        if f"{vs}{name}_diff" in m
    )
    text = f"{subject}, same prompt, labels and test rows: {own}"
    return text + (f"; challenger minus base model: {paired}." if paired else ".")
