"""Which Spark jobs start their driver JVM with the short-job options (sparktune.data.spark_jvm)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sparktune.data.spark_jvm import (
    CLASS_ARCHIVE_ENV,
    DRIVER_JAVA_OPTIONS,
    SHORT_JOB_JAVA_OPTIONS,
    SHORT_JOB_MAX_BYTES,
    build_class_archive,
    class_archive,
    class_archive_path,
    input_bytes,
    short_job_conf,
    spark_install_identity,
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


def test_short_jobs_get_the_options_and_the_users_value_always_wins(monkeypatch):
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "off")
    base = {"spark.log.level": "WARN"}
    assert short_job_conf(base, 1_000) == {**base, DRIVER_JAVA_OPTIONS: SHORT_JOB_JAVA_OPTIONS}
    assert base == {"spark.log.level": "WARN"}  # the caller's dict is left alone
    assert short_job_conf(base, SHORT_JOB_MAX_BYTES + 1) == base
    assert short_job_conf(base, None) == base
    mine = {DRIVER_JAVA_OPTIONS: "-Xss4m"}
    assert short_job_conf(mine, 1_000) == mine
    assert short_job_conf(None, 10) == {DRIVER_JAVA_OPTIONS: SHORT_JOB_JAVA_OPTIONS}


def test_the_archive_is_the_users_cache_per_spark_install_and_java_unless_set(tmp_path, monkeypatch):
    monkeypatch.delenv(CLASS_ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    default = class_archive_path()
    assert default.parent == tmp_path / "cache" / "sparktune" / "spark-classes"
    assert default.name.startswith("spark-4.") and default.suffix == ".jsa"
    assert class_archive() is None  # not built in this cache
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))  # another Java: another archive, here none
    assert class_archive_path() is None
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(tmp_path / "mine.jsa"))
    assert class_archive_path() == tmp_path / "mine.jsa" and class_archive() is None
    (tmp_path / "mine.jsa").write_bytes(b"x")
    assert class_archive() == tmp_path / "mine.jsa"
    assert short_job_conf({}, None) == {DRIVER_JAVA_OPTIONS: f"-XX:SharedArchiveFile={tmp_path / 'mine.jsa'}"}
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, "off")
    assert class_archive() is None and short_job_conf({}, None) == {}


def test_a_spark_install_reinstalled_in_the_same_place_is_another_install(tmp_path):
    # The JVM refuses an archive whose jars changed size or time: a venv deleted and installed
    # again at the same path (a fresh clone where the last one was) must not reuse the old archive.
    import os

    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"classes")
    (jars / "README").write_text("not a jar")
    first = spark_install_identity(tmp_path / "pyspark", "4.2.0")
    assert first == spark_install_identity(tmp_path / "pyspark", "4.2.0")
    assert first != spark_install_identity(tmp_path / "pyspark", "4.2.1")
    stat = (jars / "spark-core.jar").stat()
    os.utime(jars / "spark-core.jar", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    reinstalled = spark_install_identity(tmp_path / "pyspark", "4.2.0")
    assert reinstalled != first
    (jars / "README").write_text("still not a jar, changed")  # not on the classpath: no new archive
    assert spark_install_identity(tmp_path / "pyspark", "4.2.0") == reinstalled
    (jars / "extra.jar").write_bytes(b"more")
    assert spark_install_identity(tmp_path / "pyspark", "4.2.0") != reinstalled


@pytest.fixture(scope="session")
def built_archive() -> Path:
    """This environment's archive: ``make venv`` built it; built here when pytest runs without make."""
    return build_class_archive()


@pytest.mark.slow  # a spark-submit job of its own (15-24 s of a worker): left to make test
def test_a_spark_driver_loads_its_classes_from_the_built_archive(built_archive, tmp_path):
    """-Xshare:on makes the JVM refuse to start when it cannot map the archive (a wrong Java, another
    classpath, a half-written file), instead of quietly loading every class as usual."""
    script = tmp_path / "job.py"
    script.write_text(
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        "print('rows', spark.range(10).selectExpr('sum(id)').first()[0])\n"
        "spark.stop()\n"
    )
    options = short_job_conf({}, 1)[DRIVER_JAVA_OPTIONS]
    assert f"-XX:SharedArchiveFile={built_archive}" in options
    loaded = tmp_path / "classes.log"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]"]
        + ["--conf", f"{DRIVER_JAVA_OPTIONS}={options} -Xshare:on -Xlog:class+load=info:file={loaded}"]
        + [str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0 and "rows 45" in result.stdout, output
    # Spark's own classes; lambdas and generated code are made at run time and never archived.
    spark_classes = [
        line
        for line in loaded.read_text().splitlines()
        if " org.apache.spark." in line and "$$Lambda" not in line and "Generated" not in line
    ]
    from_jars = [line for line in spark_classes if "shared objects file (top)" not in line]
    assert len(spark_classes) > 1000 and len(from_jars) < 0.02 * len(spark_classes), from_jars[:20]
