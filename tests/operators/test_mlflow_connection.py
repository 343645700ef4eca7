"""The MLflow-facing operators reach MLflow through the ``mlflow_default`` Airflow connection.

``MLflowHook.get_conn()`` hands out a client that sends the connection's credentials itself, and the
processes a task starts get them in their own environment; the task's process keeps its
``os.environ`` and MLflow's globals as they were. Checked against a small HTTP server of this test
that records what each request carried (fast), and against a real ``mlflow server`` behind a proxy
that turns away requests without the connection's credentials (registry, runs and the proxied
artifacts; slow: the server takes seconds to start).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk import Connection
from sparktune_airflow.core.mlflow import MLflowHook, tracking_env

LOGIN, PASSWORD = "svc", "s3cret"
BASIC = "Basic " + base64.b64encode(f"{LOGIN}:{PASSWORD}".encode()).decode()


def test_http_connection_gives_the_server_and_its_credentials():
    conn = Connection(
        conn_id="mlflow_default", conn_type="https", host="mlflow.example.com", port=443,
        login="svc", password="s3cret", extra=json.dumps({"token": "tok"}),
    )  # fmt: skip
    assert tracking_env(conn) == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.com:443",
        "MLFLOW_TRACKING_USERNAME": "svc",
        "MLFLOW_TRACKING_PASSWORD": "s3cret",
        "MLFLOW_TRACKING_TOKEN": "tok",
    }


def test_tracking_uri_in_the_extra_wins_and_a_missing_host_names_the_fix():
    conn = Connection(conn_id="m", conn_type="generic", extra=json.dumps({"tracking_uri": "databricks"}))
    assert tracking_env(conn) == {"MLFLOW_TRACKING_URI": "databricks"}
    with pytest.raises(ValueError, match="AIRFLOW_CONN_MLFLOW_DEFAULT"):
        tracking_env(Connection(conn_id="m", conn_type="http"))


def test_generic_connection_takes_its_scheme_from_the_schema():
    # What `make stack` and docker-compose.yaml define: no HTTP provider is installed.
    conn = Connection(conn_id="mlflow_default", conn_type="generic", host="mlflow", port=5000, schema="http")
    assert tracking_env(conn) == {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}


# -- a server that records what reaches it


class _Recorder(ThreadingHTTPServer):
    """127.0.0.1 on a free port. Without ``upstream``: answers MLflow's REST calls with ``answers``
    (path -> JSON; anything else ``{}``). With ``upstream`` (a port): forwards every request that
    carries ``required`` as its Authorization header there, and answers 401 to the rest, as a
    reverse proxy with basic authentication in front of an MLflow server does."""

    daemon_threads = True

    def __init__(self, answers=None, upstream: int | None = None, required: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers, self.upstream, self.required = answers or {}, upstream, required
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, *args) -> None:  # quiet
        pass

    def _handle(self) -> None:
        auth = self.headers.get("Authorization")
        self.server.requests.append((self.command, self.path, auth))
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.upstream is None:
            self._reply(200, json.dumps(self.server.answers.get(self.path.split("?")[0], {})).encode())
        elif auth != self.server.required:
            self._reply(401, b'{"error_code": "UNAUTHENTICATED", "message": "credentials required"}')
        else:
            upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=60)
            skip = {"host", "connection", "content-length", "transfer-encoding"}
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
            upstream.request(self.command, self.path, body=body, headers=headers)
            reply = upstream.getresponse()
            self._reply(reply.status, reply.read(), reply.getheader("Content-Type"))
            upstream.close()

    def _reply(self, status: int, body: bytes, content_type: str | None = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type or "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


@contextmanager
def _serving(recorder: _Recorder) -> Iterator[_Recorder]:
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.shutdown()
        recorder.server_close()


def _process_state() -> dict:
    """What a client must not change: the environment and MLflow's tracking URI global."""
    from mlflow.tracking._tracking_service import utils as tracking_utils

    env = {k: v for k, v in os.environ.items() if k != "_MLFLOW_TELEMETRY_SESSION_ID"}  # MLflow's own
    return {**env, "(mlflow.set_tracking_uri)": tracking_utils._tracking_uri}


