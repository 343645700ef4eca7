"""The MLflow server goes away while ``register`` or ``promote_champion`` runs; Airflow's retry finishes.

A real ``mlflow server`` (the native stack's command, ``stack.mlflow_command``, on a throwaway
PostgreSQL database, artifacts in a temp folder) sits behind a small TCP proxy of this test. The
operators reach it as a DAG run does: through the ``mlflow_default`` connection (pointing at the
proxy), ``pre_execute`` then ``execute``, with MLflow's own HTTP retries turned down
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES=1``, ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=0``,
``MLFLOW_HTTP_REQUEST_TIMEOUT=5``; the defaults retry for minutes) so an attempt fails within a
second, as one Airflow task attempt would. The retry is a new operator instance with the same
task, DAG run and arguments and the next try number, as Airflow's retry is.

Why a proxy: it reads the HTTP requests between client and server, so an outage lands exactly
between two requests of the operator, the k-th, which a timer or a signal sent from outside
cannot do. From the client's side a cut is what a stopped server looks like: every connection is
reset and new ones are refused until the proxy listens again. A cut comes in two kinds: the k-th
request never reaches the server, or the server applies it and its answer is lost (the client
cannot tell whether the write happened). The sweep cuts the champion promotion at every k, both
kinds, in about a second each; a restart of the real server costs 10-40 s here, so the real
SIGKILL happens once, in the middle of registration: right after the server committed the new
model version and before its answer left, a hook of the proxy kills the server's process group;
the test starts it again on the same database and port.

After every failed attempt the registry must be in a state a user may see: ``champion`` on a
version whose ``gate_decision`` tag is ``promote``, and either still the old champion or already
the new one with ``previous_champion`` the old one. After the retry: one model version per
training run, the aliases where the run put them, each alias move in the audit log exactly once
and no audit record left unfinished. (Before the audit record became a write-ahead intent, a cut
after the alias moved and before the record was written lost the move from the audit log.)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from sparktune.core.experiments import get_or_create_experiment
from sparktune.model.process_setup import using_tracking_uri
from sparktune.release.registry import (
    AUDIT_EXPERIMENT,
    CANDIDATE,
    CHAMPION,
    PREVIOUS_CHAMPION,
    STAGING,
    alias_version,
    audit_log,
)
from sparktune_airflow import PromoteModelOperator, PromotionGateOperator, RegisterModelOperator
from sparktune_dev.stack import (
    MLFLOW_SERVER_ENV,
    StackConfig,
    drop_databases,
    ensure_databases,
    mlflow_command,
)

pytestmark = pytest.mark.slow

MODEL = "outage-intent"
# What evaluate returns for a good model, per-class recalls included (the gate's per-class rule reads them).
METRICS = {
    "eval_accuracy": 0.95,
    "eval_loss": 0.1,
    "eval_macro_f1": 0.95,
    "eval_recall_billing": 0.95,
    "eval_recall_login": 0.95,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the proxy


def _read_message(stream, *, response_to: str | None = None) -> bytes | None:
    """One HTTP/1.1 message (head and body) from ``stream``, raw; None at end of stream."""
    head = b""
    while True:
        line = stream.readline(65537)
        if not line:
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            break
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    status = head.split(b" ", 2)[1] if response_to is not None else b""
    if response_to == "HEAD" or status in (b"204", b"304") or status.startswith(b"1"):
        return head
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = b""
        while True:
            size_line = stream.readline()
            body += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = stream.readline()
                    body += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return head + body
            body += stream.read(size + 2)
    length = int(headers.get("content-length") or 0)
    return head + (stream.read(length) if length else b"")


@dataclass
class Cut:
    """Cut the connection at the ``at``-th request after arming (after the server answered it if
    ``answered``); ``hook`` runs first (e.g. kill the server)."""

    at: int
    answered: bool
    hook: Callable[[], None] | None = None
    match: Callable[[str, str, bytes], bool] = lambda method, path, body: True
    stay_up: bool = False  # drop this connection only: the server is back before the client retries
    seen: int = 0
    fired: str | None = None


@dataclass
class FaultProxy:
    """127.0.0.1:``port`` -> the server; ``requests`` lists what passed through (method, path)."""

    upstream_port: int
    port: int = field(default_factory=_free_port)
    requests: list[tuple[str, str]] = field(default_factory=list)
    cut: Cut | None = None
    _sockets: set = field(default_factory=set)
    _listener: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(32)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """What a stopped server does: refuse new connections, reset the open ones."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = list(self._sockets), set()
        for sock in ([listener] if listener is not None else []) + sockets:
            with contextlib.suppress(OSError):  # shutdown wakes a thread blocked in accept() too
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets.update((client, upstream))
        from_client, from_server = client.makefile("rb"), upstream.makefile("rb")
        try:
            while True:
                # Between requests, the server closing an idle connection closes the client's too,
                # so the client's pool sees it dropped instead of sending into it.
                readable, _, _ = select.select([client, upstream], [], [])
                if upstream in readable and client not in readable:
                    return
                request = _read_message(from_client)
                if request is None:
                    return
                method, path = request.split(b" ", 2)[:2]
                method, path = method.decode(), path.decode().split("?")[0]
                cut = self._due(method, path, request)
                if cut is not None and not cut.answered:
                    return self._fire(cut, method, path)
                upstream.sendall(request)
                response = _read_message(from_server, response_to=method)
                if response is None:
                    return
                if cut is not None:  # the server did it; its answer never arrives
                    return self._fire(cut, method, path)
                with self._lock:
                    self.requests.append((method, path))
                client.sendall(response)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                with self._lock:
                    self._sockets.discard(sock)
                sock.close()

    def _due(self, method: str, path: str, request: bytes) -> Cut | None:
        with self._lock:
            cut = self.cut
            if cut is None or cut.fired or not cut.match(method, path, request):
                return None
            cut.seen += 1
            if cut.seen < cut.at:
                return None
            cut.fired = f"{method} {path}"
            return cut

    def _fire(self, cut: Cut, method: str, path: str) -> None:
        if cut.hook is not None:
            cut.hook()
        if not cut.stay_up:
            self.down()


