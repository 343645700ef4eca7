"""The promotion gate: rules as data, a decision with every reason, three modes.

``enabled`` blocks promotion when a rule fails; ``dry_run`` records what it would have decided
and promotes anyway (to watch a new rule before trusting it); ``disabled`` promotes without
evaluating anything and says so.

The accuracy rules account for the test split's size: ``min_accuracy`` holds the challenger's
accuracy interval's *lower bound* to the threshold, and ``max_regression`` the lower bound of the
paired interval of the accuracy difference to the champion (:mod:`sparktune.release.comparison`). A
challenger then passes when the test rows show that it meets the rule, not when a lucky split
puts its point estimate above the line.

``min_margin_over_baseline`` holds the lower bound of the paired interval of the accuracy
difference to the TF-IDF + logistic regression baseline (:mod:`sparktune.release.baseline`, scored on the
same rows) to the margin: a fine-tuned model that a classifier trained in a second beats is not
worth serving. -1 turns it off; an evaluation without baseline numbers passes it and says so.

``label_set_unchanged`` compares the two models' label sets: a challenger that added or removed
labels answers another question than the champion under the same model name, so it fails unless
``allow_label_change`` is set, and its reason names the labels. Whatever it decides, the champion
rules then compare the two only on the test rows whose true label both models know (a row of a
label one of them never learned is no contest), and their reasons say on how many rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PromotionRules
from sparktune.release.baseline import BASELINE_NAME, VS_BASELINE_PREFIX
from sparktune.release.metrics import CONFIDENCE, metric_safe

if TYPE_CHECKING:
    from sparktune.release.comparison import LabelChange, PairedComparison

MODES = ("enabled", "dry_run", "disabled")
RECALL_PREFIX = "eval_recall_"
# A recall cannot drop by more than 1: at 1 the per-class rule could never fail, so it is off.
CLASS_REGRESSION_OFF = 1.0
# A margin of -1 over the baseline can never fail (accuracies lie in [0, 1]): at -1 the rule is off.
BASELINE_MARGIN_OFF = -1.0
# Recalls are ratios of counts; a drop equal to the threshold must not fail on a rounding error.
_TOLERANCE = 1e-9
# How many of the classes that lost most a per-class reason names.
_WORST_CLASSES_SHOWN = 3


@dataclass(frozen=True)
class GateRule:
    name: str
    metric: str
    # "min_lower_bound" | "max" | "max_regression" | "max_class_regression" | "min_margin" | "label_set"
    kind: str
    threshold: float
    description: str


@dataclass(frozen=True)
class GateDecision:
    mode: str
    passed: bool
    promote: bool
    reasons: list[str] = field(default_factory=list)
    failed_rules: list[str] = field(default_factory=list)

    def to_summary(self) -> dict:
        return asdict(self)


def gate_rules(params: PromotionRules) -> list[GateRule]:
    rules = [
        GateRule(
            "min_accuracy",
            "eval_accuracy",
            "min_lower_bound",
            params.min_accuracy,
            "the lower bound of the challenger's test accuracy interval at least the threshold",
        ),
        GateRule(
            "max_eval_loss",
            "eval_loss",
            "max",
            params.max_eval_loss,
            "challenger test loss at most the threshold",
        ),
        GateRule(
            "max_regression",
            "eval_accuracy",
            "max_regression",
            params.max_regression,
            "the lower bound of the paired interval of (challenger - champion) accuracy at least "
            "minus the threshold",
        ),
    ]
    if params.max_class_regression < CLASS_REGRESSION_OFF:
        rules.append(
            GateRule(
                "max_class_regression",
                RECALL_PREFIX,
                "max_class_regression",
                params.max_class_regression,
                "no class's test recall more than the threshold below the champion's",
            )
        )
    if params.min_margin_over_baseline > BASELINE_MARGIN_OFF:
        rules.append(
            GateRule(
                "min_margin_over_baseline",
                f"{VS_BASELINE_PREFIX}accuracy",
                "min_margin",
                params.min_margin_over_baseline,
                "the lower bound of the paired interval of (challenger - baseline) accuracy at least "
                "the threshold",
            )
        )
    rules.append(
        GateRule(
            "label_set_unchanged",
            "labels",
            "label_set",
            # How many labels may be added or removed: none, or any once a person allowed it.
            math.inf if params.allow_label_change else 0.0,
            "the challenger's label set the champion's, unless allow_label_change",
        )
    )
    return rules


@dataclass(frozen=True)
class _Evidence:
    """What the rules are checked against."""

    challenger: Mapping[str, float]
    champion: Mapping[str, float] | None
    comparison: PairedComparison | None
    champion_name: str  # "champion v3", for the reasons
    # The flat baseline metrics (baseline_accuracy..., vs_baseline_accuracy_diff...); None: not scored.
    baseline: Mapping[str, float] | None = None
    # The challenger's labels against the champion's; None without a champion or when not reported.
    label_change: LabelChange | None = None

    @property
    def labels_changed(self) -> bool:
        return self.label_change is not None and self.label_change.changed


def _verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def _min_lower_bound(rule: GateRule, value: float, evidence: _Evidence) -> tuple[bool, str]:
    low = evidence.challenger.get(f"{rule.metric}_ci_low")
    high = evidence.challenger.get(f"{rule.metric}_ci_high")
    if low is None or high is None:  # evaluated with bootstrap_resamples=0
        ok = value >= rule.threshold
        return ok, (
            f"{rule.name}: {_verdict(ok)}, {rule.metric} {value:.3f} {'>=' if ok else '<'} "
            f"{rule.threshold:.3f} (point estimate: the evaluation has no confidence interval)"
        )
    ok = low >= rule.threshold
    # evaluate_model's intervals are at CONFIDENCE; the flat metrics carry only their bounds.
    interval = f"[{CONFIDENCE:.0%} CI {low:.3f}, {high:.3f}]"
    return ok, (
        f"{rule.name}: {_verdict(ok)}, {rule.metric} {value:.3f} {interval}: "
        f"lower bound {low:.3f} {'>=' if ok else '<'} {rule.threshold:.3f}"
    )


def _max(rule: GateRule, value: float) -> tuple[bool, str]:
    ok = value <= rule.threshold
    return ok, f"{rule.name}: {_verdict(ok)}, {rule.metric} {value:.4f} <= {rule.threshold:.4f}"


def _shared_rows_text(evidence: _Evidence) -> str:
    """`` on 180 shared-label rows`` when the label sets differ (the comparison kept only those)."""
    if not evidence.labels_changed:
        return ""
    assert evidence.label_change is not None
    return f" on {evidence.label_change.n_shared_rows} shared-label rows"


def _difference_text(name: str, evidence: _Evidence) -> str:
    """``accuracy vs champion v3: +0.012 [95% CI -0.008, +0.031]`` from the paired comparison
    (``accuracy vs champion v3 on 180 shared-label rows: ...`` when the label sets differ)."""
    assert evidence.comparison is not None
    diff = evidence.comparison.differences()[name]
    return (
        f"{name} vs {evidence.champion_name}{_shared_rows_text(evidence)}: {diff.difference:+.3f} "
        f"[{evidence.comparison.confidence:.0%} CI {diff.ci_low:+.3f}, {diff.ci_high:+.3f}]"
    )


def _max_regression(rule: GateRule, value: float, evidence: _Evidence) -> tuple[bool, str]:
    if evidence.champion is None:
        return True, f"{rule.name}: pass, no champion to compare against"
    if evidence.comparison is None and evidence.labels_changed:
        # The champion's own numbers cover rows of labels it never learned: no like-for-like reference.
        assert evidence.label_change is not None
        change = evidence.label_change
        return True, (
            f"{rule.name}: pass, nothing to compare: no paired comparison on the rows whose label both "
            f"the challenger and {evidence.champion_name} know ({change.n_shared_rows} of {change.n_rows} "
            "test rows)"
        )
    if evidence.comparison is None:
        reference = evidence.champion.get(rule.metric)
        if reference is None:
            return True, f"{rule.name}: pass, the champion has no {rule.metric} to compare against"
        ok = value >= reference - rule.threshold
        return ok, (
            f"{rule.name}: {_verdict(ok)}, {rule.metric} {value:.3f} vs {evidence.champion_name} "
            f"{reference:.3f}, allowed drop {rule.threshold:.3f} (point estimates: no paired comparison)"
        )
    name = rule.metric.removeprefix("eval_")
    low = evidence.comparison.differences()[name].ci_low
    ok = low >= -rule.threshold - _TOLERANCE
    reason = (
        f"{rule.name}: {_verdict(ok)}, {_difference_text(name, evidence)}, allowed drop {rule.threshold:.3f}"
    )
    if not ok:
        reason += f": the drop may be as large as {-low:.3f}"
    return ok, reason


def _recalls(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k.removeprefix(RECALL_PREFIX): v for k, v in metrics.items() if k.startswith(RECALL_PREFIX)}


def _max_class_regression(rule: GateRule, evidence: _Evidence) -> tuple[bool, str]:
    # A first model has nothing to regress from, whatever metrics it carries.
    if evidence.champion is None:
        return True, f"{rule.name}: pass, no champion to compare against"
    challenger = _recalls(evidence.challenger)
    if not challenger:
        return False, f"{rule.name}: FAIL, the challenger has no per-class recall ({RECALL_PREFIX}*) metrics"
    champion = _recalls(evidence.champion)
    common = set(champion) & set(challenger)
    scope = _shared_rows_text(evidence)
    if evidence.labels_changed:
        # Only labels both models know: a class's recall reads only that class's rows, so on these
        # labels the recalls already are the shared-label rows' recalls.
        assert evidence.label_change is not None
        common -= {metric_safe(c) for c in (*evidence.label_change.added, *evidence.label_change.removed)}
    # Largest drop first; ties by class name, so the reason reads the same every time.
    drops = sorted(((champion[c] - challenger[c], c) for c in common), key=lambda d: (-d[0], d[1]))
    if not drops and evidence.labels_changed:
        return True, f"{rule.name}: pass, no label both models know has a recall to compare"
    if not drops:
        return True, f"{rule.name}: pass, the champion has no per-class recall to compare against"
    over = [c for drop, c in drops if drop > rule.threshold + _TOLERANCE]
    worst = [(drop, c) for drop, c in drops if drop > 0][: max(_WORST_CLASSES_SHOWN, len(over))]
    listed = ", ".join(f"{c} {champion[c]:.3f} -> {challenger[c]:.3f} ({-drop:+.3f})" for drop, c in worst)
    if over:
        return False, (
            f"{rule.name}: FAIL, recall fell by more than {rule.threshold:.3f} vs {evidence.champion_name}"
            f"{scope} for {len(over)} of {len(drops)} classes; fell most: {listed}"
        )
    if not worst:
        return True, (
            f"{rule.name}: pass, no class's recall fell vs {evidence.champion_name}{scope}, "
            f"allowed drop {rule.threshold:.3f}"
        )
    return True, (
        f"{rule.name}: pass, recall vs {evidence.champion_name}{scope} fell most for {listed}; "
        f"allowed drop {rule.threshold:.3f}"
    )


def _min_margin(rule: GateRule, evidence: _Evidence) -> tuple[bool, str]:
    """The challenger against the baseline on the same rows: the paired interval's lower bound."""
    baseline = evidence.baseline or {}
    difference = baseline.get(f"{rule.metric}_diff")
    if difference is None:  # the baseline was not scored (an evaluation before it, or it was skipped)
        return True, (
            f"{rule.name}: pass, the evaluation has no baseline numbers ({rule.metric}_diff): "
            "nothing to compare the challenger with"
        )
    name = rule.metric.removeprefix(VS_BASELINE_PREFIX)
    reference = baseline.get(f"baseline_{name}")
    ref_low, ref_high = baseline.get(f"baseline_{name}_ci_low"), baseline.get(f"baseline_{name}_ci_high")
    scored = "" if reference is None else f", {reference:.3f}"
    if reference is not None and ref_low is not None and ref_high is not None:
        scored += f" [{CONFIDENCE:.0%} CI {ref_low:.3f}, {ref_high:.3f}]"
    subject = f"{name} vs baseline ({BASELINE_NAME}{scored})"
    low, high = baseline.get(f"{rule.metric}_ci_low"), baseline.get(f"{rule.metric}_ci_high")
    if low is None or high is None:
        ok = difference >= rule.threshold - _TOLERANCE
        return ok, (
            f"{rule.name}: {_verdict(ok)}, {subject}: {difference:+.3f} {'>=' if ok else '<'} "
            f"{rule.threshold:+.3f} (point estimate: the evaluation has no confidence interval)"
        )
    # A difference of accuracies is a ratio of counts: one exactly at the margin must not fail.
    ok = low >= rule.threshold - _TOLERANCE
    # The paired intervals are at CONFIDENCE (PairedComparison's default); the flat metrics carry
    # only their bounds.
    return ok, (
        f"{rule.name}: {_verdict(ok)}, {subject}: {difference:+.3f} "
        f"[{CONFIDENCE:.0%} CI {low:+.3f}, {high:+.3f}]: lower bound {low:+.3f} {'>=' if ok else '<'} "
        f"{rule.threshold:+.3f}"
    )


