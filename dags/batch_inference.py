"""
### batch_inference

Scores new texts with `models:/NAME@champion` over Spark and writes Parquet partitioned by day
(`id, prediction, score, model_name, model_version, model_alias, data_fingerprint, scored_at`).
The scored rows and their texts also land in the feedback table for review; corrections recorded
with the `record_corrections` DAG flow into the next `llm_finetune` run.

Runs whenever a promotion moves the `champion` alias (the event names the model and version), or
from the trigger form. A rerun of a run overwrites its own day's partition, never duplicates rows.
Same DAG on `local[*]` or a cluster: only the `spark_default` connection changes.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.config import DEFAULT_MODEL_NAME, settings
from sparktune_airflow.assets import champion_asset
from sparktune_airflow.dag_defaults import RETRY_DEFAULTS
from sparktune_airflow.feedback_operators import BatchInferenceOperator
from sparktune_airflow.params import form_param

with DAG(
    dag_id="batch_inference",
    description="Score new data with the champion model over Spark; feed the review queue",
    schedule=[champion_asset()],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["llm", "inference", "spark", "mlflow"],
    params={
        "source_uri": form_param(
            str(settings().incoming_source_path),
            type="string",
            minLength=1,
            description="Table name or path (Parquet, CSV, JSON Lines) of the texts to score.",
        ),
        "source_format": form_param(
            "auto",
            type="string",
            enum=["auto", "parquet", "csv", "json", "table"],
            description="How to read source_uri.",
        ),
        "text_column": form_param("message", type="string", minLength=1, description="Column with the text."),
        "id_column": form_param(
            "message_hash", type="string", minLength=1, description="Column identifying each row."
        ),
        "output_uri": form_param(
            f"{settings().lake_uri}/predictions",
            type="string",
            minLength=1,
            description="Parquet root of the predictions; each run writes <output_uri>/date=<day>.",
        ),
        "model_name": form_param(
            DEFAULT_MODEL_NAME,
            type="string",
            minLength=1,
            description="Registered model (a champion-alias event that triggers the run names its own).",
        ),
        "model_alias": form_param("champion", type="string", minLength=1, description="Alias to score with."),
        "min_score": form_param(
            0.0,
            type="number",
            minimum=0.0,
            maximum=1.0,
            description="Keep predictions whose confidence is at least this (0 keeps all).",
        ),
        "batch_size": form_param(
            32, type="integer", minimum=1, maximum=4096, description="Texts per forward pass."
        ),
        "feedback_uri": form_param(
            settings().feedback_uri,
            type=["string", "null"],  # the form sends an emptied field as null: no feedback table
            description="Feedback table that receives the scored rows for review; empty: none.",
        ),
        "trust_remote_code": form_param(
            False,
            type="boolean",
            description="Let a model that ships its own Python code (config auto_map) load. Off: such a "
            "model is refused. Turn on only for a model whose code you trust.",
        ),
    },
    render_template_as_native_obj=True,
    default_args=RETRY_DEFAULTS,
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
    )
