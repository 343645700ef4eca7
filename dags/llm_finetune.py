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
from sparktune_airflow.core.params import trigger_form_params


def _schedule():
    assets = training_source_asset() | feedback_asset()
    if settings().retrain_cron is None:
        return assets
    return AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(settings().retrain_cron, timezone="UTC"), assets=assets
    )


def _xcom(task_id: str, key: str | None = None) -> str:
    item = f"['{key}']" if key else ""
    return f"{{{{ ti.xcom_pull(task_ids='{task_id}'){item} }}}}"


# Every operator gets the run's params explicitly (rendered natively: a dict), never from the
# context on its own: the same operators in another DAG take only what that DAG passes them.
RUN_PARAMS = "{{ params }}"


with DAG(
    dag_id="llm_finetune",
    description="Fine-tune an LLM on labelled text from Spark and promote it through MLflow aliases",
    schedule=_schedule(),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["llm", "fine-tuning", "spark", "mlflow", "great-expectations"],
    params=trigger_form_params(),
    render_template_as_native_obj=True,
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    validate_params = ValidateParamsOperator(task_id="validate_params", pipeline_params=RUN_PARAMS)

    resolve_base_model = ResolveBaseModelOperator(
        task_id="resolve_base_model",
        base_model="{{ params.base_model }}",
        trust_remote_code="{{ params.trust_remote_code }}",
    )

    merge_feedback = MergeFeedbackOperator(task_id="merge_feedback", pipeline_params=RUN_PARAMS)

    # Before any Spark job: the source files (path, size, modification time) the champion trained on.
    skip_unchanged_source = SkipUnchangedOperator(
        task_id="skip_unchanged_source",
        pipeline_params=RUN_PARAMS,
        model_name="{{ params.model_name }}",
        source_uri=_xcom("merge_feedback", "source_uri"),
    )

    prepare_data = PrepareDataOperator(
        task_id="prepare_data",
        pipeline_params=RUN_PARAMS,
        tokenizer=_xcom("resolve_base_model"),
        source_uri=_xcom("merge_feedback", "source_uri"),
        source_format=_xcom("merge_feedback", "source_format"),
        # The quality gate runs in the same Spark application; validate_data decides on its report.
        validate_quality=True,
    )

    # After it: the prepared rows' content, for a source rewritten with the same rows.
    skip_unchanged = SkipUnchangedOperator(
        task_id="skip_unchanged",
        pipeline_params=RUN_PARAMS,
        model_name="{{ params.model_name }}",
        data_fingerprint=_xcom("prepare_data", "data_fingerprint"),
    )

    validate_data = SparkQualityGateOperator(
        task_id="validate_data",
        pipeline_params=RUN_PARAMS,
        prepared_uri=_xcom("prepare_data", "prepared_uri"),
        source_uri=_xcom("prepare_data", "source_uri"),
        # None when prepare_data reused published data: then the gate runs here, on Spark.
        quality_summary="{{ ti.xcom_pull(task_ids='prepare_data').get('quality') }}",
    )

    materialize_dataset = MaterializeDatasetOperator(
        task_id="materialize_dataset",
        source=_xcom("prepare_data", "prepared_uri"),
        data_fingerprint=_xcom("prepare_data", "data_fingerprint"),
        label_names=_xcom("prepare_data", "labels"),
        splits=["train", "validation", "test"],
        dataset_mode="{{ params.dataset_mode }}",
    )

    train = TrainModelOperator(
        task_id="train",
        pipeline_params=RUN_PARAMS,
        dataset_uri=_xcom("materialize_dataset", "dataset_uri"),
        base_model=_xcom("resolve_base_model"),
        data_fingerprint=_xcom("prepare_data", "data_fingerprint"),
        # train_backend=databricks waits in the triggerer, not in a worker slot; local and spark
        # training run in the task's own process whatever this says.
        deferrable=True,
    )

    register = RegisterModelOperator(
        task_id="register",
        run_id=_xcom("train", "mlflow_run_id"),
        model_name="{{ params.model_name }}",
        tags={
            "fine_tuned_on": _xcom("prepare_data", "prepared_uri"),
            "data_fingerprint": _xcom("prepare_data", "data_fingerprint"),
            "source_signature": _xcom("skip_unchanged_source", "source_signature"),
            "base_model": "{{ params.base_model }}",
            "airflow_dag_id": "{{ dag.dag_id }}",
            "airflow_run_id": "{{ run_id }}",
        },
        run_artifacts={
            "prepare_summary": _xcom("prepare_data"),
            "quality_summary": _xcom("validate_data"),
            "dataset_summary": _xcom("materialize_dataset"),
            "feedback_summary": _xcom("merge_feedback"),
        },
        run_files={
            "data_docs": _xcom("validate_data", "validation_pages"),
            # The rows whose label a correction replaced in the data version trained on.
            "feedback": [_xcom("merge_feedback", "overrides_uri")],
        },
    )

    evaluate = EvaluateModelOperator(
        task_id="evaluate",
        pipeline_params=RUN_PARAMS,
        model_name="{{ params.model_name }}",
        version=_xcom("register", "version"),
        dataset_uri=_xcom("materialize_dataset", "dataset_uri"),
        run_id=_xcom("train", "mlflow_run_id"),
    )

    gate = PromotionGateOperator(
        task_id="gate",
        pipeline_params=RUN_PARAMS,
        evaluation=_xcom("evaluate"),
        run_id=_xcom("train", "mlflow_run_id"),
    )

    promote_staging = PromoteModelOperator(
        task_id="promote_staging",
        model_name="{{ params.model_name }}",
        version=_xcom("register", "version"),
        alias="staging",
        gate_decision=_xcom("gate"),
    )

    smoke_test = SmokeTestOperator(
        task_id="smoke_test",
        pipeline_params=RUN_PARAMS,
        model_name="{{ params.model_name }}",
        version=_xcom("register", "version"),
        dataset_uri=_xcom("materialize_dataset", "dataset_uri"),
        run_id=_xcom("train", "mlflow_run_id"),
    )

    # approval=required: a person signs off in the UI (Required Actions) first; none: passes at once.
    approve_champion = ChampionApprovalOperator(
        task_id="approve_champion",
        pipeline_params=RUN_PARAMS,
        model_name="{{ params.model_name }}",
        version=_xcom("register", "version"),
        evaluation=_xcom("evaluate"),
        gate_decision=_xcom("gate"),
        smoke=_xcom("smoke_test"),
        data_fingerprint=_xcom("prepare_data", "data_fingerprint"),
        run_id=_xcom("train", "mlflow_run_id"),
        quality=_xcom("validate_data"),
    )

    promote_champion = PromoteModelOperator(
        task_id="promote_champion",
        model_name="{{ params.model_name }}",
        version=_xcom("register", "version"),
        alias="champion",
        expected_champion=_xcom("gate", "champion_version"),
        gate_decision=_xcom("gate"),
        outlets=[champion_asset()],
        on_success_callback=PipelineNotifier(PROMOTED),
    )

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
