"""The pipeline's Spark tasks start their driver JVM with the short-job options on small inputs only
(sparktune.data.spark_jvm), and a value the user sets wins. spark-submit and the Spark session are
replaced by recorders: what is checked is the conf each operator would start Spark with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from sparktune.data.spark_jvm import CLASS_ARCHIVE_ENV, DRIVER_JAVA_OPTIONS, SHORT_JOB_JAVA_OPTIONS
from sparktune_airflow import PrepareDataOperator, SparkQualityGateOperator
from sparktune_airflow.data import prepare

SUMMARY = {"steps": [], "data_fingerprint": "f" * 20, "prepared_uri": "/lake/prepared/f"}


def _params(source):
    return {"source_uri": str(source)}


def _context(source):
    ti = SimpleNamespace(dag_id="d", run_id="manual__1", task_id="t", try_number=1)
    return {"params": _params(source), "ti": ti}


@pytest.fixture
def submitted(monkeypatch):
    confs: list[dict] = []

    def record(operator, context, summary_path, job):
        confs.append(dict(operator.conf))
        return SUMMARY

    monkeypatch.setattr(prepare, "submit_and_read_summary", record)
    return confs


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    # No class archive unless a test writes one here (the user's cache may hold a real one).
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(tmp_path / "spark.jsa"))
    return tmp_path


def test_prepare_on_a_small_file_gets_the_short_job_options(home, submitted):
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    PrepareDataOperator(task_id="prepare_data", tokenizer="t", source=_params(source)).execute(
        _context(source)
    )
    assert submitted[0][DRIVER_JAVA_OPTIONS] == SHORT_JOB_JAVA_OPTIONS
    assert submitted[0]["spark.log.level"] == "WARN"


def test_prepare_on_a_large_input_or_a_table_keeps_the_jvm_defaults(home, submitted, monkeypatch):
    monkeypatch.setattr("sparktune.data.spark_jvm.SHORT_JOB_MAX_BYTES", 10)
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    PrepareDataOperator(task_id="prepare_data", tokenizer="t", source=_params(source)).execute(
        _context(source)
    )
    PrepareDataOperator(task_id="prepare_data", tokenizer="t", source=_params("sales.tickets")).execute(
        _context("sales.tickets")
    )
    assert all(DRIVER_JAVA_OPTIONS not in conf for conf in submitted)


def test_every_driver_maps_the_class_archive_when_the_environment_has_one(home, submitted, monkeypatch):
    (home / "spark.jsa").write_bytes(b"archive")
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    PrepareDataOperator(task_id="prepare_data", tokenizer="t", source=_params(source)).execute(
        _context(source)
    )
    archive = f"-XX:SharedArchiveFile={home / 'spark.jsa'}"
    assert submitted[-1][DRIVER_JAVA_OPTIONS] == f"{SHORT_JOB_JAVA_OPTIONS} {archive}"
    # A large input or a table keeps the JIT and collector defaults, and still starts faster.
    PrepareDataOperator(task_id="prepare_data", tokenizer="t", source=_params("sales.tickets")).execute(
        _context("sales.tickets")
    )
    assert submitted[-1][DRIVER_JAVA_OPTIONS] == archive


def test_the_users_java_options_win(home, submitted):
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    mine = {DRIVER_JAVA_OPTIONS: "-Xss4m"}
    PrepareDataOperator(task_id="prepare_data", tokenizer="t", conf=mine, source=_params(source)).execute(
        _context(source)
    )
    assert submitted[0][DRIVER_JAVA_OPTIONS] == "-Xss4m"


def test_the_quality_gate_session_gets_them_unless_the_connection_sets_them(home, monkeypatch):
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    seen: list[dict] = []
    monkeypatch.setattr(PySparkOperator, "execute", lambda op, context: seen.append(dict(op.config_kwargs)))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    gate = SparkQualityGateOperator(task_id="validate_data", source_uri=str(source), source=_params(source))
    gate.execute(_context(source))
    assert seen[-1] == {DRIVER_JAVA_OPTIONS: SHORT_JOB_JAVA_OPTIONS}
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        '{"conn_type": "spark", "host": "local[2]", "extra": {"spark.driver.extraJavaOptions": "-Xss4m"}}',
    )
    SparkQualityGateOperator(task_id="validate_data", source_uri=str(source), source=_params(source)).execute(
        _context(source)
    )
    assert seen[-1] == {}


def test_the_feedback_sessions_and_spark_training_map_the_archive_too(home, monkeypatch):
    from datetime import UTC, datetime

    import sparktune.serve.feedback
    from sparktune.core.params import parse_params
    from sparktune_airflow import MergeFeedbackOperator, RecordCorrectionsOperator, TrainModelOperator

    (home / "spark.jsa").write_bytes(b"archive")
    archive = f"-XX:SharedArchiveFile={home / 'spark.jsa'}"
    source = home / "tickets.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a"}\n')
    seen: list[dict] = []
    monkeypatch.setattr(PySparkOperator, "execute", lambda op, context: seen.append(dict(op.config_kwargs)))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setattr(sparktune.serve.feedback, "corrections_present", lambda uri: True)

    MergeFeedbackOperator(task_id="merge_feedback", source=_params(source)).execute(_context(source))
    assert seen[-1] == {DRIVER_JAVA_OPTIONS: f"{SHORT_JOB_JAVA_OPTIONS} {archive}"}
    context = {**_context(source), "logical_date": datetime(2026, 11, 25, tzinfo=UTC)}
    RecordCorrectionsOperator(task_id="record", corrections_uri=str(source), model_name="m").execute(context)
    assert seen[-1] == {DRIVER_JAVA_OPTIONS: archive}  # it reads tables of unknown size too

    # Training on Spark is long: the archive, and the JVM's own compiler and collector.
    train = TrainModelOperator(task_id="train", dataset_uri="/d", base_model="/m", data_fingerprint="fp")
    params = parse_params({"train_backend": "spark"})
    command = train._process_command({"train_key": "k"}, params, home / "work")
    assert f"{DRIVER_JAVA_OPTIONS}={archive}" in command
