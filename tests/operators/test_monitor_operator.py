"""MonitorChampionOperator end to end below Airflow's scheduler: the champion found in a real MLflow
registry (its run's training split and test-split scores), the window read by a real local Spark,
Evidently's report written under the monitoring root, and on drift a notification that reaches a
real HTTP receiver through the ``sparktune_webhook`` connection; no drift sends none."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow import MonitorChampionOperator
from sparktune_airflow.core.links import drift_report_url

try:
    from tests import drift_data
    from tests.mlflow_store import new_store
    from tests.receivers import WebhookReceiver
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    import drift_data
    from mlflow_store import new_store
    from receivers import WebhookReceiver

pytestmark = pytest.mark.spark

MODEL, WHEN = drift_data.MODEL, drift_data.WHEN
RUN_ID = "scheduled__2026-11-20T10:00:00+00:00"


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    """A registered version whose run names its training split and logged its test-split scores,
    with the champion alias on it."""
    from mlflow.tracking import MlflowClient
    from sparktune.release.registry import CHAMPION

    root = tmp_path_factory.mktemp("monitored-champion")
    data = drift_data.publish_champion(root)
    uri = new_store(root / "mlflow.db")
    client = MlflowClient(uri)
    experiment = client.create_experiment("monitor", artifact_location=(root / "artifacts").as_uri())
    run = client.create_run(experiment, tags={"sparktune.dataset_path": data["dataset_uri"]})
    client.log_artifact(run.info.run_id, data["predictions"], "evaluation")
    client.set_terminated(run.info.run_id)
    client.create_registered_model(MODEL)
    version = client.create_model_version(MODEL, f"{run.info.artifact_uri}/model", run.info.run_id)
    client.set_registered_model_alias(MODEL, CHAMPION, version.version)
    return {**data, "tracking_uri": uri, "version": version.version}


@pytest.fixture
def operator_env(spark, champion, tmp_path, monkeypatch):
    """SPARKTUNE_HOME in tmp_path, the champion's registry, and the Spark callable run on the test's
    Spark session (PySparkOperator would start one of its own and stop it)."""
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    for name in ("SPARKTUNE_LAKE_URI", "SPARKTUNE_FEEDBACK_URI", "SPARKTUNE_MONITORING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SPARKTUNE_SERVING_CAPTURES_URI", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", champion["tracking_uri"])
    monkeypatch.delenv("AIRFLOW_CONN_SPARKTUNE_SMTP", raising=False)
    # PythonOperator's own execute picks the callable's arguments out of the context; only the
    # session the callable gets is the test's.
    monkeypatch.setattr(
        PySparkOperator, "execute_callable", lambda op: op.python_callable(**{**op.op_kwargs, "spark": spark})
    )
    return tmp_path / "home" / "lake"


def _context(tmp_path: Path) -> dict:
    ti = SimpleNamespace(dag_id="monitor_champion", run_id=RUN_ID, task_id="compare", try_number=1)
    return {"ti": ti, "logical_date": WHEN + timedelta(minutes=30), "dag_run": SimpleNamespace()}


def _operator(**kwargs) -> MonitorChampionOperator:
    return MonitorChampionOperator(task_id="compare", model_name=MODEL, **kwargs)


def test_shifted_traffic_is_reported_and_notified(operator_env, champion, tmp_path, spark, monkeypatch):
    drift_data.shifted_traffic(spark, str(operator_env / "feedback"), champion["labels"])
    with WebhookReceiver() as webhook:
        monkeypatch.setenv("AIRFLOW_CONN_SPARKTUNE_WEBHOOK", webhook.connection())
        summary = _operator(review_size=10).execute(_context(tmp_path))
        payload = webhook.wait_for(lambda p: p["event"] == "drift_detected")
    assert summary["status"] == "drift" and summary["model_version"] == str(champion["version"])
    folder = operator_env / "monitoring" / MODEL / "scheduled__2026-11-20T10_00_00_00_00"
    assert summary["report_uri"] == str(folder / "drift_report.html") and Path(summary["report_uri"]).exists()
    assert json.loads((operator_env / "monitoring" / MODEL / "latest_summary.json").read_text()) == summary
    assert payload["subject"] == f"[sparktune] drift in what {MODEL} v{champion['version']} scores"
    assert payload["summary"] == summary["message"]
    assert payload["details"]["Texts to label"] == summary["review_csv_uri"]
    assert "record_corrections" in payload["fix"]
    assert drift_report_url(summary, "http://airflow:8080/") == (
        f"http://airflow:8080/sparktune/models/drift?model={MODEL}&run=scheduled__2026-11-20T10_00_00_00_00"
    )


def test_unshifted_traffic_is_reported_without_a_notification(operator_env, tmp_path, spark, monkeypatch):
    drift_data.unshifted_traffic(spark, str(operator_env / "feedback"))
    with WebhookReceiver() as webhook:
        monkeypatch.setenv("AIRFLOW_CONN_SPARKTUNE_WEBHOOK", webhook.connection())
        summary = _operator().execute(_context(tmp_path))
    assert summary["status"] == "no_drift", summary["message"]
    assert webhook.payloads == []
    assert Path(summary["report_uri"]).exists()


def test_too_little_traffic_succeeds_with_a_summary_and_no_link(operator_env, tmp_path, spark):
    summary = _operator(window_hours="2").execute(_context(tmp_path))
    assert summary["status"] == "too_little_traffic"
    assert summary["message"].startswith(
        f"0 texts scored by {MODEL} since 2026-11-20T08:00:00+00:00; need 300"
    )
    assert drift_report_url(summary, "http://airflow:8080") == ""


def test_a_model_without_a_champion_fails_without_retries(operator_env, tmp_path):
    with pytest.raises(AirflowFailException, match="has no champion to monitor"):
        MonitorChampionOperator(task_id="compare", model_name="unknown-model").execute(_context(tmp_path))
    with pytest.raises(AirflowFailException, match="model_name is empty"):
        MonitorChampionOperator(task_id="compare", model_name=" ").execute(_context(tmp_path))