def _changed(before: dict) -> list[str]:
    after = _process_state()
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def _connect(monkeypatch, url: str, **fields) -> None:
    host, port = url.removeprefix("http://").split(":")
    conn = {"conn_type": "http", "host": host, "port": int(port), **fields}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))


@pytest.fixture
def other_servers_credentials(monkeypatch):
    """The worker's environment names another server, with its credentials: none of it may be used."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9/elsewhere")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "other")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "from-another-server")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "token-of-another-server")


def test_get_conn_sends_the_connections_credentials_and_changes_nothing_in_the_process(
    monkeypatch, other_servers_credentials
):
    answers = {"/api/2.0/mlflow/registered-models/get": {"registered_model": {"name": "m"}}}
    with _serving(_Recorder(answers)) as server:
        _connect(monkeypatch, server.url, login=LOGIN, password=PASSWORD)
        before = _process_state()
        client = MLflowHook().get_conn()
        assert client.get_registered_model("m").name == "m"  # the registry
        client.set_tag("run-1", "k", "v")  # the tracking store
        assert not _changed(before)
        import mlflow

        assert mlflow.get_tracking_uri() == "http://127.0.0.1:9/elsewhere"
    assert client.tracking_uri == server.url
    assert [(m, p.split("?")[0], a) for m, p, a in server.requests] == [
        ("GET", "/api/2.0/mlflow/registered-models/get", BASIC),
        ("POST", "/api/2.0/mlflow/runs/set-tag", BASIC),
    ]


def test_a_token_connection_sends_a_bearer_token_and_no_login(monkeypatch, other_servers_credentials):
    with _serving(_Recorder()) as server:
        _connect(monkeypatch, server.url, extra=json.dumps({"token": "tok"}))
        MLflowHook().get_conn().set_tag("run-1", "k", "v")
    assert [auth for *_, auth in server.requests] == ["Bearer tok"]


def test_a_connection_without_credentials_sends_none(monkeypatch, other_servers_credentials):
    with _serving(_Recorder()) as server:
        _connect(monkeypatch, server.url)
        MLflowHook().get_conn().set_tag("run-1", "k", "v")
    assert [auth for *_, auth in server.requests] == [None]


def test_the_processes_a_task_starts_get_the_connection(monkeypatch, other_servers_credentials):
    _connect(monkeypatch, "http://127.0.0.1:5999", login=LOGIN, password=PASSWORD)
    before = dict(os.environ)
    env = MLflowHook().process_env()
    assert os.environ == before
    assert {k: v for k, v in env.items() if k.startswith("MLFLOW_TRACKING_")} == {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5999",
        "MLFLOW_TRACKING_USERNAME": LOGIN,
        "MLFLOW_TRACKING_PASSWORD": PASSWORD,
    }  # the other server's token is gone
    assert env["PATH"] == os.environ["PATH"]
    assert MLflowHook().tracking_uri() == "http://127.0.0.1:5999"


def test_without_the_connection_the_environment_decides(monkeypatch, tmp_path):
    uri = f"sqlite:///{tmp_path / 'kept.db'}"
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for hook in (MLflowHook(), MLflowHook(None)):
        assert hook.tracking_env() == {}
        assert hook.tracking_uri() == uri
        assert hook.process_env() == dict(os.environ)
    assert MLflowHook().get_conn().tracking_uri == uri


def test_the_smoke_test_process_gets_the_connection_and_the_task_keeps_its_environment(
    monkeypatch, tmp_path, other_servers_credentials
):
    """SmokeTestOperator end to end over the fake server: its own requests carry the connection's
    credentials, the smoke-test process it starts has them in its environment, and the task's
    environment is what it was."""
    import sparktune_airflow.release.smoke as smoke
    from sparktune_airflow import SmokeTestOperator

    started = []

    def fake_job(module, *args, env):
        started.append(env)
        output = Path(args[args.index("--output") + 1])
        output.write_text(json.dumps({"metrics": {"smoke_load_seconds": 1.0}}))
        return SimpleNamespace(exit_code=0, output="")

    monkeypatch.setattr(smoke, "run_module", fake_job)
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path))
    alias = {"model_version": {"name": "m", "version": "3"}}
    with _serving(_Recorder({"/api/2.0/mlflow/registered-models/alias": alias})) as server:
        _connect(monkeypatch, server.url, login=LOGIN, password=PASSWORD)
        before = _process_state()
        operator = SmokeTestOperator(
            task_id="smoke_test", model_name="m", version="3", dataset_uri="d", run_id="r"
        )
        ti = SimpleNamespace(dag_id="d", run_id="manual__1", task_id="smoke_test", try_number=1)
        operator.execute({"ti": ti})
        assert not _changed(before)
    assert {auth for *_, auth in server.requests} == {BASIC}
    child = started[0]
    assert child["MLFLOW_TRACKING_URI"] == server.url
    assert (child["MLFLOW_TRACKING_USERNAME"], child["MLFLOW_TRACKING_PASSWORD"]) == (LOGIN, PASSWORD)
    assert "MLFLOW_TRACKING_TOKEN" not in child


# -- a real MLflow server that asks for the connection's credentials


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory):
    """``mlflow server`` (SQLite, proxied artifacts) behind a proxy that wants the connection's login."""
    home = tmp_path_factory.mktemp("mlflow-guarded")
    recorder = _Recorder(required=BASIC)
    port = _free_port()
    command = [
        str(Path(sys.executable).parent / "mlflow"), "server",
        "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
        "--artifacts-destination", str(home / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    # No job runner (MLflow 3's background jobs): nothing here uses it, and it costs seconds.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(home / "server.log", "wb") as log:
        process = subprocess.Popen(
            command, env=env, cwd=home, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start: {home / 'server.log'}") from None
                time.sleep(0.2)
        recorder.upstream = port
        with _serving(recorder):
            yield recorder
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_client_works_a_guarded_server_with_the_connections_login_alone(
    guarded_server, monkeypatch, tmp_path, other_servers_credentials
):
    """Registry, runs, logged models and proxied artifacts (upload, listing, download) through a
    server that turns away any request without the connection's login; the process's environment
    (another server's credentials) and MLflow's globals stay as they were."""
    from mlflow.exceptions import MlflowException
    from sparktune.core.mlflow_client import mlflow_client
    from sparktune.model.train_request import TrainResult
    from sparktune.model.train_runs import load_finished_result
    from sparktune.release.registry import CANDIDATE, alias_version, move_alias, register_run_model

    _connect(monkeypatch, guarded_server.url, login=LOGIN, password=PASSWORD)
    before = _process_state()
    client = MLflowHook().get_conn()
    experiment = client.create_experiment(f"guarded-{tmp_path.name}")
    run = client.create_run(experiment, tags={"sparktune.train_key": "k1"})
    run_id = run.info.run_id
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    model = client.create_logged_model(experiment, name="model", source_run_id=run_id)
    result = tmp_path / "train_result.json"
    result.write_text(TrainResult(run_id, "m", 1, 2, 50.0, 0.1, 1.0, 1.0, 1.0, 1.0, 1).to_json())
    client.log_artifact(run_id, str(result))
    client.log_dict(run_id, {"rows": 3}, "pipeline/prepare_summary.json")
    assert sorted(f.path for f in client.list_artifacts(run_id)) == ["pipeline", "train_result.json"]
    client.set_tag(run_id, "sparktune.model_uri", f"runs:/{run_id}/model")
    client.set_terminated(run_id)
    finished = load_finished_result(client, f"guarded-{tmp_path.name}", "k1")
    assert finished["mlflow_run_id"] == run_id
    version = register_run_model(client, "guarded", run_id, {"data_fingerprint": "fp"})
    assert client.get_model_version("guarded", version).source == f"models:/{model.model_id}"
    move_alias(client, "guarded", CANDIDATE, version, actor="test", reason="registered")
    assert alias_version(client, "guarded", CANDIDATE) == version
    assert not _changed(before)
    assert guarded_server.requests and {auth for *_, auth in guarded_server.requests} == {BASIC}
    # The proxy does turn away a client with other credentials: the ones above were the connection's.
    with pytest.raises(MlflowException):
        mlflow_client(guarded_server.url).get_experiment(experiment)
