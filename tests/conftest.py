"""Session-wide test environment: state in a temp folder, Spark workers on this interpreter."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import pytest

# Set before any sparktune/airflow import so nothing a test does can touch the user's .local/.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="sparktune-test-"))
# Forced, not defaults: `make test` inherits the Makefile's SPARKTUNE_HOME (the user's .local/), and a
# user's shell may point AIRFLOW_HOME or MLFLOW_TRACKING_URI at real servers.
os.environ["SPARKTUNE_HOME"] = str(_SESSION_HOME)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["AIRFLOW_HOME"] = str(_SESSION_HOME / "airflow")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# MLflow's own default is sqlite:///mlflow.db in the working directory (the repository root): a
# test that reaches MLflow without a store of its own gets this one. A test that sets
# SPARKTUNE_HOME and wants that home's store sets MLFLOW_TRACKING_URI too (settings() prefers the
# variable); tests/e2e strips it so DAG runs use their SPARKTUNE_HOME's embedded store.
(_SESSION_HOME / "mlflow").mkdir()
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_HOME / 'mlflow' / 'mlflow.db'}"
# py4j logs "Closing down clientserver connection" from __del__ at exit, after pytest closed the streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every test that needs one (a JVM start costs seconds)."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("sparktune-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    yield session
    session.stop()
