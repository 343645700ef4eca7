"""A local stand-in for a Databricks workspace's Jobs API, because no workspace is reachable from here.

It speaks the endpoints the Airflow Databricks provider (7.23) calls for one-time runs, in both
API versions the provider has used (``2.1`` and ``2.2``), over real HTTP on 127.0.0.1:

- ``POST /api/2.x/jobs/runs/submit``: validates the payload as the real API would reject it
  (HTTP 400 with ``error_code`` and ``message``), honours ``idempotency_token`` (the same token
  returns the same ``run_id`` and starts nothing), and really runs the ``python_wheel_task``:
  the console script ``entry_point`` of the installed distribution ``package_name`` as a local
  subprocess (the "cluster" is this machine; the wheel in ``libraries`` is taken as installed).
- ``GET /api/2.x/jobs/runs/get``: the run with ``state`` (``life_cycle_state``, ``result_state``
  once terminal, ``state_message``), ``run_page_url`` and ``tasks`` (each with its own task
  ``run_id`` and state). ``run_id`` is read from the query string (requests) or from a JSON body
  (the provider's aiohttp path sends one even on GET).
- ``GET /api/2.x/jobs/runs/get-output``: ``error``, ``error_trace`` and ``logs`` of a task run
  (the provider reads ``error`` of failed tasks).
- ``POST /api/2.x/jobs/runs/cancel``: kills the process group; TERMINATING, then
  TERMINATED with ``result_state`` CANCELED.

States follow the real lifecycle: PENDING (the cluster "starts" for ``pending_seconds``) ->
RUNNING (the process is alive) -> TERMINATED with SUCCESS (exit code 0) or FAILED (any other);
``timeout_seconds`` ends a run as TIMEDOUT. Every request is recorded (``requests``) so tests can
assert on payloads. Requests need ``Authorization: Bearer <token>``.

Usage::

    with FakeJobsApi() as api:
        os.environ["AIRFLOW_CONN_DATABRICKS_DEFAULT"] = api.connection_json()
        ...
        api.submits()          # every runs/submit body
        api.run(run_id).pid    # the process that ran it
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

API_VERSIONS = ("2.1", "2.2")
TERMINAL = ("TERMINATED", "SKIPPED", "INTERNAL_ERROR")
TASK_TYPES = (
    "notebook_task",
    "spark_jar_task",
    "spark_python_task",
    "spark_submit_task",
    "pipeline_task",
    "python_wheel_task",
    "dbt_task",
    "sql_task",
    "run_job_task",
    "condition_task",
    "for_each_task",
    "clean_rooms_notebook_task",
    "dashboard_task",
    "power_bi_task",
)
CLUSTER_FIELDS = ("new_cluster", "existing_cluster_id", "job_cluster_key", "environment_key")
LIBRARY_KINDS = ("whl", "jar", "egg", "pypi", "maven", "cran", "requirements")
TASK_KEY_PATTERN = re.compile(r"^[\w\-]{1,100}$")
# Environment variables of the payload that name paths on a Databricks node; the local stand-in
# uses its own interpreter instead.
LOCAL_ENV_OVERRIDES = {"PYSPARK_PYTHON": sys.executable}


class ApiError(Exception):
    def __init__(self, status: int, error_code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class FakeRun:
    run_id: int
    task_run_id: int
    job_id: int
    payload: dict[str, Any]
    run_page_url: str
    log_path: Path
    life_cycle_state: str = "PENDING"
    result_state: str | None = None
    state_message: str = "Waiting for cluster"
    user_cancelled_or_timedout: bool = False
    start_time: int = field(default_factory=lambda: int(time.time() * 1000))
    end_time: int = 0
    process: subprocess.Popen | None = None
    command: list[str] = field(default_factory=list)
    exit_code: int | None = None
    cancel_requested: bool = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def task(self) -> dict[str, Any]:
        return self.payload["tasks"][0]

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "life_cycle_state": self.life_cycle_state,
            "state_message": self.state_message,
            "user_cancelled_or_timedout": self.user_cancelled_or_timedout,
        }
        if self.result_state is not None:  # the real API leaves it out until the run ends
            state["result_state"] = self.result_state
        return state

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class FakeJobsApi:
    """The Jobs API of one fake workspace on 127.0.0.1; start() / stop() or use it as a context manager."""

    def __init__(
        self,
        workdir: Path | str | None = None,
        *,
        token: str = "fake-databricks-token",
        pending_seconds: float = 0.3,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        import tempfile

        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fake-databricks-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.pending_seconds = pending_seconds
        self.python = python
        self.env = env
        self.requests: list[RecordedRequest] = []
        self.runs: dict[int, FakeRun] = {}
        self._by_token: dict[str, int] = {}
        self._task_runs: dict[int, int] = {}
        self._ids = itertools.count(1001, 2)  # run ids; a run's task run id is the next number
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> FakeJobsApi:
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-databricks", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        for run in list(self.runs.values()):
            if run.process is not None and run.process.poll() is None:
                _kill_group(run.process)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeJobsApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the fake first"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connection(self) -> dict[str, Any]:
        """An Airflow ``databricks`` connection to this fake.

        The hook builds ``{schema or 'https'}://{host}{:port}/api/...`` and strips any scheme and
        port written into ``host``, so plain HTTP needs ``schema`` and ``port`` as fields.
        """
        return {
            "conn_type": "databricks",
            "host": "127.0.0.1",
            "port": self.port,
            "schema": "http",
            "password": self.token,
        }

    def connection_json(self) -> str:
        return json.dumps(self.connection())

    # -- what tests look at

    def requests_to(self, endpoint: str) -> list[RecordedRequest]:
        """Recorded requests whose path ends with ``endpoint`` (e.g. ``jobs/runs/submit``)."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith("/" + endpoint)]

    def submits(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests_to("jobs/runs/submit")]

    def run(self, run_id: int) -> FakeRun:
        return self.runs[run_id]

    def wait_for(self, run_id: int, states: Iterable[str], timeout: float = 120.0) -> FakeRun:
        """Block until the run's life cycle state is one of ``states``."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.runs[run_id]
            if run.life_cycle_state in wanted:
                return run
            time.sleep(0.05)
        raise TimeoutError(f"run {run_id} still {self.runs[run_id].life_cycle_state} after {timeout}s")

    # -- the endpoints

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        match = re.fullmatch(r"/api/(\d\.\d)/jobs/runs/([\w-]+)", path)
        if not match or match.group(1) not in API_VERSIONS:
            raise ApiError(404, "ENDPOINT_NOT_FOUND", f"No API found for '{method} {path}'")
        endpoint = (method, match.group(2))
        if endpoint == ("POST", "submit"):
            return self._submit(body)
        if endpoint == ("GET", "get"):
            return self._get(self._run_id_arg(query, body))
        if endpoint == ("GET", "get-output"):
            return self._get_output(self._run_id_arg(query, body))
        if endpoint == ("POST", "cancel"):
            return self._cancel(self._run_id_arg(query, body))
        raise ApiError(404, "ENDPOINT_NOT_FOUND", f"No API found for '{method} {path}'")

    @staticmethod
    def _run_id_arg(query: dict[str, str], body: Any) -> int:
        raw = query.get("run_id")
        if raw is None and isinstance(body, dict):
            raw = body.get("run_id")
        if raw is None:
            raise ApiError(400, "INVALID_PARAMETER_VALUE", "Missing required field: run_id")
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ApiError(400, "INVALID_PARAMETER_VALUE", f"Invalid run_id: {raw!r}") from None

    def _submit(self, body: Any) -> dict[str, Any]:
        validate_submit_payload(body)
        token = body.get("idempotency_token")
        with self._lock:
            if token and token in self._by_token:
                return {"run_id": self._by_token[token]}
            run_id = next(self._ids)
            run = FakeRun(
                run_id=run_id,
                task_run_id=run_id + 1,
                job_id=run_id * 7,
                payload=body,
                run_page_url=f"{self.url}/?o=0#job/{run_id * 7}/run/{run_id}",
                log_path=self.workdir / f"run-{run_id}.log",
            )
            self.runs[run_id] = run
            self._task_runs[run.task_run_id] = run_id
            if token:
                self._by_token[token] = run_id
        threading.Thread(target=self._execute, args=(run,), name=f"fake-run-{run_id}", daemon=True).start()
        return {"run_id": run_id}

    def _lookup(self, run_id: int) -> FakeRun:
        with self._lock:
            parent = self._task_runs.get(run_id, run_id)
            if parent not in self.runs:
                raise ApiError(404, "RESOURCE_DOES_NOT_EXIST", f"Run {run_id} does not exist.")
            return self.runs[parent]

    def _get(self, run_id: int) -> dict[str, Any]:
        run = self._lookup(run_id)
        with self._lock:
            task = run.task
            task_view = {
                "run_id": run.task_run_id,
                "task_key": task["task_key"],
                "state": run.state(),
                "attempt_number": 0,
                "start_time": run.start_time,
                "end_time": run.end_time,
                "run_page_url": f"{self.url}/?o=0#job/{run.job_id}/run/{run.task_run_id}",
                **{k: task[k] for k in ("new_cluster", "libraries", "python_wheel_task") if k in task},
            }
            if run_id == run.task_run_id:  # runs/get of a task run describes that task
                return {**task_view, "job_id": run.job_id, "run_type": "SUBMIT_RUN"}
            return {
                "job_id": run.job_id,
                "run_id": run.run_id,
                "number_in_job": run.run_id,
                "run_name": run.payload.get("run_name", "Untitled"),
                "run_type": "SUBMIT_RUN",
                "creator_user_name": "fake@example.com",
                "state": run.state(),
                "start_time": run.start_time,
                "end_time": run.end_time,
                "run_page_url": run.run_page_url,
                "tasks": [task_view],
            }

    def _get_output(self, run_id: int) -> dict[str, Any]:
        run = self._lookup(run_id)
        if run_id != run.task_run_id:
            raise ApiError(
                400,
                "INVALID_PARAMETER_VALUE",
                "Retrieving the output of runs with multiple tasks is not supported. Please retrieve "
                "the output of each individual task run instead.",
            )
        output: dict[str, Any] = {"metadata": self._get(run_id), "logs": run.log_tail()}
        if run.result_state in ("FAILED", "TIMEDOUT"):
            tail = run.log_tail(15)
            output["error"] = (tail.splitlines() or [run.state_message])[-1]
            output["error_trace"] = tail
        return output

    def _cancel(self, run_id: int) -> dict[str, Any]:
        run = self._lookup(run_id)
        with self._lock:
            if run.life_cycle_state in TERMINAL:
                return {}  # cancelling an ended run changes nothing
            run.cancel_requested = True
            if run.process is None:  # still PENDING: nothing runs yet
                self._end(run, "CANCELED", "Run cancelled.", user=True)
                return {}
            run.life_cycle_state = "TERMINATING"
            run.state_message = "Run cancellation requested."
            process = run.process
        threading.Thread(target=_kill_group, args=(process,), daemon=True).start()
        return {}

    # -- the "cluster"

    def _execute(self, run: FakeRun) -> None:
        time.sleep(self.pending_seconds)  # cluster start
        task = run.task
        wheel_task = task["python_wheel_task"]
        command = [self.python, "-c", _launcher(wheel_task["package_name"], wheel_task["entry_point"])]
        command += list(wheel_task.get("parameters") or [])
        env = dict(os.environ if self.env is None else self.env)
        env.update({k: str(v) for k, v in (task["new_cluster"].get("spark_env_vars") or {}).items()})
        env.update({k: v for k, v in LOCAL_ENV_OVERRIDES.items() if k in env})
        with self._lock:
            if run.cancel_requested:
                return
            log = run.log_path.open("wb")
            run.command = command
            try:
                run.process = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.workdir,
                    start_new_session=True,  # a process group: cancel takes the children too
                )
            except OSError as err:
                log.close()
                run.life_cycle_state = "INTERNAL_ERROR"
                run.state_message = f"Could not start the task: {err}"
                run.end_time = int(time.time() * 1000)
                return
            run.life_cycle_state = "RUNNING"
            run.state_message = "In run"
        timeout = run.payload.get("timeout_seconds") or None
        try:
            exit_code = run.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(run.process)
            exit_code = run.process.wait()
            with self._lock:
                self._end(run, "TIMEDOUT", f"Run timed out after {timeout} seconds.", user=True)
            return
        finally:
            log.close()
        with self._lock:
            run.exit_code = exit_code
            if run.cancel_requested:
                self._end(run, "CANCELED", "Run cancelled.", user=True)
            elif exit_code == 0:
                self._end(run, "SUCCESS", "")
            else:
                self._end(
                    run,
                    "FAILED",
                    f"Workload failed, see run output for details (exit code {exit_code}).",
                )

    @staticmethod
    def _end(run: FakeRun, result_state: str, message: str, user: bool = False) -> None:
        run.life_cycle_state = "TERMINATED"
        run.result_state = result_state
        run.state_message = message
        run.user_cancelled_or_timedout = user
        run.end_time = int(time.time() * 1000)


def _launcher(package_name: str, entry_point: str) -> str:
    """Python source that runs the wheel task as Databricks does: the package's console script
    ``entry_point``, else ``<package_name>.<entry_point>()``; argv is the task's parameters."""
    target = f"{package_name}:{entry_point}"
    for candidate in metadata.entry_points(group="console_scripts", name=entry_point):
        dist = getattr(candidate, "dist", None)
        if dist is None or _normalise(dist.metadata["Name"]) == _normalise(package_name):
            target = candidate.value
            break
    module, _, attr = target.partition(":")
    return (
        "import importlib, sys\n"
        f"sys.argv[0] = {entry_point!r}\n"
        f"result = getattr(importlib.import_module({module!r}), {attr!r})()\n"
        "sys.exit(result if isinstance(result, int) else 0)\n"
    )


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _kill_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the process group, SIGKILL after ``grace`` seconds."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _invalid(message: str) -> ApiError:
    return ApiError(400, "INVALID_PARAMETER_VALUE", message)


