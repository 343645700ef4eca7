"""TrainModelOperator on the local and spark backends, for real.

The spark test starts a standalone Spark cluster on 127.0.0.1 from the pyspark wheel (a Master
and a Worker with two cores, as `spark-class` runs them on any cluster), submits the training
entry point to it with spark-submit, and TorchDistributor runs DDP (gloo) in two processes on the
executor.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    import tiny_model

pytestmark = pytest.mark.slow


@dataclass
class FakeTaskInstance:
    dag_id: str = "llm_finetune"
    run_id: str = "manual__2026-11-23"
    task_id: str = "train"
    try_number: int = 1
    xcom: dict = field(default_factory=dict)
    stats_tags: dict = field(default_factory=dict)

    def xcom_push(self, key, value):
        self.xcom[key] = value


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, monkeypatch_module):
    root = tiny_model.workspace(tmp_path_factory.mktemp("backends"))
    home = root / "home"
    monkeypatch_module.setenv("SPARKTUNE_HOME", str(home))
    monkeypatch_module.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
    monkeypatch_module.setenv("OMP_NUM_THREADS", "1")
    return root


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _params(**overrides):
    from sparktune.core.params import default_params

    params = default_params()
    params.update(
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        warmup_ratio=0.0,
        max_length=128,
        lora_modules_to_save="lm_head",
        learning_rate=1e-2,
        max_steps=20,
        checkpoint_steps=10,
        model_name="tiny-backends",
    )
    params.update(overrides)
    return params


def _operator(workspace: Path, pipeline_params: dict | None = None, **kwargs):
    from sparktune.core.params import by_section
    from sparktune_airflow import TrainModelOperator

    sections = by_section(pipeline_params or {})
    return TrainModelOperator(
        model_name=(pipeline_params or {}).get("model_name", "support-intent"),
        training=sections["training"],
        backend=sections["backend"],
        preparation=sections["preparation"],
        task_id="train",
        dataset_uri=str(workspace / "data"),
        base_model=str(workspace / "model"),
        data_fingerprint="fp-backends",
        **kwargs,
    )


class TaskStateStore:
    """What ``context["task_state_store"]`` offers an operator (``get``/``set``), kept in memory.
    Airflow scopes it by dag, run and task, so that every try of a task instance sees it."""

    def __init__(self) -> None:
        self.values: dict = {}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value, *, retention=None):
        self.values[key] = json.loads(json.dumps(value))  # stored as JSON, as Airflow does


_STORES: dict[tuple, TaskStateStore] = {}


def _store(run_id: str) -> TaskStateStore:
    return _STORES.setdefault(("llm_finetune", run_id, "train"), TaskStateStore())


def _context(params: dict, **ti) -> dict:
    instance = FakeTaskInstance(**ti)
    return {"ti": instance, "params": params, "task_state_store": _store(instance.run_id)}


def _stored_submission(run_id: str):
    from sparktune_airflow.model import training_process

    value = _store(run_id).get("sparktune_training")
    return training_process.Submission.from_json(value) if value else None


def _client():
    from mlflow import MlflowClient

    # Explicit: an earlier test module may have left MLflow's global tracking URI elsewhere.
    return MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])


def _runs_of(key_filter: str):
    client = _client()
    experiment = client.get_experiment_by_name("sparktune-tiny-backends")
    return client.search_runs([experiment.experiment_id], key_filter) if experiment else []


def test_local_backend_trains_streams_the_log_and_a_retry_reuses_the_run(workspace, capsys):
    operator = _operator(workspace, pipeline_params=_params())
    context = _context(_params(), run_id="local-1")
    result = operator.execute(context)
    assert result["global_steps"] == 20 and not result["reused"]
    # The subprocess's own log lines reached the task log (Airflow's structlog writes to stdout here).
    assert "Trained 20 steps" in capsys.readouterr().out

    again = _operator(workspace, pipeline_params=_params()).execute(
        _context(_params(), run_id="local-1", try_number=2)
    )
    assert again["reused"] and again["mlflow_run_id"] == result["mlflow_run_id"]
    runs = _runs_of(f"tags.`sparktune.train_key` = '{operator._train_key(context, operator._params())}'")
    assert len(runs) == 1


def test_a_retry_reattaches_to_the_live_process_instead_of_starting_another(workspace, capsys):
    from sparktune_airflow.model import training_process

    params = _params(max_steps=60)
    first = _operator(workspace, pipeline_params=params)
    context = _context(params, run_id="reattach-1")
    request = first._request(context, first._params())
    work = Path(request["output_dir"])
    # The first attempt's process, left running as if its task runner had died after keeping it in
    # the task state store.
    command = first._process_command(request, first._params(), work)
    orphan, submission = training_process.start(command, dict(os.environ), work, "local")
    context["task_state_store"].set("sparktune_training", submission.to_json())

    retry = _operator(workspace, pipeline_params=params)
    result = retry.execute(_context(params, run_id="reattach-1", try_number=2))
    orphan.wait()
    assert "Reattaching to training process" in capsys.readouterr().out
    stored = _stored_submission("reattach-1")
    assert stored.pid == orphan.pid and stored.ended  # no second process was started
    assert result["global_steps"] == 60 and not result["reused"]
    assert len(_runs_of(f"tags.`sparktune.train_key` = '{request['train_key']}'")) == 1


def test_a_retry_on_another_host_refuses_to_train_a_second_time_until_the_first_has_ended(workspace):
    """Celery may run a retry on another worker host, which cannot see the first try's process: it
    must fail saying where the training runs and how to go on, not start a second one beside it."""
    from airflow.sdk.exceptions import AirflowException
    from sparktune_airflow.model import training_process

    params = _params(max_steps=10, checkpoint_steps=10)
    operator = _operator(workspace, pipeline_params=params)
    context = _context(params, run_id="other-host-1")
    request = operator._request(context, operator._params())
    work = Path(request["output_dir"])
    # What the first try kept on the worker "gpu-worker-2" before its task runner died there.
    elsewhere = training_process.Submission(
        pid=4242,
        create_time=time.time() - 60,
        command=["python", "-m", "sparktune.jobs.train"],
        log_path=str(work / training_process.LOG_NAME),
        backend="local",
        host="gpu-worker-2",
    )
    context["task_state_store"].set("sparktune_training", elsewhere.to_json())

    with pytest.raises(AirflowException) as failed:
        _operator(workspace, pipeline_params=params).execute(
            _context(params, run_id="other-host-1", try_number=2)
        )
    message = str(failed.value)
    assert "started on host gpu-worker-2 (pid 4242" in message
    state_key = (
        "/api/v2/dags/llm_finetune/dagRuns/other-host-1/taskInstances/train/state-store/sparktune_training"
    )
    assert f"delete the task state key (DELETE {state_key}) and clear this task" in message
    assert _stored_submission("other-host-1") == elsewhere  # nothing was started here
    assert not _runs_of(f"tags.`sparktune.train_key` = '{request['train_key']}'")

    # Once the training is known to have ended (the attempt following it marks it), a retry
    # anywhere trains the key, resuming from its checkpoints.
    context["task_state_store"].set("sparktune_training", elsewhere.ended_now().to_json())
    result = _operator(workspace, pipeline_params=params).execute(
        _context(params, run_id="other-host-1", try_number=3)
    )
    assert result["global_steps"] == 10
    stored = _stored_submission("other-host-1")
    assert stored.host == training_process.this_host() and stored.ended


def test_on_kill_stops_the_training_process(workspace):
    import threading

    params = _params(max_steps=100000, checkpoint_steps=100000)
    operator = _operator(workspace, pipeline_params=params)
    context = _context(params, run_id="kill-1")
    errors: list[BaseException] = []

    def run():
        try:
            operator.execute(context)
        except BaseException as exc:  # the task fails once its process is gone
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while operator._submission is None and time.monotonic() < deadline:
        time.sleep(0.1)
    submission = operator._submission
    assert submission is not None and submission.process() is not None
    assert _stored_submission("kill-1") == submission  # kept before the log is followed
    operator.on_kill()
    thread.join(60)
    assert submission.process() is None
    assert errors and "exited with code" in str(errors[0])
    # Marked ended: a retry on another worker host may train the key again.
    assert _stored_submission("kill-1").ended


def test_train_timeout_minutes_is_the_time_limit_and_reaching_it_stops_the_training(workspace):
    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.task_runner import _run_execute_callable

    params = _params(max_steps=100000, checkpoint_steps=100000, train_timeout_minutes=0.25)
    operator = _operator(workspace, pipeline_params=params)
    context = _context(params, run_id="timeout-1")
    operator.pre_execute(context)
    assert operator.execution_timeout == timedelta(seconds=15)
    # What the task runner does with execution_timeout: a SIGALRM, then on_kill.
    with pytest.raises(AirflowTaskTimeout):
        _run_execute_callable(context, operator.execute, operator)
    record = _stored_submission("timeout-1")
    assert record is not None, "the training had not started after 15 s"
    deadline = time.monotonic() + 30
    while record.process() is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert record.process() is None  # stopped, not left running for the next attempt to find


# --------------------------------------------------------------------------------------------
# spark: a real standalone cluster (the standalone_cluster fixture is in conftest.py)


@pytest.mark.spark
def test_spark_backend_runs_ddp_with_two_processes_on_a_standalone_cluster(
    workspace, standalone_cluster, monkeypatch
):
    from sparktune_airflow import RegisterModelOperator

    host, port = standalone_cluster["master"].rsplit(":", 1)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": host, "port": int(port)})
    )
    params = _params(train_backend="spark", num_workers=2, max_steps=20)
    operator = _operator(
        workspace,
        pipeline_params=params,
        spark_conf={
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.OMP_NUM_THREADS": "1",
            "spark.executor.memory": "3g",
        },
    )
    result = operator.execute(_context(params, run_id="spark-1"))

    client = _client()
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["world_size"] == 2
    assert run.data.tags["sparktune.train_backend"] == "spark"
    assert result["global_steps"] == 20
    # Both ranks fed every optimizer step: twice the examples of one process.
    assert run.data.metrics["train_tokens"] > 0

    apps = json.load(urllib.request.urlopen(f"{standalone_cluster['ui']}/json/", timeout=5))
    assert any(app["name"].startswith("sparktune-train-") for app in apps["completedapps"])

    register = RegisterModelOperator(
        task_id="register", run_id=result["mlflow_run_id"], model_name="tiny-spark"
    )
    registered = register.execute(_context(params, run_id="spark-1", task_id="register"))
    # A retry of the training task does not train or register again.
    again = _operator(workspace, pipeline_params=params).execute(
        _context(params, run_id="spark-1", try_number=2)
    )
    assert again["reused"] and again["mlflow_run_id"] == result["mlflow_run_id"]
    versions = client.search_model_versions("name = 'tiny-spark'")
    assert [str(v.version) for v in versions] == [str(registered["version"])]


@pytest.mark.spark
def test_batch_inference_scores_on_the_same_cluster_with_only_the_connection_changed(
    workspace, standalone_cluster, monkeypatch, tmp_path
):
    """BatchInferenceOperator spark-submits the scoring job to the standalone master: the model
    trained above, promoted to champion, scores on the cluster's executors."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    import pyarrow.parquet as pq
    from sparktune.release.registry import CHAMPION, move_alias
    from sparktune_airflow import BatchInferenceOperator

    client = _client()
    [version] = client.search_model_versions("name = 'tiny-spark'")  # the spark test's model
    move_alias(client, "tiny-spark", CHAMPION, str(version.version), actor="test", reason="score it")
    incoming = tmp_path / "incoming.jsonl"
    texts = ["where is my parcel", "refund my order please", "the app crashes at login", "hi"] * 10
    incoming.write_text(
        "".join(json.dumps({"ticket": f"t{i}", "body": t}) + "\n" for i, t in enumerate(texts))
    )
    host, port = standalone_cluster["master"].rsplit(":", 1)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": host, "port": int(port)})
    )
    # spark-submit comes with the pyspark wheel, as on a worker whose PATH has the environment.
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    output = tmp_path / "predictions"
    operator = BatchInferenceOperator(
        task_id="score",
        source_uri=str(incoming),
        output_uri=str(output),
        model_name="tiny-spark",
        text_column="body",
        id_column="ticket",
        conf={
            "spark.pyspark.python": sys.executable,
            "spark.executor.memory": "2g",
            "spark.log.level": "WARN",
        },
    )
    day = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
    context = {
        "ti": FakeTaskInstance(dag_id="batch_inference", run_id="cluster-1", task_id="score"),
        "logical_date": day,
        "dag_run": SimpleNamespace(run_after=day),
        "params": {},
    }
    summary = operator.execute(context)

    assert summary["rows_written"] == len(texts)
    assert summary["model"]["version"] == str(version.version)
    apps = json.load(urllib.request.urlopen(f"{standalone_cluster['ui']}/json/", timeout=5))
    assert any(app["name"] == "sparktune-batch_inference" for app in apps["completedapps"])
    table = pq.read_table(output / "date=2026-11-23").to_pandas()
    assert len(table) == len(texts) and set(table["model_version"]) == {str(version.version)}
    assert set(table["id"]) == {f"t{i}" for i in range(len(texts))}
