"""Extra links of the sparktune operators: the MLflow run, the registered model version, the GX Data
Docs page, the Spark master UI, the Databricks run and the drift report.

Airflow 3 calls ``get_link(operator, ti_key=...)`` on the worker when the task ends and stores the
URL in XCom under the link's ``xcom_key``; the UI reads that XCom (the serialized DAG keeps only
the link's name and key), so no plugin registers these links. Each link reads the task's return
value (XCom ``return_value``) and builds its URL with a plain function, tested without Airflow.
An empty string shows no button (the task failed, or there is no page to show); the UI also drops
links that are not http(s), such as the ``file://`` Data Docs page without ``SPARKTUNE_DATA_DOCS_URL``.

MLflow pages: the operator's MLflow server (its ``mlflow_conn_id`` connection, else
``MLFLOW_TRACKING_URI``) when it is http(s); with the embedded SQLite store, ``make mlflow-ui``
serves it at http://127.0.0.1:5000 (``SPARKTUNE_MLFLOW_UI_URL`` changes that). Data Docs: the
``file://`` page GX wrote; ``SPARKTUNE_DATA_DOCS_URL`` maps the Data Docs folder to where a web
server publishes it. Spark: a standalone master's web UI (``spark://host:7077``
-> ``http://host:8080``, where finished applications are listed); ``SPARKTUNE_SPARK_UI_URL`` points
elsewhere (a history server); ``local[*]`` has no UI once the job ended. Drift reports: the
Models page's app on the api-server serves them (``/sparktune/models/drift``) from the lake,
under the UI's ``[api] base_url``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlparse

from airflow.sdk import BaseOperatorLink

EMBEDDED_MLFLOW_UI = "http://127.0.0.1:5000"
MLFLOW_UI_ENV = "SPARKTUNE_MLFLOW_UI_URL"
DATA_DOCS_URL_ENV = "SPARKTUNE_DATA_DOCS_URL"
SPARK_UI_ENV = "SPARKTUNE_SPARK_UI_URL"
SPARK_MASTER_UI_PORT = 8080


def mlflow_ui_base(tracking_uri: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Where the MLflow UI is: ``SPARKTUNE_MLFLOW_UI_URL``, else an http(s) tracking URI, else the
    ``make mlflow-ui`` address of the embedded store."""
    env = os.environ if env is None else env
    if env.get(MLFLOW_UI_ENV):
        return env[MLFLOW_UI_ENV].rstrip("/")
    uri = tracking_uri if tracking_uri is not None else env.get("MLFLOW_TRACKING_URI", "")
    if urlparse(uri).scheme in ("http", "https"):
        return uri.rstrip("/")
    return EMBEDDED_MLFLOW_UI


def operator_mlflow_ui(operator: Any) -> str:
    """:func:`mlflow_ui_base` of the operator's MLflow server (``UsesMLflowConnection``), else of the
    environment's."""
    hook = getattr(operator, "mlflow_hook", None)
    return mlflow_ui_base(hook.tracking_uri() if hook is not None else None)


def mlflow_run_url(result: Mapping[str, Any] | None, base: str) -> str:
    """The run page of ``TrainModelOperator``'s result (``mlflow_run_id``)."""
    run_id = (result or {}).get("mlflow_run_id")
    return f"{base}/#/runs/{quote(str(run_id))}" if run_id else ""


def model_version_url(result: Mapping[str, Any] | None, base: str) -> str:
    """The version page of ``RegisterModelOperator``'s (``model_name``, ``version``) or
    ``PromoteModelOperator``'s (``model_name``, ``to_version``) result."""
    result = result or {}
    name = result.get("model_name")
    version = result.get("version") or result.get("to_version")
    if not name or not version:
        return ""
    return f"{base}/#/models/{quote(str(name), safe='')}/versions/{quote(str(version))}"


