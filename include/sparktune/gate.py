"""The promotion gate: rules as data, a decision with every reason, three modes.

``enabled`` blocks promotion when a rule fails; ``dry_run`` records what it would have decided
and promotes anyway (to watch a new rule before trusting it); ``disabled`` promotes without
evaluating anything and says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sparktune.params import PipelineParams

MODES = ("enabled", "dry_run", "disabled")


@dataclass(frozen=True)
class GateRule:
    name: str
    metric: str
    kind: str  # "min" | "max" | "max_regression"
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


def gate_rules(params: PipelineParams) -> list[GateRule]:
    return [
        GateRule(
            "min_accuracy",
            "eval_accuracy",
            "min",
            params.min_accuracy,
            "challenger test accuracy at least the threshold",
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
            "challenger accuracy trails the champion's by at most the threshold",
        ),
    ]


def _check(
    rule: GateRule, challenger: dict[str, float], champion: dict[str, float] | None
) -> tuple[bool, str]:
    value = challenger.get(rule.metric)
    if value is None:
        return False, f"{rule.name}: FAIL, the challenger has no {rule.metric} metric"
    if rule.kind == "min":
        ok = value >= rule.threshold
        return (
            ok,
            f"{rule.name}: {'pass' if ok else 'FAIL'}, {rule.metric} {value:.4f} >= {rule.threshold:.4f}",
        )
    if rule.kind == "max":
        ok = value <= rule.threshold
        return (
            ok,
            f"{rule.name}: {'pass' if ok else 'FAIL'}, {rule.metric} {value:.4f} <= {rule.threshold:.4f}",
        )
    if champion is None or champion.get(rule.metric) is None:
        return True, f"{rule.name}: pass, no champion to compare against"
    reference = champion[rule.metric]
    ok = value >= reference - rule.threshold
    return ok, (
        f"{rule.name}: {'pass' if ok else 'FAIL'}, {rule.metric} {value:.4f} vs champion {reference:.4f} "
        f"(allowed drop {rule.threshold:.4f})"
    )


def decide(
    rules: list[GateRule],
    challenger: dict[str, float],
    champion: dict[str, float] | None,
    mode: str,
) -> GateDecision:
    """Evaluate every rule (never stopping at the first failure) and decide under ``mode``."""
    if mode not in MODES:
        raise ValueError(f"gate mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "disabled":
        return GateDecision(mode, True, True, ["gate disabled: promoted without evaluating rules"], [])
    reasons, failed = [], []
    for rule in rules:
        ok, reason = _check(rule, challenger, champion)
        reasons.append(reason)
        if not ok:
            failed.append(rule.name)
    passed = not failed
    if mode == "dry_run" and not passed:
        reasons.append("dry_run: rules failed but promotion goes ahead")
    return GateDecision(mode, passed, passed or mode == "dry_run", reasons, failed)


def promotion_reason(decision: dict, actor: str) -> str:
    """Why an alias moves, for the audit log: what the gate said, and in which mode."""
    mode = decision.get("mode", "enabled")
    if mode == "disabled":
        return f"gate disabled: promoted without evaluating rules by {actor}"
    if decision.get("passed"):
        return f"passed the gate ({mode}) by {actor}"
    failed = ", ".join(decision.get("failed_rules") or []) or "unknown rules"
    return f"gate dry_run: rules FAILED ({failed}) but promoted anyway, dry_run never blocks, by {actor}"