def validate_submit_payload(body: Any) -> None:
    """Raise the 400 the real runs/submit returns for the mistakes this fake knows about."""
    if not isinstance(body, dict):
        raise ApiError(
            400, "MALFORMED_REQUEST", "Invalid JSON given in the body of the request - expected a map"
        )
    token = body.get("idempotency_token")
    if token is not None and (not isinstance(token, str) or len(token) > 64):
        raise _invalid("idempotency_token must be a string of at most 64 characters")
    timeout = body.get("timeout_seconds")
    if timeout is not None and (not isinstance(timeout, int) or timeout < 0):
        raise _invalid(f"timeout_seconds must be a non-negative integer, got {timeout!r}")
    tasks = body.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise _invalid("Missing required field: tasks (a one-time run needs at least one task)")
    keys = set()
    for i, task in enumerate(tasks):
        where = f"tasks[{i}]"
        if not isinstance(task, dict):
            raise _invalid(f"{where} must be an object")
        key = task.get("task_key")
        if not isinstance(key, str) or not TASK_KEY_PATTERN.match(key):
            raise _invalid(f"{where}.task_key is required: 1-100 letters, digits, '-' or '_'")
        if key in keys:
            raise _invalid(f"Task key {key} is not unique")
        keys.add(key)
        kinds = [t for t in TASK_TYPES if t in task]
        if len(kinds) != 1:
            raise _invalid(f"{where}: exactly one of {', '.join(TASK_TYPES)} must be provided, got {kinds}")
        clusters = [c for c in CLUSTER_FIELDS if c in task]
        if len(clusters) > 1:
            raise _invalid(f"{where}: only one of {', '.join(CLUSTER_FIELDS)} may be set, got {clusters}")
        if not clusters:
            raise _invalid(f"{where}: one of {', '.join(CLUSTER_FIELDS)} must be provided")
        if "new_cluster" in task:
            _validate_cluster(task["new_cluster"], f"{where}.new_cluster")
        for j, library in enumerate(task.get("libraries") or []):
            if not isinstance(library, dict) or len([k for k in LIBRARY_KINDS if library.get(k)]) != 1:
                raise _invalid(f"{where}.libraries[{j}] must set exactly one of {', '.join(LIBRARY_KINDS)}")
        if "python_wheel_task" in task:
            _validate_wheel_task(task["python_wheel_task"], f"{where}.python_wheel_task")
        # What this stand-in can run, beyond what the real API accepts.
        if kinds[0] != "python_wheel_task" or clusters[0] != "new_cluster" or len(tasks) != 1:
            raise _invalid(
                "This fake workspace runs one python_wheel_task on a new_cluster per run; "
                f"got {kinds[0]} on {clusters[0]} in {len(tasks)} task(s)"
            )


