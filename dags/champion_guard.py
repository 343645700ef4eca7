"""
### champion_guard

Checks, every hour (`SPARKTUNE_CHAMPION_GUARD_CRON`, default `17 * * * *`; `off` for none), that
each registered model's `champion` alias is where the registry's audit log says the pipeline left
it. A champion set by hand in the MLflow UI or API is reported by e-mail and webhook (the
`sparktune_smtp` and `sparktune_webhook` connections); the run itself succeeds.

To keep a hand-set champion on purpose, record it: trigger `rollback_champion` with `to_version`
= that version and a `reason`. The audit log then holds it (kind `adopted`) and the check passes.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, CronTriggerTimetable
from sparktune.core.config import settings
from sparktune.core.dag_params import ChampionGuardParams
from sparktune_airflow import ChampionGuardOperator
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_params

cron = settings().champion_guard_cron

with DAG(
    dag_id="champion_guard",
    description="Report a champion alias moved outside the pipeline (not in the audit log)",
    schedule=CronTriggerTimetable(cron, timezone="UTC") if cron else None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["mlflow", "registry", "audit"],
    params=form_params(ChampionGuardParams),
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    ChampionGuardOperator(task_id="check_champion", model_name="{{ params.model_name or '' }}")
