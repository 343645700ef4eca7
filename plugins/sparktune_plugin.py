"""The project's Airflow plugin: what Airflow loads from ``plugins/`` rather than from a DAG file.

- The operators' extra links. Airflow's docs: operator extra links "should be registered via
  Airflow Plugins or custom Airflow Provider to work" (the api-server renders a link it knows from a
  plugin). The links themselves live with the operators (``sparktune_airflow.core.links``).
- The Models page (docs/decisions/0027-models-page-in-the-airflow-ui.md): a FastAPI app on the
  api-server under ``/sparktune``, shown in the UI's Browse menu by an external view, and a root
  middleware that lets it call the REST API in process. It lives in ``sparktune_airflow.ui``.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from sparktune_airflow.core.links import (
    DatabricksRunLink,
    DataDocsLink,
    DriftReportLink,
    MLflowModelVersionLink,
    MLflowRunLink,
    SparkUILink,
)
from sparktune_airflow.ui.models_app import PAGE_PATH, URL_PREFIX, ApiAppInScope, create_app

MODELS_PAGE = {
    "name": "Models",
    # Relative (no leading slash): the UI resolves it against its base URL, and frames it.
    "href": f"{URL_PREFIX.strip('/')}/{PAGE_PATH}",
    "url_route": "sparktune-models",
    "destination": "nav",
    "category": "browse",
}


class SparktunePlugin(AirflowPlugin):
    name = "sparktune"
    operator_extra_links = [
        MLflowRunLink(),
        MLflowModelVersionLink(),
        DataDocsLink(),
        DatabricksRunLink(),
        SparkUILink(),
        DriftReportLink(),
    ]
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "sparktune Models page"}]
    fastapi_root_middlewares = [{"middleware": ApiAppInScope, "name": "sparktune REST API in scope"}]
    external_views = [MODELS_PAGE]
