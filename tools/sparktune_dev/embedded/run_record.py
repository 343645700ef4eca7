"""What Airflow's metadata database records of a DAG run: its newest run, failed tasks and gate."""

from __future__ import annotations

import configparser
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    from sparktune.release.gate import blocked_promotion_lines

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