# -- the server


@dataclass
class MlflowServer:
    config: StackConfig
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return self.config.mlflow_url

    def start(self, timeout: float = 120) -> None:
        log = open(self.config.home / "mlflow-server.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            mlflow_command(self.config), env={**os.environ, **MLFLOW_SERVER_ENV},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.config.home,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server did not start; see {self.config.home / 'mlflow-server.log'}"
                )
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL to the server's process group: no shutdown, no flushing, as a crash."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("mlflow-outage")
    config = StackConfig(
        home=home, mlflow_port=_free_port(), database_prefix=f"sparktune_outage_{uuid.uuid4().hex[:8]}"
    )
    (config.state_dir / "mlflow-artifacts").mkdir(parents=True)
    ensure_databases(config)
    server = MlflowServer(config)
    try:
        started = time.monotonic()
        server.start()
        print(f"mlflow server up in {time.monotonic() - started:.1f} s")
        yield server
    finally:
        server.kill()
        drop_databases(config)


@pytest.fixture(scope="module")
def proxy(server):
    proxy = FaultProxy(server.config.mlflow_port)
    proxy.up()
    yield proxy
    proxy.down()


@pytest.fixture()
def env(proxy, monkeypatch):
    """The task's environment: mlflow_default at the proxy, MLflow's retries turned down."""
    connection = {"conn_type": "generic", "host": "127.0.0.1", "port": proxy.port, "schema": "http"}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(connection))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{proxy.port}")  # restored afterwards
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    yield
    proxy.cut = None
    if not proxy.is_up:
        proxy.up()


