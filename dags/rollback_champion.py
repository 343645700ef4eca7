"""
### rollback_champion

Moves the MLflow alias `champion` of a registered model back to an earlier version, by hand.

- `to_version` empty: back to the `previous_champion` alias (the version that was champion
  before the last move). Rolling back twice with it empty toggles between the two versions;
  name a version to go further back.
- The version that was champion becomes `previous_champion`.
- The move is written to the audit log (MLflow experiment `sparktune-registry-audit`) with this
  DAG run as the actor, the time, from and to versions and your `reason`; `make models` prints it.
- An impossible request (no champion, no previous champion, unknown version, version already
  champion) fails at once, without retries, and says what to pass instead.
- `to_version` naming a champion someone set by hand in MLflow (the audit log says otherwise)
  records it as meant (kind `adopted`, your `reason`) and moves nothing: `champion_guard` then
  stops reporting it.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.core.dag_params import RollbackParams
from sparktune.core.notifications import ROLLED_BACK
from sparktune_airflow import RollbackChampionOperator
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.notify import PipelineNotifier
from sparktune_airflow.core.params import form_params

with DAG(
    dag_id="rollback_champion",
    description="Move the champion alias back to the previous champion (or a named version), audited",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["mlflow", "registry", "rollback"],
    params=form_params(RollbackParams),
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    RollbackChampionOperator(
        task_id="rollback_champion",
        model_name="{{ params.model_name }}",
        to_version="{{ params.to_version or '' }}",
        reason="{{ params.reason or '' }}",
        on_success_callback=PipelineNotifier(ROLLED_BACK),
    )
