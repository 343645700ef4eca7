"""A Databricks token planted in the ``databricks_default`` connection leaks nowhere.

The connection is defined as a user would define it, ``AIRFLOW_CONN_DATABRICKS_DEFAULT`` (JSON,
the token as its password), for the Airflow process only. A one-task DAG (``train`` as
``llm_finetune`` builds it: ``TrainModelOperator``, deferrable, params from the trigger form,
the DAG defaults) runs with ``airflow dags test`` on embedded defaults (SQLite metadata, the
OpenLineage file transport, SQLite MLflow) against the fake Jobs API (``tests/fakes``), which
really runs the training job. Then the token is searched in everything the run left: the task's
console output and log files, every XCom, the rendered template fields, every MLflow param and
tag (runs, experiments, model versions), every OpenLineage event, and what Databricks received:
each request's body and query (the run's payload: its parameters and cluster environment) and
the job's own output. Only the ``Authorization`` header may carry it, and must (the fake answers
401 without it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sparktune_dev.embedded.environment import embedded_env

try:
    from tests.e2e.dag_runs import SESSION_ONLY
    from tests.fakes.databricks_jobs_api import FakeJobsApi
    from tests.operators.test_train_databricks import FAST
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from e2e.dag_runs import SESSION_ONLY
    from fakes.databricks_jobs_api import FakeJobsApi
    from operators.test_train_databricks import FAST
    from unit import tiny_model

pytestmark = [pytest.mark.databricks, pytest.mark.slow]

TOKEN = "dapi-PLANTED-4f9c2e7a1b-secret"
DAG_ID = "databricks_token_probe"
CONF = FAST  # a few LoRA steps of the tiny model, train_backend=databricks
DAG_FILE = """
from airflow.sdk import DAG
from sparktune_airflow.core.dag_defaults import RETRY_DEFAULTS
from sparktune_airflow import TrainModelOperator
from sparktune_airflow.core.params import form_params

with DAG(
    {dag_id!r},
    schedule=None,
    params=form_params(),
    render_template_as_native_obj=True,
    default_args={{**RETRY_DEFAULTS, "retries": 0}},
    tags=["test"],
    description="canary-5e1d: the search sees what the run stored",
):
    TrainModelOperator(
        task_id="train",
        dataset_uri="{{{{ '{dataset}' }}}}",
        base_model={base_model!r},
        data_fingerprint="fp-tiny",
        # The run's conf: train_backend=databricks.
        training={{"max_steps": "{{{{ params.max_steps }}}}"}},
        backend={{
            k: "{{{{ params." + k + " }}}}" for k in ("train_backend", "databricks_wheel", "num_workers")
        }},
        deferrable=True,
        polling_period_seconds=1,
    )
"""


def _texts(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` as text, SQLite databases and binary files included (the token
    is ASCII: it would show up in them as it is)."""
    return {str(p): p.read_bytes().decode("latin-1") for p in folder.rglob("*") if p.is_file()}


def _airflow_db(home: Path, query: str) -> list[tuple]:
    with sqlite3.connect(home / "airflow" / "airflow.db") as db:
        return db.execute(query).fetchall()


