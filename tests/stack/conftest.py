"""The native production stack (``make stack``) for the tests in this folder, once per session.

Real parts only: Airflow's api-server, scheduler, dag-processor and triggerer (LocalExecutor) on
the machine's PostgreSQL server, an MLflow server on PostgreSQL, a Spark standalone master and
worker. Each session gets its own databases (dropped at the end), its own free ports on 127.0.0.1
and its own state folder, so it never meets a stack a developer left running.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:
    from tests.receivers import SmtpReceiver, WebhookReceiver, connection_env
    from tests.stack.stack_client import HTTPError
    from tests.stack.stack_client import request as _request
    from tests.stack.ui_steps import CHROMIUM, SHOTS, UI_TIMEOUT_MS, log_in
except ImportError:  # rootdir-relative import, as pytest puts this folder on sys.path
    from receivers import SmtpReceiver, WebhookReceiver, connection_env
    from stack_client import HTTPError
    from stack_client import request as _request
    from ui_steps import CHROMIUM, SHOTS, UI_TIMEOUT_MS, log_in

STACK_ROWS = 2500  # the generated training source, as in the e2e module
INCOMING_ROWS = 300  # the texts batch_inference scores after the promotion
# Seconds without a heartbeat before the scheduler fails a task and retries it (Airflow: 300), and
# how often it looks (Airflow: 10): rest_run kills a worker and waits for Airflow to notice.
TASK_HEARTBEAT_TIMEOUT = 20
HEARTBEAT_CHECK_SECONDS = 5
# The first retry's delay (the pipeline's default: 30 s), doubling after each up to the longest
# (default 600 s): the killed worker's retries of train on the other host fail until the training
# process has ended, and nothing here needs the production pause between tries. Doubling without a
# low ceiling left the run idle for most of a minute after the training ended (5, 10, 20, 40, 80 s).
RETRY_DELAY_SECONDS = 5
MAX_RETRY_DELAY_SECONDS = 10
# Enough tries 10 s apart to outlast the training on a machine twice as slow as this one.
TASK_RETRIES = 20
# The Celery broker's database on the local Redis: emptied when the session's stack starts, so no
# message a stopped session left reaches this stack's workers.
REDIS_DB = 9
# Every llm_finetune run here takes longer than this: each one's deadline alert must fire.
RUN_DEADLINE_MINUTES = 1
PLANTED_SECRET = f"planted-{uuid.uuid4().hex}"

# Variables the test session set for unit tests; the stack must start from the user's view.
_SESSION_ONLY = ("AIRFLOW_HOME", "MLFLOW_TRACKING_URI", "SPARKTUNE_LAKE_URI", "SPARKTUNE_HOME")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Stack:
    """What a test needs of the running stack: addresses, the login, a REST client."""

    config: Any
    home: Path
    airflow_url: str
    mlflow_url: str
    username: str
    password: str
    base_env: dict[str, str] | None = None
    planted_secret: str = PLANTED_SECRET
    _token: str | None = None

    def token(self) -> str:
        if self._token is None:
            reply = _request(
                "POST",
                f"{self.airflow_url}/auth/token",
                {"username": self.username, "password": self.password},
            )
            self._token = reply["access_token"]
        return self._token

    def rest(self, method: str, path: str, json: Any = None) -> Any:
        """The Airflow REST API (``/api/v2`` + path) as the admin user; raises on HTTP errors."""
        return _request(method, f"{self.airflow_url}/api/v2{path}", json, token=self.token())

    def mlflow(self, path: str, **query: str) -> Any:
        """MLflow's REST API (``/api/2.0/mlflow`` + path), GET with query parameters."""
        from urllib.parse import urlencode

        url = f"{self.mlflow_url}/api/2.0/mlflow{path}" + (f"?{urlencode(query)}" if query else "")
        return _request("GET", url)

    def task_logs(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str]:
        """A task's log files by name (``attempt=1.log``, ...): the workers write them under the
        stack's home (AIRFLOW__LOGGING__BASE_LOG_FOLDER, sparktune_dev.stack), one JSON object a line."""
        tasks = self.config.state_dir / "logs" / "tasks"
        folder = tasks / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return {path.name: path.read_text(errors="replace") for path in folder.glob("*.log")}

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 1500) -> dict[str, Any]:
        from urllib.parse import quote

        deadline = time.monotonic() + timeout
        while True:
            run = self.rest("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")
            if run["state"] in ("success", "failed") or time.monotonic() > deadline:
                return run
            time.sleep(5)


