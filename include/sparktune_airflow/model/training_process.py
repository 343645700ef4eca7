"""A training process started on the Airflow worker, described so that a retry can reattach to it.

The local backend runs ``python -m sparktune.jobs.train``; the spark backend runs
``spark-submit`` in client mode, whose driver is also a process on this worker. Both are
started in a session of their own with their output going to a log file. What identifies the
process (host, pid, start time, command, log) is a :class:`Submission`, which
``TrainModelOperator`` keeps in Airflow's task state store (``ResumableJobMixin``): a task
attempt that dies (a worker restart, an OOM-killed task runner) leaves the process running, and
the next attempt, on whichever worker it lands, reads the submission back. On the same host it
follows the live process's log until it exits instead of starting a second training on the same
key; on another host it cannot see the process and refuses to start a second one while the
submission is not marked ended.

Not ``SubprocessHook``: it can neither be found again by a later attempt nor tailed from a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

LOG_NAME = "train.log"


@dataclass(frozen=True)
class Submission:
    pid: int
    create_time: float
    command: list[str]
    log_path: str
    backend: str
    host: str
    ended: bool = False

    @classmethod
    def from_json(cls, value: Any) -> Submission:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(value).items() if k in fields})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def ended_now(self) -> Submission:
        return dataclasses.replace(self, ended=True)

    def on_this_host(self) -> bool:
        return self.host == this_host()

    def process(self) -> psutil.Process | None:
        """The recorded process if it still runs (same pid *and* start time: pids are reused)."""
        if not self.on_this_host():
            return None
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.NoSuchProcess:
            return None


def this_host() -> str:
    """The name processes are recorded under: one per process namespace (a machine, a container)."""
    return socket.gethostname()


def start(
    command: Sequence[str], env: dict[str, str], work_dir: Path, backend: str
) -> tuple[subprocess.Popen, Submission]:
    """Start ``command`` in its own session, its output appended to the key's log."""
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / LOG_NAME
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            list(command), stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    submission = Submission(
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        command=list(command),
        log_path=str(log_path),
        backend=backend,
        host=this_host(),
    )
    return proc, submission


def follow(
    submission: Submission,
    emit: Callable[[str], None],
    *,
    child: subprocess.Popen | None = None,
    from_start: bool = False,
    poll_seconds: float = 0.5,
) -> tuple[int | None, str]:
    """Stream the process's new log lines to ``emit`` until it exits.

    Returns ``(exit code, last non-empty line)``. The exit code is None for a process this
    attempt did not start (only a parent can read it); the caller then judges by the result the
    process left in MLflow.
    """
    last_line = ""
    with open(submission.log_path, errors="replace") as log:
        if not from_start:
            log.seek(0, os.SEEK_END)
        while True:
            line = log.readline()
            if line:
                text = line.rstrip("\n")
                if text.strip():
                    last_line = text
                emit(text)
                continue
            finished = child.poll() is not None if child is not None else submission.process() is None
            if finished:
                # Drain what was written between the last read and the exit.
                for rest in log.readlines():
                    text = rest.rstrip("\n")
                    if text.strip():
                        last_line = text
                    emit(text)
                break
            time.sleep(poll_seconds)
    return (child.returncode if child is not None else None), last_line


def stop(submission: Submission, grace_seconds: float = 30.0) -> None:
    """SIGTERM the process's whole session (spark-submit's JVM and Python workers too), then SIGKILL."""
    if submission.process() is None:
        return
    try:
        pgid = os.getpgid(submission.pid)
    except ProcessLookupError:
        return
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if submission.process() is None:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