def _label_set(rule: GateRule, evidence: _Evidence) -> tuple[bool, str]:
    """The challenger's labels against the champion's: the same set, or a change a person allowed."""
    if evidence.champion is None:
        return True, f"{rule.name}: pass, no champion to compare against"
    change = evidence.label_change
    if change is None:
        return True, f"{rule.name}: pass, the evaluation did not report the two models' label sets"
    if not change.changed:
        return True, f"{rule.name}: pass, the challenger's labels are {evidence.champion_name}'s"
    parts = [f"added {change.added}"] if change.added else []
    parts += [f"removed {change.removed}"] if change.removed else []
    differ = f"the challenger's labels differ from {evidence.champion_name}'s: {', '.join(parts)}"
    ok = len(change.added) + len(change.removed) <= rule.threshold
    if not ok:
        return False, (
            f"{rule.name}: FAIL, {differ}; set allow_label_change=true to promote a new label set under "
            "this model name"
        )
    return True, (
        f"{rule.name}: pass, {differ}; the change was allowed (allow_label_change=true); the champion "
        f"rules compare the two on the {change.n_shared_rows} of {change.n_rows} test rows whose label "
        "both know"
    )


def _check(rule: GateRule, evidence: _Evidence) -> tuple[bool, str]:
    if rule.kind == "max_class_regression":
        return _max_class_regression(rule, evidence)
    if rule.kind == "min_margin":
        return _min_margin(rule, evidence)
    if rule.kind == "label_set":
        return _label_set(rule, evidence)
    value = evidence.challenger.get(rule.metric)
    if value is None:
        return False, f"{rule.name}: FAIL, the challenger has no {rule.metric} metric"
    if rule.kind == "min_lower_bound":
        return _min_lower_bound(rule, value, evidence)
    if rule.kind == "max":
        return _max(rule, value)
    if rule.kind == "max_regression":
        return _max_regression(rule, value, evidence)
    raise ValueError(f"gate rule {rule.name!r} has an unknown kind {rule.kind!r}")


