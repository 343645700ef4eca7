"""The floor under a run's fixed cost: the processes an ``llm_finetune`` run starts, with no work in them.

``make bench-overhead`` (``bench_overhead.py``) measures three parts, in the same bench home,
environment and Airflow database as its runs, right before and right after its run on new data
(the floor is their mean: the shared machine's load drifts within minutes):

- **dags test**: the embedded runner (``python -m sparktune_dev.embedded run``, the command the
  runs go through: ``airflow dags test`` with ``--dagfile-path``) on a generated DAG of no-op
  tasks with ``llm_finetune``'s task ids and dependencies, alone in a DAG folder of its own under
  the bench folder (it never ships). Its tasks run inside the ``airflow dags test`` process as
  ``llm_finetune``'s do, and the first starts the in-process execution API as ``validate_params``
  does. No params, no callbacks, no outlets, no XCom.
- **spark-submit**: one spark-submit of a job that starts a Spark session and stops it, through
  the Spark provider's ``SparkSubmitHook`` on ``spark_default`` with the conf ``prepare_data``'s
  submit gets (``spark.log.level``, the short-job JVM options for the source's size, the class
  archive), timed around ``submit()`` as the operator calls it. Its driver imports what the
  preparation job's driver needs beyond PySpark (Great Expectations, pandas and pyarrow for the
  UDFs) the way that job does: Great Expectations on a thread while the JVM starts.
- **imports**: what the tasks import in the ``airflow dags test`` process (the operators, MLflow's
  client and its SQL store, ``datasets``), timed in a fresh interpreter after importing what that
  process has loaded by the time a task runs (the CLI, the task runner, the execution API).

Training, evaluation and the smoke test run in processes of their own whose time is the model
tasks' (left out of the fixed cost), so their starts are not in the floor either.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FLOOR_DAG_ID = "overhead_floor"

# What the airflow dags test process has imported by the time a task's execute runs.
DAGS_TEST_PRELOADED = (
    "airflow.cli.commands.dag_command",
    "airflow.sdk.execution_time.task_runner",
    "airflow.api_fastapi.execution_api.app",
)
# What the run's tasks import in that process: the operators (the DAG file), MLflow's client and
# its SQL store (skip_unchanged_source, register, gate, the promotions, the approval), and
# datasets (materialize_dataset converting small Parquet in the task).
DAGS_TEST_TASK_IMPORTS = (
    "sparktune_airflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "datasets",
)
# What the preparation job's driver imports beyond PySpark: the quality gate, and the pandas UDFs'
# Arrow path. Great Expectations goes on a thread while the JVM starts, as the job does.
SPARK_DRIVER_BACKGROUND_IMPORTS = ("great_expectations",)
SPARK_DRIVER_IMPORTS = ("pandas", "pyarrow")

_NOOP_DAG = '''"""No-op tasks shaped like {source} (written by benchmarks/overhead_floor.py; not shipped)."""

from datetime import datetime

from airflow.sdk import DAG, BaseOperator


class NoOp(BaseOperator):
    def execute(self, context):
        return None


UPSTREAM = {upstream}

with DAG(dag_id="{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    tasks = {{task_id: NoOp(task_id=task_id) for task_id in UPSTREAM}}
    for task_id, upstream in UPSTREAM.items():
        for other in upstream:
            tasks[other] >> tasks[task_id]
'''

_SHAPE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("shape_of_dag", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
dag = next(v for v in vars(module).values() if getattr(v, "dag_id", None) == sys.argv[2])
print(json.dumps({t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks}))
"""

_NOOP_JOB = '''"""A Spark job with no work: its session starts and stops (benchmarks/overhead_floor.py)."""

import importlib
import sys
import threading

background, foreground = (names.split(",") if names else [] for names in sys.argv[1:3])
imports = threading.Thread(target=lambda: [importlib.import_module(name) for name in background], daemon=True)
imports.start()
for name in foreground:
    importlib.import_module(name)

from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("sparktune-overhead-floor").getOrCreate()
imports.join()
spark.stop()
'''

_SUBMIT = """
import json, sys, time
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
job, conf, name, args = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
hook = SparkSubmitHook(conf=conf, conn_id="spark_default", name=name, application_args=args)
started = time.perf_counter()
hook.submit(job)
print(json.dumps({"seconds": time.perf_counter() - started}))
"""

