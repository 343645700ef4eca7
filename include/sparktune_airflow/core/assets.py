"""The Airflow Assets that tie the DAGs into a loop.

- ``training_source``: the labelled texts ``llm_finetune`` trains on. A DAG or system that lands new
  data emits its event (an ``outlets=[training_source_asset()]`` task, or
  ``POST /api/v2/assets/events``) and a retraining run follows.
- ``feedback``: the feedback table's human corrections (``record_corrections`` emits it).
- ``scored_traffic``: the texts the champion scored (batch inference's rows in the feedback table);
  ``batch_inference`` emits it and ``monitor_champion`` runs after it.
- ``champion``: the ``champion`` alias of a registered model. ``llm_finetune``'s promotion emits
  it with ``{"model_name", "version", "previous_version"}`` as the event's extra;
  ``batch_inference`` is scheduled on it and scores with the model the event names.

URIs are fixed when a DAG file is parsed, from the same settings the tasks read
(``SPARKTUNE_HOME``, ``SPARKTUNE_LAKE_URI``, ``SPARKTUNE_FEEDBACK_URI``,
``SPARKTUNE_SOURCE_ASSET_URI``), so the scheduler and the tasks agree on them.
"""

from __future__ import annotations

import os

from airflow.sdk import Asset
from sparktune.core.config import settings

SOURCE_ASSET_ENV = "SPARKTUNE_SOURCE_ASSET_URI"
CHAMPION_ASSET_NAME = "sparktune_champion"


def _uri(location: str) -> str:
    return location if "://" in location else f"file://{location}"


def training_source_asset() -> Asset:
    """The training source: ``SPARKTUNE_SOURCE_ASSET_URI``, else the demo data under SPARKTUNE_HOME."""
    location = os.environ.get(SOURCE_ASSET_ENV) or str(settings().demo_source_path)
    return Asset(name="sparktune_training_source", uri=_uri(location), group="training_data")


def feedback_asset() -> Asset:
    return Asset(name="sparktune_feedback", uri=_uri(settings().feedback_uri), group="training_data")


def scored_traffic_asset() -> Asset:
    """Batch inference's scored rows in the feedback table (the serving captures have no event)."""
    uri = _uri(f"{settings().feedback_uri.rstrip('/')}/predictions")
    return Asset(name="sparktune_scored_traffic", uri=uri, group="monitoring")


def champion_asset() -> Asset:
    """One asset for every model's champion alias; the event's extra names the model and version."""
    return Asset(name=CHAMPION_ASSET_NAME, uri="x-sparktune://mlflow-registry/champion", group="model")
