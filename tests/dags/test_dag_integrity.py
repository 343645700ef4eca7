"""Every DAG parses with fake connections, is tagged, retries with backoff, and imports nothing heavy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sparktune_airflow.core.params import SCHEMA_DIALECT

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"
DAG_FILES = sorted(p for p in DAGS_DIR.glob("*.py") if not p.name.startswith("_"))
HEAVY = ("torch", "transformers", "pyspark", "mlflow", "great_expectations", "datasets", "peft", "trl")


@pytest.fixture(scope="module")
def dagbag(monkeypatch_module):
    from airflow.models import DagBag

    # Fake connections: parsing must not need a reachable service.
    monkeypatch_module.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"})
    )
    return DagBag(dag_folder=str(DAGS_DIR))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_dag_files_exist():
    assert DAG_FILES, f"no DAG files in {DAGS_DIR}"


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}, dagbag.import_errors
    assert "llm_finetune" in dagbag.dags


def test_every_dag_is_tagged(dagbag):
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"


def test_every_task_retries_with_exponential_backoff(dagbag):
    for dag_id, dag in dagbag.dags.items():
        for task in dag.tasks:
            assert task.retries >= 2, f"{dag_id}.{task.task_id} retries={task.retries}"
            assert task.retry_exponential_backoff, f"{dag_id}.{task.task_id} has no exponential backoff"
            assert task.retry_delay <= timedelta(minutes=5), (
                f"{dag_id}.{task.task_id} waits too long to retry"
            )


def _notifier_events(callbacks) -> list[str]:
    from sparktune_airflow.core.notify import PipelineNotifier

    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    return [c.event for c in callbacks if isinstance(c, PipelineNotifier)]


def test_every_task_has_a_time_limit_and_tells_the_team_when_it_fails_for_good(dagbag):
    from sparktune_airflow.core.dag_defaults import DEFAULT_TASK_TIMEOUT_MINUTES

    for dag_id, dag in dagbag.dags.items():
        for task in dag.tasks:
            where = f"{dag_id}.{task.task_id}"
            assert task.execution_timeout == timedelta(minutes=DEFAULT_TASK_TIMEOUT_MINUTES), where
            assert _notifier_events(task.on_failure_callback) == ["task_failed"], where


def test_every_run_has_a_deadline_that_notifies_when_it_is_overdue(dagbag):
    from airflow.sdk import DeadlineReference, SyncCallback
    from sparktune_airflow.core.dag_defaults import DEFAULT_RUN_DEADLINE_MINUTES

    for dag_id, dag in dagbag.dags.items():
        alerts = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
        assert len(alerts) == 1, dag_id
        alert = alerts[0]
        assert alert.reference == DeadlineReference.DAGRUN_QUEUED_AT, dag_id
        assert alert.interval == timedelta(minutes=DEFAULT_RUN_DEADLINE_MINUTES), dag_id
        assert isinstance(alert.callback, SyncCallback), dag_id
        assert alert.callback.path == "sparktune_airflow.core.notify.PipelineNotifier", dag_id
        assert alert.callback.kwargs == {"event": "run_overdue"}, dag_id


def test_promotion_and_rollback_tell_the_team(dagbag):
    finetune = dagbag.dags["llm_finetune"]
    assert _notifier_events(finetune.get_task("promote_champion").on_success_callback) == ["promoted"]
    assert _notifier_events(finetune.get_task("promote_staging").on_success_callback) == []
    rollback = dagbag.dags["rollback_champion"].get_task("rollback_champion")
    assert _notifier_events(rollback.on_success_callback) == ["rolled_back"]
    approval = finetune.get_task("approve_champion")
    assert [n.event for n in approval.notifiers] == ["approval_waiting"]


def test_llm_finetune_order(dagbag):
    dag = dagbag.dags["llm_finetune"]
    order = [
        "validate_params",
        "resolve_base_model",
        "merge_feedback",
        "skip_unchanged_source",
        "prepare_data",
        "skip_unchanged",
        "validate_data",
        "materialize_dataset",
        "train",
        "register",
        "evaluate",
        "gate",
        "promote_staging",
        "smoke_test",
        "approve_champion",
        "promote_champion",
    ]
    for upstream, downstream in zip(order, order[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids, (upstream, downstream)
    assert dag.max_active_runs == 1, "promotions of two runs must not interleave"


def test_the_embedded_runner_reads_the_decision_of_llm_finetunes_gate_task(dagbag):
    # make run exits 3 on a blocked gate by reading this task's XCom (sparktune_dev.embedded.run_record).
    from sparktune_airflow import PromotionGateOperator
    from sparktune_dev.embedded.run_record import GATE_TASK_ID

    assert isinstance(dagbag.dags["llm_finetune"].get_task(GATE_TASK_ID), PromotionGateOperator)


def test_the_dags_form_a_loop_through_assets(dagbag):
    from airflow.sdk import AssetOrTimeSchedule
    from sparktune_airflow.core.assets import champion_asset, feedback_asset, training_source_asset

    finetune = dagbag.dags["llm_finetune"]
    # Retrains on its cron, and when new training data or corrections land.
    assert isinstance(finetune.timetable, AssetOrTimeSchedule)
    assert finetune.timetable.timetable.expression == "0 3 * * 1"
    triggers = {asset.name for asset in finetune.timetable.asset_condition.objects}
    assert triggers == {training_source_asset().name, feedback_asset().name}
    # Promotion to champion emits the asset batch_inference is scheduled on...
    assert finetune.get_task("promote_champion").outlets == [champion_asset()]
    assert finetune.get_task("promote_staging").outlets == []
    scoring = dagbag.dags["batch_inference"]
    assert {a.name for a in scoring.timetable.asset_condition.objects} == {champion_asset().name}
    # ...and recorded corrections emit the feedback asset that retrains.
    assert dagbag.dags["record_corrections"].get_task("record").outlets == [feedback_asset()]


SCALARS = ("string", "integer", "number", "boolean")
# "value: what it does" in a description lists the choices of a param: those need an enum.
CHOICE_IN_DESCRIPTION = re.compile(r"(?:^|[.;] )([a-z][a-z0-9_]*): ")


def _form_type(schema: dict) -> tuple[str, bool]:
    """The field's one scalar type and whether it may be empty (null): what the trigger form draws."""
    declared = schema.get("type")
    types = declared if isinstance(declared, list) else [declared]
    scalars = [t for t in types if t != "null"]
    assert len(scalars) == 1 and scalars[0] in SCALARS, f"not one flat scalar type: {declared!r}"
    return scalars[0], "null" in types


