"""The rollback_champion DAG through `airflow dags test` on embedded defaults, checked in MLflow.

The registry is prepared directly (two versions of a trivial logged model, v1 then v2 promoted):
a rollback needs no training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

_SESSION_ONLY = ("AIRFLOW_HOME", "MLFLOW_TRACKING_URI", "SPARKTUNE_LAKE_URI")
MODEL = "rollback-intent"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SESSION_ONLY}
    env["SPARKTUNE_HOME"] = str(home)
    return env


def run_dag(home: Path, conf: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sparktune_dev.embedded", "run", "--dag", "rollback_champion"]
    result = subprocess.run(
        [*command, "--conf", json.dumps(conf)],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    (home / f"dags-test-{len(list(home.glob('dags-test-*')))}.log").write_text(result.stdout + result.stderr)
    return result


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A SPARKTUNE_HOME whose registry has v1 and v2 of MODEL, v2 champion and v1 previous_champion."""
    import mlflow
    from mlflow.tracking import MlflowClient
    from sparktune.core.config import Settings
    from sparktune.model.process_setup import using_tracking_uri
    from sparktune.release.registry import CHAMPION, move_alias, register_run_model

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return model_input

    home = tmp_path_factory.mktemp("rollback-home")
    settings = Settings(home=home)
    settings.mlflow_dir.mkdir(parents=True)
    client = MlflowClient(settings.embedded_mlflow_uri)
    experiment = client.create_experiment("rollback-e2e", artifact_location=settings.mlflow_artifact_root)
    for version in ("1", "2"):
        # The fluent API (start_run, log_model) on this store, for this block only.
        with (
            using_tracking_uri(settings.embedded_mlflow_uri),
            mlflow.start_run(experiment_id=experiment) as run,
        ):
            mlflow.pyfunc.log_model(name="model", python_model=Echo(), pip_requirements=[])
        assert (
            register_run_model(client, MODEL, run.info.run_id, {"data_fingerprint": f"fp{version}"})
            == version
        )
        move_alias(client, MODEL, CHAMPION, version, actor="test", reason=f"promote v{version}")
    return home, client


def test_rollback_dag_restores_the_previous_champion_and_audits_the_run(registry):
    from sparktune.release.registry import CHAMPION, PREVIOUS_CHAMPION, alias_version, audit_log

    home, client = registry
    result = run_dag(home, {"model_name": MODEL, "reason": "v2 misroutes refunds"})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert alias_version(client, MODEL, CHAMPION) == "1"
    assert alias_version(client, MODEL, PREVIOUS_CHAMPION) == "2"
    last = audit_log(client, MODEL)[-1]
    assert (last["alias"], last["from_version"], last["to_version"], last["kind"]) == (
        "champion",
        "2",
        "1",
        "rollback",
    )
    assert last["reason"] == "v2 misroutes refunds"
    assert last["actor"].startswith("airflow:rollback_champion/") and last["actor"].endswith(
        "/rollback_champion"
    )
    assert len(audit_log(client, MODEL)) == 3  # two promotions, one rollback

    # make models shows the rollback, with this DAG run as the actor.
    report = subprocess.run(
        [sys.executable, "-m", "sparktune.release.models_report", "--model-name", MODEL],
        env=_env(home),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(line for line in report.splitlines() if "2 -> 1" in line)
    assert "rollback" in line and last["actor"] in line and line.endswith("v2 misroutes refunds")


def test_rollback_to_an_unknown_version_fails_at_once_and_moves_nothing(registry):
    from sparktune.release.registry import CHAMPION, alias_version, audit_log

    home, client = registry
    champion_before, moves_before = alias_version(client, MODEL, CHAMPION), len(audit_log(client, MODEL))
    result = run_dag(home, {"model_name": MODEL, "to_version": "99"})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"{MODEL} has no version '99'. Pass to_version as one of the versions: 1, 2" in output
    assert "up_for_retry" not in output.lower()  # AirflowFailException: no retries
    assert alias_version(client, MODEL, CHAMPION) == champion_before
    assert len(audit_log(client, MODEL)) == moves_before
