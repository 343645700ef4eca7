"""A training process started on the Airflow worker, recorded so that a retry can reattach to it.

The local backend runs ``python -m sparktune.jobs.train``; the spark backend runs
``spark-submit`` in client mode, whose driver is also a process on this worker. Both are
started in a session of their own with their output going to a log file, and a record
(``submission.json``: host, pid, the process's start time, the command) is written beside the
checkpoints of the train key. A task attempt that dies (a worker restart, an OOM-killed task
runner) leaves the process running; the next attempt finds it alive through the record and
follows its log until it exits instead of starting a second training on the same key. The attempt
that saw the process exit marks the record ended. A retry on another host cannot see a process of
the record's host: while the record is not marked ended it refuses to start a second training
(:func:`started_elsewhere`) and says how to go on.

Not ``SubprocessHook``: it can neither be found again by a later attempt nor tailed from a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

RECORD_NAME = "submission.json"
LOG_NAME = "train.log"


@dataclass
class Submission:
    pid: int
    create_time: float
    command: list[str]
    log_path: str
    backend: str
    # Records written before hosts were recorded have none: they are taken as this host's.
    host: str = ""
    ended: bool = False

    def on_this_host(self) -> bool:
        return not self.host or self.host == this_host()

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


def read_record(work_dir: Path) -> Submission | None:
    path = work_dir / RECORD_NAME
    try:
        return Submission(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def started_elsewhere(work_dir: Path) -> Submission | None:
    """The record of a training another host started for this key and no attempt saw end."""
    record = read_record(work_dir)
    return record if record is not None and not record.ended and not record.on_this_host() else None


def mark_ended(work_dir: Path) -> None:
    """Record that the training process exited: a retry anywhere may then start the key again."""
    record = read_record(work_dir)
    if record is not None:
        _write(work_dir, dataclasses.replace(record, ended=True))


def _write(work_dir: Path, record: Submission) -> None:
    tmp = work_dir / f"{RECORD_NAME}.tmp"
    tmp.write_text(json.dumps(asdict(record), indent=2))
    tmp.replace(work_dir / RECORD_NAME)


def live_submission(work_dir: Path) -> Submission | None:
    """The training process an earlier attempt started for this key, if it is still running."""
    record = read_record(work_dir)
    return record if record is not None and record.process() is not None else None


def start(command: Sequence[str], env: dict[str, str], work_dir: Path, backend: str) -> subprocess.Popen:
    """Start ``command`` in its own session, its output appended to the key's log, and record it."""
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / LOG_NAME
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            list(command), stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    record = Submission(
        pid=proc.pid,
        create_time=psutil.Process(proc.pid).create_time(),
        command=list(command),
        log_path=str(log_path),
        backend=backend,
        host=this_host(),
    )
    _write(work_dir, record)
    return proc


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
