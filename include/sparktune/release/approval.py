"""A person signs off the move to ``champion`` (``approval=required``): what they are shown, and how
their answer is recorded.

The request shows the evidence the gate decided on (challenger and champion metrics with their 95%
intervals, the paired differences, the baseline, the gate's reasons), what fine-tuning added over
the base model (information, no gate rule), the smoke test, the data fingerprint and links to the
MLflow run, its confusion matrix and the Data Docs. The answer
(approve, reject, or no answer in time: rejected) goes on the model version's tags and into the
registry's audit log, with who answered, when and their comment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlflow.tracking import MlflowClient
from sparktune.release.base_model_eval import BaseModelOutcome
from sparktune.release.base_model_eval import describe as describe_base_model
from sparktune.release.registry import record_approval

APPROVED, REJECTED, TIMED_OUT = "approved", "rejected", "timed_out"
# The HITL form's options (the standard provider's ApprovalOperator names them so).
APPROVE_OPTION, REJECT_OPTION = "Approve", "Reject"
_SHOWN_METRICS = ("eval_accuracy", "eval_macro_f1", "eval_loss")


@dataclass(frozen=True)
class ApprovalDecision:
    decision: str  # approved | rejected | timed_out
    by: str  # the user's name or id; "" when nobody answered
    at: str  # ISO time of the answer (of the timeout)
    comment: str

    @property
    def approved(self) -> bool:
        return self.decision == APPROVED

    def reason(self, timeout_minutes: float | None = None) -> str:
        if self.decision == TIMED_OUT:
            unit = "minute" if timeout_minutes == 1 else "minutes"
            waited = f" within {timeout_minutes:g} {unit}" if timeout_minutes else ""
            return f"no answer{waited}: rejected, the champion stays"
        text = f"{self.decision} by {self.by or 'an unnamed user'}"
        return f"{text}: {self.comment}" if self.comment else text

    def tags(self) -> dict[str, str]:
        return {
            "approval_decision": self.decision,
            "approval_by": self.by,
            "approval_at": self.at,
            "approval_comment": self.comment[:5000],
        }


def decision_from_response(
    chosen_options: Sequence[str],
    responded_by: Mapping[str, Any] | None,
    responded_at: str,
    params_input: Mapping[str, Any] | None,
    timed_out: bool,
) -> ApprovalDecision:
    """The decision in a Human-in-the-loop response. A timeout answers with the defaults (Reject)
    and no user: recorded as ``timed_out``, never as a person's rejection."""
    by = ""
    if responded_by:
        by = str(responded_by.get("name") or responded_by.get("id") or "")
    comment = str((params_input or {}).get("comment") or "").strip()
    if timed_out or not responded_by:
        return ApprovalDecision(TIMED_OUT, "", responded_at, comment)
    decision = APPROVED if APPROVE_OPTION in chosen_options else REJECTED
    return ApprovalDecision(decision, by, responded_at, comment)


def record_decision(
    client: MlflowClient,
    model_name: str,
    version: str,
    decision: ApprovalDecision,
    *,
    actor: str,
    reason: str,
) -> None:
    """The decision on the version's tags and in the audit log (kind ``approval``)."""
    for key, value in decision.tags().items():
        client.set_model_version_tag(model_name, str(version), key, value)
    record_approval(
        client,
        model_name,
        str(version),
        decision=decision.decision,
        actor=actor,
        reason=reason,
        at=decision.at,
    )


def _number(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "-"


def _with_interval(metrics: Mapping[str, Any] | None, name: str) -> str:
    if not metrics or name not in metrics:
        return "-"
    low, high = metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high")
    interval = f" [{_number(low)}, {_number(high)}]" if low is not None and high is not None else ""
    return f"{_number(metrics[name])}{interval}"


def approval_request(
    *,
    model_name: str,
    version: str,
    evaluation: Mapping[str, Any],
    gate: Mapping[str, Any],
    smoke: Mapping[str, Any] | None,
    data_fingerprint: str,
    links: Mapping[str, str],
) -> tuple[str, str]:
    """The request's subject and Markdown body: the evidence a reviewer decides on."""
    champion_version = evaluation.get("champion_version")
    subject = f"Make {model_name} v{version} the champion?"
    against = f"champion v{champion_version}" if champion_version else "no champion yet"
    # A dry-run gate lets a failing challenger through: the reviewer must not read "passed".
    verdict = "passed the gate" if gate.get("passed", True) else "FAILED the gate (dry run lets it through)"
    lines = [
        f"**{model_name} v{version}** {verdict} and passed the smoke test, against {against}. "
        "Approve moves `champion` to it; Reject (or no answer in time) leaves the champion where it is.",
        "",
        "| metric (test split, 95% interval) | challenger | champion |",
        "| --- | --- | --- |",
    ]
    for name in _SHOWN_METRICS:
        lines.append(
            f"| {name} | {_with_interval(evaluation.get('challenger'), name)} | "
            f"{_with_interval(evaluation.get('champion'), name)} |"
        )
    comparison = evaluation.get("comparison") or {}
    paired = [
        f"{name} {comparison[name]['difference']:+.3f} [{comparison[name]['ci_low']:+.3f}, "
        f"{comparison[name]['ci_high']:+.3f}]"
        for name in ("accuracy", "macro_f1")
        if isinstance(comparison.get(name), Mapping)
    ]
    if paired:
        rows = comparison.get("n_examples", "the")
        lines += ["", f"Challenger minus champion on the same {rows} test rows: " + "; ".join(paired) + "."]
    baseline = evaluation.get("baseline") or {}
    if "baseline_accuracy" in baseline:
        lines += [
            "",
            f"TF-IDF + logistic regression baseline accuracy: {_number(baseline['baseline_accuracy'])}.",
        ]
    # What fine-tuning added (information, no gate rule), or why the evaluation has no number for it.
    if isinstance(evaluation.get("base_model"), Mapping):
        lines += ["", describe_base_model(BaseModelOutcome.from_summary(evaluation["base_model"]))]
    lines += ["", f"**Gate** ({gate.get('mode', 'enabled')} mode):"]
    lines += [f"- {reason}" for reason in gate.get("reasons", [])] or ["- (no rules ran)"]
    if smoke:
        measured = ", ".join(f"{k} {_number(v)}" for k, v in smoke.items() if isinstance(v, int | float))
        lines += ["", f"**Smoke test** of `{smoke.get('model_uri', '')}`: passed ({measured})."]
    lines += ["", f"**Data fingerprint**: `{data_fingerprint}`"]
    shown = [f"[{label}]({url})" for label, url in links.items() if url]
    if shown:
        lines += ["", "Links: " + " · ".join(shown)]
    return subject, "\n".join(lines)
