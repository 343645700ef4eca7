"""Operators over the MLflow registry that stand apart from the training pipeline (rollback)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.task_context import audit_actor


class RollbackChampionOperator(UsesMLflowConnection, BaseOperator):
    """Moves ``champion`` back to ``to_version`` (empty: the ``previous_champion`` alias).

    A thin shell over :func:`sparktune.release.registry.rollback_champion`: the move is written to the
    registry's audit trail with this task instance (``airflow:<dag>/<run>/<task>``) as the actor,
    and the old champion becomes ``previous_champion``. A request that cannot succeed (no champion,
    no previous champion, unknown version, version already champion) fails at once without
    retries; a retry of a rollback that already happened changes nothing. ``to_version`` naming the
    champion someone set by hand (the audit log says otherwise) records it as meant, kind
    ``adopted``, without moving anything. Returns the move.

    :param model_name: (templated) the registered model name.
    :param to_version: (templated) the version to make champion; None or empty: the version the
        ``previous_champion`` alias points at.
    :param reason: (templated) recorded in the audit log; default: "rollback requested by" this task.
    """

    template_fields: Sequence[str] = ("model_name", "to_version", "reason")

    def __init__(self, *, model_name: str, to_version: str | None = None, reason: str = "", **kwargs: Any):
        super().__init__(**kwargs)
        self.model_name = model_name
        self.to_version = to_version
        self.reason = reason

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.release.registry import ChampionChangedError, RollbackError, rollback_champion

        actor = audit_actor(context)
        # Rendered templates are strings, or ints under render_template_as_native_obj.
        to_version = "" if self.to_version is None else str(self.to_version)
        reason = str(self.reason or "").strip() or f"rollback requested by {actor}"
        try:
            move = rollback_champion(
                self.mlflow_hook.get_conn(), str(self.model_name), to_version, actor=actor, reason=reason
            )
        except (RollbackError, ChampionChangedError) as exc:
            raise AirflowFailException(str(exc)) from exc
        if move.changed:
            self.log.info(
                "%s@champion: version %s -> %s; previous_champion is now %s. Reason: %s",
                move.model_name,
                move.from_version,
                move.to_version,
                move.from_version,
                move.reason,
            )
        elif move.kind == "adopted":
            self.log.info(
                "%s@champion v%s, set outside the pipeline, is recorded as meant (was v%s in the audit "
                "log). Reason: %s",
                move.model_name,
                move.to_version,
                move.from_version,
                move.reason,
            )
        else:
            self.log.info(
                "%s@champion is already version %s from this run's rollback: nothing changed",
                move.model_name,
                move.to_version,
            )
        return move.to_summary()
