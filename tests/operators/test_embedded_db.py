"""``ensure_airflow_db`` runs ``airflow db migrate`` only when the schema may be stale.

The ``airflow`` CLI is replaced by a recorder that leaves what a migration leaves: a SQLite file
with Alembic's ``alembic_version`` table. The real migration and its stamp are exercised by every
end-to-end run (tests/e2e/test_llm_finetune_dag.py checks the stamp against the real database).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from sparktune_dev.embedded import airflow_cli, environment

try:
    from tests.e2e.dag_runs import SESSION_ONLY
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from e2e.dag_runs import SESSION_ONLY


def _env(home: Path) -> dict[str, str]:
    """What ``make run`` gives Airflow for ``home`` (the test session's own AIRFLOW_HOME left out)."""
    return environment.embedded_env(home, base={k: v for k, v in os.environ.items() if k not in SESSION_ONLY})


def _set_revision(db: Path, revision: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("create table if not exists alembic_version (version_num varchar(32) not null)")
        conn.execute("delete from alembic_version")
        conn.execute("insert into alembic_version values (?)", (revision,))


class _AirflowCli:
    """Records the ``airflow`` calls; ``db migrate`` brings the database to ``revision``."""

    def __init__(self, airflow_home: Path, revision: str = "29ce7909c52b") -> None:
        self.db, self.revision, self.calls = airflow_home / "airflow.db", revision, []

    def __call__(self, args, env, **kwargs):
        self.calls.append(list(args))
        if list(args) == ["db", "migrate"]:
            _set_revision(self.db, self.revision)
        return subprocess.CompletedProcess(args, 0, "", "")


@pytest.fixture()
def home(tmp_path, monkeypatch):
    cli = _AirflowCli(tmp_path / "airflow")
    monkeypatch.setattr(airflow_cli, "run_airflow", cli)
    return tmp_path, _env(tmp_path), cli


def test_a_migrated_database_is_not_migrated_again(home):
    root, env, cli = home
    environment.ensure_airflow_db(env)
    stamp = root / "airflow" / environment.MIGRATED_STAMP
    assert stamp.read_text().startswith("apache-airflow ")
    assert stamp.read_text().endswith(" schema 29ce7909c52b")
    environment.ensure_airflow_db(env)
    environment.ensure_airflow_db(env)
    assert cli.calls == [["db", "migrate"]]


def test_another_schema_airflow_version_or_database_migrates_again(home):
    root, env, cli = home
    environment.ensure_airflow_db(env)
    db, stamp = root / "airflow" / "airflow.db", root / "airflow" / environment.MIGRATED_STAMP
    _set_revision(db, "0000older000")  # the database was replaced by an older one
    environment.ensure_airflow_db(env)
    assert len(cli.calls) == 2
    # Airflow upgraded since:
    stamp.write_text(stamp.read_text().replace("apache-airflow ", "apache-airflow 0.0.1-"))
    environment.ensure_airflow_db(env)
    assert len(cli.calls) == 3
    stamp.unlink()  # a migration that did not finish writes no stamp
    environment.ensure_airflow_db(env)
    assert len(cli.calls) == 4
    db.unlink()  # a new database
    environment.ensure_airflow_db(env)
    assert len(cli.calls) == 5
    environment.ensure_airflow_db(env)
    assert len(cli.calls) == 5


def test_airflow_pointed_at_another_database_always_migrates(home):
    root, env, cli = home
    environment.ensure_airflow_db(env)
    postgres = "postgresql+psycopg2://postgres@127.0.0.1/airflow"
    environment.ensure_airflow_db({**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres})
    (root / "airflow" / "airflow.cfg").write_text(f"[database]\nsql_alchemy_conn = {postgres}\n")
    environment.ensure_airflow_db(env)
    assert len(cli.calls) == 3
