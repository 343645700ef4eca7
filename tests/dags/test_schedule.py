"""llm_finetune's schedule is a deployment setting read when the DAG file is parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "llm_finetune.py"


def _parsed_schedule(monkeypatch, cron: str | None):
    from airflow.models import DagBag

    if cron is None:
        monkeypatch.delenv("SPARKTUNE_RETRAIN_CRON", raising=False)
    else:
        monkeypatch.setenv("SPARKTUNE_RETRAIN_CRON", cron)
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["llm_finetune"].timetable


def test_default_runs_on_mondays_and_on_asset_updates(monkeypatch):
    timetable = _parsed_schedule(monkeypatch, None)
    assert type(timetable).__name__ == "AssetOrTimeSchedule"
    assert timetable.timetable.expression == "0 3 * * 1"


@pytest.mark.parametrize("off", ["off", "None"])
def test_retrain_cron_off_leaves_only_the_asset_triggers(monkeypatch, off):
    assert type(_parsed_schedule(monkeypatch, off)).__name__ == "AssetTriggeredTimetable"
