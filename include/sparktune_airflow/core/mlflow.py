"""MLflow through an Airflow connection, as the DAGs reach Spark through ``spark_default``.

MLflow has no Airflow provider: :class:`MLflowHook` is this project's hook on the ``mlflow_default``
connection. ``get_conn()`` returns an ``MlflowClient`` on the connection's server that sends the
connection's credentials itself (:mod:`sparktune.core.mlflow_client`): the task's environment and
MLflow's process-wide settings stay as they are. The processes a task starts (training, evaluation,
the smoke test, spark-submit drivers) get the connection as MLflow's own variables in their
environment (:meth:`MLflowHook.process_env`), so credentials live in the connection or a secrets
backend and nowhere in a DAG file.

- an ``http``/``https`` connection (``AIRFLOW_CONN_MLFLOW_DEFAULT=http://host:port``), or a
  ``generic`` one whose schema says ``http``/``https``: that server; login and password become
  ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``; ``{"token": ...}`` in the extra
  becomes ``MLFLOW_TRACKING_TOKEN``.
- ``{"tracking_uri": "databricks"}`` (or any URI) in the extra wins over host and port.
- No such connection: ``MLFLOW_TRACKING_URI`` from the environment, else the embedded SQLite store,
  with MLflow's own defaults for credentials (the environment's variables).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
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
    server (tracking and registry) that carries the connection's credentials itself;
    :meth:`tracking_uri` names the server; :meth:`process_env` is the environment of a process the
    task starts, with the connection's MLflow variables in it. None of them changes ``os.environ``
    or MLflow's process-wide settings. No such connection (or ``mlflow_conn_id=None``): the
    environment decides (``MLFLOW_TRACKING_URI``, else the embedded SQLite store).
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

    def tracking_uri(self) -> str:
        """The server's URI: the connection's, else ``MLFLOW_TRACKING_URI``, else the embedded store."""
        from sparktune.core.config import settings

        return self.tracking_env().get("MLFLOW_TRACKING_URI") or settings().mlflow_tracking_uri

    def process_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process the task starts: ``base`` (default: this process's) with the
        connection's MLflow variables, and without another server's credentials; ``base`` as it is
        when there is no connection."""
        env = dict(os.environ if base is None else base)
        own = self.tracking_env()
        if own:
            for key in CREDENTIAL_ENV:  # credentials of another server must not reach this one
                env.pop(key, None)
            env.update(own)
        return env

    def get_conn(self) -> Any:
        """An ``MlflowClient`` on the connection's server that sends the connection's credentials
        (and no one else's); without a connection, one on the environment's server."""
        from sparktune.core.config import settings
        from sparktune.core.mlflow_client import Credentials, mlflow_client

        env = self.tracking_env()
        if not env:
            return mlflow_client(settings().mlflow_tracking_uri)
        log.info("MLflow from connection %r: %s", self.mlflow_conn_id, env["MLFLOW_TRACKING_URI"])
        credentials = Credentials(*(env.get(key) for key in CREDENTIAL_ENV))
        return mlflow_client(env["MLFLOW_TRACKING_URI"], credentials)


class UsesMLflowConnection:
    """Mixin of the operators that talk to MLflow: ``mlflow_conn_id`` (default ``mlflow_default``;
    None to use the environment only) names the server; ``mlflow_hook`` reaches it (its client, the
    environment of the processes the task starts)."""

    def __init__(self, *, mlflow_conn_id: str | None = MLFLOW_CONN_ID, **kwargs: Any) -> None:
        self.mlflow_conn_id = mlflow_conn_id
        super().__init__(**kwargs)

    @property
    def mlflow_hook(self) -> MLflowHook:
        return MLflowHook(self.mlflow_conn_id)
