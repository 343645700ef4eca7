"""
### review_queue

Writes the rows most worth a person's time as a file they fill in, in two parts:

1. **Label issues** (up to `label_issues`, default 50; 0: none): rows of the training source
   (`source_uri`, `text_column`, `label_column`, `id_column`: set them as in `llm_finetune`'s run;
   empty `source_uri`: the demo data) whose given label a model that never saw them contradicts.
   TF-IDF + logistic regression scores each row out of sample (stratified folds) and cleanlab
   flags and ranks the labels those probabilities contradict, likeliest wrong first. The champion
   cannot find these: it learned around them.
2. **Scored rows**: the `queue_size` distinct texts with the lowest score (the probability of the
   predicted label) among the rows batch inference scored (`make score`) and the answers the
   serving endpoint captured (`make serve`), of `model_name`. One row per text, however often it
   was scored (its latest scoring counts); least confident first.

Texts already corrected are left out of both, and a text is queued once (as a label issue when it
is both).

Each run writes `<output_uri>/<run id>/review_queue.csv` (UTF-8, opens in a spreadsheet) and the
same rows as `review_queue.parquet`; the task log and its XCom name both files. Columns: `id, text,
prediction, score, model_version, scored_at, origin` (`label_issue`, `batch` or `serving`),
`given_label` and `label_quality` (label issues: the source's label and cleanlab's score of it;
`prediction` is the suggested label, `score` its out-of-sample probability) and an empty `label`.

To review: fill in `label` with the right label (one of the champion's labels) on the rows you
checked, leave the others blank, save as CSV (UTF-8), and trigger `record_corrections` with
`corrections_uri` set to the file. Blank rows are skipped as not reviewed; a label outside the
label set refuses the file with the rows to fix. The corrections then retrain through the feedback
asset (a corrected label issue relabels its rows of the source), and the next queue leaves the
corrected texts out.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.core.dag_params import ReviewQueueParams
from sparktune.core.params import DataSource
from sparktune_airflow import ReviewQueueOperator
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_params, param_refs

with DAG(
    dag_id="review_queue",
    description="Likely wrong training labels, then the scored rows the model doubts, as a file to label",
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
        label_issues="{{ params.label_issues }}",
        source=param_refs(DataSource, ReviewQueueParams.model_fields),
        label_issue_max_rows="{{ params.label_issue_max_rows }}",
    )
