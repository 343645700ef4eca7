"""The environment the embedded runner gives Airflow, and its metadata database's migration."""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import sqlite3
import sys
from importlib import metadata
from pathlib import Path

from sparktune.core.config import HOME_ENV, RUN_DEADLINE_ENV, Settings
from sparktune_dev import secret_files

# Called as airflow_cli.run_airflow, never imported by name: a stand-in for the CLI (the tests')
# then replaces it here and in the runner at once.
from sparktune_dev.embedded import airflow_cli

# tools/sparktune_dev/embedded/environment.py: the repository is three folders up.
PROJECT_ROOT = Path(__file__).resolve().parents[3]

# The address every server the project starts listens on unless the environment names another.
LOOPBACK = "127.0.0.1"
# The embedded Airflow's signing secrets (make airflow-ui's api-server, and the execution API that
# `airflow dags test` runs in its own process), as files under <home>/secrets. Without them Airflow
# signs with the 24-character secret it generated into airflow.cfg (readable by every user), below
# the 64 bytes HS512 wants.
JWT_SECRET_ENV = "AIRFLOW__API_AUTH__JWT_SECRET"
API_SECRET_ENV = "AIRFLOW__API__SECRET_KEY"
_SECRET_FILE_NAMES = {JWT_SECRET_ENV: "airflow-jwt.secret", API_SECRET_ENV: "airflow-api.secret"}


def secrets_dir(home: Path) -> Path:
    """The folder (0700) of the embedded state's generated secrets."""
    return home / "secrets"


def embedded_secret_files(home: Path) -> dict[str, Path]:
    """Each generated secret's variable and the file that keeps it."""
    return {key: secrets_dir(home) / name for key, name in _SECRET_FILE_NAMES.items()}


def airflow_option_given(env: dict[str, str], variable: str) -> bool:
    """Whether ``env`` sets the Airflow option of ``variable`` itself or through its _CMD/_SECRET variant."""
    return any(name in env for name in (variable, f"{variable}_CMD", f"{variable}_SECRET"))


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
        # Loopback unless the environment says otherwise: Airflow's api-server (make airflow-ui)
        # defaults to 0.0.0.0, and so does the scheduler's health check server when it is on.
        "AIRFLOW__API__HOST": LOOPBACK,
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": LOOPBACK,
        # A Spark driver's UI (port 4040) otherwise listens on every interface, and its RPC and block
        # manager on the address the host name resolves to. A driver whose executors run on other
        # machines (spark_default on a remote master, client mode) needs an address they reach here.
        "SPARK_LOCAL_IP": LOOPBACK,
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    for key, path in embedded_secret_files(home).items():
        # A secret the environment gives (its value, a _CMD or a _SECRET) wins; a private key for
        # the JWTs rules out a shared secret (Airflow refuses both).
        if airflow_option_given(env, key) or (
            key == JWT_SECRET_ENV and airflow_option_given(env, "AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH")
        ):
            continue
        env[key] = secret_files.ensure_secret(
            path, secret_files.signing_key, min_length=secret_files.MIN_SIGNING_KEY_BYTES
        )
    # No deadline alerts: `airflow dags test` has no scheduler to fire them, and Airflow 3.3's
    # dag.test() fails the run at its end on a DAG that has one (it looks the alerts up by id and
    # finds their serialized form instead).
    env[RUN_DEADLINE_ENV] = "off"
    # spark-submit and airflow are console scripts of this interpreter's environment.
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    (home / "lineage").mkdir(parents=True, exist_ok=True)
    settings.mlflow_dir.mkdir(parents=True, exist_ok=True)
    return env


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
    result = airflow_cli.run_airflow(["db", "migrate"], env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"airflow db migrate failed for {db}; see the output above")
    key = _schema_key(sqlite_db) if sqlite_db else None
    if key is not None:
        stamp.write_text(key)