@pytest.fixture(scope="module")
def direct(server) -> MlflowClient:
    """A client straight to the server (not through the proxy), for setting up and checking."""
    return MlflowClient(server.url)


class _EchoModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def trained_run(server: MlflowServer) -> str:
    """A finished MLflow run with a logged model, as ``train`` leaves one (the registry does not
    look inside the model, so a tiny pyfunc stands in for the fine-tuned one)."""
    experiment = get_or_create_experiment(MlflowClient(server.url), "sparktune-outage-intent")
    with using_tracking_uri(server.url), mlflow.start_run(experiment_id=experiment) as run:
        mlflow.pyfunc.log_model(name="model", python_model=_EchoModel(), pip_requirements=[])
    return run.info.run_id


# -- the tasks, as a DAG run executes them


class FakeTI:
    def __init__(self, dag_run: str, task_id: str, try_number: int) -> None:
        self.dag_id, self.run_id, self.task_id, self.try_number = "llm_finetune", dag_run, task_id, try_number

    def xcom_push(self, key: str, value: Any) -> None:
        pass


def attempt(make: Callable[[], Any], dag_run: str, try_number: int) -> Any:
    operator = make()
    context = {"ti": FakeTI(dag_run, operator.task_id, try_number), "params": {}, "task": operator}
    operator.pre_execute(context)
    return operator.execute(context)


def register(run_id: str) -> Callable[[], RegisterModelOperator]:
    tags = {"data_fingerprint": "fp-outage", "base_model": "tiny"}
    return lambda: RegisterModelOperator(task_id="register", run_id=run_id, model_name=MODEL, tags=tags)


def gate(version: str, run_id: str, champion: str | None) -> Callable[[], PromotionGateOperator]:
    evaluation = {
        "model_name": MODEL,
        "challenger_version": version,
        "champion_version": champion,
        "challenger": METRICS,
        "champion": METRICS if champion else None,
    }
    return lambda: PromotionGateOperator(task_id="gate", evaluation=evaluation, run_id=run_id, rules={})


def promote(
    version: str, alias: str, expected: str | None, decision: dict
) -> Callable[[], PromoteModelOperator]:
    return lambda: PromoteModelOperator(
        task_id=f"promote_{alias}", model_name=MODEL, version=version, alias=alias,
        expected_champion=expected, gate_decision=decision,
    )  # fmt: skip


def with_retries(proxy: FaultProxy, make, dag_run: str, cuts: list[Cut], between=None) -> Any:
    """One attempt per cut, each of which must fail because its cut fired; after each, ``between``
    looks at the registry, the proxy (the server) comes back, and the next attempt starts. The
    last attempt runs without a cut and returns the task's result."""
    for try_number, cut in enumerate(cuts, start=1):
        proxy.cut = cut
        try:
            attempt(make, dag_run, try_number)
        except Exception as exc:  # noqa: BLE001 - any error of the attempt; the cut must explain it
            assert cut.fired, f"attempt {try_number} failed without an outage: {exc!r}"
        else:
            raise AssertionError(f"attempt {try_number} succeeded: the cut at request {cut.at} never came")
        finally:
            proxy.cut = None
        if between is not None:
            between()
        if not proxy.is_up:
            proxy.up()
    return attempt(make, dag_run, len(cuts) + 1)


# -- what must hold


def gate_passed(client: MlflowClient, version: str | None) -> bool:
    return (
        version is not None
        and client.get_model_version(MODEL, version).tags.get("gate_decision") == "promote"
    )


def assert_champion_sane(client: MlflowClient, old: str | None, new: str, old_previous: str | None) -> None:
    """Between attempts: champion gated, and either not moved yet or moved with previous_champion."""
    champion = alias_version(client, MODEL, CHAMPION)
    previous = alias_version(client, MODEL, PREVIOUS_CHAMPION)
    assert gate_passed(client, champion), champion
    assert champion in (old, new), (champion, old, new)
    if champion == new:
        assert previous == old, (champion, previous, old)
    else:  # not moved: previous_champion is the one from before, or already the champion
        assert previous in (old_previous, old), (previous, old_previous, old)


