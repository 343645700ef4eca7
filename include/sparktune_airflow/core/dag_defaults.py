"""What every sparktune DAG shares: retries with exponential backoff, a time limit and a failure
notification on every task, and a deadline on every run.

Limits come from the environment of the scheduler and workers (a DAG file is parsed before any run
has params): ``SPARKTUNE_TASK_RETRIES`` (default 2) is how many times a failed task is tried again,
``SPARKTUNE_TASK_RETRY_DELAY_SECONDS`` (default 30) how long after the first failure, doubling after
each next one up to ``SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS`` (default 600) apart,
``SPARKTUNE_TASK_TIMEOUT_MINUTES`` (default 180) bounds each task, training excepted (its param
``train_timeout_minutes``); ``SPARKTUNE_RUN_DEADLINE_MINUTES`` (default 720) is how long
after it was queued a run may take before the team is told it is overdue (``off``: no deadline). The
run is not stopped: a deadline tells, a timeout stops.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from sparktune.core.config import (
    RUN_DEADLINE_ENV,
    TASK_MAX_RETRY_DELAY_ENV,
    TASK_RETRIES_ENV,
    TASK_RETRY_DELAY_ENV,
    TASK_TIMEOUT_ENV,
)
from sparktune.core.notifications import RUN_OVERDUE, TASK_FAILED
from sparktune_airflow.core.notify import PipelineNotifier

DEFAULT_TASK_TIMEOUT_MINUTES = 180.0
DEFAULT_RUN_DEADLINE_MINUTES = 720.0
DEFAULT_TASK_RETRIES = 2
DEFAULT_TASK_RETRY_DELAY_SECONDS = 30.0
DEFAULT_TASK_MAX_RETRY_DELAY_SECONDS = 600.0

# Transient faults (a lost executor, a busy MLflow server) get more tries (SPARKTUNE_TASK_RETRIES);
# deterministic failures raise AirflowFailException and skip them.
RETRY_DEFAULTS = {
    "retry_delay": timedelta(seconds=DEFAULT_TASK_RETRY_DELAY_SECONDS),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(seconds=DEFAULT_TASK_MAX_RETRY_DELAY_SECONDS),
}


def _minutes(env: str, default: float) -> timedelta:
    raw = os.environ.get(env, "").strip()
    try:
        minutes = float(raw) if raw else default
    except ValueError:
        raise ValueError(
            f"{env}={raw!r} is not a number of minutes; set it to one, such as {default:g}"
        ) from None
    if minutes <= 0:
        raise ValueError(f"{env}={raw!r} must be more than 0 minutes; unset it for {default:g}")
    return timedelta(minutes=minutes)


def task_timeout() -> timedelta:
    """Every task's ``execution_timeout`` (training sets its own from ``train_timeout_minutes``)."""
    return _minutes(TASK_TIMEOUT_ENV, DEFAULT_TASK_TIMEOUT_MINUTES)


def task_retries() -> int:
    """How many times a failed task is tried again: ``SPARKTUNE_TASK_RETRIES`` (default 2)."""
    raw = os.environ.get(TASK_RETRIES_ENV, "").strip()
    try:
        retries = int(raw) if raw else DEFAULT_TASK_RETRIES
    except ValueError:
        retries = -1
    if retries < 0:
        raise ValueError(
            f"{TASK_RETRIES_ENV}={raw!r} is not a number of retries; set it to 0 or more, or unset it "
            f"for {DEFAULT_TASK_RETRIES}"
        )
    return retries


def _seconds(env: str, default: float) -> timedelta:
    raw = os.environ.get(env, "").strip()
    try:
        seconds = float(raw) if raw else default
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise ValueError(
            f"{env}={raw!r} is not a number of seconds; set it to 0 or more, or unset it for {default:g}"
        )
    return timedelta(seconds=seconds)


def task_retry_delay() -> timedelta:
    """The wait before a failed task's first retry: ``SPARKTUNE_TASK_RETRY_DELAY_SECONDS`` (default
    30). A test stack that kills workers on purpose shortens it; production keeps the default."""
    return _seconds(TASK_RETRY_DELAY_ENV, DEFAULT_TASK_RETRY_DELAY_SECONDS)


def task_max_retry_delay() -> timedelta:
    """The longest wait between two tries, which the doubling stops at:
    ``SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS`` (default 600). A test stack whose retries wait on a
    training that ends within a minute keeps them 10 s apart, where doubling would leave the run
    idle for most of a minute after the training ended; production keeps the default."""
    return _seconds(TASK_MAX_RETRY_DELAY_ENV, DEFAULT_TASK_MAX_RETRY_DELAY_SECONDS)


def task_defaults() -> dict[str, Any]:
    """``default_args`` of the sparktune DAGs: retries, the task time limit, and a notification when
    a task fails with no retry left (Airflow calls ``on_failure_callback`` then, not on retries)."""
    return {
        **RETRY_DEFAULTS,
        "retries": task_retries(),
        "retry_delay": task_retry_delay(),
        "max_retry_delay": task_max_retry_delay(),
        "execution_timeout": task_timeout(),
        "on_failure_callback": PipelineNotifier(TASK_FAILED),
    }


def run_deadline():
    """The DAG's ``deadline``: notify when a run is not done ``SPARKTUNE_RUN_DEADLINE_MINUTES`` after
    it was queued. The callback runs on the executor (LocalExecutor and Celery run callbacks).
    None with ``SPARKTUNE_RUN_DEADLINE_MINUTES=off`` (the embedded runner's ``airflow dags test``)."""
    from airflow.sdk import DeadlineAlert, DeadlineReference, SyncCallback

    if os.environ.get(RUN_DEADLINE_ENV, "").strip().lower() == "off":
        return None
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=_minutes(RUN_DEADLINE_ENV, DEFAULT_RUN_DEADLINE_MINUTES),
        callback=SyncCallback(PipelineNotifier, kwargs={"event": RUN_OVERDUE}),
        name="run_overdue",
    )
