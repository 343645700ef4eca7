"""Each task's part of ``airflow dags test`` output, the exception it failed with, and the summary a
failed run closes with."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Where `airflow dags test` (Airflow 3.3) opens and closes each task run it makes in its process.
_TASK_START = re.compile(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")
_TASK_END = re.compile(r"\[DAG TEST\] end task task_id=(\S+) map_index=(-?\d+)")
# A line that opens a log record (Airflow's console format, a job's "%(asctime)s", a JSON record):
# the end of an exception message printed above it.
_LOG_RECORD = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\{\")")
TRACEBACK_HEADER = "Traceback (most recent call last):"
TASK_FAILED_EVENT = "Task failed with exception"
# How Python joins the tracebacks of chained exceptions; the last one printed is the one raised.
_CHAINED_TRACEBACK = ("The above exception was the direct cause", "During handling of the above exception")
# The most lines of an exception message the summary shows (_shorten says which).
SUMMARY_MESSAGE_LINES = 8


def base_log_folder(env: Mapping[str, str]) -> Path:
    """``[logging] base_log_folder`` under ``env`` (Airflow's default: ``$AIRFLOW_HOME/logs``)."""
    folder = env.get("AIRFLOW__LOGGING__BASE_LOG_FOLDER")
    return Path(folder) if folder else Path(env["AIRFLOW_HOME"]) / "logs"


def task_log_path(folder: Path, dag_id: str, run_id: str, task_id: str, map_index: int, attempt: int) -> Path:
    """A task attempt's log file in Airflow's default ``[logging] log_filename_template`` layout."""
    path = folder / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    if map_index >= 0:
        path = path / f"map_index={map_index}"
    return path / f"attempt={attempt}.log"


def task_sections(lines: Iterable[str]) -> dict[tuple[str, int], list[list[str]]]:
    """Each task's part of ``airflow dags test`` output, one list of lines per attempt, keyed by
    ``(task_id, map_index)``: from Airflow's "[DAG TEST] starting task_id=..." line to its
    "[DAG TEST] end task ..." line, both kept."""
    sections: dict[tuple[str, int], list[list[str]]] = {}
    current: list[str] | None = None
    for line in lines:
        if start := _TASK_START.search(line):
            current = []
            sections.setdefault((start[1], int(start[2])), []).append(current)
        if current is not None:
            current.append(line)
            if _TASK_END.search(line):
                current = None
    return sections


def _exception_message(lines: Sequence[str], start: int) -> tuple[list[str], int]:
    """The message the traceback whose header is ``lines[start]`` ends with, and the index after it."""
    index = start + 1
    while index < len(lines) and (not lines[index].strip() or lines[index][0] in " \t"):
        index += 1  # the frames: "  File ...", their source lines and ^^^ markers
    message: list[str] = []
    while index < len(lines) and not (
        _LOG_RECORD.match(lines[index]) or lines[index].startswith((TRACEBACK_HEADER, *_CHAINED_TRACEBACK))
    ):
        message.append(lines[index].rstrip())
        index += 1
    while message and not message[-1].strip():
        message.pop()
    return message, index


def last_exception(lines: Sequence[str]) -> list[str]:
    """The message of the exception a task failed with, from the Python traceback Airflow logged
    after "Task failed with exception" (else the last traceback in ``lines``), one item per line:
    ``ValueError: ...`` without its module path, and without the class at all for Airflow's own
    exceptions (``AirflowFailException``), whose message is the whole point. [] when no traceback
    ends in a message."""
    starts = [index for index, line in enumerate(lines) if line.startswith(TRACEBACK_HEADER)]
    # A task's own failure: the traceback after Airflow's last "Task failed with exception" (a
    # library may log tracebacks of its own after it), followed through the exceptions it chains.
    failed_at = [index for index, line in enumerate(lines) if TASK_FAILED_EVENT in line]
    after = [start for start in starts if failed_at and start > failed_at[-1]]
    if not starts:
        return []
    message, end = _exception_message(lines, after[0] if after else starts[-1])
    while end < len(lines) and lines[end].startswith(_CHAINED_TRACEBACK):
        following = next((start for start in starts if start > end), None)
        if following is None:
            break
        message, end = _exception_message(lines, following)
    if not message:
        return []
    exception = re.match(r"([A-Za-z_][\w.]*)(?:: ?(.*))?$", message[0])
    if exception:
        name, text = exception[1].rsplit(".", 1)[-1], exception[2]
        if not text:
            message[0] = name
        else:
            message[0] = text if name.startswith("Airflow") else f"{name}: {text}"
    return message


@dataclass(frozen=True)
class FailedTask:
    """A task of the run that failed: the message it failed with, and its log file."""

    task_id: str
    map_index: int = -1
    message: tuple[str, ...] = ()
    log: Path | None = None


def _shorten(message: Sequence[str], limit: int = SUMMARY_MESSAGE_LINES) -> list[str]:
    """At most ``limit`` lines of ``message``: its first paragraph when a blank line ends one early
    (Python's and jsonschema's style: the point, then details), else its first lines and its last
    (the operators' style: what failed, each problem, then the fix)."""
    if len(message) <= limit:
        return list(message)
    blank = next((index for index, line in enumerate(message[:limit]) if index and not line.strip()), None)
    if blank is not None:
        return [*message[:blank], f"... ({len(message) - blank} more lines in the log)"]
    head = list(message[: limit - 2])
    return [*head, f"... ({len(message) - len(head) - 1} more lines in the log)", message[-1]]


def failure_summary(
    dag_id: str,
    run_id: str | None,
    failed: Sequence[FailedTask],
    output: Path | None,
    output_message: Sequence[str] = (),
    *,
    states_read: bool = True,
) -> list[str]:
    """The closing lines of a failed run: per failed task its id, the message it failed with
    (shortened) and its log; without a failed task (none failed, no run started, or the metadata
    database was unreadable: not ``states_read``), the last exception in the whole output
    (``output_message``) and where that output is."""
    lines: list[str] = []
    for task in failed:
        index = f"[{task.map_index}]" if task.map_index >= 0 else ""
        lines.append(f"run failed: {dag_id} / {task.task_id}{index} (run {run_id})")
        message = task.message or ("(no exception message found in its log)",)
        lines += [f"  {line}" for line in _shorten(message)]
        if task.log is not None:
            lines.append(f"  log: {task.log}")
    if not failed:
        if not states_read:
            what = "its tasks' states are unreadable in Airflow's metadata database"
        else:
            what = f"run {run_id} failed with no failed task" if run_id else "no DAG run started"
        lines.append(f"run failed: {dag_id}: {what}")
        lines += [f"  {line}" for line in _shorten(output_message)]
    if output is not None and (not failed or any(task.log is None for task in failed)):
        lines.append(f"  output: {output}")
    return lines


def split_task_logs(output: Path, folder: Path, dag_id: str, run_id: str) -> dict[tuple[str, int], Path]:
    """Write each task attempt's part of the run's ``output`` to its file under ``folder``; the
    file of each task's last attempt, by ``(task_id, map_index)``."""
    sections = task_sections(output.read_text(errors="replace").splitlines())
    last: dict[tuple[str, int], Path] = {}
    for (task_id, map_index), attempts in sections.items():
        for attempt, lines in enumerate(attempts, start=1):
            path = task_log_path(folder, dag_id, run_id, task_id, map_index, attempt)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{line}\n" for line in lines))
            last[(task_id, map_index)] = path
    return last
