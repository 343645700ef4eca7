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
and the failed rules).
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

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


def _airflow(args: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow", *args], env=env, check=False, **kwargs)


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

    dag_run = table("dag_run", column("id"), column("dag_id"))
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
    may reuse).
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
    code = _airflow(
        ["dags", "test", dag_id, "--conf", json.dumps(conf), *dagfile_args(dag_id, env)], env
    ).returncode
    if code != 0 or before is None or db_url is None:
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
            if key.startswith(("AIRFLOW", "SPARKTUNE", "MLFLOW", "PYSPARK")):
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