def _mlflow_records(tracking_uri: str) -> dict[str, str]:
    """Params and tags of every MLflow run, experiment and model version in the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    seen = {}
    experiments = client.search_experiments()
    for experiment in experiments:
        seen[f"mlflow experiment {experiment.name}"] = json.dumps(experiment.tags)
        for run in client.search_runs([experiment.experiment_id], max_results=1000):
            data = {"params": run.data.params, "tags": run.data.tags, "metrics": list(run.data.metrics)}
            seen[f"mlflow run {run.info.run_id}"] = json.dumps(data)
    for version in client.search_model_versions(max_results=1000):
        seen[f"mlflow version {version.name}/{version.version}"] = json.dumps(version.tags)
    return seen


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    """The DAG run, and where its traces are; the fake Jobs API stays up for the assertions."""
    root = tmp_path_factory.mktemp("databricks-token")
    home, dags = root / "home", root / "dags"
    dags.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    base["SPARKTUNE_HOME"] = str(home)  # models/runs/<key> (the job's output dir) too
    env = embedded_env(home, base=base)
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    env["OMP_NUM_THREADS"] = "1"
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # The metadata database migrates while the tiny model and dataset are built.
    migrate = subprocess.Popen(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    workspace = tiny_model.workspace(tmp_path_factory.getbasetemp() / "tiny-llama-databricks")
    (dags / f"{DAG_ID}.py").write_text(
        DAG_FILE.format(dag_id=DAG_ID, dataset=workspace / "data", base_model=str(workspace / "model"))
    )
    output, _ = migrate.communicate(timeout=300)
    assert migrate.returncode == 0, output[-3000:]
    migrated = time.monotonic()
    with FakeJobsApi(root / "fake-databricks", token=TOKEN) as api:
        env["AIRFLOW_CONN_DATABRICKS_DEFAULT"] = api.connection_json()  # the token as its password
        assert TOKEN in env["AIRFLOW_CONN_DATABRICKS_DEFAULT"]
        result = subprocess.run(
            [sys.executable, "-m", "airflow", "dags", "test", DAG_ID, "--conf", json.dumps(CONF)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        (home / "dags-test.log").write_text(result.stdout + result.stderr)
        print(
            f"databricks token probe: {time.monotonic() - started:.1f} s "
            f"(migrate + tiny model {migrated - started:.1f} s)"
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
        yield home, env, api, result


def test_the_planted_databricks_token_leaks_nowhere(probe_run):
    home, env, api, result = probe_run
    seen: dict[str, str] = {"task output": result.stdout + result.stderr}
    # Everything the run wrote: task logs, the Airflow and MLflow databases, MLflow artifacts,
    # the lineage file, the job's output folder; then the same, item by item, named.
    seen.update(_texts(home))
    seen.update(_texts(api.workdir))  # the fake workspace: the job's driver log
    xcoms = _airflow_db(home, f"select task_id, key, value from xcom where dag_id = '{DAG_ID}'")
    for task_id, key, value in xcoms:
        # Text, bytes, or a number (each key of a multiple_outputs result is a row of its own).
        if isinstance(value, bytes | bytearray | memoryview):
            value = bytes(value).decode(errors="replace")
        seen[f"xcom {task_id} {key}"] = str(value)
    rendered = _airflow_db(
        home, f"select task_id, rendered_fields from rendered_task_instance_fields where dag_id = '{DAG_ID}'"
    )
    for task_id, fields in rendered:
        seen[f"rendered {task_id}"] = fields
    seen["triggers"] = json.dumps(_airflow_db(home, "select classpath, kwargs from trigger"), default=str)
    seen["lineage"] = (home / "lineage" / "events.jsonl").read_text()
    seen.update(_mlflow_records(env["MLFLOW_TRACKING_URI"]))
    for i, request in enumerate(api.requests):
        seen[f"databricks {request.method} {request.path} #{i}"] = json.dumps([request.query, request.body])
    for run in api.runs.values():
        seen[f"databricks run {run.run_id} command"] = json.dumps(run.command)
        seen[f"databricks run {run.run_id} output"] = run.log_path.read_text(errors="replace")

    # Everything looked at is there: the search is not vacuous.
    (submitted,) = api.submits()
    (run,) = api.runs.values()
    assert run.result_state == "SUCCESS"  # every call carried the token, in its Authorization header
    assert f"Databricks run {run.run_id}" in seen["task output"]  # the task's own log lines
    assert {key for _, key, _ in xcoms} >= {"return_value", "run_id", "run_page_url"}
    assert [task for task, _ in rendered] == ["train"] and "dataset_uri" in rendered[0][1]
    events = [json.loads(line) for line in seen["lineage"].splitlines()]
    assert {e["eventType"] for e in events if e["job"]["name"].endswith(".train")} >= {"START", "COMPLETE"}
    assert any(k.startswith("mlflow run") and "sparktune.train_key" in v for k, v in seen.items())
    assert "spark_env_vars" in json.dumps(submitted) and "--request-json" in json.dumps(submitted)

    assert any("canary-5e1d" in text for where, text in seen.items() if where.endswith("airflow.db"))
    leaked = sorted(where for where, text in seen.items() if TOKEN in text)
    assert not leaked, leaked
