"""``PromotionGateOperator``: the promotion rules applied to an evaluation, as Airflow's
short-circuit: a blocked decision skips promotion and the run still ends cleanly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.short_circuit import DecidingShortCircuit
from sparktune_airflow.core.task_context import typed_params


class PromotionGateOperator(UsesMLflowConnection, DecidingShortCircuit):
    """Applies the gate rules; a failed gate skips everything downstream (``ShortCircuitOperator``).

    Returns the decision, its reasons, the model name and challenger version, and the champion
    version it compared against (``make run`` reads it to exit 3 when promotion was blocked); each
    key is an XCom of its own too (``gate.output["champion_version"]``). A blocked decision is
    pushed as the return value before the skip, so it is the one a person can read.

    :param evaluation: (templated) what ``EvaluateModelOperator`` returned.
    :param run_id: (templated) the MLflow run tagged with the decision, mode and reasons.
    :param rules: (templated) :class:`sparktune.core.params.PromotionRules` or a dict of them
        (``gate_mode``, ``min_accuracy``, ``max_eval_loss``, ``max_regression``,
        ``max_class_regression``, ``min_margin_over_baseline``, ``allow_label_change``); missing
        names (or None) take their defaults.
    """

    template_fields: Sequence[str] = (*DecidingShortCircuit.template_fields, "evaluation", "run_id", "rules")

    def __init__(self, *, evaluation: Any, run_id: str, rules: Any = None, **kwargs: Any) -> None:
        kwargs.setdefault("multiple_outputs", True)
        super().__init__(**kwargs)
        self.evaluation = evaluation
        self.run_id = run_id
        self.rules = rules

    def decide(self, ti: Any = None) -> dict[str, Any] | bool:
        """The decision's summary when promotion goes on; False (after pushing the summary) when
        it is blocked, which makes the short-circuit skip the rest."""
        from sparktune.core.params import PromotionRules
        from sparktune.release.comparison import LabelChange, PairedComparison
        from sparktune.release.gate import decide, gate_rules

        rules = typed_params(PromotionRules, self.rules, "rules")
        evaluation = self.evaluation
        comparison = evaluation.get("comparison")
        # Absent from what an evaluation before these rules returned: the rules then say so and pass.
        change = evaluation.get("label_change")
        decision = decide(
            gate_rules(rules),
            evaluation["challenger"],
            evaluation["champion"],
            rules.gate_mode,
            comparison=PairedComparison.from_summary(comparison) if comparison else None,
            champion_version=evaluation["champion_version"],
            baseline=evaluation.get("baseline"),
            label_change=LabelChange.from_summary(change) if change else None,
        )
        for reason in decision.reasons:
            self.log.info("gate: %s", reason)
        verdict = "promote" if decision.promote else "blocked"
        self.log.info("gate decision (%s mode): %s", decision.mode, verdict)
        client = self.mlflow_hook.get_conn()
        client.set_tag(self.run_id, "sparktune.gate.decision", verdict)
        client.set_tag(self.run_id, "sparktune.gate.mode", decision.mode)
        client.set_tag(self.run_id, "sparktune.gate.reasons", "\n".join(decision.reasons)[:5000])
        client.set_model_version_tag(
            evaluation["model_name"], evaluation["challenger_version"], "gate_decision", verdict
        )
        summary = {
            **decision.to_summary(),
            "model_name": evaluation["model_name"],
            "challenger_version": evaluation["challenger_version"],
            "champion_version": evaluation["champion_version"],
        }
        return summary if decision.promote else self.stop(ti, summary)