@pytest.fixture(scope="session", autouse=True)
def _fresh_screenshots():
    """The browser tests' screenshots are this session's only."""
    for old in [*SHOTS.glob("*.png"), *SHOTS.glob("*.html")]:
        old.unlink()


@pytest.fixture(scope="session")
def notification_receivers():
    """The mailbox and webhook receiver the stack's notifications go to (tests/receivers.py)."""
    with SmtpReceiver() as smtp, WebhookReceiver() as webhook:
        yield smtp, webhook


@pytest.fixture(scope="session")
def stack(tmp_path_factory, install_base_model, notification_receivers) -> Stack:
    from sparktune_dev.stack import StackConfig, StackError, admin_password, down, up

    home = tmp_path_factory.mktemp("stack-home")
    subprocess.run(
        [sys.executable, "-m", "sparktune_dev.demo_data", "--rows", str(STACK_ROWS), "--out",
         str(home / "data" / "support_tickets.jsonl")],
        check=True,
    )  # fmt: skip
    # What batch_inference scores by default when a promotion starts it (test_full_stack).
    subprocess.run(
        [sys.executable, "-m", "sparktune_dev.demo_data", "--rows", str(INCOMING_ROWS), "--seed", "11",
         "--out", str(home / "data" / "incoming_tickets.jsonl")],
        check=True,
    )  # fmt: skip
    mlflow_port = _free_port()
    config = StackConfig(
        home=home,
        airflow_port=_free_port(),
        mlflow_port=mlflow_port,
        spark_port=_free_port(),
        spark_ui_port=_free_port(),
        spark_worker_ui_port=_free_port(),
        serving_port=_free_port(),
        database_prefix=f"sparktune_test_{uuid.uuid4().hex[:8]}",
        parallelism=2,
        # Two workers, each with a host name of its own: a retry of train may land on another host.
        executor="celery",
        redis=f"redis://127.0.0.1:6379/{REDIS_DB}",
        celery_concurrency=1,
        # Only REST calls start llm_finetune here: unpausing a cron DAG would also start the latest
        # cron run, and the two would queue behind each other (max_active_runs=1).
        extra_env={
            **connection_env(*notification_receivers),
            "SPARKTUNE_RUN_DEADLINE_MINUTES": str(RUN_DEADLINE_MINUTES),
            "SPARKTUNE_RETRAIN_CRON": "off",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            # The DAG files do not change during the tests: parsed once at start. Airflow's default
            # re-parses each file every 30 s, about 6 s of CPU every 90 s here, taken from the other
            # test worker for the stack's whole life.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            # Above the parse interval, as Airflow wants it when the interval is long: at 50 s (the
            # default) the killed worker's failure callback was followed by a parse of
            # llm_finetune.py, then the processor marked the DAG stale (its last_parsed_time older
            # than the file's last parse by more than the threshold), and the scheduler left its run
            # alone until the next parse, 9.5 minutes later (apache/airflow#55315: the same on 3.0).
            "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "1200",
            # A task whose heartbeat is older than this is failed and retried (default 300 s):
            # rest_run kills the Celery worker that runs train.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(TASK_HEARTBEAT_TIMEOUT),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": str(
                HEARTBEAT_CHECK_SECONDS
            ),
            # Tries of train on the other host fail while the first try's training runs; enough
            # retries (5 s, then 10 s apart) that one comes soon after it has finished.
            "SPARKTUNE_TASK_RETRY_DELAY_SECONDS": str(RETRY_DELAY_SECONDS),
            "SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS": str(MAX_RETRY_DELAY_SECONDS),
            "SPARKTUNE_TASK_RETRIES": str(TASK_RETRIES),
            # Credentials planted in the MLflow connection (the server runs without auth and ignores
            # them): test_full_stack shows they reach no log, XCom, template, tag or lineage event.
            "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
                {
                    "conn_type": "generic",
                    "host": "127.0.0.1",
                    "port": mlflow_port,
                    "schema": "http",
                    "login": "sparktune-svc",
                    "password": PLANTED_SECRET,
                    "extra": {"token": PLANTED_SECRET},
                }
            ),
        },
    )
    base = {k: v for k, v in os.environ.items() if k not in _SESSION_ONLY}
    import redis

    redis.Redis.from_url(config.redis).flushdb()
    try:
        up(config, timeout=300, base=base)
    except StackError:
        down(config, purge=True)
        raise
    try:
        # After the services start: the other worker builds the session's base model meanwhile
        # (tests/conftest.py), and nothing runs a DAG before this returns.
        install_base_model(home)
    except BaseException:
        down(config, purge=True)
        raise
    try:
        yield Stack(
            config=config,
            home=home,
            airflow_url=config.airflow_url,
            mlflow_url=config.mlflow_url,
            username=config.username,
            password=admin_password(config),
            base_env=base,
        )
    finally:
        down(config, purge=True)


