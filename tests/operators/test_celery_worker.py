"""The Celery configuration that has workers import MLflow once (sparktune_airflow.core.celery_worker).

The test stack's Celery workers run with it (tests/stack/), so a configuration that broke a worker
fails every stack test; here: Airflow's settings are all kept, and a Celery app built from it imports
the modules when a worker starts, without torch.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_configuration_is_airflows_own_plus_the_imports():
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
    from sparktune_airflow.core.celery_worker import CELERY_CONFIG, PRELOADED_MODULES

    assert {k: v for k, v in CELERY_CONFIG.items() if k != "imports"} == DEFAULT_CELERY_CONFIG
    assert "mlflow.tracking" in CELERY_CONFIG["imports"]
    assert set(PRELOADED_MODULES) <= set(CELERY_CONFIG["imports"])


WORKER_START = """
import sys
from celery import Celery
from sparktune_airflow.core.celery_worker import CELERY_CONFIG, PRELOADED_MODULES

app = Celery("airflow.providers.celery.executors.celery_executor", config_source=CELERY_CONFIG)
before = set(sys.modules)
app.loader.import_default_modules()  # what a worker does before it starts its pool
missing = [name for name in PRELOADED_MODULES if name not in sys.modules]
assert not missing, missing
assert "mlflow" not in before, "imported before the worker started: the check proves nothing"
assert "torch" not in sys.modules, "the worker would hold torch's memory in every process"
print("preloaded", len(set(sys.modules) - before))
"""


@pytest.mark.slow  # a fresh interpreter importing MLflow: ~11 s of a worker, make test only
def test_a_worker_built_from_it_imports_mlflow_before_its_pool_starts_and_not_torch():
    result = subprocess.run([sys.executable, "-c", WORKER_START], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preloaded" in result.stdout
