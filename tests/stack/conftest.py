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
    from tests.stack.stack_client import request as _request
except ImportError:  # rootdir-relative import, as pytest puts this folder on sys.path
    from stack_client import request as _request

STACK_ROWS = 2500  # the generated training source, as in the e2e module
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

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 1500) -> dict[str, Any]:
        from urllib.parse import quote

        deadline = time.monotonic() + timeout
        while True:
            run = self.rest("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")
            if run["state"] in ("success", "failed") or time.monotonic() > deadline:
                return run
            time.sleep(5)


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    from sparktune_airflow.stack import StackConfig, StackError, admin_password, down, up

    home = tmp_path_factory.mktemp("stack-home")
    subprocess.run(
        [sys.executable, "-m", "sparktune.demo_data", "--rows", str(STACK_ROWS), "--out",
         str(home / "data" / "support_tickets.jsonl")],
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
        database_prefix=f"sparktune_test_{uuid.uuid4().hex[:8]}",
        parallelism=2,
        # Only REST calls start llm_finetune here: unpausing a cron DAG would also start the latest
        # cron run, and the two would queue behind each other (max_active_runs=1).
        extra_env={
            "SPARKTUNE_RETRAIN_CRON": "off",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
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
    try:
        up(config, timeout=300, base=base)
    except StackError:
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
        )
    finally:
        down(config, purge=True)
