"""``llm_finetune`` on the production topology, driven the way an operator drives it: over REST.

The stack (tests/stack/conftest.py) is `make stack` on free ports: Airflow on PostgreSQL with the
LocalExecutor and separate api-server, scheduler, dag-processor and triggerer; an MLflow server on
PostgreSQL; a Spark standalone master and worker. The DAG reaches Spark and MLflow only through
the ``spark_default`` and ``mlflow_default`` connections; the test reads results only through the
Airflow and MLflow REST APIs, and lineage from the file transport the stack configures.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import psutil
import pytest

try:
    from tests.receivers import body_text
    from tests.stack.stack_client import HTTPError
    from tests.stack.stack_client import request as _request
except ImportError:  # rootdir-relative import, as pytest puts this folder on sys.path
    from receivers import body_text
    from stack_client import HTTPError
    from stack_client import request as _request

pytestmark = [pytest.mark.stack, pytest.mark.e2e]

MODEL = "support-intent"


def _stack_processes(stack) -> list[psutil.Process]:
    from sparktune_dev.stack import _read_pids

    processes = []
    for pid in _read_pids(stack.config).values():
        root = psutil.Process(pid)
        processes += [root, *root.children(recursive=True)]
    return processes


def test_services_listen_on_loopback_only_and_the_api_wants_a_login(stack):
    listening = []
    for process in _stack_processes(stack):
        try:
            sockets = process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        listening += [(process.name(), s.laddr) for s in sockets if s.status == psutil.CONN_LISTEN]
    assert listening, "found no listening sockets of the stack"
    exposed = [
        (name, addr) for name, addr in listening if addr.ip not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")
    ]
    assert not exposed, exposed
    with pytest.raises(HTTPError) as refused:
        _request("GET", f"{stack.airflow_url}/api/v2/dags")
    assert refused.value.status == 401
    with pytest.raises(HTTPError) as wrong:
        _request("POST", f"{stack.airflow_url}/auth/token", {"username": "admin", "password": "admin"})
    assert wrong.value.status in (401, 403)  # the generated password, never a default one


def test_the_mlflow_server_runs_without_mlflows_job_runner(stack):
    # The job runner (huey consumers for MLflow's own jobs) costs a start about 40 s; unused here.
    from sparktune_dev.stack import _read_pids

    server = psutil.Process(_read_pids(stack.config)["mlflow"])
    processes = [server, *server.children(recursive=True)]
    runners = [" ".join(p.cmdline()) for p in processes if "mlflow.server.jobs" in " ".join(p.cmdline())]
    assert not runners, runners


def test_the_stack_signs_with_long_private_keys_and_its_spark_drivers_bind_loopback(stack):
    """The generated secrets of the running stack (issue 22), and the address each task's Spark
    driver binds: a driver runs only while a task does, so its environment is what is checked."""
    import stat

    from sparktune_dev.stack import _log, _read_pids, secret_paths, stack_env

    state = stack.config.state_dir
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = {**secret_paths(stack.config), "passwords": state / "passwords.json"}
    for name, path in files.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{name}: {path} is {oct(path.stat().st_mode)}"
    for name in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        assert len(files[name].read_bytes()) >= 64, f"{name} is shorter than HS512's 64 bytes"
    stack.token()  # the api-server signs a JWT now, if it had not yet
    api_log = _log(stack.config, "api-server").read_text(errors="replace")
    assert "minimum recommended length" not in api_log and "using a generated one" not in api_log
    # The environment every stack process starts with (Airflow's own processes rewrite the copy
    # /proc shows, setproctitle): spark-submit's driver, its UI, RPC and block manager, takes
    # SPARK_LOCAL_IP from the task's process. The Spark daemons show theirs as they got it.
    assert stack_env(stack.config, base=stack.base_env)["SPARK_LOCAL_IP"] == "127.0.0.1"
    pids = _read_pids(stack.config)
    for name in ("spark-master", "spark-worker"):
        assert psutil.Process(pids[name]).environ().get("SPARK_LOCAL_IP") == "127.0.0.1", name


def _task_log_tail(stack, run: dict) -> str:
    failed = [t for t, ti in run["tasks"].items() if ti["state"] not in ("success", "skipped")]
    logs = []
    for task in failed:
        for path in stack.home.glob(f"stack/logs/tasks/dag_id=llm_finetune/run_id=*/task_id={task}/*.log"):
            logs.append(f"--- {path}\n{path.read_text()[-3000:]}")
    return "\n".join(logs) or "no failed task logs"


def test_a_run_triggered_over_rest_succeeds_and_registers_a_champion_in_the_mlflow_server(stack, rest_run):
    assert rest_run["state"] == "success", _task_log_tail(stack, rest_run)
    assert rest_run["run_type"] == "manual"
    assert rest_run["tasks"]["train"]["state"] == "success"

    # The model, seen through MLflow's REST API.
    version = stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]
    tags = {t["key"]: t["value"] for t in version.get("tags", [])}
    assert {"candidate", "staging", "champion"} <= set(version["aliases"])
    assert tags["gate_decision"] == "promote"
    run = stack.mlflow("/runs/get", run_id=version["run_id"])["run"]
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    run_tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert run_tags["sparktune.data_fingerprint"] == tags["data_fingerprint"]
    assert run_tags["airflow.run_id"] == rest_run["dag_run_id"]
    # Artifacts went through the server to its artifact store, not to a path on the worker.
    experiment = stack.mlflow("/experiments/get", experiment_id=run["info"]["experiment_id"])["experiment"]
    assert experiment["artifact_location"].startswith("mlflow-artifacts:")
    stored = list((stack.home / "stack" / "mlflow-artifacts").rglob("MLmodel"))
    assert stored, "no model in the MLflow server's artifact store"
    # Nothing fell back to the embedded SQLite store: MLflow came from the mlflow_default connection.
    assert not (stack.home / "mlflow" / "mlflow.db").exists()


def _search_runs(stack, filter_string: str) -> list[dict]:
    experiments = _request(
        "POST", f"{stack.mlflow_url}/api/2.0/mlflow/experiments/search", {"max_results": 100}
    )["experiments"]
    return _request(
        "POST",
        f"{stack.mlflow_url}/api/2.0/mlflow/runs/search",
        {
            "experiment_ids": [e["experiment_id"] for e in experiments],
            "filter": filter_string,
            "max_results": 1000,
        },
    ).get("runs", [])


def test_a_worker_killed_during_train_leaves_one_training_job_one_run_one_version(stack, rest_run):
    """rest_run SIGKILLs the Celery worker (its pool, the task supervisor and runner) that runs
    ``train`` while the training process runs, and leaves it down. The retry runs on the other
    worker, another host: it cannot reattach to the process there, so it fails saying where the
    training runs instead of starting a second one; a later try reuses the MLflow run the training
    finished. One training process, one MLflow run, one model version."""
    try:
        from tests.stack.conftest import stored_submission
    except ImportError:
        from conftest import stored_submission

    fault = rest_run["fault"]
    pid, killed = fault["training_pid"], fault["worker_killed"]
    # The kill hit try 1 on its worker while its training process ran, and the process outlived it.
    assert fault["train_at_kill"] == {"try_number": 1, "state": "running"}, fault
    assert fault["training_host"] == killed and fault["training_alive_after_kill"], fault
    # The retry on the other host ran (and failed) while the training still ran there.
    assert fault["train_at_release"] == {"try_number": 2, "state": "up_for_retry"}, fault
    train = rest_run["tasks"]["train"]
    assert train["state"] == "success" and train["try_number"] >= 2, train
    other = next(name for name in stack.config.celery_workers if name != killed)
    assert train["hostname"] == other, train  # the try that succeeded ran on the other host
    logs = stack.task_logs("llm_finetune", rest_run["dag_run_id"], "train")
    started = [name for name, text in logs.items() if "Starting: " in text]
    assert started == ["attempt=1.log"], started  # one training process, from the first try
    refused = [name for name, text in logs.items() if f"was started on host {killed} (pid {pid}," in text]
    assert "attempt=2.log" in refused, {name: text[-2000:] for name, text in logs.items()}
    assert f"this attempt runs on {other}, which cannot reattach to it" in logs["attempt=2.log"]
    last = logs[f"attempt={train['try_number']}.log"]
    assert "Reusing finished MLflow run" in last, last[-3000:]
    # The task state store still names the process of the first try, which its end never marked
    # (no try followed it): no other training process was ever started.
    record = stored_submission(stack, "llm_finetune", rest_run["dag_run_id"])
    assert record is not None and (record.pid, record.create_time) == (pid, fault["training_create_time"])
    # One MLflow training run and one model version for this Airflow run.
    runs = _search_runs(stack, f"tags.`airflow.run_id` = '{rest_run['dag_run_id']}'")
    training = [r for r in runs if any(t["key"] == "sparktune.train_key" for t in r["data"]["tags"])]
    assert len(training) == 1, [r["info"]["run_id"] for r in training]
    versions = stack.mlflow("/model-versions/search", filter=f"run_id = '{training[0]['info']['run_id']}'")[
        "model_versions"
    ]
    assert len(versions) == 1, versions
    # The failure callback of the killed try left the DAG active: a DAG marked stale is not
    # scheduled until its file's next parse (stack/conftest.py: the stale threshold).
    from sparktune_dev.stack import _log

    processor_log = _log(stack.config, "dag-processor").read_text(errors="replace")
    stale = [line for line in processor_log.splitlines() if "Deactivating stale DAG" in line]
    assert not stale, stale


def test_the_spark_steps_ran_on_the_standalone_master(stack, rest_run):
    master = _request("GET", f"http://{stack.config.host}:{stack.config.spark_ui_port}/json/")
    apps = {app["name"] for app in master["completedapps"] + master["activeapps"]}
    assert any("prepare_data" in name for name in apps), apps


def test_the_promotion_starts_batch_inference_which_scores_with_the_new_champion(stack, rest_run):
    """promote_champion's asset event -> the scheduler starts an asset-triggered batch_inference run
    -> it scores the incoming texts with the new champion, on the standalone master."""
    import time

    import pyarrow.dataset as ds

    try:
        from tests.stack.conftest import INCOMING_ROWS
    except ImportError:
        from conftest import INCOMING_ROWS

    assert rest_run["state"] == "success"
    deadline, runs = time.monotonic() + 600, []
    while time.monotonic() < deadline:
        runs = [
            r
            for r in stack.rest("GET", "/dags/batch_inference/dagRuns")["dag_runs"]
            if r["run_type"] == "asset_triggered"
        ]
        if runs and runs[-1]["state"] in ("success", "failed"):
            break
        time.sleep(5)
    # No later alias move (the Models page's rollback, the approval runs' promotions) needs scoring
    # again: each would start another batch_inference run that no test reads.
    stack.rest("PATCH", "/dags/batch_inference", {"is_paused": True})
    assert runs, "no asset-triggered batch_inference run after the promotion"
    logs = stack.home.glob("stack/logs/tasks/dag_id=batch_inference/**/*.log")
    assert runs[-1]["state"] == "success", "\n".join(p.read_text()[-3000:] for p in logs)
    champion = stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]
    table = ds.dataset(stack.home / "lake" / "predictions", format="parquet", partitioning="hive").to_table()
    assert table.num_rows == INCOMING_ROWS
    assert set(table.column("model_version").to_pylist()) == {champion["version"]}
    master = _request("GET", f"http://{stack.config.host}:{stack.config.spark_ui_port}/json/")
    apps = {app["name"] for app in master["completedapps"] + master["activeapps"]}
    assert any("batch_inference" in name for name in apps), apps


def test_the_serving_service_answers_with_the_champion_and_captures_what_it_answered(stack, rest_run):
    """The stack's serving service over HTTP: it follows the alias the run moved, answers in MLflow's
    scoring protocol, refuses a client's mistake with a 4xx, and captures the answers to the lake."""
    import time

    import pyarrow.dataset as ds

    assert rest_run["state"] == "success"
    champion = stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]
    url = stack.config.serving_url
    # What promote_champion's caller would do instead of waiting for the next poll.
    reloaded = _request("POST", f"{url}/admin/reload")
    assert reloaded["serving_version"] == champion["version"], reloaded
    texts = ["I was charged twice for my order", "I cannot log in to my account"]
    answer = _request(
        "POST", f"{url}/invocations", {"dataframe_split": {"columns": ["text"], "data": [[t] for t in texts]}}
    )
    assert [row["model_version"] for row in answer["predictions"]] == [champion["version"]] * 2
    assert all(row["model_name"] == MODEL and 0 <= row["score"] <= 1 for row in answer["predictions"])
    with pytest.raises(HTTPError) as refused:
        _request("POST", f"{url}/invocations", {"dataframe_split": {"columns": ["text"], "data": []}})
    assert refused.value.status == 400
    captures = stack.home / "lake" / "serving_captures"
    deadline = time.monotonic() + 30  # written every 5 s off the request path
    while not list(captures.glob("date=*/part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(1)
    table = ds.dataset(captures, format="parquet", partitioning="hive").to_table().to_pandas()
    mine = table[table["request_id"] == answer["request_id"]]
    assert sorted(mine["text"]) == sorted(texts) and set(mine["model_version"]) == {champion["version"]}


def test_extra_links_point_at_the_run_and_the_model_version_in_the_mlflow_ui(stack, rest_run):
    run_id = quote(rest_run["dag_run_id"], safe="")

    def links(task_id: str) -> dict[str, str | None]:
        path = f"/dags/llm_finetune/dagRuns/{run_id}/taskInstances/{task_id}/links"
        return stack.rest("GET", path)["extra_links"]

    train = links("train")
    version = stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]
    assert train["MLflow run"] == f"{stack.mlflow_url}/#/runs/{version['run_id']}"
    promote = links("promote_champion")
    assert promote["MLflow model version"].endswith(f"/#/models/{MODEL}/versions/{version['version']}")
    prepare = links("prepare_data")
    assert prepare["Spark UI"].startswith(f"http://{stack.config.host}:{stack.config.spark_ui_port}")


def _completed_events(stack, run_id: str) -> dict[str, dict]:
    events = {}
    for line in (stack.home / "lineage" / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("eventType") != "COMPLETE":
            continue
        dag_run = event["run"]["facets"].get("airflow", {}).get("dagRun", {})
        if dag_run.get("run_id") == run_id:
            events[event["job"]["name"].removeprefix("llm_finetune.")] = event
    return events


def _names(datasets: list[dict]) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in datasets}


def test_lineage_chains_source_splits_dataset_and_model_version_at_the_fingerprint(stack, rest_run):
    events = _completed_events(stack, rest_run["dag_run_id"])
    prepare, materialize = events["prepare_data"], events["materialize_dataset"]
    train, register = events["train"], events["register"]
    # Each step's inputs are the previous step's outputs.
    assert _names(prepare["outputs"]) == _names(materialize["inputs"])
    assert _names(materialize["outputs"]) == _names(train["inputs"])
    assert _names(train["outputs"]) == _names(register["inputs"])
    assert any("support_tickets" in name for _, name in _names(prepare["inputs"]))
    [(_, model_version)] = _names(register["outputs"])
    version = stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]
    assert model_version.endswith(f"{MODEL}/{version['version']}")
    # Every dataset of the chain carries the run's data fingerprint as its version.
    fingerprint = {t["key"]: t["value"] for t in version["tags"]}["data_fingerprint"]
    for step in (prepare, materialize, train, register):
        for dataset in step["inputs"] + step["outputs"]:
            assert dataset["facets"]["version"]["datasetVersion"] == fingerprint, (step["job"], dataset)


