"""The plugins/ folder is loaded where the project runs Airflow, and registers the operators' links."""

from __future__ import annotations

import json
import subprocess
import sys

from sparktune_dev.embedded.environment import embedded_env

LIST_PLUGINS = (
    "import json; from airflow import plugins_manager; "
    "print(json.dumps([{'name': p['name'], 'links': p.get('operator_extra_links')} "
    "for p in plugins_manager.get_plugin_info()], default=str))"
)


def test_the_embedded_airflow_loads_the_plugin_with_every_operator_link(tmp_path):
    env = embedded_env(tmp_path)
    found = subprocess.run(
        [sys.executable, "-c", LIST_PLUGINS], env=env, capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 0, found.stderr[-3000:]
    plugins = {p["name"]: p for p in json.loads(found.stdout.strip().splitlines()[-1])}
    assert "sparktune" in plugins, plugins
    links = str(plugins["sparktune"]["links"])
    names = ("MLflowRunLink", "MLflowModelVersionLink", "DataDocsLink", "DatabricksRunLink", "SparkUILink")
    assert all(name in links for name in names), links
