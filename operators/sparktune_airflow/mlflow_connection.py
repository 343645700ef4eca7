"""MLflow through an Airflow connection, as the DAGs reach Spark through ``spark_default``.

MLflow has no Airflow provider, so the MLflow-facing operators resolve the ``mlflow_default``
connection themselves, in ``pre_execute``: its address becomes ``MLFLOW_TRACKING_URI`` and its
credentials MLflow's own variables, in the task's process only. MLflow's client reads those, and
so do the processes the task starts (training, evaluation, the smoke test, spark-submit drivers),
so credentials live in the connection or a secrets backend and nowhere in a DAG file.

- an ``http``/``https`` connection (``AIRFLOW_CONN_MLFLOW_DEFAULT=http://host:port``), or a
  ``generic`` one whose schema says ``http``/``https``: that server; login and password become
  ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``; ``{"token": ...}`` in the extra
  becomes ``MLFLOW_TRACKING_TOKEN``.
- ``{"tracking_uri": "databricks"}`` (or any URI) in the extra wins over host and port.
- No such connection: ``MLFLOW_TRACKING_URI`` from the environment, else the embedded SQLite store.
"""

from __future__ import annotations

import logging
import os
from typing import Any

MLFLOW_CONN_ID = "mlflow_default"
CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")

log = logging.getLogger(__name__)


def tracking_env(conn: Any) -> dict[str, str]:
    """MLflow's environment variables for one Airflow connection."""
    extra = conn.extra_dejson
    uri = extra.get("tracking_uri")
    if not uri:
        if not conn.host:
            raise ValueError(
                f"the MLflow connection {conn.conn_id!r} has no host: set its host and port (e.g. "
                "AIRFLOW_CONN_MLFLOW_DEFAULT='http://127.0.0.1:5000') or an extra "
                '{"tracking_uri": "..."}'
            )
        scheme = conn.conn_type if conn.conn_type in ("http", "https") else (conn.schema or "http")
        port = f":{conn.port}" if conn.port else ""
        uri = conn.host if "://" in conn.host else f"{scheme}://{conn.host}{port}"
    env = {"MLFLOW_TRACKING_URI": str(uri).rstrip("/")}
    if conn.login:
        env["MLFLOW_TRACKING_USERNAME"] = conn.login
    if conn.password:
        env["MLFLOW_TRACKING_PASSWORD"] = conn.password
    if extra.get("token"):
        env["MLFLOW_TRACKING_TOKEN"] = str(extra["token"])
    return env


def use_mlflow_connection(conn_id: str | None = MLFLOW_CONN_ID) -> str | None:
    """Point this process (and its children) at the connection's MLflow; returns the tracking URI,
    or None when the connection is not defined and the environment decides."""
    if not conn_id:
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        log.info("no %r connection: MLflow at MLFLOW_TRACKING_URI or the embedded store", conn_id)
        return None
    env = tracking_env(conn)
    for key in CREDENTIAL_ENV:  # credentials of another server must not leak to this one
        os.environ.pop(key, None)
    os.environ.update(env)
    log.info("MLflow from connection %r: %s", conn_id, env["MLFLOW_TRACKING_URI"])
    return env["MLFLOW_TRACKING_URI"]


class UsesMLflowConnection:
    """Mixin of the operators that talk to MLflow: ``mlflow_conn_id`` (default ``mlflow_default``;
    None to use the environment only) is resolved before ``execute``."""

    def __init__(self, *, mlflow_conn_id: str | None = MLFLOW_CONN_ID, **kwargs: Any) -> None:
        self.mlflow_conn_id = mlflow_conn_id
        super().__init__(**kwargs)

    def pre_execute(self, context: Any) -> None:
        use_mlflow_connection(self.mlflow_conn_id)
        super().pre_execute(context)  # type: ignore[misc]
