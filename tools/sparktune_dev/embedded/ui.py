"""``make airflow-ui``: Airflow's UI and services on the embedded state, listening on loopback only.

``airflow standalone`` ran this before. It starts the scheduler's and the triggerer's log servers,
which Airflow 3.3 binds to every interface (``airflow.utils.serve_logs`` hands uvicorn ``host=""``
and no setting changes it), and it passes its components no flag to leave them off. This starts the
same four components itself with the log servers off (``--skip-serve-logs``, as ``make stack``
does): task logs are files on this machine, which the api-server reads directly.

- The api-server listens on ``AIRFLOW__API__HOST``:``AIRFLOW__API__PORT``, default 127.0.0.1:8080.
- On a loopback address every user is admin (``[core] simple_auth_manager_all_admins``), as before.
  On any other address the UI wants a login, user ``admin`` with a password generated into
  ``$SPARKTUNE_HOME/secrets/airflow-ui-passwords.json`` (0600), and all-admins is refused.
- The JWT and session signing secrets come from ``$SPARKTUNE_HOME/secrets`` (``embedded_env``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

from sparktune_dev import secret_files
from sparktune_dev.embedded.environment import (
    airflow_option_given,
    embedded_env,
    ensure_airflow_db,
    secrets_dir,
)

COMPONENTS = {
    "api-server": ["api-server"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}
DEFAULT_PORT = "8080"
ALL_ADMINS_ENV = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"
PASSWORDS_FILE_ENV = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
USERS_ENV = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"
_WILDCARDS = ("0.0.0.0", "::", "")


class UiError(RuntimeError):
    """The UI cannot start as configured; the message says which setting and what to change."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_url(host: str, port: str) -> str:
    """The URL this machine reaches a server on ``host``:``port`` at (a wildcard bind: on loopback)."""
    reach = "127.0.0.1" if host in _WILDCARDS else host
    return f"http://{f'[{reach}]' if ':' in reach else reach}:{port}"


def ui_env(home: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The embedded environment, completed for the four long-running components."""
    env = embedded_env(home, base=base)
    host = env["AIRFLOW__API__HOST"]
    port = env.setdefault("AIRFLOW__API__PORT", DEFAULT_PORT)
    # Airflow's default is http://localhost:8080/execution/: another port would leave the task
    # processes calling nobody, and localhost may resolve to ::1, where nothing listens.
    env.setdefault("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", f"{local_url(host, port)}/execution/")
    all_admins = env.get(ALL_ADMINS_ENV, "").strip().lower() == "true"
    if is_loopback(host):
        env.setdefault(ALL_ADMINS_ENV, "True")
        all_admins = env[ALL_ADMINS_ENV].strip().lower() == "true"
    elif all_admins:
        raise UiError(
            f"AIRFLOW__API__HOST={host} opens the UI to other machines, and {ALL_ADMINS_ENV}=True would "
            f"make everyone who reaches it an admin; unset {ALL_ADMINS_ENV} to log in as admin with a "
            f"generated password, or keep the host on 127.0.0.1"
        )
    else:
        env[ALL_ADMINS_ENV] = "False"
    if not all_admins and not airflow_option_given(env, PASSWORDS_FILE_ENV):
        # Airflow would generate the passwords into a file every local user can read, and print them.
        users = [entry.split(":")[0].strip() for entry in env.get(USERS_ENV, "admin:admin").split(",")]
        env[PASSWORDS_FILE_ENV] = secret_files.ensure_password_file(
            secrets_dir(home) / "airflow-ui-passwords.json", [u for u in users if u]
        )
    return env


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5) as reply:
            health = json.load(reply)
    except (OSError, ValueError):
        return False
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all((health.get(part) or {}).get("status") == "healthy" for part in parts)


class _Output:
    """Each component's lines on this terminal, prefixed with its name (as standalone showed them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def line(self, name: str, text: bytes) -> None:
        with self._lock:
            sys.stdout.buffer.write(f"{name:13} | ".encode() + text.rstrip(b"\n") + b"\n")
            sys.stdout.flush()

    def follow(self, name: str, stream: IO[bytes]) -> threading.Thread:
        def pump() -> None:
            for text in iter(stream.readline, b""):
                self.line(name, text)

        thread = threading.Thread(target=pump, name=f"output-{name}", daemon=True)
        thread.start()
        return thread


def _stop(processes: dict[str, subprocess.Popen], timeout: float = 30) -> None:
    for process in processes.values():
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
    deadline = time.monotonic() + timeout
    for process in processes.values():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_ui(home: Path) -> int:
    """Start the four components, print where the UI is once all are healthy, and run until one
    exits or this process is stopped (Ctrl-C, SIGTERM); then stop the others."""
    try:
        env = ui_env(home)
    except UiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ensure_airflow_db(env)
    url = local_url(env["AIRFLOW__API__HOST"], env["AIRFLOW__API__PORT"])
    output = _Output()
    # SIGTERM (a supervisor, `kill`) stops the components as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    processes: dict[str, subprocess.Popen] = {}
    try:
        for name, args in COMPONENTS.items():
            # Same process group: Ctrl-C in the terminal, or a signal to the group, reaches them all.
            processes[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            output.follow(name, processes[name].stdout)
        shown = False
        while True:
            exited = {name: p.returncode for name, p in processes.items() if p.poll() is not None}
            if exited:
                name, code = next(iter(exited.items()))
                output.line("airflow-ui", f"{name} exited with code {code}; stopping the others".encode())
                return code or 1
            if not shown and _healthy(url):
                shown = True
                if env[ALL_ADMINS_ENV].lower() == "true":
                    login = "every user is admin, so it stays on loopback"
                else:
                    login = f"log in as a user of {env[PASSWORDS_FILE_ENV]}"
                output.line("airflow-ui", f"ready: {url}; {login}; Ctrl-C stops it".encode())
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(processes)
