"""RollbackChampionOperator, the task of the rollback_champion DAG, against a real MLflow registry.

The DAG itself runs on the native stack, triggered by the Models page's rollback button
(tests/stack/test_models_page.py): there its task moves the alias as the signed-in user's run. Here,
without a DAG run, what the task does with each answer the registry gives: the previous champion
restored and audited with the task instance as the actor, and a version the model does not have
refused at once (no retry) with the versions it does have, nothing moved.
"""

from __future__ import annotations

from types import SimpleNamespace

import mlflow
import pytest
from airflow.sdk.exceptions import AirflowFailException
from mlflow.tracking import MlflowClient
from sparktune.model.process_setup import using_tracking_uri
from sparktune.release.registry import (
    CHAMPION,
    PREVIOUS_CHAMPION,
    alias_version,
    audit_log,
    move_alias,
    register_run_model,
)
from sparktune_airflow import RollbackChampionOperator

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store

MODEL = "rollback-intent"


class _EchoModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


@pytest.fixture
def registry(tmp_path, monkeypatch) -> MlflowClient:
    """v1 and v2 of MODEL, each promoted in turn: v2 champion, v1 previous_champion."""
    uri = new_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # what the operator's MLflow connection falls back to
    client = MlflowClient(uri)
    experiment = client.create_experiment("rollback", artifact_location=(tmp_path / "artifacts").as_uri())
    for version in ("1", "2"):
        with using_tracking_uri(uri), mlflow.start_run(experiment_id=experiment) as run:
            mlflow.pyfunc.log_model(name="model", python_model=_EchoModel(), pip_requirements=[])
        assert (
            register_run_model(client, MODEL, run.info.run_id, {"data_fingerprint": f"fp{version}"})
            == version
        )
        move_alias(client, MODEL, CHAMPION, version, actor="test", reason=f"promote v{version}")
    return client


def _run(**arguments) -> dict:
    task = RollbackChampionOperator(task_id="rollback_champion", model_name=MODEL, **arguments)
    ti = SimpleNamespace(
        dag_id="rollback_champion", run_id="manual__1", task_id="rollback_champion", try_number=1
    )
    context = {"ti": ti, "params": {}, "task": task}
    task.pre_execute(context)
    return task.execute(context)


def test_the_previous_champion_is_restored_and_audited_with_the_task_as_actor(registry):
    _run(reason="v2 misroutes refunds")
    assert alias_version(registry, MODEL, CHAMPION) == "1"
    assert alias_version(registry, MODEL, PREVIOUS_CHAMPION) == "2"
    moves = audit_log(registry, MODEL)
    assert len(moves) == 3  # two promotions, one rollback
    last = moves[-1]
    assert (last["alias"], last["from_version"], last["to_version"], last["kind"]) == (
        "champion",
        "2",
        "1",
        "rollback",
    )
    assert last["reason"] == "v2 misroutes refunds"
    assert last["actor"] == "airflow:rollback_champion/manual__1/rollback_champion"


def test_an_unknown_version_fails_at_once_and_moves_nothing(registry):
    before = audit_log(registry, MODEL)
    with pytest.raises(
        AirflowFailException,
        match=f"{MODEL} has no version '99'. Pass to_version as one of the versions: 1, 2",
    ):
        _run(to_version="99")
    assert alias_version(registry, MODEL, CHAMPION) == "2"
    assert audit_log(registry, MODEL) == before
