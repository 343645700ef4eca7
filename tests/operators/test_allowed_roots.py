"""Every DAG that takes a location param refuses one outside SPARKTUNE_ALLOWED_ROOTS before Spark starts.

Each test takes the DAG's own first task from its file, renders its templates from the run's params
and executes it with spark-submit and the PySpark session replaced by a tripwire: the refusal must
come first, as an AirflowFailException (no retries) naming the param and the roots.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"


@dataclass
class FakeTaskInstance:
    dag_id: str
    run_id: str = "manual__2026-11-23"
    task_id: str = "task"
    try_number: int = 1


@pytest.fixture(scope="module")
def dags():
    from airflow.models import DagBag

    found = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
        for name in (
            "llm_finetune.py",
            "batch_inference.py",
            "record_corrections.py",
            "review_queue.py",
            "data_quality_report.py",
            "example_spark_to_dataset.py",
        ):
            bag = DagBag(dag_folder=str(DAGS_DIR / name))
            assert bag.import_errors == {}, bag.import_errors
            found.update(bag.dags)
    return found


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Allowed: <tmp>/data only (plus the pipeline's own lake under SPARKTUNE_HOME); Spark is a tripwire."""
    from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    def spark_started(*args, **kwargs):
        raise AssertionError("Spark started before the location was checked")

    monkeypatch.setattr(SparkSubmitOperator, "execute", spark_started)
    monkeypatch.setattr(PySparkOperator, "execute_callable", spark_started)
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("SPARKTUNE_ALLOWED_ROOTS", str(data))
    return SimpleNamespace(data=data, escape=f"{data}/../etc/passwd")


def _run(dag, task_id: str, params: dict):
    task = copy.deepcopy(dag.get_task(task_id))  # rendering replaces the templates in place
    day = datetime(2026, 11, 23, tzinfo=UTC)
    context = {
        "params": {**dag.params.dump(), **params},
        "ti": FakeTaskInstance(dag_id=dag.dag_id, task_id=task_id),
        "logical_date": day,
        "dag_run": SimpleNamespace(run_after=day),
        "run_id": "manual__2026-11-23",
    }
    task.render_template_fields(context)
    with pytest.raises(AirflowFailException) as caught:
        task.execute(context)
    return str(caught.value)


def _assert_names(message: str, param: str, roots) -> None:
    assert f"{param}: " in message and "is outside the allowed roots" in message
    assert str(roots.data) in message and "SPARKTUNE_ALLOWED_ROOTS" in message


def test_llm_finetune_validate_params_refuses_a_source_outside_the_roots(dags, roots):
    message = _run(dags["llm_finetune"], "validate_params", {"source_uri": roots.escape})
    _assert_names(message, "source_uri", roots)
    assert "resolves to" in message and message.rstrip().endswith("SPARKTUNE_ALLOWED_ROOTS.")


@pytest.mark.parametrize("param", ["source_uri", "output_uri", "feedback_uri"])
def test_batch_inference_refuses_each_location_outside_the_roots(dags, roots, param):
    inside = {
        "source_uri": str(roots.data / "incoming.jsonl"),
        "output_uri": str(roots.data / "predictions"),
        "feedback_uri": str(roots.data / "feedback"),
    }
    message = _run(dags["batch_inference"], "score", {**inside, param: roots.escape})
    _assert_names(message, param, roots)


def test_batch_inference_inside_the_roots_gets_to_spark(dags, roots):
    dag = dags["batch_inference"]
    task = copy.deepcopy(dag.get_task("score"))
    params = {
        **dag.params.dump(),
        "source_uri": str(roots.data / "incoming.jsonl"),
        "output_uri": str(roots.data / "predictions"),
        "feedback_uri": str(roots.data / "feedback"),
    }
    day = datetime(2026, 11, 23, tzinfo=UTC)
    context = {
        "params": params,
        "ti": FakeTaskInstance(dag_id="batch_inference", task_id="score"),
        "logical_date": day,
        "dag_run": SimpleNamespace(run_after=day),
    }
    task.render_template_fields(context)
    with pytest.raises(AssertionError, match="Spark started"):
        task.execute(context)


def test_record_corrections_refuses_a_corrections_file_outside_the_roots(dags, roots):
    message = _run(dags["record_corrections"], "record", {"corrections_uri": roots.escape})
    _assert_names(message, "corrections_uri", roots)


def test_review_queue_refuses_an_output_folder_outside_the_roots(dags, roots):
    message = _run(dags["review_queue"], "build_queue", {"output_uri": roots.escape})
    _assert_names(message, "output_uri", roots)


def test_review_queue_refuses_a_label_issue_source_outside_the_roots(dags, roots):
    inside = {"output_uri": str(roots.data / "queues")}
    message = _run(dags["review_queue"], "build_queue", {**inside, "source_uri": roots.escape})
    _assert_names(message, "source_uri", roots)


def test_data_quality_report_refuses_a_source_outside_the_roots(dags, roots):
    message = _run(dags["data_quality_report"], "validate_source", {"source_uri": roots.escape})
    _assert_names(message, "source_uri", roots)


def test_example_dag_refuses_a_source_outside_the_roots(dags, roots):
    message = _run(dags["example_spark_to_dataset"], "check_source", {"source_uri": roots.escape})
    _assert_names(message, "source_uri", roots)


def test_a_symlink_out_of_a_root_is_refused_like_a_dotdot(dags, roots, tmp_path):
    (tmp_path / "secret").mkdir()
    (roots.data / "shared").symlink_to(tmp_path / "secret")
    message = _run(
        dags["data_quality_report"], "validate_source", {"source_uri": str(roots.data / "shared" / "x.csv")}
    )
    _assert_names(message, "source_uri", roots)
    assert f"resolves to {tmp_path / 'secret' / 'x.csv'}" in message