def data_docs_url(result: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> str:
    """The Data Docs page of ``SparkQualityGateOperator``'s run (its ``data_docs_uri``, else the
    index), under ``SPARKTUNE_DATA_DOCS_URL`` when the site is published there."""
    env = os.environ if env is None else env
    result = result or {}
    page = result.get("data_docs_uri") or result.get("data_docs_index_uri") or ""
    published = env.get(DATA_DOCS_URL_ENV, "").rstrip("/")
    docs_dir = result.get("data_docs_dir")
    if page and published and docs_dir:
        from pathlib import Path

        prefix = Path(docs_dir).resolve().as_uri().rstrip("/")
        if page.startswith(prefix + "/"):
            return published + page[len(prefix) :]
    return page


def drift_report_url(result: Mapping[str, Any] | None, base: str) -> str:
    """The Models page's view of ``MonitorChampionOperator``'s report (none: too little traffic)."""
    result = result or {}
    report, name = result.get("report_uri") or "", result.get("model_name") or ""
    if not report or not name:
        return ""
    run_folder = report.rstrip("/").rsplit("/", 2)[-2]
    # The plugin mounts the Models app under /sparktune (sparktune_airflow.ui.models_app.URL_PREFIX).
    query = f"model={quote(name, safe='')}&run={quote(run_folder, safe='')}"
    return f"{base.rstrip('/')}/sparktune/models/drift?{query}"


def spark_ui_url(master: str | None, env: Mapping[str, str] | None = None) -> str:
    """The web UI of the Spark master a task ran on: ``SPARKTUNE_SPARK_UI_URL``, else a standalone
    master's UI on port 8080; ``local``, YARN and Kubernetes give "" (no UI of their own here)."""
    env = os.environ if env is None else env
    if env.get(SPARK_UI_ENV):
        return env[SPARK_UI_ENV]
    master = (master or "").strip()
    if not master.startswith("spark://"):
        return ""
    first = master.removeprefix("spark://").split(",")[0]
    host = first.rsplit(":", 1)[0] if ":" in first else first
    return f"http://{host}:{SPARK_MASTER_UI_PORT}" if host else ""


def _task_result(ti_key: Any) -> Any:
    """The task's return value, from XCom (the task's own, written before the links are built)."""
    from airflow.sdk.execution_time.xcom import XCom

    return XCom.get_value(ti_key=ti_key, key="return_value")


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


class MLflowRunLink(BaseOperatorLink):
    """The MLflow run that trained the model (``TrainModelOperator``)."""

    name = "MLflow run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return mlflow_run_url(_as_mapping(_task_result(ti_key)), operator_mlflow_ui(operator))


class MLflowModelVersionLink(BaseOperatorLink):
    """The registered model version (``RegisterModelOperator``, ``PromoteModelOperator``)."""

    name = "MLflow model version"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return model_version_url(_as_mapping(_task_result(ti_key)), operator_mlflow_ui(operator))


class DataDocsLink(BaseOperatorLink):
    """The Great Expectations Data Docs page of the validation (``SparkQualityGateOperator``)."""

    name = "GX Data Docs"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return data_docs_url(_as_mapping(_task_result(ti_key)))


class DatabricksRunLink(BaseOperatorLink):
    """The Databricks run page of a ``train_backend=databricks`` training (``TrainModelOperator``).

    The provider's ``DatabricksJobRunLink`` returns None when the task started no Databricks run
    (every other backend); Airflow stores that as the string "None", which the UI shows as a
    button to a page that does not exist. This reads the same XCom and gives "" (no button)."""

    name = "Databricks run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.providers.databricks.operators.databricks import XCOM_RUN_PAGE_URL_KEY
        from airflow.sdk.execution_time.xcom import XCom

        url = XCom.get_value(ti_key=ti_key, key=XCOM_RUN_PAGE_URL_KEY)
        return str(url) if url else ""


class SparkUILink(BaseOperatorLink):
    """The Spark master's web UI the spark-submit went to (Spark-submitting operators)."""

    name = "Spark UI"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        hook = getattr(operator, "_hook", None)  # SparkSubmitOperator's, set by execute
        master = (getattr(hook, "_connection", None) or {}).get("master")
        return spark_ui_url(master)


class DriftReportLink(BaseOperatorLink):
    """The Evidently drift report of a monitor run (``MonitorChampionOperator``)."""

    name = "Drift report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from sparktune_airflow.core.notify import ui_base

        return drift_report_url(_as_mapping(_task_result(ti_key)), ui_base())
