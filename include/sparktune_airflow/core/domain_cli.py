"""The jobs a task runs in a process of its own on the worker (``sparktune.jobs.evaluate``,
``sparktune.jobs.smoke_test``; training through ``model.training_process``): starting one, and what
its exit code means for the task (fail at once, or retry)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from airflow.providers.standard.hooks.subprocess import SubprocessHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException


def run_module(module: str, *args: str, env: Mapping[str, str]) -> Any:
    """``python -m module args`` on this worker's interpreter, its output in the task log, in
    ``env`` (the task's environment with its MLflow connection: ``MLflowHook.process_env()``).

    Evaluation and the smoke test run in a process of their own so torch and the model do not stay
    in the task runner.
    """
    command = [sys.executable, "-m", module, *args]
    return SubprocessHook().run_command(command, env=dict(env))


# Every sparktune job exits 2 on bad input (a retry would fail the same way), 1 on anything else.
EXIT_BAD_INPUT = 2


def raise_for_exit_code(what: str, exit_code: int, last_line: str) -> None:
    """Fail the task at once on :data:`EXIT_BAD_INPUT`, raise a retryable ``AirflowException`` on any
    other non-zero exit code; ``what`` names the process and ``last_line`` its last output."""
    if exit_code == EXIT_BAD_INPUT:
        raise AirflowFailException(f"{what} rejected its input: {last_line}")
    if exit_code != 0:
        raise AirflowException(f"{what} exited with code {exit_code}: {last_line}")