_IMPORTS = """
import importlib, json, sys, time
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
started = time.perf_counter()
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
print(json.dumps({"seconds": time.perf_counter() - started}))
"""


def _last_json(result: subprocess.CompletedProcess, what: str) -> dict[str, Any]:
    """The JSON object a helper process printed last; its output in the error when it failed."""
    if result.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def dag_shape(env: dict[str, str], dag_file: Path, dag_id: str) -> dict[str, list[str]]:
    """Every task of the DAG ``dag_id`` in ``dag_file`` and the tasks directly upstream of it."""
    result = subprocess.run(
        [sys.executable, "-c", _SHAPE, str(dag_file), dag_id], env=env, capture_output=True, text=True
    )
    return _last_json(result, f"reading the tasks of {dag_id}")


def write_noop_dag(folder: Path, shape: dict[str, list[str]], source: str) -> Path:
    """``<folder>/overhead_floor.py``: a DAG of no-op tasks with ``shape``'s ids and dependencies."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{FLOOR_DAG_ID}.py"
    path.write_text(_NOOP_DAG.format(source=source, upstream=repr(shape), dag_id=FLOOR_DAG_ID))
    return path


def submit_noop_job(env: dict[str, str], folder: Path, conf: dict[str, Any], name: str) -> float:
    """Seconds of ``SparkSubmitHook.submit`` of the no-op job, its driver importing what a
    preparation driver imports."""
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "noop_job.py"
    job.write_text(_NOOP_JOB)
    args = [",".join(SPARK_DRIVER_BACKGROUND_IMPORTS), ",".join(SPARK_DRIVER_IMPORTS)]
    command = [sys.executable, "-c", _SUBMIT, str(job), json.dumps(conf), name, json.dumps(args)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    return _last_json(result, "the no-op spark-submit")["seconds"]


def import_seconds(env: dict[str, str], preloaded: tuple[str, ...], modules: tuple[str, ...]) -> float:
    """Seconds to import ``modules`` in a fresh interpreter that has imported ``preloaded`` first."""
    command = [sys.executable, "-c", _IMPORTS, json.dumps(list(preloaded)), json.dumps(list(modules))]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    return _last_json(result, f"importing {', '.join(modules)}")["seconds"]


def measure_floor(
    env: dict[str, str],
    folder: Path,
    run_dag: Callable[[dict[str, str], str, Path], tuple[float, int]],
    shape: dict[str, list[str]],
    source_dag_id: str,
    submit_conf: dict[str, Any],
    submit_name: str,
) -> dict[str, Any]:
    """One measurement of the floor: its parts in seconds (``dags_test_s``, ``spark_submit_s``,
    ``imports_s``), their sum ``total_s``, and the no-op DAG run's exit code.

    ``shape`` is the DAG's tasks and their upstream tasks (:func:`dag_shape`); ``run_dag(env, dag_id,
    log)`` runs a DAG the way the bench's runs go and returns (seconds, exit code). The no-op DAG runs
    with ``env`` but a DAG folder of its own under ``folder``.
    """
    dags = folder / "dags"
    write_noop_dag(dags, shape, source_dag_id)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"noop-dag-{len(list(folder.glob('noop-dag-*.log'))) + 1}.log"
    seconds, code = run_dag({**env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}, FLOOR_DAG_ID, log)
    parts = {
        "dags_test_s": seconds,
        "spark_submit_s": submit_noop_job(env, folder, submit_conf, submit_name),
        "imports_s": import_seconds(env, DAGS_TEST_PRELOADED, DAGS_TEST_TASK_IMPORTS),
    }
    return {
        **{key: round(value, 2) for key, value in parts.items()},
        "total_s": round(sum(parts.values()), 2),
        "noop_dag_exit_code": code,
    }


def mean_floor(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    """Each part's mean over ``measurements``, their sum, and the measurements themselves."""
    parts = ("dags_test_s", "spark_submit_s", "imports_s")
    mean = {key: round(sum(m[key] for m in measurements) / len(measurements), 2) for key in parts}
    return {
        **mean,
        "total_s": round(sum(mean.values()), 2),
        "ran": all(m["noop_dag_exit_code"] == 0 for m in measurements),
        "measurements": measurements,
    }
