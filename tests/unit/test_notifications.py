"""What each notification says (sparktune.core.notifications), without sending anything."""

from __future__ import annotations

import json

import pytest
from sparktune.core import notifications
from sparktune.core.notifications import run_url, split_error


@pytest.mark.parametrize(
    ("message", "cause", "fix"),
    [
        (
            "train_backend=databricks needs the Airflow connection 'databricks_default', which is not "
            "defined. Create it (type databricks, host = the workspace URL).",
            "train_backend=databricks needs the Airflow connection 'databricks_default', which is not "
            "defined.",
            "Create it (type databricks, host = the workspace URL).",
        ),
        (
            "ValueError: label_set_unchanged: FAIL, labels differ; set allow_label_change=true",
            "label_set_unchanged: FAIL, labels differ;",
            "set allow_label_change=true",
        ),
        ("airflow.sdk.exceptions.AirflowFailException: disk full\n  File x.py", "disk full", None),
        ("\n\n  Connection refused  \nmore", "Connection refused", None),
        ("", "(no message)", None),
    ],
)
def test_an_error_splits_into_its_first_sentence_and_the_fix_after_it(message, cause, fix):
    assert split_error(message) == (cause, fix)


def test_the_run_link_quotes_the_run_id():
    url = run_url("http://host:8080/", "llm_finetune", "manual__2026-11-26T10:00:00+00:00", "train")
    assert (
        url == "http://host:8080/dags/llm_finetune/runs/manual__2026-11-26T10%3A00%3A00%2B00%3A00/tasks/train"
    )


def test_a_failure_says_what_where_the_error_the_fix_and_the_link():
    note = notifications.task_failed(
        dag_id="llm_finetune",
        run_id="r1",
        task_id="train",
        try_number=3,
        error="RuntimeError: CUDA out of memory. Lower per_device_train_batch_size.",
        url="http://ui/dags/llm_finetune/runs/r1/tasks/train",
    )
    assert note.subject == "[sparktune] llm_finetune: train failed"
    assert note.text().splitlines() == [
        "Task train of llm_finetune failed on try 3, with no retry left.",
        "",
        "DAG: llm_finetune",
        "Run: r1",
        "Task: train",
        "Error: CUDA out of memory.",
        "Fix: Lower per_device_train_batch_size.",
        "",
        "Open the run: http://ui/dags/llm_finetune/runs/r1/tasks/train",
    ]
    payload = note.payload()
    assert json.loads(json.dumps(payload)) == payload  # JSON as it is
    assert payload["event"] == "task_failed" and payload["fix"] == "Lower per_device_train_batch_size."


def test_a_promotion_and_a_rollback_name_the_versions_and_the_actor():
    move = {
        "model_name": "support-intent",
        "alias": "champion",
        "from_version": "3",
        "to_version": "4",
        "actor": "llm_finetune/r1/promote_champion",
        "reason": "gate passed",
        "kind": "move",
    }
    promoted = notifications.alias_moved(
        dag_id="llm_finetune", run_id="r1", task_id="promote_champion", move=move, url=None
    )
    assert promoted.event == "promoted"
    assert promoted.summary == "support-intent @champion is now v4 (was v3): promoted."
    assert "Actor: llm_finetune/r1/promote_champion" in promoted.text()
    rolled = notifications.alias_moved(
        dag_id="rollback_champion", run_id="r2", task_id="rollback_champion",
        move={**move, "from_version": "4", "to_version": "3", "kind": "rollback"}, url=None,
    )  # fmt: skip
    assert (
        rolled.event == "rolled_back"
        and rolled.subject == "[sparktune] support-intent champion rolled back to v3"
    )


def test_an_overdue_run_and_a_hand_moved_champion_say_what_to_do():
    overdue = notifications.run_overdue(
        dag_id="llm_finetune", run_id="r1", deadline="2026-11-26T12:00:00+00:00", state="running", url="u"
    )
    assert "was not done by its deadline (2026-11-26T12:00:00+00:00); it is running" in overdue.summary
    assert overdue.fix
    moved = notifications.champion_moved_outside(
        dag_id="champion_guard", run_id="r", model_name="m", version="7", expected="5", url=None
    )
    assert "m @champion is v7, but the audit trail's last move leaves v5" in moved.summary
    assert "rollback_champion" in moved.fix
