"""A failed ``make run`` (``python -m sparktune_dev.embedded run``) closes with a summary: each
failed task, the message it failed with, and its log file, split out of ``airflow dags test``'s output.

The ``airflow`` CLI is replaced by a recorder that leaves what a failed run leaves: ``dag_run`` and
``task_instance`` rows in tables with Airflow 3.3's columns (most of task_instance's left out), and
output shaped like Airflow 3.3's (copied from a real run). The real thing is checked end to end by
tests/e2e/test_llm_finetune_failures.py::test_bad_data_fails_the_run_before_training.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sparktune_dev.embedded import airflow_cli, runner
from sparktune_dev.embedded.failure_summary import (
    FailedTask,
    failure_summary,
    last_exception,
    task_log_path,
    task_sections,
)

try:
    from tests.e2e.dag_runs import SESSION_ONLY
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from e2e.dag_runs import SESSION_ONLY
try:
    from tests.operators.airflow_metadata import SCHEMA
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    from airflow_metadata import SCHEMA


RUN_ID = "manual__2026-11-26T10:18:44.208688+00:00"
INFO = "2026-11-26T10:19:02.815790Z [info     ]"  # how Airflow's console log opens a record
QUALITY_MESSAGE = [
    "Data quality gate failed: 1 of 26 expectations not met.",
    "- [train_rows_min] The train split has at least 999999 rows (min_train_rows). Failed on "
    "label_counts column 'train_rows': observed 2596. (param min_train_rows)",
    "Fix the source data or the param named on each line and rerun (a rule listed in "
    "quality_warning_rules only warns). See Data Docs at file:///home/gx/index.html for the failing rows.",
]


def _task(task_id: str, body: list[str], map_index: int = -1) -> list[str]:
    return [
        f"{INFO} [DAG TEST] starting task_id={task_id} map_index={map_index} "
        "[airflow.sdk.definitions.dag] loc=dag.py:1501",
        f"{INFO} [DAG TEST] running task <TaskInstance: llm_finetune.{task_id} "
        f"{RUN_ID} [TaskInstanceState.SCHEDULED]> [airflow.sdk.definitions.dag] loc=dag.py:1504",
        *body,
        f"{INFO} [DAG TEST] end task task_id={task_id} map_index={map_index} "
        "[airflow.sdk.definitions.dag] loc=dag.py:1563",
    ]


def _traceback(exception_line: str, *more: str) -> list[str]:
    return [
        "Traceback (most recent call last):",
        '  File "/venv/lib/python3.11/site-packages/airflow/sdk/execution_time/task_runner.py", line 1579, '
        "in _run_task_and_map_outcome",
        "    result = _execute_task(context=context, ti=ti, log=log)",
        "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/work/include/sparktune_airflow/data/quality.py", line 73, in _enforce_quality',
        "    raise AirflowFailException(format_failures(report))",
        exception_line,
        *more,
    ]


TASK_FAILED = (
    "2026-11-26T10:19:28.449110Z [error    ] Task failed with exception     [task] loc=task_runner.py:1639"
)
PY4J_TRACEBACK = [  # what a forked OpenLineage emitter left behind: a library's traceback, logged at INFO
    f"{INFO} Exception while sending command. [root] loc=java_gateway.py:1056",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 527, in send_command',
    '    self.socket.sendall(command.encode("utf-8"))',
    "ConnectionResetError: [Errno 104] Connection reset by peer",
]
VALIDATE_DATA = _task(
    "validate_data",
    [
        "quality: 26 expectations, success=False, docs file:///home/gx/index.html",
        TASK_FAILED,
        *_traceback(
            f"airflow.sdk.exceptions.AirflowFailException: {QUALITY_MESSAGE[0]}", *QUALITY_MESSAGE[1:]
        ),
        f"{INFO} ::group::Post Execute          [task] loc=task_runner.py:1640",
        *PY4J_TRACEBACK,
    ],
)
FAILED_RUN_OUTPUT = [
    f"{INFO} creating dag run [airflow.serialization.definitions.dag]",
    *_task("prepare_data", [f"{INFO} read  rows in 4000  out 4000 [operators]"]),
    *VALIDATE_DATA,
    f"{INFO} Marking run <DagRun llm_finetune> failed [airflow.models.dagrun.DagRun]",
    "DagRun failed",
]
PARAM_REFUSED_OUTPUT = [
    f"{INFO} creating dag run [airflow.serialization.definitions.dag]",
    *_traceback(
        "airflow.sdk.definitions.param.ParamValidationError: Invalid input for param lora_r: 0 is less "
        "than the minimum of 1",
        "",
        "Failed validating 'minimum' in schema:",
        *[f"    line {n}" for n in range(10)],
    ),
]


class _AirflowCli:
    """``db migrate`` creates the tables; ``dags test`` writes ``lines`` to its output file, records
    a run whose tasks ended in ``states`` (no run when None), and exits ``exit_code``."""

    def __init__(self, airflow_home: Path) -> None:
        self.db = airflow_home / "airflow.db"
        self.lines: list[str] = FAILED_RUN_OUTPUT
        self.states: dict[str, str] | None = {"prepare_data": "success", "validate_data": "failed"}
        self.exit_code = 1

    def __call__(self, args, env, output: Path | None = None, **kwargs):
        with sqlite3.connect(self.db) as conn:
            if list(args) == ["db", "migrate"]:
                conn.executescript(SCHEMA)
            elif args[:2] == ["dags", "test"]:
                assert output is not None
                output.parent.mkdir(parents=True, exist_ok=True)
                output.write_text("".join(f"{line}\n" for line in self.lines))
                if self.states is not None:
                    (run,) = conn.execute("select count(*) + 1 from dag_run").fetchone()
                    conn.execute(
                        "insert into dag_run values (?, ?, ?, 'manual', 'failed', '2026-11-26')",
                        (run, args[2], RUN_ID),
                    )
                    for order, (task_id, state) in enumerate(self.states.items()):
                        conn.execute(
                            "insert into task_instance values (?, ?, ?, ?, -1, ?, ?, 1)",
                            (
                                f"ti-{run}-{task_id}",
                                task_id,
                                args[2],
                                RUN_ID,
                                f"2026-11-26 10:1{order}",
                                state,
                            ),
                        )
        return subprocess.CompletedProcess(args, self.exit_code if args[:2] == ["dags", "test"] else 0)


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    for name in SESSION_ONLY:  # the DAG run gets the embedded defaults of its own home
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", raising=False)
    monkeypatch.setattr(airflow_cli, "run_airflow", _AirflowCli(tmp_path / "airflow"))
    return airflow_cli.run_airflow


def test_a_failed_run_ends_with_the_failed_task_its_message_and_its_log(tmp_path, cli, capsys):
    assert runner.run_dag("llm_finetune", {}, tmp_path) == 1  # the exit code stays the run's
    lines = capsys.readouterr().err.strip().splitlines()
    log = (
        tmp_path
        / "logs"
        / "dag_id=llm_finetune"
        / f"run_id={RUN_ID}"
        / "task_id=validate_data"
        / "attempt=1.log"
    )
    assert lines[-5:] == [
        f"run failed: llm_finetune / validate_data (run {RUN_ID})",
        *[f"  {line}" for line in QUALITY_MESSAGE],  # the task's exception, not py4j's logged after it
        f"  log: {log}",
    ]
    assert log.read_text().splitlines() == VALIDATE_DATA
    # Every task's part of the output is split out, not only the failed one's.
    prepare = log.parents[1] / "task_id=prepare_data" / "attempt=1.log"
    assert "read  rows in 4000" in prepare.read_text()
    (whole,) = (tmp_path / "logs" / "dags_test").glob("llm_finetune-*.log")
    assert whole.read_text().splitlines() == FAILED_RUN_OUTPUT


def test_a_run_refused_before_it_started_names_the_error_and_the_output(tmp_path, cli, capsys):
    cli.lines, cli.states = PARAM_REFUSED_OUTPUT, None
    assert runner.run_dag("llm_finetune", {"lora_r": 0}, tmp_path) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    (whole,) = (tmp_path / "logs" / "dags_test").glob("llm_finetune-*.log")
    assert lines[-4:] == [
        "run failed: llm_finetune: no DAG run started",
        "  ParamValidationError: Invalid input for param lora_r: 0 is less than the minimum of 1",
        "  ... (12 more lines in the log)",
        f"  output: {whole}",
    ]


def test_an_unreadable_database_still_names_the_error_and_the_output(tmp_path, cli, monkeypatch, capsys):
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD", "cat /nowhere")  # only Airflow runs it
    assert runner.run_dag("llm_finetune", {}, tmp_path) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    (whole,) = (tmp_path / "logs" / "dags_test").glob("llm_finetune-*.log")
    assert lines[-5:] == [
        "run failed: llm_finetune: its tasks' states are unreadable in Airflow's metadata database",
        *[f"  {line}" for line in QUALITY_MESSAGE],
        f"  output: {whole}",
    ]


def test_a_successful_run_prints_no_summary_and_still_splits_the_task_logs(tmp_path, cli, capsys):
    cli.lines = _task("prepare_data", ["2026-11-26T10:19:01Z [info     ] done [operators]"])
    cli.states, cli.exit_code = {"prepare_data": "success"}, 0
    assert runner.run_dag("llm_finetune", {}, tmp_path) == 0
    assert capsys.readouterr().err == ""
    run = tmp_path / "logs" / "dag_id=llm_finetune" / f"run_id={RUN_ID}"
    assert (run / "task_id=prepare_data" / "attempt=1.log").read_text().splitlines() == cli.lines


def test_task_sections_keep_each_attempt_and_each_mapped_index():
    first = _task("train", [TASK_FAILED, *_traceback("RuntimeError: executor lost")])
    second = _task("train", ["2026-11-26T10:20:00Z [info     ] trained [operators]"])
    mapped = _task("score", ["2026-11-26T10:21:00Z [info     ] scored [operators]"], map_index=0)
    between = "2026-11-26T10:19:59Z [info     ] No tasks to run. [airflow.sdk.definitions.dag]"
    sections = task_sections([*first, between, *second, *mapped])
    assert sections == {("train", -1): [first, second], ("score", 0): [mapped]}
    folder = Path("/logs")
    assert task_log_path(folder, "d", "r", "score", 0, 1) == Path(
        "/logs/dag_id=d/run_id=r/task_id=score/map_index=0/attempt=1.log"
    )
    assert task_log_path(folder, "d", "r", "train", -1, 2) == Path(
        "/logs/dag_id=d/run_id=r/task_id=train/attempt=2.log"
    )


def test_last_exception_reads_the_message_a_task_failed_with():
    assert last_exception(VALIDATE_DATA) == QUALITY_MESSAGE
    # Without Airflow's "Task failed" line: the last traceback; a class of its own is kept, short.
    assert last_exception(PY4J_TRACEBACK) == ["ConnectionResetError: [Errno 104] Connection reset by peer"]
    chained = [
        TASK_FAILED,
        *_traceback("KeyError: 'label'"),
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        *_traceback(
            "sparktune.data.prepare.DataPreparationError: column 'label' is missing; set label_column"
        ),
        "",
    ]
    assert last_exception(chained) == ["DataPreparationError: column 'label' is missing; set label_column"]
    assert last_exception([TASK_FAILED, *_traceback("airflow.sdk.exceptions.AirflowException")]) == [
        "AirflowException"
    ]
    assert last_exception(["2026-11-26T10:19:01Z [info     ] no traceback here"]) == []


def test_failure_summary_keeps_long_messages_short_and_their_fix():
    rules = [f"- rule {n} failed" for n in range(12)]
    message = ("Data quality gate failed: 12 of 26 expectations not met.", *rules, "Fix the source data.")
    task = FailedTask("validate_data", -1, message, Path("/logs/attempt=1.log"))
    assert failure_summary("dag", "run", [task], Path("/out.log")) == [
        "run failed: dag / validate_data (run run)",
        "  Data quality gate failed: 12 of 26 expectations not met.",
        *[f"  - rule {n} failed" for n in range(5)],
        "  ... (7 more lines in the log)",
        "  Fix the source data.",
        "  log: /logs/attempt=1.log",
    ]
    mapped = FailedTask("score", 3)  # no log found, no message found: say so, and where to look
    assert failure_summary("dag", "run", [mapped], Path("/out.log")) == [
        "run failed: dag / score[3] (run run)",
        "  (no exception message found in its log)",
        "  output: /out.log",
    ]
    assert failure_summary("dag", "run", [], None) == ["run failed: dag: run run failed with no failed task"]


def test_the_output_reaches_the_terminal_as_it_comes_and_the_file_as_lines(tmp_path, capsys):
    script = (
        "import sys\n"
        "print('\\x1b[32minfo\\x1b[0m line', flush=True)\n"
        "sys.stderr.write('[Stage 0:>  (0 + 1) / 1]\\r          \\rDagRun failed\\n')\n"
        "sys.stdout.write('no newline at the end')\n"
        "sys.exit(1)\n"
    )
    output = tmp_path / "out" / "run.log"
    result = airflow_cli.run_copying_output([sys.executable, "-c", script], {}, output)
    assert result.returncode == 1
    seen = capsys.readouterr()
    assert seen.out == "\x1b[32minfo\x1b[0m line\nno newline at the end"
    assert seen.err == "[Stage 0:>  (0 + 1) / 1]\r          \rDagRun failed\n"
    assert sorted(output.read_text().splitlines()) == ["DagRun failed", "info line", "no newline at the end"]
