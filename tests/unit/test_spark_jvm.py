"""Which Spark jobs start their driver JVM with the short-job options (sparktune.spark_jvm)."""

from __future__ import annotations

from sparktune.spark_jvm import (
    DRIVER_JAVA_OPTIONS,
    SHORT_JOB_JAVA_OPTIONS,
    SHORT_JOB_MAX_BYTES,
    input_bytes,
    short_job_conf,
)


def test_input_bytes_adds_up_a_file_a_folder_and_a_glob(tmp_path):
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "a.parquet").write_bytes(b"x" * 100)
    (tmp_path / "part" / "b.parquet").write_bytes(b"x" * 50)
    (tmp_path / "one.jsonl").write_bytes(b"x" * 7)
    assert input_bytes(str(tmp_path / "one.jsonl")) == 7
    assert input_bytes(str(tmp_path / "part")) == 150
    assert input_bytes(f"file://{tmp_path / 'part'}") == 150
    assert input_bytes(str(tmp_path / "part" / "*.parquet")) == 150


def test_input_bytes_is_unknown_for_a_table_a_missing_path_and_nothing(tmp_path):
    assert input_bytes("sales.tickets") is None
    assert input_bytes(str(tmp_path / "missing.jsonl")) is None
    assert input_bytes(str(tmp_path / "nothing-*.csv")) is None
    assert input_bytes("") is None and input_bytes(None) is None
    # A scheme fsspec has no implementation for here (Spark may read it through Hadoop).
    assert input_bytes("nosuchscheme://bucket/tickets.jsonl") is None


def test_short_jobs_get_the_options_and_the_users_value_always_wins():
    base = {"spark.log.level": "WARN"}
    assert short_job_conf(base, 1_000) == {**base, DRIVER_JAVA_OPTIONS: SHORT_JOB_JAVA_OPTIONS}
    assert base == {"spark.log.level": "WARN"}  # the caller's dict is left alone
    assert short_job_conf(base, SHORT_JOB_MAX_BYTES + 1) == base
    assert short_job_conf(base, None) == base
    mine = {DRIVER_JAVA_OPTIONS: "-Xss4m"}
    assert short_job_conf(mine, 1_000) == mine
    assert short_job_conf(None, 10) == {DRIVER_JAVA_OPTIONS: SHORT_JOB_JAVA_OPTIONS}
