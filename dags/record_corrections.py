"""
### record_corrections

Adds a file of human corrections to the feedback table: one row per corrected prediction with
the scored row's `id` and the right `label` (optional `text`, `corrected_at`). Labels are checked
against the champion's label set, ids against the rows batch inference scored and the answers the
serving endpoint captured (`make serve`; a served answer's id is `<request_id>:<row>`). The feedback
asset it updates starts an `llm_finetune` run, which adds the corrected texts it has not trained
on as a new data version.

Trigger it from the form, or from a labelling tool through the REST API
(`POST /api/v2/dags/record_corrections/dagRuns` with `{"conf": {"corrections_uri": ...}}`).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.config import DEFAULT_MODEL_NAME
from sparktune_airflow.assets import feedback_asset
from sparktune_airflow.dag_defaults import RETRY_DEFAULTS
from sparktune_airflow.feedback_operators import RecordCorrectionsOperator
from sparktune_airflow.params import form_param

with DAG(
    dag_id="record_corrections",
    description="Record human corrections of predictions in the feedback table",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["llm", "feedback", "spark"],
    params={
        "corrections_uri": form_param(
            type="string",
            minLength=1,
            description="Path of the corrections (Parquet, CSV or JSON Lines) with columns id and label.",
        ),
        "model_name": form_param(
            DEFAULT_MODEL_NAME,
            type="string",
            minLength=1,
            description="Model whose champion's labels the corrections use.",
        ),
    },
    default_args=RETRY_DEFAULTS,
    doc_md=__doc__,
) as dag:
    RecordCorrectionsOperator(
        task_id="record",
        corrections_uri="{{ params.corrections_uri }}",
        model_name="{{ params.model_name }}",
        outlets=[feedback_asset()],
    )
