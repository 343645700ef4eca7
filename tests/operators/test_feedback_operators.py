"""What the loop's operators read from the run context: the triggering champion event, the run day."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from airflow.sdk import Asset
from sparktune_airflow.core.assets import champion_asset, feedback_asset
from sparktune_airflow.serve.batch_inference import champion_event, run_day

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store


def _event(extra: dict, minute: int) -> SimpleNamespace:
    return SimpleNamespace(extra=extra, timestamp=datetime(2026, 11, 23, 10, minute, tzinfo=UTC))


def test_the_newest_champion_event_names_the_model_and_other_assets_are_ignored():
    events = {
        feedback_asset(): [_event({"model_name": "not-a-champion"}, 59)],
        champion_asset(): [
            _event({"model_name": "intent", "version": "3"}, 1),
            _event({"model_name": "intent", "version": "4"}, 5),
            _event({"model_name": "intent", "version": "2"}, 0),
        ],
    }
    assert champion_event({"triggering_asset_events": events}) == {"model_name": "intent", "version": "4"}
    # A manual or scheduled run has no triggering events: the DAG's params decide.
    assert champion_event({"triggering_asset_events": {}}) is None
    assert champion_event({}) is None
    assert champion_event({"triggering_asset_events": {Asset("other"): [_event({}, 1)]}}) is None


def test_run_day_is_the_logical_date_or_when_the_run_was_due():
    logical = datetime(2026, 11, 22, 23, 59, tzinfo=UTC)
    due = datetime(2026, 11, 23, 0, 5, tzinfo=UTC)
    run = SimpleNamespace(run_after=due)
    assert run_day({"logical_date": logical, "dag_run": run}) == "2026-11-22"
    # Asset-triggered runs have no logical date in Airflow 3.
    assert run_day({"logical_date": None, "dag_run": run}) == "2026-11-23"


def test_batch_inference_with_an_empty_source_fails_at_once_instead_of_scoring_the_demo_data():
    import pytest
    from airflow.sdk.exceptions import AirflowFailException
    from sparktune_airflow import BatchInferenceOperator

    operator = BatchInferenceOperator(task_id="score", source_uri=" ", output_uri="/tmp/out", model_name="m")
    with pytest.raises(AirflowFailException, match="source_uri is empty"):
        operator.execute({})


def test_skip_unchanged_skips_a_rerun_of_the_champion_and_links_to_that_version(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from sparktune.core.params import config_hash, parse_params
    from sparktune.core.provenance import code_fingerprint
    from sparktune_airflow import SkipUnchangedOperator
    from sparktune_airflow.core.links import model_version_url

    uri = new_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    params = {"model_name": "intent"}
    client.create_registered_model("intent")
    version = client.create_model_version("intent", source=str(tmp_path), tags={
        "data_fingerprint": "fp1", "config_hash": config_hash(parse_params(params)),
        "code_fingerprint": code_fingerprint(),
    }).version  # fmt: skip
    client.set_registered_model_alias("intent", "champion", version)

    def decide(fingerprint: str) -> tuple[dict | bool, SimpleNamespace]:
        operator = SkipUnchangedOperator(
            task_id="skip_unchanged",
            model_name="intent",
            data_fingerprint=fingerprint,
            config_hash=config_hash(parse_params(params)),
        )
        pushed: dict = {}
        ti = SimpleNamespace(pushed=pushed, xcom_push=lambda key, value: pushed.update({key: value}))
        return operator.decide(ti), ti

    # The short-circuit's condition: False skips the rest, the reason pushed first for make run.
    condition, ti = decide("fp1")
    same = ti.pushed["return_value"]
    assert condition is False and not same["train"]
    assert model_version_url(same, "http://mlflow") == f"http://mlflow/#/models/intent/versions/{version}"
    condition, ti = decide("fp2")  # new data: trains, skips nothing
    assert condition["train"] and not ti.pushed


def test_corrections_are_recorded_as_by_the_user_who_triggered_the_run(tmp_path, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
    from sparktune_airflow import RecordCorrectionsOperator

    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[1]"}')
    kwargs: list[dict] = []
    monkeypatch.setattr(PySparkOperator, "execute", lambda op, context: kwargs.append(dict(op.op_kwargs)))
    ti = SimpleNamespace(dag_id="record_corrections", run_id="manual__1", task_id="record", try_number=1)
    due = datetime(2026, 11, 23, tzinfo=UTC)
    corrections = tmp_path / "data" / "c.csv"
    operator = RecordCorrectionsOperator(task_id="record", corrections_uri=str(corrections), model_name="m")
    for user, expected in (("ana", "ana"), (None, "airflow:record_corrections/manual__1")):
        run = SimpleNamespace(run_after=due, triggering_user_name=user)
        operator.execute({"ti": ti, "dag_run": run, "logical_date": None})
        assert kwargs[-1]["corrected_by"] == expected
