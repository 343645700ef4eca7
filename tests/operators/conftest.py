"""Fixtures the operator tests share: a real standalone Spark cluster on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def free_port():
    """A function that returns a port nobody listens on at the moment, on 127.0.0.1."""
    return _free_port


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A Spark standalone Master and one two-core Worker, started from the pyspark wheel.

    Yields ``master`` (the spark:// URL), ``ui`` (the master's web UI), ``logs`` (the daemons'
    logs), ``worker_pid`` (the Worker JVM: the executors it launches are its children) and
    ``work_dir`` (the Worker's ``--work-dir``: one folder per application and executor).
    """
    from sparktune_dev.stack import StackConfig, spark_commands, spark_home

    logs = tmp_path_factory.mktemp("spark-cluster")
    config = StackConfig(
        home=logs, spark_port=_free_port(), spark_ui_port=_free_port(), spark_worker_ui_port=_free_port()
    )
    port, ui_port = config.spark_port, config.spark_ui_port
    env = {
        **os.environ,
        "SPARK_HOME": spark_home(),
        "SPARK_LOG_DIR": str(logs),
        # Daemons that live for a few tests: the C1 compiler alone and the serial collector
        # about halve the CPU their start-up costs (11 s -> 6 s here), on 2 cores shared with the tests.
        "SPARK_DAEMON_JAVA_OPTS": os.environ.get(
            "SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        ),
    }

    def daemon(name: str) -> subprocess.Popen:
        # The child keeps its own copy of the descriptor; the log outlives this handle.
        with open(logs / f"{name}.log", "wb") as out:
            return subprocess.Popen(
                spark_commands(config)[name], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    master = daemon("spark-master")
    worker = daemon("spark-worker")
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as reply:
                    state = json.load(reply)
                if state.get("aliveworkers", 0) >= 1:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standalone cluster did not come up; see {logs}")
            time.sleep(0.5)
        yield {
            "master": f"spark://127.0.0.1:{port}",
            "ui": f"http://127.0.0.1:{ui_port}",
            "logs": logs,
            "worker_pid": worker.pid,  # spark-class execs the JVM: this is the Worker itself
            "work_dir": config.state_dir / "spark-work",
        }
    finally:
        for proc in (worker, master):
            proc.terminate()
        for proc in (worker, master):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
