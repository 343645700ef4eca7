"""``PromotionGateOperator``: the promotion rules applied to an evaluation; a blocked decision skips
promotion and the run still ends cleanly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.standard.utils.skipmixin import SkipMixin
from airflow.sdk import BaseOperator
from airflow.sdk.bases.xcom import BaseXCom
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.task_context import pipeline_params, skip_downstream


class PromotionGateOperator(UsesMLflowConnection, BaseOperator, SkipMixin):
    """Applies the gate rules; a failed gate skips promotion (the run still ends cleanly).

    Returns the decision, its reasons, the model name and challenger version, and the champion
    version it compared against (``make run`` reads it to exit 3 when promotion was blocked).

    :param evaluation: (templated) what ``EvaluateModelOperator`` returned.
    :param run_id: (templated) the MLflow run tagged with the decision, mode and reasons.
    :param pipeline_params: (templated) ``gate_mode``, ``min_accuracy``, ``max_eval_loss``,
        ``max_regression``, ``max_class_regression``, ``min_margin_over_baseline``,
        ``allow_label_change``; missing names (or None) take their defaults.
    """

    template_fields: Sequence[str] = ("evaluation", "run_id", "pipeline_params")

    def __init__(
        self,
        *,
        evaluation: dict[str, Any],
        run_id: str,
        pipeline_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.evaluation = evaluation
        self.run_id = run_id
        self.pipeline_params = pipeline_params

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.release.comparison import LabelChange, PairedComparison
        from sparktune.release.gate import decide, gate_rules

        params = pipeline_params(self.pipeline_params)
        evaluation = self.evaluation
        comparison = evaluation.get("comparison")
        # Absent from what an evaluation before these rules returned: the rules then say so and pass.
        change = evaluation.get("label_change")
        decision = decide(
            gate_rules(params),
            evaluation["challenger"],
            evaluation["champion"],
            params.gate_mode,
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
        if not decision.promote:
            # Airflow 3's skip raises to end the task, so this return never happens: push it first,
            # or a blocked decision (the one worth reading) would be the one missing from XCom.
            context["ti"].xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=summary)
            skip_downstream(self, context)
        return summary
