"""``make run`` (``python -m sparktune_dev.embedded run``) exits 3 when the gate blocked promotion.

The ``airflow`` CLI is replaced by a recorder that leaves what a run leaves in the metadata
database: a ``dag_run`` row and the gate task's XCom, in tables with Airflow 3.3's columns. The
real database and a real blocked gate are exercised end to end by
tests/e2e/test_llm_finetune_failures.py::test_a_bad_model_is_blocked_and_a_dry_run_says_so_but_never_reaches_champion.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
from sparktune_dev.embedded import airflow_cli, run_record, runner

try:
    from tests.e2e.dag_runs import SESSION_ONLY
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from e2e.dag_runs import SESSION_ONLY
try:
    from tests.operators.airflow_metadata import SCHEMA
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    from airflow_metadata import SCHEMA


BLOCKED = {
    "mode": "enabled",
    "passed": False,
    "promote": False,
    "reasons": [
        "min_accuracy: FAIL, eval_accuracy 0.250 [95% CI 0.180, 0.320]: lower bound 0.180 < 0.600",
        "max_eval_loss: pass, eval_loss 2.1000 <= 10.0000",
        "max_regression: pass, no champion to compare against",
    ],
    "failed_rules": ["min_accuracy"],
    "model_name": "support-intent",
    "challenger_version": "4",
    "champion_version": None,
}


class _AirflowCli:
    """``db migrate`` creates the tables; each ``dags test`` adds a run whose gate returned
    ``gate`` (no gate XCom when None) and exits ``exit_code``."""

    def __init__(self, airflow_home: Path) -> None:
        self.db = airflow_home / "airflow.db"
        self.gate: dict | None = None
        self.exit_code = 0

    def __call__(self, args, env, **kwargs):
        with sqlite3.connect(self.db) as conn:
            if list(args) == ["db", "migrate"]:
                conn.executescript(SCHEMA)
            elif args[:2] == ["dags", "test"]:
                (run,) = conn.execute("select count(*) + 1 from dag_run").fetchone()
                run_id = f"manual__2026-11-25T10:0{run}:00+00:00"
                conn.execute(
                    "insert into dag_run values (?, ?, ?, 'manual', 'success', '2026-11-25')",
                    (run, args[2], run_id),
                )
                if self.gate is not None:
                    conn.execute(
                        "insert into xcom values "
                        "(?, 'gate', -1, 'return_value', null, ?, ?, ?, '2026-11-25')",
                        (run, args[2], run_id, json.dumps(self.gate)),
                    )
        return subprocess.CompletedProcess(args, self.exit_code, "", "")


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    for name in SESSION_ONLY:  # the DAG run gets the embedded defaults of its own home
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(airflow_cli, "run_airflow", _AirflowCli(tmp_path / "airflow"))
    return airflow_cli.run_airflow


def test_a_blocked_gate_exits_3_with_the_version_and_failed_rules_last(tmp_path, cli, capsys):
    cli.gate = BLOCKED
    assert runner.run_dag("llm_finetune", {}, tmp_path) == run_record.GATE_BLOCKED_EXIT_CODE == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == "gate blocked promotion of support-intent v4: min_accuracy"
    assert lines[-2] == f"gate: {BLOCKED['reasons'][0]}"


def test_a_promotion_a_dry_run_or_a_run_without_a_gate_exit_0(tmp_path, cli, capsys):
    for gate in (
        {**BLOCKED, "passed": True, "promote": True, "failed_rules": []},
        {**BLOCKED, "mode": "dry_run", "promote": True},  # rules failed, promoted anyway: not blocked
        None,  # training skipped on unchanged data, or another DAG
    ):
        cli.gate = gate
        assert runner.run_dag("llm_finetune", {}, tmp_path) == 0, gate
    assert "gate blocked" not in capsys.readouterr().err


def test_only_this_runs_gate_counts_and_a_failed_run_keeps_its_exit_code(tmp_path, cli):
    cli.gate = BLOCKED
    assert runner.run_dag("llm_finetune", {}, tmp_path) == 3
    # The next run skipped training: the earlier run's blocked gate must not speak for it.
    cli.gate = None
    assert runner.run_dag("llm_finetune", {}, tmp_path) == 0
    # A failed run is a failed run (1), whatever its gate said before it failed.
    cli.gate, cli.exit_code = BLOCKED, 1
    assert runner.run_dag("llm_finetune", {}, tmp_path) == 1


def test_exit_code_after_run():
    assert run_record.exit_code_after_run(0, BLOCKED) == (
        3,
        [f"gate: {BLOCKED['reasons'][0]}", "gate blocked promotion of support-intent v4: min_accuracy"],
    )
    assert run_record.exit_code_after_run(1, BLOCKED) == (1, [])
    assert run_record.exit_code_after_run(0, None) == (0, [])
    assert run_record.exit_code_after_run(0, {**BLOCKED, "mode": "disabled", "promote": True}) == (0, [])


def test_the_metadata_database_is_found_as_airflow_finds_it(tmp_path):
    home = tmp_path / "airflow"
    home.mkdir()
    env = {"AIRFLOW_HOME": str(home)}
    assert run_record.metadata_db_url(env) == f"sqlite:///{home / 'airflow.db'}"
    (home / "airflow.cfg").write_text("[database]\nsql_alchemy_conn = postgresql://af@db/airflow\n")
    assert run_record.metadata_db_url(env) == "postgresql://af@db/airflow"
    url = "postgresql://af@other/airflow"
    assert run_record.metadata_db_url({**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url}) == url
    # Only Airflow runs a command or reads a secrets backend: the runner then says it cannot tell.
    assert run_record.metadata_db_url({**env, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD": "cat conn"}) is None


def test_an_unreadable_database_leaves_the_runs_exit_code_and_says_why(tmp_path, monkeypatch, capsys):
    for name in SESSION_ONLY:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD", "cat /nowhere")
    calls = []
    monkeypatch.setattr(runner, "ensure_airflow_db", lambda env: None)
    monkeypatch.setattr(
        airflow_cli,
        "run_airflow",
        lambda args, env, **kw: calls.append(args) or subprocess.CompletedProcess(args, 0),
    )
    assert runner.run_dag("llm_finetune", {}, tmp_path) == 0
    assert calls and calls[0][:2] == ["dags", "test"]
    assert "not whether its gate blocked promotion" in capsys.readouterr().err
