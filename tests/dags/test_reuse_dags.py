"""The DAGs built from llm_finetune's operators: wired from the same operators and param specs, no copies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sparktune.data.quality_rules import raw_rule_params
from sparktune_airflow import MaterializeDatasetOperator, SparkQualityGateOperator
from sparktune_airflow.core.params import form_params

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dags():
    from airflow.models import DagBag

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
        found = {}
        for name in ("data_quality_report.py", "example_spark_to_dataset.py"):
            bag = DagBag(dag_folder=str(DAGS_DIR / name))
            assert bag.import_errors == {}, bag.import_errors
            found.update(bag.dags)
    return found


def test_report_is_nightly_and_runs_the_pipelines_gate_on_the_raw_table_only(dags):
    dag = dags["data_quality_report"]
    assert dag.timetable.expression == "0 0 * * *"  # @daily
    assert dag.catchup is False and dag.max_active_runs == 1
    (task,) = dag.tasks
    assert type(task) is SparkQualityGateOperator
    assert task.prepared_uri is None  # no preparation, no training
    assert task.op_kwargs["raw_suite_name"] == "data_quality_report"
    assert dag.render_template_as_native_obj  # fail_on_error reaches the task as a boolean
    assert dag.params["fail_on_error"] is True
    # The task gets its two sections, each field a reference to the form's, not the whole form.
    assert task.source["text_column"] == "{{ params.text_column }}"
    assert set(task.source) | set(task.rules) == set(raw_rule_params())
    # The source and rule params are the pipeline's own specs, not copies of them.
    pipeline = form_params()
    shared = [name for name in dag.params if name != "fail_on_error"]
    assert shared == list(raw_rule_params())
    assert {"source_uri", "text_column", "label_column", "min_rows", "max_null_rate"} <= set(shared)
    for name in shared:
        assert dag.params.get_param(name).schema == pipeline[name].schema, name
        assert dag.params[name] == pipeline[name].value, name


def test_example_checks_the_source_before_writing_a_dataset_from_what_was_checked(dags):
    dag = dags["example_spark_to_dataset"]
    check, to_arrow = dag.get_task("check_source"), dag.get_task("to_arrow_dataset")
    assert type(check) is SparkQualityGateOperator and type(to_arrow) is MaterializeDatasetOperator
    assert to_arrow.upstream_task_ids == {"check_source"}  # from the XComArg, no explicit edge
    assert (to_arrow.source.operator, to_arrow.source.key) == (check, "source_uri")
    assert to_arrow.label_column == check.source["label_column"]
