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
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.config import DEFAULT_MODEL_NAME
from sparktune_airflow import RollbackChampionOperator
from sparktune_airflow.dag_defaults import RETRY_DEFAULTS
from sparktune_airflow.params import form_param

with DAG(
    dag_id="rollback_champion",
    description="Move the champion alias back to the previous champion (or a named version), audited",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["mlflow", "registry", "rollback"],
    params={
        "model_name": form_param(
            DEFAULT_MODEL_NAME,
            type="string",
            minLength=1,
            title="model_name",
            description="Registered model name in MLflow whose champion to roll back.",
        ),
        # Optional fields are nullable: the trigger form sends an emptied field as null.
        "to_version": form_param(
            "",
            type=["string", "null"],
            pattern=r"^\s*[0-9]*\s*$",
            title="to_version",
            description="Version number to make champion. Empty: the version the previous_champion "
            "alias points at.",
        ),
        "reason": form_param(
            "",
            type=["string", "null"],
            title="reason",
            description="Why you roll back; recorded in the audit log. Empty: 'rollback requested by' "
            "this DAG run.",
        ),
    },
    default_args=RETRY_DEFAULTS,
    doc_md=__doc__,
) as dag:
    RollbackChampionOperator(
        task_id="rollback_champion",
        model_name="{{ params.model_name }}",
        to_version="{{ params.to_version or '' }}",
        reason="{{ params.reason or '' }}",
    )