def test_the_planted_mlflow_credentials_leak_nowhere(stack, rest_run):
    """The mlflow_default connection carries a password and a token (conftest): neither may show up
    in a task or service log, an XCom, a rendered template, an MLflow param or tag, or a lineage
    event of the run."""
    secret = stack.planted_secret
    run_id = quote(rest_run["dag_run_id"], safe="")
    seen: dict[str, str] = {}
    for path in (stack.home / "stack" / "logs").rglob("*.log"):
        seen[str(path)] = path.read_text(errors="replace")
    seen["lineage"] = (stack.home / "lineage" / "events.jsonl").read_text()
    for task_id in rest_run["tasks"]:
        task_path = f"/dags/llm_finetune/dagRuns/{run_id}/taskInstances/{task_id}"
        seen[f"{task_id} rendered"] = json.dumps(stack.rest("GET", task_path).get("rendered_fields"))
        for entry in stack.rest("GET", f"{task_path}/xcomEntries")["xcom_entries"]:
            value = stack.rest("GET", f"{task_path}/xcomEntries/{quote(entry['key'], safe='')}")
            seen[f"{task_id} xcom {entry['key']}"] = json.dumps(value)
    runs = _search_runs(stack, "")
    assert runs
    for run in runs:
        seen[f"mlflow run {run['info']['run_id']}"] = json.dumps(run["data"])
    versions = stack.mlflow("/model-versions/search", max_results="1000")
    seen["model versions"] = json.dumps(versions)
    assert sum("xcom" in k for k in seen) >= 5 and any(k.endswith(".log") for k in seen)
    leaked = [where for where, text in seen.items() if secret in text]
    assert not leaked, leaked