def _task_states(stack: Stack, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
    from urllib.parse import quote

    tasks = stack.rest("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")
    return {t["task_id"]: t for t in tasks["task_instances"]}


def stored_submission(stack: Stack, dag_id: str, run_id: str) -> Any:
    """The training process ``train`` of a run keeps in Airflow's task state store, read over REST
    (None before it has one)."""
    from urllib.parse import quote

    from sparktune_airflow.model.training_process import Submission

    run = quote(run_id, safe="")
    path = f"/dags/{dag_id}/dagRuns/{run}/taskInstances/train/state-store/sparktune_training"
    try:
        return Submission.from_json(stack.rest("GET", path)["value"])
    except HTTPError as error:
        if error.status == 404:
            return None
        raise


def _running(record: Any) -> bool:
    """Whether the recorded training process still runs, whatever host name its worker had (the
    workers' UTS namespaces share this machine's processes)."""
    import psutil

    try:
        proc = psutil.Process(record.pid)
        return abs(proc.create_time() - record.create_time) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_training_process(stack: Stack, run_id: str, timeout: float = 900) -> Any:
    """The submission of the training process ``train`` started, once that process runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = stored_submission(stack, "llm_finetune", run_id)
        if record is not None and _running(record):
            return record
        states = _task_states(stack, "llm_finetune", run_id)
        finished = [t for t, ti in states.items() if ti["state"] in ("failed", "upstream_failed")]
        assert not finished, f"the run failed before training started: {finished}"
        time.sleep(1)
    raise AssertionError(f"no live training process after {timeout:.0f} s")


def _kill_the_worker_during_training(stack: Stack, run_id: str) -> dict[str, Any]:
    """SIGKILL the process group of the Celery worker that runs ``train`` while its training
    process runs, and leave it down until the run has ended.

    The group is the worker with its pool, the task supervisor and the task runner of ``train``:
    what a worker machine's crash takes with it, but for the training process, which lives in a
    session of its own. The scheduler finds the task's heartbeat gone
    (``task_instance_heartbeat_timeout``) and retries it on the only worker left: another host,
    which cannot reattach to the process. The training here is shorter than the time Airflow takes
    to notice the kill and wait out the retry delay, so it is held (SIGSTOP) until that retry has
    run, as a real training of hours would still run then, and let go (SIGCONT) after.

    Returns what the test checks: the training process at the kill, the worker (host) it ran on,
    whether the process outlived the kill, and the state of ``train`` when the process was let go.
    """
    import signal

    from sparktune_dev.stack import _read_pids

    record = _wait_for_training_process(stack, run_id)
    train_at_kill = _task_states(stack, "llm_finetune", run_id)["train"]
    host = train_at_kill["hostname"]
    assert host in stack.config.celery_workers, (
        f"train ran on host {host!r}, not on a worker of its own host name {stack.config.celery_workers}: "
        "the stack tests run as root, where each Celery worker gets a UTS namespace (sparktune_dev.stack)"
    )
    os.killpg(_read_pids(stack.config)[f"celery-{host}"], signal.SIGKILL)
    os.killpg(record.pid, signal.SIGSTOP)
    try:
        alive_after_kill = _running(record)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            train = _task_states(stack, "llm_finetune", run_id)["train"]
            if train["try_number"] >= 2 and train["state"] in ("up_for_retry", "failed", "success"):
                break
            time.sleep(1)
    finally:
        os.killpg(record.pid, signal.SIGCONT)
    return {
        "training_pid": record.pid,
        "training_create_time": record.create_time,
        "training_host": record.host,
        "worker_killed": host,
        "train_at_kill": {"try_number": train_at_kill["try_number"], "state": train_at_kill["state"]},
        "training_alive_after_kill": alive_after_kill,
        "train_at_release": {"try_number": train["try_number"], "state": train["state"]},
    }


@pytest.fixture(scope="session")
def rest_run(stack) -> dict:
    """One llm_finetune run triggered through the REST API, with the Celery worker running ``train``
    killed while its training process runs (see :func:`_kill_the_worker_during_training`); waited
    for until it ends, then the worker is started again.

    The other tests check everything a clean run must show on this run: the fault must change
    nothing but ``train``'s tries.
    """
    from sparktune_dev.stack import up

    stack.rest("PATCH", "/dags/llm_finetune", {"is_paused": False})
    # Started by the champion asset event that promote_champion emits (test_full_stack checks it).
    stack.rest("PATCH", "/dags/batch_inference", {"is_paused": False})
    run = stack.rest("POST", "/dags/llm_finetune/dagRuns", {"logical_date": None, "conf": {}})
    fault = _kill_the_worker_during_training(stack, run["dag_run_id"])
    run = stack.wait_for_run("llm_finetune", run["dag_run_id"])
    up(stack.config, timeout=300, base=stack.base_env)
    run["tasks"] = _task_states(stack, "llm_finetune", run["dag_run_id"])
    run["fault"] = fault
    return run


@pytest.fixture(scope="session")
def form_runs() -> dict[str, str]:
    """Runs the browser test triggered from the form, by what they are for (``approval``: a run that
    asks for approval, which test_approval answers): a later module picks its run up here instead
    of training one of its own."""
    return {}


@pytest.fixture(scope="module")
def browser():
    """One chromium per module: Playwright's sync API runs an event loop on the main thread while it
    is open, and a later test of the session that calls asyncio.run() would fail beside it."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (apt-get install -y chromium) first")
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    # expect() waits 5 s by default, not the page's timeout; on two cores shared with a training run
    # the React app takes longer than that to render a page.
    expect.set_options(timeout=UI_TIMEOUT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield browser
        browser.close()


@pytest.fixture
def page(browser, request):
    """A fresh browser tab; at the end the page where the test left it, as a screenshot and as HTML
    (``test-output/ui/99-last-page-<test>.*``: where a failure stopped)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    yield page
    last = SHOTS / f"99-last-page-{request.node.name}"
    page.screenshot(path=last.with_suffix(".png"), full_page=True)
    last.with_suffix(".html").write_text(page.content())
    context.close()


@pytest.fixture
def signed_in_page(page, stack):
    log_in(page, stack)
    return page
