"""``PromoteModelOperator``: moves a registry alias to a version, audited; before moving ``champion``
it checks that nobody promoted another version in between."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow.core.links import MLflowModelVersionLink
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.task_context import audit_actor


class PromoteModelOperator(UsesMLflowConnection, BaseOperator):
    """Moves one alias to the challenger; for ``champion`` it first checks nobody promoted in between.

    Every move is written to the audit log (MLflow experiment ``sparktune-registry-audit``) with
    this task as the actor. Returns the move.

    :param model_name: (templated) the registered model name.
    :param version: (templated) the version the alias moves to.
    :param alias: the alias to move (``staging``, ``champion``, ...); moving ``champion`` keeps
        the old one as ``previous_champion``.
    :param expected_champion: (templated) for ``champion``: the version the gate compared against;
        if the alias points elsewhere now, the task fails at once and nothing moves.
    :param reason: (templated) the audit reason; default: "promoted by" this task.
    :param gate_decision: (templated) the gate's summary; the audit reason then says what the gate
        decided and in which mode.
    """

    template_fields: Sequence[str] = ("model_name", "version", "expected_champion", "reason", "gate_decision")
    operator_extra_links = (MLflowModelVersionLink(),)

    def __init__(
        self,
        *,
        model_name: str,
        version: str,
        alias: str,
        expected_champion: str | None = None,
        reason: str = "",
        gate_decision: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """``gate_decision``: the gate task's summary; the audit record then says what the gate
        decided and in which mode (a dry_run that failed its rules says so)."""
        super().__init__(**kwargs)
        self.model_name = model_name
        self.version = version
        self.alias = alias
        self.expected_champion = expected_champion
        self.reason = reason
        self.gate_decision = gate_decision

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.release.gate import promotion_reason
        from sparktune.release.registry import CHAMPION, ChampionChangedError, move_alias

        client = self.mlflow_hook.get_conn()
        reason = self.reason or f"promoted by {audit_actor(context)}"
        if self.gate_decision:
            reason = promotion_reason(self.gate_decision, audit_actor(context))
        try:
            move = move_alias(
                client,
                self.model_name,
                self.alias,
                str(self.version),
                actor=audit_actor(context),
                reason=reason,
                check_current=self.alias == CHAMPION,
                expected_current=self.expected_champion,
            )
        except ChampionChangedError as exc:
            raise AirflowFailException(str(exc)) from exc
        # Each outlet (llm_finetune gives champion its asset) gets an event saying what moved, so
        # a consumer such as batch_inference knows which model and version to use.
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {
                "model_name": move.model_name,
                "alias": move.alias,
                "version": move.to_version,
                "previous_version": move.from_version,
                "reason": move.reason[:500],
            }
        return move.to_summary()
