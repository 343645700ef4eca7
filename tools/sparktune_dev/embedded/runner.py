"""One DAG run on embedded defaults, from the environment to the exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

# Called as airflow_cli.run_airflow, as environment.py does: one stand-in for the CLI replaces both.
from sparktune_dev.embedded import airflow_cli
from sparktune_dev.embedded.environment import embedded_env, ensure_airflow_db
from sparktune_dev.embedded.failure_summary import (
    FailedTask,
    base_log_folder,
    failure_summary,
    last_exception,
    split_task_logs,
)
from sparktune_dev.embedded.run_record import (
    exit_code_after_run,
    gate_summary,
    last_dag_run_id,
    metadata_db_url,
    newest_run,
)


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
    :data:`~.run_record.GATE_BLOCKED_EXIT_CODE` when the run succeeded but its gate blocked promotion.

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
    code = airflow_cli.run_airflow(
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
