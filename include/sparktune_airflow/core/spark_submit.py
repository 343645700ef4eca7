"""The Spark provider's ``SparkSubmitOperator``, imported without loading the OpenLineage listener.

``airflow.providers.apache.spark.operators.spark_submit`` binds two OpenLineage helpers when it is
imported (from ``airflow.providers.common.compat.openlineage.utils.spark``), and importing those
loads the OpenLineage listener: Airflow's ORM models (``airflow.models.taskinstance``) and the
OpenLineage client, about 0.5-0.7 s here. Every DAG file with a Spark task paid it at parse time,
although only the operator's ``execute`` calls them.

When this module is the first to import the provider's module, it binds stand-ins for those two
helpers instead: each imports the real one (the same compat module, with its own fallback when
the OpenLineage provider is absent) on its first call, at execute time, and calls it. The
stand-in module is in ``sys.modules`` only while the provider's module is being imported; any
other import of the compat module gets the real one. If the provider's module is imported
already, or the provider asks the compat module for a name the stand-in lacks, it is imported
the ordinary way. Import ``SparkSubmitOperator`` from here, not from the provider.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

PROVIDER_MODULE = "airflow.providers.apache.spark.operators.spark_submit"
OPENLINEAGE_COMPAT_MODULE = "airflow.providers.common.compat.openlineage.utils.spark"
# What the provider's module imports from the compat module (apache-airflow-providers-apache-spark 6.x).
DEFERRED_HELPERS = (
    "inject_parent_job_information_into_spark_properties",
    "inject_transport_information_into_spark_properties",
)


def deferred_helper(name: str) -> Callable[..., Any]:
    """A function that imports ``name`` from the OpenLineage compat module on its call and calls it."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(OPENLINEAGE_COMPAT_MODULE), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{OPENLINEAGE_COMPAT_MODULE}.{name}``, imported on the first call."
    return call


def import_provider_without_listener() -> None:
    """Import the provider's submit-operator module with the OpenLineage helpers deferred (see above)."""
    if PROVIDER_MODULE in sys.modules or OPENLINEAGE_COMPAT_MODULE in sys.modules:
        return  # imported already, or the listener is loaded anyway: nothing to save
    stand_in = types.ModuleType(OPENLINEAGE_COMPAT_MODULE, "Deferred OpenLineage helpers (sparktune_airflow)")
    for name in DEFERRED_HELPERS:
        setattr(stand_in, name, deferred_helper(name))
    stand_in.__all__ = list(DEFERRED_HELPERS)
    sys.modules[OPENLINEAGE_COMPAT_MODULE] = stand_in
    try:
        importlib.import_module(PROVIDER_MODULE)
    except ImportError:
        # A provider version that imports more than the stand-in has: import it as it is.
        sys.modules.pop(PROVIDER_MODULE, None)
    finally:
        if sys.modules.get(OPENLINEAGE_COMPAT_MODULE) is stand_in:
            del sys.modules[OPENLINEAGE_COMPAT_MODULE]


import_provider_without_listener()

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator  # noqa: E402

__all__ = ["SparkSubmitOperator"]