def _validate_cluster(cluster: Any, where: str) -> None:
    if not isinstance(cluster, dict):
        raise _invalid(f"{where} must be an object")
    if not cluster.get("spark_version"):
        raise _invalid(f"Missing required field: {where}.spark_version")
    if not cluster.get("node_type_id") and not cluster.get("instance_pool_id"):
        raise _invalid(f"{where}: one of node_type_id or instance_pool_id must be provided")
    if "num_workers" not in cluster and "autoscale" not in cluster:
        raise _invalid(f"{where}: one of num_workers or autoscale must be provided")
    workers = cluster.get("num_workers", 0)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise _invalid(f"{where}.num_workers must be a non-negative integer, got {workers!r}")
    for name in ("spark_env_vars", "spark_conf", "custom_tags"):
        value = cluster.get(name)
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
        ):
            raise _invalid(f"{where}.{name} must be a map of strings")


def _validate_wheel_task(task: Any, where: str) -> None:
    if not isinstance(task, dict):
        raise _invalid(f"{where} must be an object")
    for name in ("package_name", "entry_point"):
        if not isinstance(task.get(name), str) or not task[name]:
            raise _invalid(f"Missing required field: {where}.{name}")
    parameters = task.get("parameters")
    if parameters is not None and (
        not isinstance(parameters, list) or not all(isinstance(p, str) for p in parameters)
    ):
        raise _invalid(f"{where}.parameters must be a list of strings")
    if parameters and task.get("named_parameters"):
        raise _invalid(f"{where}: parameters and named_parameters cannot both be set")


class _Handler(BaseHTTPRequestHandler):
    api: FakeJobsApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # tests read api.requests instead of stderr

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode(errors="replace")
        with self.api._lock:
            self.api.requests.append(RecordedRequest(method, split.path, query, body))
        try:
            if self.headers.get("Authorization") != f"Bearer {self.api.token}":
                raise ApiError(401, "UNAUTHENTICATED", "Invalid access token.")
            if isinstance(body, str):
                raise ApiError(400, "MALFORMED_REQUEST", "Invalid JSON given in the body of the request")
            status, response = 200, self.api.handle(method, split.path, query, body)
        except ApiError as err:
            status, response = err.status, {"error_code": err.error_code, "message": err.message}
        data = json.dumps(response).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")
