"""
### batch_inference

Scores new texts with `models:/NAME@champion` over Spark and writes Parquet partitioned by day
(`id, prediction, score, model_name, model_version, model_alias, data_fingerprint, scored_at`).
The scored rows and their texts also land in the feedback table for review; corrections recorded
with the `record_corrections` DAG flow into the next `llm_finetune` run.

Runs whenever a promotion moves the `champion` alias (the event names the model and version), or
from the trigger form; each scoring then triggers `monitor_champion`. A rerun of a run overwrites
its own day's partition, never duplicates rows. Same DAG on `local[*]` or a cluster: only the
`spark_default` connection changes.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.core.dag_params import BatchInferenceParams
from sparktune_airflow import BatchInferenceOperator
from sparktune_airflow.core.assets import champion_asset, scored_traffic_asset
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_params

with DAG(
    dag_id="batch_inference",
    description="Score new data with the champion model over Spark; feed the review queue",
    schedule=[champion_asset()],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["llm", "inference", "spark", "mlflow"],
    params=form_params(BatchInferenceParams),
    render_template_as_native_obj=True,
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    BatchInferenceOperator(
        task_id="score",
        source_uri="{{ params.source_uri }}",
        source_format="{{ params.source_format }}",
        text_column="{{ params.text_column }}",
        id_column="{{ params.id_column }}",
        output_uri="{{ params.output_uri }}",
        model_name="{{ params.model_name }}",
        model_alias="{{ params.model_alias }}",
        min_score="{{ params.min_score }}",
        batch_size="{{ params.batch_size }}",
        feedback_uri="{{ params.feedback_uri }}",
        trust_remote_code="{{ params.trust_remote_code }}",
        # monitor_champion runs after each scoring.
        outlets=[scored_traffic_asset()],
    )
