"""The project's Airflow plugin: what Airflow loads from ``plugins/`` rather than from a DAG file.

Airflow's docs: operator extra links "should be registered via Airflow Plugins or custom Airflow
Provider to work" (the api-server renders a link it knows from a plugin). The links themselves live
with the operators (``sparktune_airflow.core.links``); this file only registers them.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from sparktune_airflow.core.links import (
    DatabricksRunLink,
    DataDocsLink,
    MLflowModelVersionLink,
    MLflowRunLink,
    SparkUILink,
)


class SparktunePlugin(AirflowPlugin):
    name = "sparktune"
    operator_extra_links = [
        MLflowRunLink(),
        MLflowModelVersionLink(),
        DataDocsLink(),
        DatabricksRunLink(),
        SparkUILink(),
    ]
