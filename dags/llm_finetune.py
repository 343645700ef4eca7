"""
### llm_finetune

Labelled text in Spark (+ the feedback table's human corrections) -> quality gate -> Arrow
dataset -> LoRA fine-tuning -> evaluation against the champion -> MLflow aliases `candidate` ->
`staging` -> smoke test of `models:/NAME@staging` -> (with `approval=required`, a person's sign-off
in Required Actions) -> `champion` (an asset event that starts `batch_inference`).

Runs on a cron (`SPARKTUNE_RETRAIN_CRON`, default Mondays 03:00 UTC; `off` for none) and
whenever the training source or feedback asset is updated. A run whose source files (before any
Spark job) or prepared rows (after `prepare_data`), config and code are the champion's skips
training and says why (`force_retrain` trains anyway).

Every task is a reusable operator from `sparktune_airflow`; the logic lives in the `sparktune`
package. XCom carries ids, URIs, fingerprints and counts only.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable
from sparktune.core.config import settings
from sparktune.core.notifications import PROMOTED
from sparktune_airflow import (
    ChampionApprovalOperator,
    EvaluateModelOperator,
    MaterializeDatasetOperator,
    MergeFeedbackOperator,
    PrepareDataOperator,
    PromoteModelOperator,
    PromotionGateOperator,
    RegisterModelOperator,
    ResolveBaseModelOperator,
    SkipUnchangedOperator,
    SmokeTestOperator,
    SparkQualityGateOperator,
    TrainModelOperator,
    ValidateParamsOperator,
)
from sparktune_airflow.core.assets import champion_asset, feedback_asset, training_source_asset
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.notify import PipelineNotifier
from sparktune_airflow.core.params import form_params


def _schedule():
    assets = training_source_asset() | feedback_asset()
    if settings().retrain_cron is None:
        return assets
    return AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(settings().retrain_cron, timezone="UTC"), assets=assets
    )


with DAG(
    dag_id="llm_finetune",
    description="Fine-tune an LLM on labelled text from Spark and promote it through MLflow aliases",
    schedule=_schedule(),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["llm", "fine-tuning", "spark", "mlflow", "great-expectations"],
    params=form_params(),
    render_template_as_native_obj=True,
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    # The one task that reads the whole form: it checks every param at once and hands each task
    # below the typed section it uses (validate_params.output["training"], ...).
    validate_params = ValidateParamsOperator(task_id="validate_params", run_params="{{ params }}")
    source, preparation, quality = (validate_params.output[k] for k in ("source", "preparation", "quality"))

    resolve_base_model = ResolveBaseModelOperator(
        task_id="resolve_base_model",
        base_model="{{ params.base_model }}",
        trust_remote_code="{{ params.trust_remote_code }}",
    )

    merge_feedback = MergeFeedbackOperator(task_id="merge_feedback", source=source)

    # Before any Spark job: the source files (path, size, modification time) the champion trained on.
    skip_unchanged_source = SkipUnchangedOperator(
        task_id="skip_unchanged_source",
        model_name="{{ params.model_name }}",
        config_hash=validate_params.output["config_hash"],
        force_retrain="{{ params.force_retrain }}",
        source_uri=merge_feedback.output["source_uri"],
    )

    prepare_data = PrepareDataOperator(
        task_id="prepare_data",
        source=source,
        preparation=preparation,
        quality=quality,
        tokenizer=resolve_base_model.output,
        source_uri=merge_feedback.output["source_uri"],
        source_format=merge_feedback.output["source_format"],
        # The quality gate runs in the same Spark application; validate_data decides on its report.
        validate_quality=True,
    )

    # After it: the prepared rows' content, for a source rewritten with the same rows.
    skip_unchanged = SkipUnchangedOperator(
        task_id="skip_unchanged",
        model_name="{{ params.model_name }}",
        config_hash=validate_params.output["config_hash"],
        force_retrain="{{ params.force_retrain }}",
        data_fingerprint=prepare_data.output["data_fingerprint"],
    )

    validate_data = SparkQualityGateOperator(
        task_id="validate_data",
        source=source,
        rules=quality,
        prepared_uri=prepare_data.output["prepared_uri"],
        source_uri=prepare_data.output["source_uri"],
        # None when prepare_data reused published data: then the gate runs here, on Spark.
        quality_summary=prepare_data.output["quality"],
    )

    materialize_dataset = MaterializeDatasetOperator(
        task_id="materialize_dataset",
        source=prepare_data.output["prepared_uri"],
        data_fingerprint=prepare_data.output["data_fingerprint"],
        label_names=prepare_data.output["labels"],
        splits=["train", "validation", "test"],
        dataset_mode="{{ params.dataset_mode }}",
    )

    train = TrainModelOperator(
        task_id="train",
        model_name="{{ params.model_name }}",
        training=validate_params.output["training"],
        backend=validate_params.output["backend"],
        preparation=preparation,
        config_hash=validate_params.output["config_hash"],
        dataset_uri=materialize_dataset.output["dataset_uri"],
        base_model=resolve_base_model.output,
        data_fingerprint=prepare_data.output["data_fingerprint"],
        # train_backend=databricks waits in the triggerer, not in a worker slot; local and spark
        # training run in the task's own process whatever this says.
        deferrable=True,
    )
    run_id = train.output["mlflow_run_id"]

    register = RegisterModelOperator(
        task_id="register",
        run_id=run_id,
        model_name="{{ params.model_name }}",
        tags={
            "fine_tuned_on": prepare_data.output["prepared_uri"],
            "data_fingerprint": prepare_data.output["data_fingerprint"],
            "source_signature": skip_unchanged_source.output["source_signature"],
            "base_model": "{{ params.base_model }}",
            "airflow_dag_id": "{{ dag.dag_id }}",
            "airflow_run_id": "{{ run_id }}",
        },
        run_artifacts={
            "prepare_summary": prepare_data.output,
            "quality_summary": validate_data.output,
            "dataset_summary": materialize_dataset.output,
            "feedback_summary": merge_feedback.output,
        },
        run_files={
            "data_docs": validate_data.output["validation_pages"],
            # The rows whose label a correction replaced in the data version trained on.
            "feedback": [merge_feedback.output["overrides_uri"]],
        },
    )
    version = register.output["version"]

    evaluate = EvaluateModelOperator(
        task_id="evaluate",
        model_name="{{ params.model_name }}",
        version=version,
        dataset_uri=materialize_dataset.output["dataset_uri"],
        run_id=run_id,
        trust_remote_code="{{ params.trust_remote_code }}",
        evaluate_base_model="{{ params.evaluate_base_model }}",
    )

    gate = PromotionGateOperator(
        task_id="gate",
        evaluation=evaluate.output,
        run_id=run_id,
        rules=validate_params.output["promotion"],
    )

    promote_staging = PromoteModelOperator(
        task_id="promote_staging",
        model_name="{{ params.model_name }}",
        version=version,
        alias="staging",
        gate_decision=gate.output,
    )

    smoke_test = SmokeTestOperator(
        task_id="smoke_test",
        model_name="{{ params.model_name }}",
        version=version,
        dataset_uri=materialize_dataset.output["dataset_uri"],
        run_id=run_id,
        max_invalid_rate="{{ params.smoke_max_invalid_rate }}",
        trust_remote_code="{{ params.trust_remote_code }}",
    )

    # approval=required: a person signs off in the UI (Required Actions) first; none: passes at once.
    approve_champion = ChampionApprovalOperator(
        task_id="approve_champion",
        policy=validate_params.output["approval"],
        model_name="{{ params.model_name }}",
        version=version,
        evaluation=evaluate.output,
        gate_decision=gate.output,
        smoke=smoke_test.output,
        data_fingerprint=prepare_data.output["data_fingerprint"],
        run_id=run_id,
        quality=validate_data.output,
    )

    promote_champion = PromoteModelOperator(
        task_id="promote_champion",
        model_name="{{ params.model_name }}",
        version=version,
        alias="champion",
        expected_champion=gate.output["champion_version"],
        gate_decision=gate.output,
        outlets=[champion_asset()],
        on_success_callback=PipelineNotifier(PROMOTED),
    )

    # The order of the stages, beyond what the XComArgs above already imply.
    (
        validate_params
        >> resolve_base_model
        >> merge_feedback
        >> skip_unchanged_source
        >> prepare_data
        >> skip_unchanged
        >> validate_data
        >> materialize_dataset
        >> train
        >> register
        >> evaluate
        >> gate
        >> promote_staging
        >> smoke_test
        >> approve_champion
        >> promote_champion
    )
