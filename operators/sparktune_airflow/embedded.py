"""Run the project's DAGs on embedded defaults: one folder of state, no servers.

``make demo``, ``make run`` and the end-to-end tests all come through here, so the
environment a DAG sees in CI is the one a user sees on their laptop:

- Airflow metadata in SQLite under ``$SPARKTUNE_HOME/airflow`` (``airflow dags test``);
- Spark ``local[*]`` through the ``spark_default`` connection, defined from the environment;
- MLflow tracking and registry in SQLite with local artifacts;
- OpenLineage events appended to ``$SPARKTUNE_HOME/lineage/events.jsonl``.

Every variable is only a default: a value already in the environment wins, which is how a
user points the same command at a Spark cluster or an MLflow server.

``run`` exits 0 when the DAG run succeeded, 1 when it failed, and 3 when it succeeded but its
promotion gate blocked the challenger (``enabled`` mode; the last line names the model version
and the failed rules). A failed run ends with a summary on stderr: each failed task, the message of
the exception it failed with (the operators' messages name the cause and the fix), and its log.

``airflow dags test`` runs every task inside the CLI's process and writes no task log file: the runner
copies its output to the terminal and to ``<base log folder>/dags_test/<dag>-<time>.log``, then
splits each task's part out into Airflow's layout,
``<base log folder>/dag_id=<dag>/run_id=<run>/task_id=<task>/attempt=<n>.log``.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from sparktune.config import HOME_ENV, Settings

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def embedded_env(
    home: Path, project_root: Path = PROJECT_ROOT, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment for Airflow CLI commands on embedded defaults, over ``base`` (os.environ)."""
    env = dict(os.environ if base is None else base)
    settings = Settings(home=home)
    bin_dir = str(Path(sys.executable).parent)
    defaults = {
        HOME_ENV: str(home),
        "AIRFLOW_HOME": str(settings.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(project_root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(project_root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(home / "lineage" / "events.jsonl"), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "sparktune",
        # Task events from a thread, not from a fork of the task's process. Under `airflow dags test`
        # that process is the whole run, and a task that ran Spark in it (validate_data on
        # PySparkOperator) leaves py4j sockets open to the JVM: the fork's copies of py4j's
        # connection objects shut those sockets down when freed, and the run's next JVM call logged
        # a "Connection reset by peer" traceback (a retry on a new socket then succeeded).
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
        # Each task's START/COMPLETE events and the in-process execution API's request log took
        # five INFO lines per task; their warnings and errors still show. Structlog loggers are
        # set here; the OpenLineage client's stdlib logger reads its own variable.
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": (
            "airflow.providers.openlineage=WARNING airflow.api_fastapi.execution_api=WARNING"
        ),
        "OPENLINEAGE_CLIENT_LOGGING": "WARNING",
        # Not settings.mlflow_tracking_uri: that reads os.environ, and only ``base`` may win here.
        "MLFLOW_TRACKING_URI": settings.embedded_mlflow_uri,
        # Spark's Python workers must run the venv's interpreter, or UDFs miss pyarrow/transformers.
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    # spark-submit and airflow are console scripts of this interpreter's environment.
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    (home / "lineage").mkdir(parents=True, exist_ok=True)
    settings.mlflow_dir.mkdir(parents=True, exist_ok=True)
    return env


def _airflow(
    args: list[str], env: dict[str, str], *, output: Path | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """``python -m airflow ARGS``; with ``output``, its stdout and stderr also go to that file."""
    command = [sys.executable, "-m", "airflow", *args]
    if output is None:
        return subprocess.run(command, env=env, check=False, **kwargs)
    return _run_copying_output(command, env, output)


# Colours and cursor moves: the terminal gets them, the log files do not.
_ANSI_ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _clean_line(line: bytes) -> bytes:
    """A line of output as a log file keeps it: no ANSI escapes, and of a line a progress bar
    redrew with carriage returns, the text after the last one."""
    line = _ANSI_ESCAPE.sub(b"", line).rstrip(b"\r")
    return line.rsplit(b"\r", 1)[-1]


def _byte_writer(stream: IO[str]) -> Callable[[bytes], None]:
    """Write bytes to a text stream as they come: to its binary buffer when it has one."""
    binary = getattr(stream, "buffer", None)
    if binary is not None:

        def write(chunk: bytes) -> None:
            binary.write(chunk)
            binary.flush()

        return write
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write_text(chunk: bytes) -> None:
        stream.write(decoder.decode(chunk))
        stream.flush()

    return write_text


def _run_copying_output(command: list[str], env: dict[str, str], output: Path) -> subprocess.CompletedProcess:
    """Run ``command`` with its stdout and stderr passed on to this process's as they come, and
    copied line by line into ``output``."""
    output.parent.mkdir(parents=True, exist_ok=True)
    if sys.stdout.isatty() and "NO_COLOR" not in env:
        env = {"FORCE_COLOR": "1", **env}  # Airflow colours its lines only on a terminal it sees
    lock = threading.Lock()
    with (
        output.open("wb") as sink,
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
        ) as process,
    ):

        def copy(source: IO[bytes], write: Callable[[bytes], None] | None) -> None:
            pending = b""
            # OSError, ValueError: the pipe or the file was closed under a copier given up on below.
            with contextlib.suppress(OSError, ValueError):
                while chunk := os.read(source.fileno(), 65536):
                    if write is not None:
                        try:
                            write(chunk)
                        except (OSError, ValueError):  # a closed terminal or pipe: keep draining
                            write = None
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    if lines:
                        with lock:
                            sink.writelines(_clean_line(line) + b"\n" for line in lines)
                    if len(pending) > 65536 and b"\r" in pending:  # a progress bar redrawn for long
                        pending = pending[pending.rindex(b"\r") + 1 :]
                if pending:
                    with lock:
                        sink.write(_clean_line(pending) + b"\n")

        assert process.stdout is not None and process.stderr is not None
        copiers = [
            threading.Thread(target=copy, args=(process.stdout, _byte_writer(sys.stdout)), daemon=True),
            threading.Thread(target=copy, args=(process.stderr, _byte_writer(sys.stderr)), daemon=True),
        ]
        for copier in copiers:
            copier.start()
        try:
            code = process.wait()
        except KeyboardInterrupt:
            process.wait()  # the terminal's Ctrl-C reached Airflow too: let it end its run
            raise
        # A process Airflow started and left running may hold the pipes open: do not wait for it.
        for copier in copiers:
            copier.join(timeout=10)
    return subprocess.CompletedProcess(command, code)


# Written after a migration: the Airflow version and the schema revision it left in the database.
MIGRATED_STAMP = ".sparktune-db-migrated"


def _embedded_sqlite_db(env: dict[str, str]) -> Path | None:
    """The SQLite file Airflow uses under ``env``; None when it is pointed at another database."""
    if any(key.startswith("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") for key in env):
        return None
    home = Path(env["AIRFLOW_HOME"])
    db = home / "airflow.db"
    config = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        config.read(home / "airflow.cfg")
    except configparser.Error:
        return None
    conn = config.get("database", "sql_alchemy_conn", fallback=None)
    return db if conn in (None, f"sqlite:///{db}") else None


def _schema_key(db: Path) -> str | None:
    """``apache-airflow <version> schema <alembic revision>``, or None when ``db`` has no schema."""
    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            row = conn.execute("select version_num from alembic_version").fetchone()
    except sqlite3.Error:
        return None
    if not row:
        return None
    return f"apache-airflow {metadata.version('apache-airflow')} schema {row[0]}"


def ensure_airflow_db(env: dict[str, str]) -> None:
    """Create or upgrade the SQLite metadata database.

    ``airflow db migrate`` costs about 5 s even when there is nothing to do, on every ``make run``
    and every end-to-end test run. It is skipped when the database still holds the schema revision
    the last migration left, and Airflow is the version that ran it; a new database, another
    revision or another Airflow version migrates again. ``airflow db check-migrations`` would answer
    the same question, but it imports Airflow too (about 4 s).
    """
    home = Path(env["AIRFLOW_HOME"])
    db = home / "airflow.db"
    home.mkdir(parents=True, exist_ok=True)
    stamp = home / MIGRATED_STAMP
    sqlite_db = _embedded_sqlite_db(env)
    key = _schema_key(sqlite_db) if sqlite_db else None
    if key is not None and stamp.is_file() and stamp.read_text() == key:
        return
    result = _airflow(["db", "migrate"], env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"airflow db migrate failed for {db}; see the output above")
    key = _schema_key(sqlite_db) if sqlite_db else None
    if key is not None:
        stamp.write_text(key)


# llm_finetune's PromotionGateOperator (tests/dags checks the id); other DAGs have no such task.
GATE_TASK_ID = "gate"
# The run succeeded (promotion skipped, as Airflow should) but the gate blocked promotion: what a
# script needs to tell apart from both "promoted" (0) and "the run failed" (1).
GATE_BLOCKED_EXIT_CODE = 3


def metadata_db_url(env: Mapping[str, str]) -> str | None:
    """The SQLAlchemy URL of Airflow's metadata database under ``env``, as Airflow resolves it:
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``, else ``airflow.cfg``, else the SQLite file in
    ``AIRFLOW_HOME``. None when a ``..._CMD`` or ``..._SECRET`` variable names it: only Airflow runs those."""
    key = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
    if env.get(key):
        return env[key]
    if any(name.startswith(key) for name in env):
        return None
    home = Path(env["AIRFLOW_HOME"])
    config = configparser.ConfigParser(interpolation=None, strict=False)
    with contextlib.suppress(configparser.Error):
        config.read(home / "airflow.cfg")
    return config.get("database", "sql_alchemy_conn", fallback=None) or f"sqlite:///{home / 'airflow.db'}"


def _tables():
    from sqlalchemy import column, table

    dag_run = table("dag_run", column("id"), column("dag_id"), column("run_id"))
    xcom = table(
        "xcom", column("dag_run_id"), column("task_id"), column("map_index"), column("key"), column("value")
    )
    return dag_run, xcom


def last_dag_run_id(db_url: str, dag_id: str) -> int:
    """The newest DAG run's id of ``dag_id`` (0: none yet): runs after it are the ones started later."""
    from sqlalchemy import create_engine, func, select

    dag_run, _ = _tables()
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(select(func.max(dag_run.c.id)).where(dag_run.c.dag_id == dag_id)).scalar() or 0
            )
    finally:
        engine.dispose()


def gate_summary(db_url: str, dag_id: str, after_run_id: int) -> dict[str, Any] | None:
    """What the gate task of the newest run of ``dag_id`` after ``after_run_id`` returned (its XCom);
    None when no such run has one (another DAG, a run that skipped training or failed before)."""
    from sqlalchemy import create_engine, select

    dag_run, xcom = _tables()
    query = (
        select(xcom.c.value)
        .select_from(xcom.join(dag_run, xcom.c.dag_run_id == dag_run.c.id))
        .where(
            dag_run.c.dag_id == dag_id,
            dag_run.c.id > after_run_id,
            xcom.c.task_id == GATE_TASK_ID,
            xcom.c.map_index == -1,
            xcom.c.key == "return_value",
        )
        .order_by(dag_run.c.id.desc())
        .limit(1)
    )
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            value = conn.execute(query).scalar()
    finally:
        engine.dispose()
    if value is None:
        return None
    # A JSON column: text in SQLite, already decoded by PostgreSQL's driver.
    summary = json.loads(value) if isinstance(value, str | bytes) else value
    return summary if isinstance(summary, dict) else None


def exit_code_after_run(run_exit_code: int, summary: Mapping[str, Any] | None) -> tuple[int, list[str]]:
    """The runner's exit code and closing lines: a failed run keeps its code; a run whose gate
    blocked promotion (``enabled`` mode) exits :data:`GATE_BLOCKED_EXIT_CODE`, its last line
    ``gate blocked promotion of NAME vN: <failed rules>``."""
    from sparktune.gate import blocked_promotion_lines

    if run_exit_code != 0 or summary is None:
        return run_exit_code, []
    lines = blocked_promotion_lines(summary)
    return (GATE_BLOCKED_EXIT_CODE, lines) if lines else (0, [])


def newest_run(db_url: str, dag_id: str, after_run_id: int) -> tuple[str | None, list[tuple[str, int]]]:
    """The newest run of ``dag_id`` after ``after_run_id``: its run id (None when no run started)
    and its failed task instances, ``(task_id, map_index)`` in the order they started."""
    from sqlalchemy import column, create_engine, select, table

    dag_run, _ = _tables()
    task_instance = table(
        "task_instance",
        column("dag_id"),
        column("run_id"),
        column("task_id"),
        column("map_index"),
        column("state"),
        column("start_date"),
    )
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            run_id = conn.execute(
                select(dag_run.c.run_id)
                .where(dag_run.c.dag_id == dag_id, dag_run.c.id > after_run_id)
                .order_by(dag_run.c.id.desc())
                .limit(1)
            ).scalar()
            if run_id is None:
                return None, []
            rows = conn.execute(
                select(task_instance.c.task_id, task_instance.c.map_index)
                .where(
                    task_instance.c.dag_id == dag_id,
                    task_instance.c.run_id == run_id,
                    task_instance.c.state == "failed",
                )
                .order_by(task_instance.c.start_date, task_instance.c.task_id, task_instance.c.map_index)
            ).all()
    finally:
        engine.dispose()
    return run_id, [(task_id, int(map_index)) for task_id, map_index in rows]


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


def dagfile_args(dag_id: str, env: Mapping[str, str]) -> list[str]:
    """``--dagfile-path`` for ``airflow dags test`` when the DAG folder holds ``<dag_id>.py`` naming
    it, as every DAG of this project does: Airflow then parses and serializes that one file, not the
    whole folder, before the run (``dag.test`` still syncs the folder once, so the database ends up
    the same). Any other DAG is looked up in the whole folder."""
    folder = env.get("AIRFLOW__CORE__DAGS_FOLDER")
    dag_file = Path(folder) / f"{dag_id}.py" if folder else None
    if dag_file is None or not dag_file.is_file() or dag_id not in dag_file.read_text(errors="replace"):
        return []
    return ["--dagfile-path", str(dag_file)]


def run_dag(dag_id: str, conf: dict, home: Path) -> int:
    """``airflow dags test`` on embedded defaults; returns its exit code (1 when the run failed), or
    :data:`GATE_BLOCKED_EXIT_CODE` when the run succeeded but its gate blocked promotion.

    The gate's decision is the gate task's XCom in Airflow's metadata database: the record of this
    very DAG run (the MLflow tags the gate also sets live on a training run that a later DAG run
    may reuse). Each task's part of the output is written to its log file (:func:`split_task_logs`);
    a failed run then closes with :func:`failure_summary`, its failed tasks read from the same database.
    """
    from sqlalchemy.exc import SQLAlchemyError

    env = embedded_env(home)
    ensure_airflow_db(env)
    db_url = metadata_db_url(env)
    before = None
    if db_url is not None:
        try:
            before = last_dag_run_id(db_url, dag_id)
        except (SQLAlchemyError, ImportError) as exc:
            _note_unread_gate(f"Airflow's metadata database is unreadable here ({exc})")
    else:
        _note_unread_gate("a _CMD or _SECRET variable names Airflow's metadata database")
    folder = base_log_folder(env)
    output = folder / "dags_test" / f"{dag_id}-{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}.log"
    code = _airflow(
        ["dags", "test", dag_id, "--conf", json.dumps(conf), *dagfile_args(dag_id, env)], env, output=output
    ).returncode
    run_id, failed, states_read = None, [], before is not None and db_url is not None
    if states_read:
        try:
            run_id, failed = newest_run(db_url, dag_id, before)
        except (SQLAlchemyError, ImportError) as exc:
            print(f"note: reading the run's task states failed ({exc})", file=sys.stderr, flush=True)
            states_read = False
    task_logs: dict[tuple[str, int], Path] = {}
    if run_id and output.is_file():
        try:
            task_logs = split_task_logs(output, folder, dag_id, run_id)
        except OSError as exc:
            print(f"note: writing the task logs failed ({exc})", file=sys.stderr, flush=True)
    if code != 0:
        lines = _failure_lines(dag_id, run_id, failed, task_logs, output, states_read)
        print("\n".join(lines), file=sys.stderr, flush=True)
        return code
    if before is None or db_url is None:
        return code
    try:
        summary = gate_summary(db_url, dag_id, before)
    except (SQLAlchemyError, ImportError) as exc:
        _note_unread_gate(f"reading the gate's XCom failed ({exc})")
        return code
    code, lines = exit_code_after_run(code, summary)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return code


def _failure_lines(
    dag_id: str,
    run_id: str | None,
    failed: Sequence[tuple[str, int]],
    task_logs: Mapping[tuple[str, int], Path],
    output: Path,
    states_read: bool,
) -> list[str]:
    """:func:`failure_summary` of a failed ``airflow dags test``, its messages read from the logs."""

    def message(path: Path | None) -> tuple[str, ...]:
        return tuple(last_exception(path.read_text(errors="replace").splitlines())) if path else ()

    tasks = []
    for task_id, map_index in failed:
        log = task_logs.get((task_id, map_index))
        tasks.append(FailedTask(task_id, map_index, message(log), log))
    output_message = () if tasks or not output.is_file() else message(output)
    return failure_summary(
        dag_id, run_id, tasks, output if output.is_file() else None, output_message, states_read=states_read
    )


def _note_unread_gate(cause: str) -> None:
    print(
        f"note: {cause}; the exit code will say whether the run failed, not whether its gate blocked "
        "promotion (read the gate task's XCom, or the MLflow run's sparktune.gate.decision tag).",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparktune_airflow.embedded", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a DAG once with airflow dags test")
    run.add_argument("--dag", default="llm_finetune")
    run.add_argument("--conf", default="{}", help="DAG run conf as a JSON object")
    sub.add_parser("env", help="print the embedded environment as shell exports")
    args = parser.parse_args(argv)
    home = Path(os.environ.get(HOME_ENV, ".local")).expanduser().resolve()
    if args.command == "env":
        for key, value in sorted(embedded_env(home).items()):
            if key.startswith(("AIRFLOW", "SPARKTUNE", "MLFLOW", "PYSPARK", "OPENLINEAGE")):
                print(f"export {key}={json.dumps(value)}")
        return 0
    try:
        conf = json.loads(args.conf)
    except json.JSONDecodeError as exc:
        parser.error(f"--conf is not valid JSON ({exc}); pass an object like '{{\"min_chars\": 30}}'")
    if not isinstance(conf, dict):
        parser.error('--conf must be a JSON object, e.g. \'{"source_uri": "data/tickets.csv"}\'')
    return run_dag(args.dag, conf, home)


if __name__ == "__main__":
    sys.exit(main())
