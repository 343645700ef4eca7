"""``ChampionApprovalOperator``: a person approves or rejects the move to ``champion``, built on the
standard provider's ``ApprovalOperator`` (Airflow's Human-in-the-loop: the Required Actions page of
the UI and the HITL REST API)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param
from airflow.sdk.definitions.param import ParamsDict
from sparktune.core.notifications import APPROVAL_WAITING
from sparktune_airflow.core.links import data_docs_url, mlflow_ui_base
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.notify import PipelineNotifier
from sparktune_airflow.core.task_context import audit_actor, typed_params

_PLACEHOLDER_SUBJECT = "Approve the new champion?"  # replaced by the evidence when the task runs


class ChampionApprovalOperator(UsesMLflowConnection, ApprovalOperator):
    """With the run's ``approval=required``, asks a person to approve the challenger as champion;
    with ``approval=none`` it returns at once and promotion goes on.

    The request shows the evidence (:func:`sparktune.release.approval.approval_request`), is assigned
    to ``approvers`` (Airflow user ids; none: any user who may act on the DAG) and waits
    ``approval_timeout_minutes``; a form field takes the reviewer's comment. Approve lets the
    downstream promotion run; Reject or the timeout skip it, so the champion stays. Each answer goes
    on the model version's tags and into the registry audit log (who, when, comment). A notification
    (``sparktune_airflow.core.notify``) tells the team a request is waiting.

    :param model_name: (templated) the registered model.
    :param version: (templated) the challenger's version.
    :param evaluation: (templated) what ``EvaluateModelOperator`` returned.
    :param gate_decision: (templated) what ``PromotionGateOperator`` returned.
    :param smoke: (templated) what ``SmokeTestOperator`` returned.
    :param data_fingerprint: (templated) the data version trained on.
    :param run_id: (templated) the challenger's MLflow run (links to it and its confusion matrix).
    :param quality: (templated) what ``SparkQualityGateOperator`` returned (its Data Docs page).
    :param policy: (templated) ``approval``, ``approvers``, ``approval_timeout_minutes``
        (:class:`sparktune.core.params.ApprovalPolicy`, or a dict of them; missing names take their
        defaults: approval ``none``).
    """

    template_fields: Sequence[str] = (
        *ApprovalOperator.template_fields,
        "model_name",
        "version",
        "evaluation",
        "gate_decision",
        "smoke",
        "data_fingerprint",
        "run_id",
        "quality",
        "policy",
    )

    def __init__(
        self,
        *,
        model_name: str,
        version: str,
        evaluation: Any,
        gate_decision: Any,
        smoke: Any = None,
        data_fingerprint: str = "",
        run_id: str = "",
        quality: Any = None,
        policy: Any = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("subject", _PLACEHOLDER_SUBJECT)
        # The DAG's params arrive merged in here; the form's own field is a task param (the provider
        # shows only those), added beside them.
        params = ParamsDict(kwargs.pop("params", None) or {})
        params["comment"] = Param(
            "", type=["string", "null"], description="Why (kept in the audit log).", source="task"
        )
        super().__init__(
            # No answer in time answers Reject: a champion never moves without a person's yes.
            defaults=ApprovalOperator.REJECT,
            params=params,
            notifiers=[PipelineNotifier(APPROVAL_WAITING)],
            # Set per run from approval_timeout_minutes; passing one keeps the provider from moving
            # execution_timeout (every task has one) into the wait.
            response_timeout=timedelta(days=1),
            **kwargs,
        )
        self.model_name = model_name
        self.version = version
        self.evaluation = evaluation
        self.gate_decision = gate_decision
        self.smoke = smoke
        self.data_fingerprint = data_fingerprint
        self.run_id = run_id
        self.quality = quality
        self.policy = policy

    def _links(self) -> dict[str, str]:
        base = mlflow_ui_base(self.mlflow_hook.tracking_uri())
        run = f"{base}/#/runs/{self.run_id}" if self.run_id else ""
        return {
            "MLflow run": run,
            "confusion matrix (run artifacts, evaluation/confusion_matrix.png)": f"{run}/artifacts"
            if run
            else "",
            "model version": f"{base}/#/models/{self.model_name}/versions/{self.version}",
            "Data Docs": data_docs_url(self.quality if isinstance(self.quality, dict) else None),
        }

    def execute(self, context: Any) -> Any:
        from sparktune.core.params import ApprovalPolicy
        from sparktune.release.approval import approval_request

        params = typed_params(ApprovalPolicy, self.policy, "policy")
        if params.approval == "none":
            self.log.info("approval=none: promotion follows the gate and the smoke test, no one is asked")
            return {"decision": "not_required"}
        earlier = self._earlier_answer(context)
        if earlier is not None:
            self.log.info(
                "try %d: an earlier try of this task was answered (%s); that answer stands, "
                "no one is asked again",
                context["ti"].try_number,
                ", ".join(earlier["chosen_options"]),
            )
            return self.execute_complete(context, earlier)
        approvers = [name.strip() for name in params.approvers.split(",") if name.strip()]
        self.assigned_users = [{"id": name, "name": name} for name in approvers] or None
        self.response_timeout = timedelta(minutes=params.approval_timeout_minutes)
        self.subject, self.body = approval_request(
            model_name=self.model_name,
            version=str(self.version),
            evaluation=self.evaluation,
            gate=self.gate_decision,
            smoke=self.smoke if isinstance(self.smoke, dict) else None,
            data_fingerprint=self.data_fingerprint,
            links=self._links(),
        )
        self.log.info(
            "asking %s to approve %s v%s as champion within %g minutes",
            ", ".join(approvers) or "any user allowed to act on this DAG",
            self.model_name,
            self.version,
            params.approval_timeout_minutes,
        )
        return super().execute(context)

    def _earlier_answer(self, context: Any) -> dict[str, Any] | None:
        """The answer an earlier try of this task instance received, as the event ``execute_complete``
        takes. An answer given within a second of the request can land before the scheduler has
        seen the task park (Airflow 3.3): the scheduler then retries the task, and asking again would
        drop the person's answer."""
        ti = context["ti"]
        if ti.try_number <= 1:
            return None
        from airflow.sdk.execution_time.hitl import get_hitl_detail_content_detail

        try:
            detail = get_hitl_detail_content_detail(ti.id)
        except Exception as exc:  # no request yet (the earlier try failed before asking): ask now
            self.log.info("no earlier answer to reuse (%s)", exc)
            return None
        if not detail.response_received or not detail.chosen_options:
            return None
        return {
            "chosen_options": list(detail.chosen_options),
            "params_input": detail.params_input or {},
            "responded_at": detail.responded_at,
            "responded_by_user": detail.responded_by_user.model_dump() if detail.responded_by_user else None,
            "timedout": detail.responded_by_user is None,  # the timeout sweep answers as no one
        }

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from sparktune.core.params import ApprovalPolicy
        from sparktune.release.approval import decision_from_response, record_decision

        params = typed_params(ApprovalPolicy, self.policy, "policy")
        responded_at = event.get("responded_at")
        at = responded_at.isoformat() if isinstance(responded_at, datetime) else str(responded_at or "")
        decision = decision_from_response(
            event.get("chosen_options") or [],
            event.get("responded_by_user"),
            at or datetime.now(UTC).isoformat(timespec="seconds"),
            event.get("params_input"),
            bool(event.get("timedout")),
        )
        reason = decision.reason(params.approval_timeout_minutes)
        # Recorded before the provider's handling: a Reject skips the promotion, which ends the task.
        record_decision(
            self.mlflow_hook.get_conn(),
            self.model_name,
            str(self.version),
            decision,
            actor=audit_actor(context),
            reason=reason,
        )
        self.log.info("%s v%s as champion: %s", self.model_name, self.version, reason)
        return super().execute_complete(context, event)
