"""Celery configuration for workers that run this project's tasks: Airflow's own, plus the modules
those tasks import, imported once by the worker when it starts.

A Celery worker forks every task process from itself (its pool process forks Airflow's supervisor,
which forks the task runner), so a module the worker imported at start costs a task nothing. Airflow
preloads its own operators that way (``on_celery_import_modules`` in the Celery provider); a task of
this pipeline then still spent most of its time importing MLflow: 2.6 of the 4 s of the stack's
``gate`` task. Celery's ``imports`` setting imports these in the worker's main process before its
pool starts. Use it with::

    AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=sparktune_airflow.core.celery_worker.CELERY_CONFIG

(``make stack`` with ``SPARKTUNE_STACK_EXECUTOR=celery`` and compose's celery profile set it).
"""

from __future__ import annotations

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

# What the tasks import when they run (the operators import them inside execute, so that parsing a
# DAG file stays cheap): the MLflow client, the registry and tracking code over it, pandas and
# pyarrow for the data steps. torch and transformers are left out: the tasks that use them run
# seconds to minutes anyway, and a worker that imported them would hold their memory all along.
PRELOADED_MODULES = (
    "mlflow",
    "mlflow.tracking",
    "pandas",
    "pyarrow.parquet",
    "sparktune.release.registry",
    "sparktune_airflow.core.mlflow",
)

CELERY_CONFIG = {
    **DEFAULT_CELERY_CONFIG,
    "imports": (*DEFAULT_CELERY_CONFIG.get("imports", ()), *PRELOADED_MODULES),
}