def test_params_are_flat_typed_and_described(dagbag):
    """What the trigger form needs from every param of every DAG: a typed field with a description,
    bounds, a default it accepts and an enum for choices. A string without "null" in its type is
    required (the form refuses it empty), so an optional one must be nullable."""
    from airflow.sdk.definitions.param import NOTSET

    for dag_id, dag in dagbag.dags.items():
        for name, param in dag.params.items():
            where = f"{dag_id} param {name}"
            schema = param.schema
            kind, nullable = _form_type(schema)
            assert param.description, f"{where} has no description"
            # Serializing a DAG validates every param of every task (sparktune_airflow.core.params).
            assert schema.get("$schema") == SCHEMA_DIALECT, (
                f"{where} is checked against the slow default dialect"
            )
            if param.value is NOTSET:
                # Only an input the user must give may go without a default (record_corrections's file).
                assert kind == "string" and not nullable and schema.get("minLength", 0) >= 1, where
            else:
                param.resolve()  # the default passes its own schema (raises otherwise)
            if kind in ("integer", "number"):
                assert "minimum" in schema and "maximum" in schema, f"{where} has no bounds"
                # None: a training-recipe number left to the base model (sparktune.model.recipes).
                if param.value is not None:
                    assert schema["minimum"] <= param.value <= schema["maximum"], where
                else:
                    assert nullable, where
            if kind == "string" and "enum" not in schema and param.value == "":
                assert nullable, f"{where} defaults to empty, so it must be nullable or the form blocks"
            choices = set(CHOICE_IN_DESCRIPTION.findall(param.description))
            if kind == "string" and len(choices) >= 2:
                assert choices <= set(schema.get("enum", ())), f"{where} describes choices {choices}: enum"
            if "enum" in schema:
                assert not nullable and param.value in schema["enum"], where


# Each DAG file is imported in a fork of one interpreter that has imported airflow.sdk alone (every
# DAG file's first import, checked to import nothing heavy itself): what a fresh interpreter per file
# finds, for one airflow import instead of one per file (1.6 of the 2 s of CPU each file cost).
_IMPORT_EACH_IN_A_FORK = """
import importlib.util, json, os, sys
import airflow.sdk
heavy = sys.argv[1].split(",")
found = {"airflow.sdk": sorted(m for m in heavy if m in sys.modules)}
for path in sys.argv[2:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            spec = importlib.util.spec_from_file_location("dag_under_test", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            loaded = sorted(m for m in heavy if m in sys.modules)
        except BaseException as exc:
            loaded = f"the import failed: {exc!r}"
        os.write(write, json.dumps(loaded).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        found[path] = json.loads(answer.read() or '"the import process died"')
    os.waitpid(pid, 0)
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def heavy_imports() -> dict[str, object]:
    """DAG file (and airflow.sdk) -> the heavy modules importing it loaded."""
    args = [sys.executable, "-c", _IMPORT_EACH_IN_A_FORK, ",".join(HEAVY), *map(str, DAG_FILES)]
    result = subprocess.run(args, capture_output=True, text=True, check=True)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found.pop("airflow.sdk") == []  # else the forks would not start as a fresh interpreter
    return found


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_imports_nothing_heavy(dag_file, heavy_imports):
    assert heavy_imports[str(dag_file)] == []


def test_champion_guard_runs_hourly_and_checks_every_model_by_default(dagbag):
    from sparktune_airflow import ChampionGuardOperator

    guard = dagbag.dags["champion_guard"]
    assert guard.timetable.expression == "17 * * * *"
    (task,) = guard.tasks
    assert isinstance(task, ChampionGuardOperator)
    assert guard.params["model_name"] == ""
