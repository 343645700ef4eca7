"""Submitting a ``sparktune.jobs`` Spark application and reading the JSON summary it writes, and the
driver JVM options of the Spark sessions the operators start themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sparktune.data.spark_jvm import DRIVER_JAVA_OPTIONS, short_job_conf
from sparktune_airflow.core.spark_submit import SparkSubmitOperator


def job_path(job: str) -> str:
    """The spark-submit application file of ``sparktune.jobs.<job>``, wherever sparktune is installed."""
    import importlib.util

    spec = importlib.util.find_spec(f"sparktune.jobs.{job}")
    if spec is None or spec.origin is None:
        raise AirflowFailException(f"sparktune.jobs.{job} is not installed; pip install the project")
    return spec.origin


def submit_and_read_summary(
    operator: SparkSubmitOperator, context: Any, summary_path: Path, job: str
) -> dict[str, Any]:
    """Run ``operator``'s spark-submit of ``sparktune.jobs.<job>`` and return the JSON summary the job
    wrote to ``summary_path``. Input errors the job recorded there fail the task at once
    (``AirflowFailException``); a fault it names as retryable, or a failure it left no record of
    (a lost executor), raises ``AirflowException`` and is retried."""
    try:
        SparkSubmitOperator.execute(operator, context)
    except AirflowException as exc:
        # A lost executor leaves no error record: that is worth a retry.
        if summary_path.exists():
            record = json.loads(summary_path.read_text())
            if record.get("error") and "retry" in record:  # a fault the job named (a full disk)
                failure = AirflowException if record["retry"] else AirflowFailException
                raise failure(f"{job} failed: {record['error']}") from exc
            if record.get("error"):
                raise AirflowFailException(f"{job} rejected its input: {record['error']}") from exc
        raise
    return json.loads(summary_path.read_text())


def session_jvm_conf(conn_id: str | None, config: dict[str, Any] | None, size: int | None) -> dict[str, Any]:
    """A ``PySparkOperator``'s session conf with the driver's JVM options (``short_job_conf``) for an
    input of ``size`` bytes (None: unknown), unless the connection's extra sets them."""
    if DRIVER_JAVA_OPTIONS in _connection_extra(conn_id):
        return dict(config or {})
    return short_job_conf(config, size)


def _connection_extra(conn_id: str | None) -> dict[str, Any]:
    """The connection's extra (Spark conf for ``PySparkOperator``); empty when there is none."""
    if not conn_id:
        return {}
    from airflow.sdk import BaseHook

    try:
        return dict(BaseHook.get_connection(conn_id).extra_dejson)
    except Exception:  # PySparkOperator falls back to local[*] without a connection as well
        return {}
