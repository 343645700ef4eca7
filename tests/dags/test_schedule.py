"""The schedules of llm_finetune and monitor_champion: settings read when the DAG file is parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "llm_finetune.py"


def _parsed_schedule(
    monkeypatch, cron: str | None, dag_id: str = "llm_finetune", env: str = "SPARKTUNE_RETRAIN_CRON"
):
    from airflow.models import DagBag

    if cron is None:
        monkeypatch.delenv(env, raising=False)
    else:
        monkeypatch.setenv(env, cron)
    bag = DagBag(dag_folder=str(DAG_FILE.with_name(f"{dag_id}.py")))
    assert not bag.import_errors, bag.import_errors
    return bag.dags[dag_id].timetable


def test_default_runs_on_mondays_and_on_asset_updates(monkeypatch):
    timetable = _parsed_schedule(monkeypatch, None)
    assert type(timetable).__name__ == "AssetOrTimeSchedule"
    assert timetable.timetable.expression == "0 3 * * 1"


@pytest.mark.parametrize("off", ["off", "None"])
def test_retrain_cron_off_leaves_only_the_asset_triggers(monkeypatch, off):
    assert type(_parsed_schedule(monkeypatch, off)).__name__ == "AssetTriggeredTimetable"


def _monitor_schedule(monkeypatch, cron: str | None):
    return _parsed_schedule(monkeypatch, cron, "monitor_champion", "SPARKTUNE_MONITOR_CRON")


def test_monitor_runs_daily_and_after_each_batch_scoring(monkeypatch):
    from airflow.models import DagBag
    from sparktune_airflow.core.assets import scored_traffic_asset

    timetable = _monitor_schedule(monkeypatch, None)
    assert type(timetable).__name__ == "AssetOrTimeSchedule"
    assert timetable.timetable.expression == "0 0 * * *"
    assert scored_traffic_asset() in timetable.asset_condition.objects
    # The asset it waits for is the one batch_inference's scoring emits.
    bag = DagBag(dag_folder=str(DAG_FILE.with_name("batch_inference.py")))
    assert bag.dags["batch_inference"].get_task("score").outlets == [scored_traffic_asset()]
    assert type(_monitor_schedule(monkeypatch, "off")).__name__ == "AssetTriggeredTimetable"
