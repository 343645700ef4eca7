"""The plugins/ folder is loaded where the project runs Airflow: ``airflow plugins`` lists the
operators' links and the Models page (its FastAPI app, root middleware and the external view in the
Browse menu), and the api-server mounts the page."""

from __future__ import annotations

import json
import subprocess
import sys

from sparktune_dev.embedded.environment import embedded_env

# The api-server's app as `airflow api-server` builds it (no database is needed to build it): where
# it mounts plugin apps and which middlewares it added.
API_SERVER_APP = (
    "import json; from starlette.routing import Mount; from airflow.api_fastapi.app import create_app; "
    "app = create_app('core'); "
    "print(json.dumps({'mounts': [r.path for r in app.routes if isinstance(r, Mount)], "
    "'middlewares': [m.cls.__name__ for m in app.user_middleware]}))"
)


def test_airflow_plugins_lists_the_plugin_with_every_operator_link_and_the_models_page(tmp_path):
    env = embedded_env(tmp_path)
    found = subprocess.run(
        [sys.executable, "-m", "airflow", "plugins", "--output", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    plugins = {p["name"]: p for p in json.loads(found.stdout)}
    assert "sparktune" in plugins, plugins
    plugin = plugins["sparktune"]
    assert plugin["source"] == "$PLUGINS_FOLDER/sparktune_plugin.py"
    links = str(plugin["operator_extra_links"])
    names = ("MLflowRunLink", "MLflowModelVersionLink", "DataDocsLink", "DatabricksRunLink", "SparkUILink")
    assert all(name in links for name in names), links
    assert plugin["fastapi_apps"] == [
        {"app": "fastapi.applications.FastAPI", "url_prefix": "/sparktune", "name": "sparktune Models page"}
    ]
    assert plugin["fastapi_root_middlewares"] == [
        {"middleware": "sparktune_airflow.ui.models_app.ApiAppInScope", "name": "sparktune REST API in scope"}
    ]
    # In the UI's navigation (Browse menu), framed at /plugin/sparktune-models; the href is relative
    # to the UI's base URL, so it works under a path prefix too.
    assert plugin["external_views"] == [
        {
            "name": "Models",
            "href": "sparktune/models/",
            "url_route": "sparktune-models",
            "destination": "nav",
            "category": "browse",
        }
    ]


def test_the_api_server_mounts_the_models_page_and_its_middleware(tmp_path):
    env = embedded_env(tmp_path)
    built = subprocess.run(
        [sys.executable, "-c", API_SERVER_APP], env=env, capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr[-3000:]
    app = json.loads(built.stdout.strip().splitlines()[-1])
    assert "/sparktune" in app["mounts"], app
    assert "ApiAppInScope" in app["middlewares"], app
