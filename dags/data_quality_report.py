"""
### data_quality_report

Every night, the Great Expectations rules of `llm_finetune`'s raw input over any table or file,
with no preparation and no training: the same `SparkQualityGateOperator`, given no prepared data.

- **Checks:** the text and label columns exist with usable types (and the optional quality, id
  and timestamp columns when named), the share of null texts and labels is at most
  `max_null_rate`, and the table has at least `min_rows` rows.
- **Output: Great Expectations Data Docs**, under the suite `data_quality_report`, at
  `$SPARKTUNE_HOME/gx/gx/uncommitted/data_docs/local_site/index.html` (one page per run; the
  task log and its XCom give this run's page, `data_docs_uri`, and the index,
  `data_docs_index_uri`). The JSON summary sits beside it under `gx/uncommitted/quality_summaries/`.
- **Red when the data is bad:** with `fail_on_error` on (the default) a failed rule fails the run
  at once, with no retries, with one message naming every failed rule, what was observed and the
  param that sets its threshold. Turn it off to look at a table you know is bad: the run then
  succeeds and the failures are in the log, the XCom summary and Data Docs. Rules listed in
  `quality_warning_rules` only warn either way.
- `source_uri` empty: the generated demo data, as in `llm_finetune`.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from sparktune.core.params import DataSource, QualityRules
from sparktune.data.quality_rules import raw_rule_params
from sparktune_airflow import SparkQualityGateOperator
from sparktune_airflow.core.dag_defaults import run_deadline, task_defaults
from sparktune_airflow.core.params import form_param, form_params, param_refs

with DAG(
    dag_id="data_quality_report",
    description="Nightly Great Expectations report (Data Docs) on a source table; no training",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["data-quality", "great-expectations", "spark", "report"],
    params={
        # The pipeline's own specs of the source and the raw-input rules' columns and thresholds.
        **form_params(names=raw_rule_params()),
        "fail_on_error": form_param(
            True,
            type="boolean",
            title="fail_on_error",
            description="Fail the run when an error rule fails (a red nightly run on bad data). Off: "
            "record the failures in the log, XCom and Data Docs and succeed.",
        ),
    },
    render_template_as_native_obj=True,
    default_args=task_defaults(),
    deadline=run_deadline(),
    doc_md=__doc__,
) as dag:
    SparkQualityGateOperator(
        task_id="validate_source",
        # The form's source and rule params, each section an operator argument of its own.
        source=param_refs(DataSource, raw_rule_params()),
        rules=param_refs(QualityRules, raw_rule_params()),
        fail_on_error="{{ params.fail_on_error }}",
        raw_suite_name="data_quality_report",
    )
