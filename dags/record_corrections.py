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

A filled review queue (the `review_queue` DAG, `make review`) is such a file as it is: its rows
left with a blank `label` are skipped as not reviewed, its other columns are ignored, and a label
outside the label set refuses the file with the rows to fix.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.core.dag_params import RecordCorrectionsParams
from sparktune_airflow import RecordCorrectionsOperator
from sparktune_airflow.core.assets import feedback_asset
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_params

with DAG(
    dag_id="record_corrections",
    description="Record human corrections of predictions in the feedback table",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["llm", "feedback", "spark"],
    params=form_params(RecordCorrectionsParams),
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    RecordCorrectionsOperator(
        task_id="record",
        corrections_uri="{{ params.corrections_uri }}",
        model_name="{{ params.model_name }}",
        outlets=[feedback_asset()],
    )
