"""Registry functions against a real MLflow tracking store (SQLite) in a temp folder."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from sparktune.registry import (
    CHAMPION,
    PREVIOUS_CHAMPION,
    ChampionChangedError,
    alias_version,
    audit_log,
    move_alias,
    register_run_model,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # One database per module: creating MLflow's schema costs seconds.
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("registry-test", artifact_location=(root / "artifacts").as_uri())
    yield uri, experiment
    mlflow.set_tracking_uri(None)


@pytest.fixture()
def client(store):
    uri, experiment = store
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=experiment)
    return MlflowClient(uri)


@pytest.fixture()
def model(request) -> str:
    return f"registry-test-{request.node.name}"  # a fresh model per test, one shared database


class _EchoModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def _run_with_model(client: MlflowClient) -> str:
    # A real logged model: MLflow 3 registers LoggedModels, not bare artifact folders.
    with mlflow.start_run() as run:
        mlflow.pyfunc.log_model(name="model", python_model=_EchoModel(), pip_requirements=[])
    return run.info.run_id


def test_register_is_idempotent_per_run(client, model):
    run_id = _run_with_model(client)
    first = register_run_model(client, model, run_id, {"data_fingerprint": "abc"})
    again = register_run_model(client, model, run_id, {"data_fingerprint": "abc"})
    assert first == again == "1"
    assert len(client.search_model_versions(f"name = '{model}'")) == 1
    assert client.get_model_version(model, first).tags["data_fingerprint"] == "abc"
    other = register_run_model(client, model, _run_with_model(client), {})
    assert other == "2"


def test_champion_moves_keep_previous_and_are_audited(client, model):
    v1 = register_run_model(client, model, _run_with_model(client), {})
    v2 = register_run_model(client, model, _run_with_model(client), {})
    assert alias_version(client, model, CHAMPION) is None
    move_alias(
        client, model, CHAMPION, v1, actor="test", reason="first", check_current=True, expected_current=None
    )
    move = move_alias(
        client, model, CHAMPION, v2, actor="test", reason="better", check_current=True, expected_current=v1
    )
    assert move.changed and move.from_version == v1
    assert alias_version(client, model, CHAMPION) == v2
    assert alias_version(client, model, PREVIOUS_CHAMPION) == v1
    # A rerun of the same promotion changes nothing and writes no second audit record.
    rerun = move_alias(
        client, model, CHAMPION, v2, actor="test", reason="retry", check_current=True, expected_current=v1
    )
    assert not rerun.changed
    log = audit_log(client, model)
    assert [(e["from_version"], e["to_version"], e["reason"]) for e in log] == [
        ("", v1, "first"),
        (v1, v2, "better"),
    ]


def test_promotion_stops_when_champion_moved_in_between(client, model):
    v1 = register_run_model(client, model, _run_with_model(client), {})
    v2 = register_run_model(client, model, _run_with_model(client), {})
    v3 = register_run_model(client, model, _run_with_model(client), {})
    move_alias(client, model, CHAMPION, v1, actor="t", reason="r")
    move_alias(client, model, CHAMPION, v2, actor="another run", reason="r")
    with pytest.raises(ChampionChangedError, match="another run promoted in between"):
        move_alias(
            client, model, CHAMPION, v3, actor="t", reason="r", check_current=True, expected_current=v1
        )
    assert alias_version(client, model, CHAMPION) == v2
