"""
### monitor_champion

Compares what the champion of `model_name` scored in the last `window_hours` (batch inference's
rows and the answers `make serve` captured) with the training split it learned from, with
Evidently: drift of the texts (a classifier telling them apart), of the predicted label mix
against the training labels, and of its confidence against its confidence on its own test split.
Runs daily (`SPARKTUNE_MONITOR_CRON`, default `@daily`; `off`: only after scoring) and after each
`batch_inference` run, or from the trigger form.

Each run writes `drift_report.html` and `drift_summary.json` under
`<lake>/monitoring/<model>/<run id>/` (the task's "Drift report" link and the Models page open
the report). A check above its threshold is drift: the run notifies through the `sparktune_smtp`
and `sparktune_webhook` connections and writes the texts most unlike the training data as a review
queue (`review_queue.csv` beside the report) to label and record with `record_corrections`.
Nothing retrains on unlabelled traffic. Fewer than `min_texts` texts in the window: the run
succeeds and says how many there were ("N texts since ...; need M").
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable
from sparktune.core.config import settings
from sparktune.core.dag_params import MonitorChampionParams
from sparktune_airflow import MonitorChampionOperator
from sparktune_airflow.core.assets import scored_traffic_asset
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_params

cron = settings().monitor_cron

with DAG(
    dag_id="monitor_champion",
    description="Drift of what the champion scores against its training data (Evidently), with alerts",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=[scored_traffic_asset()]
    )
    if cron
    else [scored_traffic_asset()],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["llm", "monitoring", "spark", "mlflow"],
    params=form_params(MonitorChampionParams),
    # The numbers reach the operator as numbers, not as their text.
    render_template_as_native_obj=True,
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    MonitorChampionOperator(
        task_id="compare_with_training_data",
        model_name="{{ params.model_name }}",
        window_hours="{{ params.window_hours }}",
        min_texts="{{ params.min_texts }}",
        thresholds={
            "text": "{{ params.text_threshold }}",
            "label_mix": "{{ params.label_mix_threshold }}",
            "score": "{{ params.score_threshold }}",
        },
        review_size="{{ params.review_size }}",
        max_rows="{{ params.max_rows }}",
    )
