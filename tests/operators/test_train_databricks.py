"""TrainModelOperator with train_backend=databricks, against a local fake of the Jobs API.

No Databricks workspace is reachable from here, so ``tests/fakes/databricks_jobs_api.py`` serves
the Jobs API over HTTP on 127.0.0.1 and really runs the submitted ``python_wheel_task`` (the
``sparktune-train`` console script) as a subprocess. Everything between the operator and that
server is the real Airflow Databricks provider: its hook (requests and aiohttp), its trigger and
its completion helpers. Training is a tiny LLaMA for a few steps, logged to a SQLite MLflow.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.databricks.hooks.databricks import DatabricksHook
from airflow.providers.databricks.triggers.databricks import DatabricksExecutionTrigger
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from sparktune.core.params import by_section, parse_params
from sparktune_airflow import TrainModelOperator
from sparktune_airflow.model.databricks_training import build_run_payload, run_token

try:
    from tests.fakes.databricks_jobs_api import FakeJobsApi
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from fakes.databricks_jobs_api import FakeJobsApi
    from unit import tiny_model

pytestmark = [pytest.mark.databricks, pytest.mark.slow]

WHEEL = "/Volumes/main/ml/wheels/sparktune-0.1.0-py3-none-any.whl"
# A few LoRA steps on the tiny model: the run costs its imports and the MLflow model check.
FAST = {
    "train_backend": "databricks",
    "num_workers": 1,
    "databricks_runtime": "16.4.x-cpu-ml-scala2.12",
    "databricks_node_type": "i3.xlarge",
    "databricks_workers": 2,
    "databricks_wheel": WHEEL,
    "peft_method": "lora",
    "lora_target_modules": "q_proj,v_proj",
    "learning_rate": 1e-2,
    "max_steps": 2,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "warmup_ratio": 0.0,
    "max_length": 64,
    "seed": 7,
}


class FakeTI:
    """What the operator reads from ``context["ti"]``, and the XComs it pushes."""

    def __init__(
        self, task_id: str, dag_id: str = "llm_finetune", run_id: str = "manual__2026-01-01"
    ) -> None:
        self.dag_id, self.run_id, self.task_id, self.try_number = dag_id, run_id, task_id, 1
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def context_for(task_id: str) -> dict[str, Any]:
    return {"ti": FakeTI(task_id), "params": {}}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with FakeJobsApi(tmp_path_factory.mktemp("fake-databricks")) as server:
        yield server


@pytest.fixture(scope="module")
def env(tmp_path_factory, api):
    """Own SPARKTUNE_HOME and MLflow store; the connection points at the fake."""
    home = tmp_path_factory.mktemp("databricks-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKTUNE_HOME", str(home))
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
        mp.setenv("AIRFLOW_CONN_DATABRICKS_DEFAULT", api.connection_json())
        # One intra-op thread: faster for a model this small on a shared 2-core machine.
        mp.setenv("OMP_NUM_THREADS", "1")
        yield home


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return tiny_model.workspace(tmp_path_factory.getbasetemp() / "tiny-llama-databricks")


def make_operator(
    workspace: Path, task_id: str, deferrable: bool = False, **overrides: Any
) -> TrainModelOperator:
    return TrainModelOperator(
        task_id=task_id,
        dataset_uri=str(overrides.pop("dataset_uri", workspace / "data")),
        base_model=str(workspace / "model"),
        data_fingerprint="fp-tiny",
        **_train_sections({**FAST, **overrides}),
        deferrable=deferrable,
        polling_period_seconds=1,
    )


def _train_sections(flat: dict[str, Any]) -> dict[str, Any]:
    sections = by_section(flat)
    return {key: sections[key] for key in ("training", "backend", "preparation")}


def submitted_tokens(api: FakeJobsApi, key: str) -> list[str]:
    """The idempotency tokens of every runs/submit for ``key`` (and its later tokens), in order."""
    return [p["idempotency_token"] for p in api.submits() if p.get("idempotency_token", "").startswith(key)]


def runs_of(api: FakeJobsApi, token: str) -> list:
    return [run for run in api.runs.values() if run.payload.get("idempotency_token") == token]


def train_key(operator: TrainModelOperator, context: dict[str, Any]) -> str:
    return operator._train_key(context, operator._params())


def mlflow_run(run_id: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"]).get_run(run_id)


# -- 1. the payload


def test_payload_is_one_wheel_task_on_a_new_cluster():
    params = parse_params({**FAST, "num_workers": 4, "databricks_workers": 3})
    request = {"run_name": "llm_finetune-manual__1", "train_key": "k" * 24, "params": {"lora_r": 16}}
    payload = build_run_payload(request, params, timeout_seconds=3600)

    assert payload["run_name"] == "llm_finetune-manual__1"
    assert payload["idempotency_token"] == "k" * 24
    assert payload["timeout_seconds"] == 3600
    (task,) = payload["tasks"]
    assert task["task_key"] == "train"
    cluster = task["new_cluster"]
    assert cluster["spark_version"] == "16.4.x-cpu-ml-scala2.12"
    assert cluster["node_type_id"] == "i3.xlarge"
    assert cluster["num_workers"] == 3
    assert all(isinstance(v, str) for v in cluster["spark_env_vars"].values())
    assert "spark_conf" not in cluster  # a multi-node cluster needs no single-node profile
    assert task["libraries"] == [{"whl": WHEEL}]
    wheel_task = task["python_wheel_task"]
    assert (wheel_task["package_name"], wheel_task["entry_point"]) == ("sparktune", "sparktune-train")
    args = wheel_task["parameters"]
    assert json.loads(args[args.index("--request-json") + 1]) == request
    assert args[args.index("--num-workers") + 1] == "4"
    assert args[args.index("--distributor") + 1] == "spark"

    single = build_run_payload(request, parse_params({**FAST, "num_workers": 1, "databricks_workers": 0}))
    (task,) = single["tasks"]
    assert task["new_cluster"]["spark_conf"]["spark.databricks.cluster.profile"] == "singleNode"
    assert task["new_cluster"]["custom_tags"] == {"ResourceClass": "SingleNode"}
    assert task["python_wheel_task"]["parameters"][-1] == "none"
    assert "timeout_seconds" not in single
    assert run_token("k" * 24, 2) == "k" * 24 + "-2"


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda p: p.pop("tasks"), "Missing required field: tasks"),
        (lambda p: p["tasks"][0].pop("python_wheel_task"), "exactly one of"),
        (lambda p: p["tasks"][0]["new_cluster"].pop("spark_version"), "new_cluster.spark_version"),
        (lambda p: p["tasks"][0]["new_cluster"].pop("node_type_id"), "node_type_id or instance_pool_id"),
        (lambda p: p["tasks"][0]["new_cluster"].pop("num_workers"), "num_workers or autoscale"),
        (lambda p: p["tasks"][0]["python_wheel_task"].pop("entry_point"), "python_wheel_task.entry_point"),
        (lambda p: p.update(idempotency_token="x" * 65), "at most 64 characters"),
    ],
)
def test_fake_rejects_what_the_api_rejects(env, api, breakage, message):
    payload = build_run_payload({"run_name": "r", "train_key": "bad"}, parse_params(FAST))
    breakage(payload)
    with pytest.raises(AirflowException, match="Status Code: 400") as info:
        DatabricksHook(retry_limit=1).submit_run(payload)
    assert message in str(info.value)


# -- 2. the sync path, end to end


@pytest.fixture(scope="module")
def sync_run(env, api, workspace):
    """One real training through the sync path; the retry test reuses it."""
    operator = make_operator(workspace, "train")
    context = context_for("train")
    started = time.monotonic()
    result = operator.execute(context)
    return operator, context, result, time.monotonic() - started


def test_sync_path_submits_once_and_returns_the_mlflow_result(api, sync_run):
    operator, context, result, seconds = sync_run
    key = train_key(operator, context)
    params = operator._params()

    assert submitted_tokens(api, key) == [key]
    (submitted,) = [p for p in api.submits() if p.get("idempotency_token") == key]
    assert submitted == build_run_payload(operator._request(context, params), params)
    assert submitted["idempotency_token"] == key

    (run,) = runs_of(api, key)
    assert (run.life_cycle_state, run.result_state, run.exit_code) == ("TERMINATED", "SUCCESS", 0)
    assert operator.databricks_run_id == run.run_id
    assert context["ti"].xcoms["run_page_url"] == run.run_page_url
    assert context["ti"].xcoms["run_id"] == run.run_id

    assert result["mlflow_run_id"] and result["global_steps"] == 2 and not result["reused"]
    trained = mlflow_run(result["mlflow_run_id"])
    assert trained.info.status == "FINISHED"
    assert trained.data.tags["sparktune.train_key"] == key
    assert trained.data.tags["sparktune.train_backend"] == "databricks"
    print(f"sync databricks path: {seconds:.1f} s")


# -- 4. a retry reattaches instead of submitting a second run


def test_a_retry_after_success_reuses_the_run_without_submitting(api, sync_run, workspace):
    first, context, result, _ = sync_run
    key = train_key(first, context)
    (run,) = runs_of(api, key)
    pid = run.pid

    retry = make_operator(workspace, "train")
    again = retry.execute(context_for("train"))

    assert again["mlflow_run_id"] == result["mlflow_run_id"] and again["reused"]
    # The finished MLflow run of the key answers the retry: nothing is submitted again. (A retry
    # while the run is live gets it back through the idempotency token: see the deferral test.)
    assert retry.databricks_run_id is None
    assert submitted_tokens(api, key) == [key]
    (same,) = runs_of(api, key)  # one run, one process, ever
    assert same.pid == pid


# -- 3. deferral, a retry while deferred, and the trigger's resume


def test_deferrable_path_defers_and_resumes_from_the_trigger_event(env, api, workspace):
    operator = make_operator(workspace, "train_deferred", deferrable=True)
    context = context_for("train_deferred")
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, DatabricksExecutionTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert trigger.run_id == operator.databricks_run_id
    assert trigger.run_page_url == context["ti"].xcoms["run_page_url"]

    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)

    # A retry while the run is live reattaches to it and defers again.
    with pytest.raises(TaskDeferred) as again:
        make_operator(workspace, "train_deferred", deferrable=True).execute(context_for("train_deferred"))
    assert again.value.trigger.run_id == trigger.run_id
    assert len(runs_of(api, train_key(operator, context))) == 1

    async def first_event():
        async for event in rebuilt.run():
            return event

    event = asyncio.run(asyncio.wait_for(first_event(), timeout=300))
    assert event.payload["run_id"] == trigger.run_id
    result = make_operator(workspace, "train_deferred", deferrable=True).execute_complete(
        context, event.payload
    )
    assert mlflow_run(result["mlflow_run_id"]).data.tags["sparktune.train_key"] == train_key(
        operator, context
    )


# -- 5. on_kill cancels; a failed run fails the try and the retry submits anew


def test_on_kill_cancels_the_running_run_and_its_process(env, api, workspace):
    operator = make_operator(workspace, "train_killed", max_steps=100_000)
    context = context_for("train_killed")
    raised: list[BaseException] = []

    def execute() -> None:
        try:
            operator.execute(context)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            raised.append(exc)

    worker = threading.Thread(target=execute, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while operator.databricks_run_id is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run = api.wait_for(operator.databricks_run_id, ["RUNNING"], timeout=60)
    time.sleep(2)  # let the training process get going
    assert run.process.poll() is None

    operator.on_kill()

    run = api.wait_for(run.run_id, ["TERMINATED"], timeout=60)
    assert (run.result_state, run.user_cancelled_or_timedout) == ("CANCELED", True)
    assert [r.body["run_id"] for r in api.requests_to("jobs/runs/cancel")] == [run.run_id]
    assert run.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(run.pid, 0)  # nothing of the process group is left
    worker.join(timeout=30)
    assert len(raised) == 1 and isinstance(raised[0], AirflowException)
    assert "CANCELED" in str(raised[0]) and run.run_page_url in str(raised[0])


def test_failed_run_raises_a_retryable_error_naming_the_run_page(env, api, workspace, tmp_path):
    def attempt() -> AirflowException:
        operator = make_operator(workspace, "train_failing", dataset_uri=tmp_path / "no-such-dataset")
        with pytest.raises(AirflowException) as info:
            operator.execute(context_for("train_failing"))
        return info.value

    error = attempt()
    assert not isinstance(error, AirflowFailException)  # a lost cluster is worth a retry
    key = train_key(make_operator(workspace, "train_failing"), context_for("train_failing"))
    (failed,) = runs_of(api, key)
    assert failed.result_state == "FAILED"
    assert "FAILED" in str(error) and failed.run_page_url in str(error)
    assert "no-such-dataset" in str(error)  # the task's error, from runs/get-output

    # The retry does not reattach to the failed run: it submits under the key's next token.
    error = attempt()
    (second,) = runs_of(api, run_token(key, 1))
    assert second.run_id != failed.run_id and second.run_page_url in str(error)
    assert submitted_tokens(api, key) == [key, key, run_token(key, 1)]


# -- errors a user can hit: cause and fix in one message


def test_missing_connection_and_rejected_payload_say_how_to_fix_them(env, api, workspace):
    operator = make_operator(workspace, "train_noconn")
    operator.databricks_conn_id = "databricks_missing"
    with pytest.raises(AirflowFailException, match="not defined") as info:
        operator.execute(context_for("train_noconn"))
    assert "AIRFLOW_CONN_DATABRICKS_MISSING" in str(info.value)

    operator = make_operator(workspace, "train_rejected")
    params = operator._params()
    payload = build_run_payload({"run_name": "r", "train_key": "rejected"}, params)
    del payload["tasks"][0]["new_cluster"]["spark_version"]
    with pytest.raises(AirflowFailException, match="HTTP 400") as info:
        operator._submit(operator._databricks_hook, payload, params)
    assert "Missing required field" in str(info.value) and "databricks_runtime" in str(info.value)


def test_rejected_token_fails_at_once(env, api, workspace, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_DATABRICKS_STALE", json.dumps({**api.connection(), "password": "stale"}))
    operator = make_operator(workspace, "train_stale")
    operator.databricks_conn_id = "databricks_stale"
    with pytest.raises(AirflowFailException, match="HTTP 401"):
        operator.execute(context_for("train_stale"))
