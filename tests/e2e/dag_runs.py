"""Run one DAG with `airflow dags test` on embedded defaults in a SPARKTUNE_HOME of a test's own.

Goes through `python -m sparktune_dev.embedded run`, as `make run` does; the output is kept
beside the state as `dags-test-<n>.log` for a failing test to be read afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Variables the test session set for unit tests; the DAG run must get the embedded defaults instead.
SESSION_ONLY = ("AIRFLOW_HOME", "MLFLOW_TRACKING_URI", "SPARKTUNE_LAKE_URI")


def run_dag(home: Path, dag: str, conf: dict, *, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    env["SPARKTUNE_HOME"] = str(home)
    command = [sys.executable, "-m", "sparktune_dev.embedded", "run", "--dag", dag]
    result = subprocess.run(
        [*command, "--conf", json.dumps(conf)], env=env, capture_output=True, text=True, timeout=timeout
    )
    (home / f"dags-test-{len(list(home.glob('dags-test-*')))}.log").write_text(result.stdout + result.stderr)
    return result


def output_tail(result: subprocess.CompletedProcess, chars: int = 8000) -> str:
    """The end of a run's stdout and stderr, for an assertion message."""
    return result.stdout[-chars:] + result.stderr[-chars:]
