"""
### review_queue

Writes the scored rows the model is least sure of as a file a person fills in: the `queue_size`
distinct texts with the lowest score (the probability of the predicted label) among the rows batch
inference scored (`make score`) and the answers the serving endpoint captured (`make serve`), of
`model_name`, leaving out texts already corrected. One row per text, however often it was scored
(its latest scoring counts); least confident first.

Each run writes `<output_uri>/<run id>/review_queue.csv` (UTF-8, opens in a spreadsheet) and the
same rows as `review_queue.parquet`; the task log and its XCom name both files. Columns: `id, text,
prediction, score, model_version, scored_at, origin` (`batch` or `serving`) and an empty `label`.

To review: fill in `label` with the right label (one of the champion's labels) on the rows you
checked, leave the others blank, save as CSV (UTF-8), and trigger `record_corrections` with
`corrections_uri` set to the file. Blank rows are skipped as not reviewed; a label outside the
label set refuses the file with the rows to fix. The corrections then retrain through the feedback
asset, and the next queue leaves the corrected texts out.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.core.dag_params import ReviewQueueParams
from sparktune_airflow import ReviewQueueOperator
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_params

with DAG(
    dag_id="review_queue",
    description="The scored rows the model is least sure of, as a CSV and Parquet file to label",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["llm", "feedback", "spark"],
    params=form_params(ReviewQueueParams),
    # queue_size reaches the operator as a number, and an emptied model_name as None, not "None".
    render_template_as_native_obj=True,
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    ReviewQueueOperator(
        task_id="build_queue",
        model_name="{{ params.model_name }}",
        size="{{ params.queue_size }}",
        output_uri="{{ params.output_uri }}",
    )
