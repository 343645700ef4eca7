"""MLflow through an Airflow connection, as the DAGs reach Spark through ``spark_default``.

MLflow has no Airflow provider: :class:`MLflowHook` is this project's hook on the ``mlflow_default``
connection, and the MLflow-facing operators activate it before ``execute``: its address is
``MLFLOW_TRACKING_URI`` and its credentials MLflow's own variables in the task's process. MLflow's
client reads those, and so do the processes the task starts (training, evaluation, the smoke test,
spark-submit drivers), so credentials live in the connection or a secrets backend and nowhere in a
DAG file.

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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk import BaseHook

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


class MLflowHook(BaseHook):
    """The MLflow tracking server of an Airflow connection (``mlflow_default`` unless named).

    MLflow has no Airflow provider. ``get_conn()`` returns an ``MlflowClient`` on the connection's
    server; :meth:`activate` points this process at it, because MLflow's client reads credentials
    (and its fluent API the tracking URI) from environment variables only, and the processes a task
    starts (training, evaluation, spark-submit drivers) inherit them; :meth:`activated` does so for
    a block of code and puts the previous values back. No such connection: the environment decides
    (``MLFLOW_TRACKING_URI``, else the embedded SQLite store).
    """

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = MLFLOW_CONN_ID
    conn_type = "http"
    hook_name = "MLflow"

    def __init__(self, mlflow_conn_id: str | None = MLFLOW_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id

    def tracking_env(self) -> dict[str, str]:
        """The connection's MLflow variables; empty when there is no connection to use."""
        if not self.mlflow_conn_id:
            return {}
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.mlflow_conn_id)
        except AirflowNotFoundException:
            log.info(
                "no %r connection: MLflow at MLFLOW_TRACKING_URI or the embedded store", self.mlflow_conn_id
            )
            return {}
        return tracking_env(conn)

    def activate(self) -> str:
        """Point this process and its children at the connection's server; returns the tracking URI
        in effect (the environment's when there is no connection)."""
        from sparktune.core.config import settings

        env = self.tracking_env()
        if env:
            for key in CREDENTIAL_ENV:  # credentials of another server must not leak to this one
                os.environ.pop(key, None)
            os.environ.update(env)
            log.info("MLflow from connection %r: %s", self.mlflow_conn_id, env["MLFLOW_TRACKING_URI"])
        return settings().mlflow_tracking_uri

    @contextmanager
    def activated(self) -> Iterator[str]:
        """:meth:`activate` for a block of code: the previous values come back after it."""
        keys = (*CREDENTIAL_ENV, "MLFLOW_TRACKING_URI")
        saved = {key: os.environ.get(key) for key in keys}
        try:
            yield self.activate()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def get_conn(self) -> Any:
        """An ``MlflowClient`` on the connection's server (credentials: after :meth:`activate`);
        the process's fluent ``mlflow.*`` calls go to the same server."""
        import mlflow
        from mlflow.tracking import MlflowClient
        from sparktune.core.config import settings

        uri = self.tracking_env().get("MLFLOW_TRACKING_URI") or settings().mlflow_tracking_uri
        mlflow.set_tracking_uri(uri)
        return MlflowClient(tracking_uri=uri)


class UsesMLflowConnection:
    """Mixin of the operators that talk to MLflow: ``mlflow_conn_id`` (default ``mlflow_default``;
    None to use the environment only) is activated before ``execute`` (:meth:`MLflowHook.activate`)
    and stays so for the rest of the task: its extra links and lineage, computed after ``execute``,
    name the same server."""

    def __init__(self, *, mlflow_conn_id: str | None = MLFLOW_CONN_ID, **kwargs: Any) -> None:
        self.mlflow_conn_id = mlflow_conn_id
        super().__init__(**kwargs)

    @property
    def mlflow_hook(self) -> MLflowHook:
        return MLflowHook(self.mlflow_conn_id)

    def pre_execute(self, context: Any) -> None:
        self.mlflow_hook.activate()
        super().pre_execute(context)  # type: ignore[misc]