def decide(
    rules: list[GateRule],
    challenger: Mapping[str, float],
    champion: Mapping[str, float] | None,
    mode: str,
    *,
    comparison: PairedComparison | None = None,
    champion_version: str | None = None,
    baseline: Mapping[str, float] | None = None,
    label_change: LabelChange | None = None,
) -> GateDecision:
    """Evaluate every rule (never stopping at the first failure) and decide under ``mode``.

    ``challenger`` and ``champion`` are flat evaluation metrics (``EvalResult.metrics()``; the
    champion's None when there is none); ``comparison`` is the paired comparison of the two on the
    same rows (without it, ``max_regression`` falls back to point estimates and says so).
    ``baseline`` is :func:`sparktune.release.baseline.baseline_metrics` (None: the baseline was not scored);
    ``label_change`` the challenger's label set against the champion's
    (:func:`sparktune.release.comparison.label_change`; None: not reported), by which ``comparison`` then
    covers only the rows of labels both know.
    """
    if mode not in MODES:
        raise ValueError(f"gate mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "disabled":
        return GateDecision(mode, True, True, ["gate disabled: promoted without evaluating rules"], [])
    evidence = _Evidence(
        challenger,
        champion,
        comparison if champion is not None else None,
        f"champion v{champion_version}" if champion_version else "champion",
        baseline,
        label_change if champion is not None else None,
    )
    reasons, failed = [], []
    for rule in rules:
        ok, reason = _check(rule, evidence)
        reasons.append(reason)
        if not ok:
            failed.append(rule.name)
    if evidence.comparison is not None:
        # No rule reads macro F1 (yet); its paired difference is shown so a drop there is seen.
        reasons.append(f"macro_f1 (information, no rule): {_difference_text('macro_f1', evidence)}")
    passed = not failed
    if mode == "dry_run" and not passed:
        reasons.append("dry_run: rules failed but promotion goes ahead")
    return GateDecision(mode, passed, passed or mode == "dry_run", reasons, failed)


def blocked_promotion_lines(summary: Mapping[str, Any]) -> list[str]:
    """What the end of a run says when its gate blocked promotion (``enabled`` mode, a rule failed):
    the failed rules' reasons, then ``gate blocked promotion of NAME vN: rule, rule``.

    ``summary`` is what the gate task returned (``GateDecision.to_summary()`` plus the model name
    and version); empty when the gate did not block (it passed, or ran in ``dry_run`` or
    ``disabled`` mode).
    """
    if summary.get("mode", "enabled") != "enabled" or summary.get("promote", True):
        return []
    name, version = summary.get("model_name"), summary.get("challenger_version")
    subject = f"{name or 'the challenger'}{f' v{version}' if version else ''}"
    failed = ", ".join(summary.get("failed_rules") or []) or "unknown rules"
    failures = [f"gate: {r}" for r in summary.get("reasons") or [] if ": FAIL" in r]
    return [*failures, f"gate blocked promotion of {subject}: {failed}"]


def promotion_reason(decision: dict, actor: str) -> str:
    """Why an alias moves, for the audit log: what the gate said, and in which mode."""
    mode = decision.get("mode", "enabled")
    if mode == "disabled":
        return f"gate disabled: promoted without evaluating rules by {actor}"
    if decision.get("passed"):
        return f"passed the gate ({mode}) by {actor}"
    failed = ", ".join(decision.get("failed_rules") or []) or "unknown rules"
    return f"gate dry_run: rules FAILED ({failed}) but promoted anyway, dry_run never blocks, by {actor}"