def test_the_run_past_its_deadline_and_its_promotion_are_told_by_mail_and_webhook(
    stack, rest_run, notification_receivers
):
    """The deadline alert (SPARKTUNE_RUN_DEADLINE_MINUTES, 1 minute here) fired on the executor while
    the run went on, and the promotion told the team; both reached the SMTP server and the webhook."""
    smtp, webhook = notification_receivers
    run_id = rest_run["dag_run_id"]
    overdue = webhook.wait_for(lambda p: p["event"] == "run_overdue" and p["run_id"] == run_id, timeout=120)
    assert overdue["dag_id"] == "llm_finetune"
    assert overdue["url"] == f"{stack.airflow_url}/dags/llm_finetune/runs/{quote(run_id, safe='')}"
    assert "was not done by its deadline" in overdue["summary"]
    assert smtp.wait_for(lambda m: m["X-Sparktune-Event"] == "run_overdue" and run_id in body_text(m))
    promoted = webhook.wait_for(lambda p: p["event"] == "promoted" and p["run_id"] == run_id)
    version = stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]
    assert promoted["summary"].startswith(f"{MODEL} @champion is now v{version['version']}")
    # The worker kill cost train tries, not the task: no failure was reported for this run.
    assert not [p for p in webhook.payloads if p["event"] == "task_failed" and p["run_id"] == run_id]