def records_of(client: MlflowClient, dag_run: str) -> tuple[list[dict], list[str]]:
    """The audit log's records of one DAG run, and the statuses of all its records."""
    experiment = client.get_experiment_by_name(AUDIT_EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], f"tags.`sparktune.audit.model` = '{MODEL}'")
    mine = [r for r in runs if r.data.tags["sparktune.audit.actor"].split("/")[1] == dag_run]
    finished = [m for m in audit_log(client, MODEL) if m["actor"].split("/")[1] == dag_run]
    return finished, [r.info.status for r in mine]


def versions_of(client: MlflowClient, run_id: str) -> list[str]:
    return [v.version for v in client.search_model_versions(f"name = '{MODEL}' and run_id = '{run_id}'")]


def gate_and_promote(client: MlflowClient, proxy, dag_run: str, run_id: str, version: str) -> None:
    """gate -> promote_staging -> promote_champion, without faults."""
    champion = alias_version(client, MODEL, CHAMPION)
    decision = with_retries(proxy, gate(version, run_id, champion), dag_run, [])
    with_retries(proxy, promote(version, STAGING, None, decision), dag_run, [])
    with_retries(proxy, promote(version, CHAMPION, champion, decision), dag_run, [])


def gated_versions(server, proxy, client: MlflowClient, wanted: int = 2) -> list[str]:
    """Versions that passed the gate, making more (a whole DAG run each) while there are too few."""
    versions = client.search_model_versions(f"name = '{MODEL}'")
    found = sorted((v.version for v in versions if v.tags.get("gate_decision") == "promote"), key=int)
    while len(found) < wanted:
        run_id = trained_run(server)
        dag_run = f"setup-{len(found)}"
        version = with_retries(proxy, register(run_id), dag_run, [])["version"]
        gate_and_promote(client, proxy, dag_run, run_id, version)
        found.append(version)
    return found


# -- the tests


def test_server_killed_during_registration_the_retries_register_once(server, proxy, direct, env):
    """Attempt 1: SIGKILL to the server right after it committed the new version, before its answer
    left; the server is started again. Attempt 2: the connection is lost before the first tag is
    set on that version. Attempt 3 (the last of ``retries=2``) completes."""
    (v1,) = gated_versions(server, proxy, direct, wanted=1)  # a champion the outage could harm
    assert alias_version(direct, MODEL, CHAMPION) == v1
    run_id = trained_run(server)
    restarts = []

    def between_attempts() -> None:
        if server.process.poll() is not None:
            started = time.monotonic()
            server.start()  # same database, same port
            restarts.append(time.monotonic() - started)
        # The version exists, created with its tags in one request; not candidate yet.
        (made,) = direct.search_model_versions(f"name = '{MODEL}' and run_id = '{run_id}'")
        assert made.tags.get("data_fingerprint") == "fp-outage"
        assert alias_version(direct, MODEL, CANDIDATE) == v1
        assert alias_version(direct, MODEL, CHAMPION) == v1 and gate_passed(direct, v1)

    cuts = [
        Cut(
            at=1, answered=True, hook=server.kill, match=lambda m, p, b: p.endswith("/model-versions/create")
        ),
        Cut(at=1, answered=False, match=lambda m, p, b: p.endswith("/model-versions/set-tag")),
    ]
    result = with_retries(proxy, register(run_id), "the-kill", cuts, between_attempts)
    assert len(restarts) == 1
    print(f"mlflow server restarted in {restarts[0]:.1f} s")
    assert versions_of(direct, run_id) == [result["version"]]  # one version for the run
    tags = direct.get_model_version(MODEL, result["version"]).tags
    assert (tags["data_fingerprint"], tags["base_model"]) == ("fp-outage", "tiny")
    assert alias_version(direct, MODEL, CANDIDATE) == result["version"]
    finished, statuses = records_of(direct, "the-kill")
    assert [(r["alias"], r["from_version"], r["to_version"]) for r in finished] == [
        (CANDIDATE, v1, result["version"])
    ]
    assert statuses == ["FINISHED"]
    gate_and_promote(direct, proxy, "the-kill", run_id, result["version"])  # the sweep's second version


