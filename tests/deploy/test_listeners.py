"""Every server the project's own commands start listens on loopback only.

Each command starts as a user starts it, in a session of its own, on a throwaway SPARKTUNE_HOME
and on ports chosen free now, all at once: ``make airflow-ui`` (api-server, scheduler,
dag-processor, triggerer), ``make mlflow-ui``, ``make serve``, and a Spark job's driver (its UI,
RPC and block manager) in the environment the embedded runner gives the tasks of ``make run``.
``make`` runs with ``-o venv``: the venv is the one running this test, and setting it up is not
what is checked. Once every one answers, the listening sockets of each session (psutil) are read
for a few seconds, and any address but 127.0.0.1 or ::1 fails the test. The native stack's
listeners are checked on the session's stack (tests/stack/test_full_stack.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
# Set by tests/conftest.py for the session's own stores and JVMs: the commands start from a user's shell.
_SESSION_ONLY = (
    "AIRFLOW_HOME",
    "MLFLOW_TRACKING_URI",
    "SPARKTUNE_LAKE_URI",
    "SPARKTUNE_HOME",
    "SPARK_LOCAL_IP",
)
# Airflow's four components on two cores that other tests share take about a minute to be healthy.
STARTUP_TIMEOUT_S = 300
# How long the listeners are watched once all answer: a log server starts beside its component.
WATCH_S = 4
# Airflow 3.3 signs with HS512; PyJWT warns of a shorter key, Airflow of a missing one.
WEAK_KEY_MESSAGES = ("minimum recommended length", "was empty, using a generated one")

DRIVER_PROBE = """
import time
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("listener-probe").getOrCreate()
spark.range(10).count()
print("driver ready", flush=True)
time.sleep(600)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    """The status and body of a GET; (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


@dataclass
class Command:
    """One command in its own session: how to tell it is up, and the port it must be seen on."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    ready: Callable[[Command], bool]
    port: int | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the session's group, SIGKILL to what is left after 30 s."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self.process.poll() is None or _session_processes(self.process.pid):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                break
            time.sleep(0.5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


def _session_processes(leader: int) -> list[psutil.Process]:
    """The processes of the session ``leader`` began: its descendants, and any that left the tree
    (re-parented to init) but kept the session."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(leader)
        found.update((p.pid, p) for p in [root, *root.children(recursive=True)])
    for process in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getsid(process.pid) == leader:
                found[process.pid] = process
    alive = []
    for process in found.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def _listeners(leader: int) -> set[tuple[str, str, int]]:
    """(process, address, port) of every listening TCP socket in the session."""
    listening = set()
    for process in _session_processes(leader):
        try:
            name = " ".join(process.cmdline()[:4]).strip() or process.name()
            sockets = process.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        listening.update((name, s.laddr.ip, s.laddr.port) for s in sockets if s.status == psutil.CONN_LISTEN)
    return listening


def _airflow_healthy(port: int) -> bool:
    status, body = _get(f"http://127.0.0.1:{port}/api/v2/monitor/health")
    if status != 200:
        return False
    health = json.loads(body)
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all((health.get(part) or {}).get("status") == "healthy" for part in parts)


def _user_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SESSION_ONLY}
    return {**env, "SPARKTUNE_HOME": str(home), **extra}


def _commands(tmp_path: Path) -> list[Command]:
    from sparktune_dev.embedded.environment import embedded_env

    make = ["make", "-s", "-o", "venv"]
    # One home each: two processes migrating one SQLite store at once can fail each other.
    homes = {name: tmp_path / name for name in ("airflow-ui", "mlflow-ui", "serve", "driver")}
    for home in homes.values():
        home.mkdir()
    airflow_port, mlflow_port, serve_port = _free_port(), _free_port(), _free_port()
    probe = tmp_path / "driver_probe.py"
    probe.write_text(DRIVER_PROBE)
    driver_env = embedded_env(homes["driver"], base=_user_env(homes["driver"]))
    return [
        Command(
            "make airflow-ui",
            [*make, "airflow-ui"],
            _user_env(homes["airflow-ui"], AIRFLOW__API__PORT=str(airflow_port)),
            tmp_path / "airflow-ui.log",
            lambda c: _airflow_healthy(airflow_port),
            airflow_port,
        ),
        Command(
            "make mlflow-ui",
            [*make, "mlflow-ui", f"MLFLOW_UI_PORT={mlflow_port}"],
            _user_env(homes["mlflow-ui"]),
            tmp_path / "mlflow-ui.log",
            lambda c: _get(f"http://127.0.0.1:{mlflow_port}/health")[0] == 200,
            mlflow_port,
        ),
        Command(
            "make serve",
            [*make, "serve", f"SERVE_ARGS=--port {serve_port}"],
            _user_env(homes["serve"]),
            tmp_path / "serve.log",
            # 503 until a champion exists: up and answering is what counts here.
            lambda c: _get(f"http://127.0.0.1:{serve_port}/ping")[0] in (200, 503),
            serve_port,
        ),
        Command(
            "a Spark job's driver (make run's environment)",
            [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]", str(probe)],
            driver_env,
            tmp_path / "driver.log",
            lambda c: "driver ready" in c.output(),
        ),
    ]


def test_every_server_the_project_starts_listens_on_loopback_only(tmp_path):
    commands = _commands(tmp_path)
    try:
        for command in commands:
            command.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        waiting = list(commands)
        while waiting:
            for command in list(waiting):
                assert command.process.poll() is None, (
                    f"{command.name} exited ({command.process.returncode}):\n{command.output()[-4000:]}"
                )
                if command.ready(command):
                    waiting.remove(command)
            assert time.monotonic() < deadline, (
                f"not up after {STARTUP_TIMEOUT_S} s: {[c.name for c in waiting]}; logs in {tmp_path}"
            )
            time.sleep(1)
        seen: dict[str, set[tuple[str, str, int]]] = {c.name: set() for c in commands}
        until = time.monotonic() + WATCH_S
        while time.monotonic() < until:
            for command in commands:
                seen[command.name] |= _listeners(command.process.pid)
            time.sleep(0.5)
        # A signed request: the all-admins UI signs a token for each one, with the generated key.
        dags_status = _get(f"http://127.0.0.1:{commands[0].port}/api/v2/dags")[0]
    finally:
        for command in commands:
            command.stop()

    for command in commands:
        ports = {port for _, _, port in seen[command.name]}
        assert seen[command.name], f"{command.name}: no listening socket found in its session"
        assert command.port is None or command.port in ports, (
            f"{command.name}: nothing listens on its port {command.port}; found {sorted(seen[command.name])}"
        )
    exposed = {
        command.name: sorted(s for s in seen[command.name] if s[1] not in LOOPBACK) for command in commands
    }
    exposed = {name: sockets for name, sockets in exposed.items() if sockets}
    assert not exposed, f"listening beyond loopback (process, address, port): {exposed}"
    assert dags_status == 200, (
        f"make airflow-ui answered {dags_status} to GET /api/v2/dags; see {commands[0].log}"
    )
    weak = [line for line in commands[0].output().splitlines() if any(m in line for m in WEAK_KEY_MESSAGES)]
    assert not weak, "make airflow-ui signs with a weak or generated key:\n" + "\n".join(weak[:5])
