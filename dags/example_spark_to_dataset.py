"""
### example_spark_to_dataset

An example of using sparktune's operators in a DAG of your own (README: "Use the operators in
your own DAG"): check a table with Great Expectations on Spark, then turn it into a Hugging Face
dataset on disk that `datasets.load_from_disk` opens.

1. `check_source`: the raw-input rules (columns present and typed, null rates, row count), Data
   Docs under `$SPARKTUNE_HOME/gx/`; bad data fails here and nothing is written.
2. `to_arrow_dataset`: the source that passed becomes a `DatasetDict` (one `train` split, the
   label as a `ClassLabel`) at `$SPARKTUNE_HOME/lake/datasets/<content fingerprint>/`; the same
   data twice is built once.

`source_uri` empty: the generated demo data. Change `COLUMNS` to your table's columns.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune_airflow import MaterializeDatasetOperator, SparkQualityGateOperator
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_params

COLUMNS = {"text_column": "message", "label_column": "intent_label"}

with DAG(
    dag_id="example_spark_to_dataset",
    description="Example: Great Expectations check of a table, then a Hugging Face dataset from it",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["example", "great-expectations", "spark", "datasets"],
    params=form_params(names=["source_uri"]),
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    check_source = SparkQualityGateOperator(
        task_id="check_source",
        source_uri="{{ params.source_uri or '' }}",  # an emptied form field is null
        source=COLUMNS,
        rules={"min_rows": 100, "max_null_rate": 0.05},
    )

    to_arrow_dataset = MaterializeDatasetOperator(
        task_id="to_arrow_dataset",
        # The URI the check resolved and validated (an empty source_uri becomes the demo data's path).
        source=check_source.output["source_uri"],
        label_column=COLUMNS["label_column"],
        split_column=None,
    )