@pytest.mark.parametrize("answered", [False, True], ids=["request-lost", "answer-lost"])
def test_champion_promotion_cut_at_every_request_leaves_no_half_moved_alias(
    server, proxy, direct, env, answered
):
    """Cut ``promote_champion`` at its k-th request for k = 1, 2, ... until an attempt gets through
    unharmed; champion alternates between two gated versions, one DAG run per k."""
    a, b = gated_versions(server, proxy, direct)[-2:]
    decision = {"promote": True, "passed": True, "mode": "enabled", "reasons": ["min_accuracy: pass"]}
    kind = "answer" if answered else "request"
    k = 0
    while True:
        k += 1
        old = alias_version(direct, MODEL, CHAMPION)
        old_previous = alias_version(direct, MODEL, PREVIOUS_CHAMPION)
        new = a if old == b else b
        dag_run = f"sweep-{kind}-{k}"
        make = promote(new, CHAMPION, old, {**decision, "champion_version": old})
        cut = Cut(at=k, answered=answered)
        try:
            with_retries(
                proxy,
                make,
                dag_run,
                [cut],
                functools.partial(assert_champion_sane, direct, old, new, old_previous),
            )
            fired = True
        except AssertionError as exc:
            if "never came" not in str(exc):
                raise
            fired = False  # k is past the promotion's last request: it ran through
        champion = alias_version(direct, MODEL, CHAMPION)
        assert (champion, alias_version(direct, MODEL, PREVIOUS_CHAMPION)) == (new, old), cut.fired
        finished, statuses = records_of(direct, dag_run)
        assert [(r["from_version"], r["to_version"]) for r in finished] == [(old, new)], cut.fired
        assert statuses == ["FINISHED"], (cut.fired, statuses)  # no record left unfinished
        if not fired:
            break
    assert k > 5, f"the promotion made only {k - 1} requests"
    print(f"champion promotion cut at each of its {k - 1} requests ({kind} lost), retried")


def test_a_create_whose_answer_is_lost_and_that_mlflow_resends_makes_no_second_version(
    server, proxy, direct, env
):
    """MLflow's client retries POSTs too (``allowed_methods=None``): when the server applied a
    create and only its answer was lost, and the server answers the client's retry, the create
    happens twice. One attempt of ``register``, one of ``promote_staging``, no Airflow retry."""
    run_id = trained_run(server)
    create = Cut(
        at=1, answered=True, stay_up=True, match=lambda m, p, b: p.endswith("/model-versions/create")
    )
    proxy.cut = create
    result = attempt(register(run_id), "resent", 1)
    assert create.fired
    assert versions_of(direct, run_id) == [result["version"]]
    assert alias_version(direct, MODEL, CANDIDATE) == result["version"]

    intent = Cut(at=1, answered=True, stay_up=True, match=lambda m, p, b: p.endswith("/runs/create"))
    proxy.cut = intent
    decision = {"promote": True, "passed": True, "mode": "enabled", "reasons": []}
    attempt(promote(result["version"], STAGING, None, decision), "resent", 1)
    assert intent.fired
    assert alias_version(direct, MODEL, STAGING) == result["version"]
    finished, statuses = records_of(direct, "resent")
    assert [(r["alias"], r["to_version"]) for r in finished] == [
        (CANDIDATE, result["version"]),
        (STAGING, result["version"]),
    ]
    # The twin the re-sent create_run made is marked FAILED: not a move, not in the audit log.
    assert sorted(statuses) == ["FAILED", "FINISHED", "FINISHED"]
