"""``ChampionGuardOperator``: tells the team when a ``champion`` alias was moved outside the pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from sparktune.core import notifications
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.notify import send


class ChampionGuardOperator(UsesMLflowConnection, BaseOperator):
    """Compares each model's ``champion`` with the registry audit log
    (:mod:`sparktune.release.champion_guard`) and sends a ``champion_moved_outside_pipeline``
    notification for every one set by hand. The check itself succeeds: like a deadline, it tells
    and stops nothing. Returns one ``{model_name, champion, audited, moved_outside}`` per model.

    To keep a hand-set champion on purpose, record it: trigger ``rollback_champion`` with
    ``to_version`` = that version and a reason (an audit record of kind ``adopted``).

    :param model_name: (templated) the registered model to check; empty: every registered model.
    """

    template_fields: Sequence[str] = ("model_name",)

    def __init__(self, *, model_name: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from sparktune.release.champion_guard import check_champions
        from sparktune_airflow.core.notify import ui_base

        name = str(self.model_name or "").strip()
        checks = check_champions(self.mlflow_hook.get_conn(), [name] if name else None)
        ti = context["ti"]
        for check in checks:
            if not check.moved_outside:
                self.log.info("%s", check.describe())
                continue
            self.log.warning("%s", check.describe())
            send(
                notifications.champion_moved_outside(
                    dag_id=ti.dag_id,
                    run_id=ti.run_id,
                    model_name=check.model_name,
                    version=str(check.champion),
                    expected=check.audited,
                    url=notifications.run_url(ui_base(), ti.dag_id, ti.run_id, ti.task_id),
                )
            )
        return [
            {
                "model_name": c.model_name,
                "champion": c.champion,
                "audited": c.audited,
                "moved_outside": c.moved_outside,
            }
            for c in checks
        ]
