"""Notifications reach a real SMTP server and a real HTTP receiver on 127.0.0.1 through the Airflow
connections `sparktune_smtp` and `sparktune_webhook` (tests/receivers.py)."""

from __future__ import annotations

import logging

import pytest

try:
    from tests.receivers import RECIPIENTS, SENDER, SmtpReceiver, WebhookReceiver, body_text, connection_env
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from receivers import RECIPIENTS, SENDER, SmtpReceiver, WebhookReceiver, body_text, connection_env

from sparktune.core import notifications

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store

FAILURE = notifications.task_failed(
    dag_id="llm_finetune",
    run_id="manual__2026-11-26T10:00:00+00:00",
    task_id="validate_data",
    try_number=3,
    error="AirflowFailException: 12 rows have no label. Fix the source or set max_null_rate=0.1.\nTraceback",
    url="http://127.0.0.1:8080/dags/llm_finetune/runs/manual__2026-11-26T10%3A00%3A00%2B00%3A00/tasks/validate_data",
)


@pytest.fixture
def receivers(monkeypatch):
    with SmtpReceiver() as smtp, WebhookReceiver() as webhook:
        for name, value in connection_env(smtp, webhook).items():
            monkeypatch.setenv(name, value)
        yield smtp, webhook


def test_a_failure_reaches_the_mailbox_and_the_webhook_with_its_error_fix_and_link(receivers):
    from sparktune_airflow.core.notify import send

    smtp, webhook = receivers
    assert send(FAILURE) == ["sparktune_smtp", "sparktune_webhook"]

    mail = smtp.wait_for(lambda m: "validate_data failed" in m["Subject"])
    assert mail["Subject"] == "[sparktune] llm_finetune: validate_data failed"
    assert mail["From"] == SENDER and mail["X-Sparktune-Event"] == "task_failed"
    assert smtp.envelopes[-1][1] == RECIPIENTS.split(",")
    text = body_text(mail)
    assert "Error: 12 rows have no label." in text
    assert "Fix: Fix the source or set max_null_rate=0.1." in text
    assert "Traceback" not in text  # the first line only
    assert FAILURE.url in text

    payload = webhook.wait_for(lambda p: p["event"] == "task_failed")
    assert payload["task_id"] == "validate_data" and payload["run_id"] == FAILURE.run_id
    assert payload["error"] == "12 rows have no label." and payload["url"] == FAILURE.url
    assert payload["text"] == FAILURE.text()
    assert webhook.headers[-1]["Authorization"] == "Bearer test-token"  # the connection's extra


def test_a_broken_webhook_does_not_stop_the_mail(receivers, monkeypatch, caplog):
    from sparktune_airflow.core.notify import send

    smtp, _ = receivers
    with WebhookReceiver(status=500) as failing:
        monkeypatch.setenv("AIRFLOW_CONN_SPARKTUNE_WEBHOOK", failing.connection())
        with caplog.at_level(logging.WARNING, logger="sparktune_airflow.core.notify"):
            assert send(FAILURE) == ["sparktune_smtp"]
        assert failing.payloads  # it was called, and answered 500
    assert smtp.wait_for(lambda m: "validate_data failed" in m["Subject"])
    assert "could not send the task_failed notification through connection 'sparktune_webhook'" in caplog.text


def test_without_connections_nothing_is_sent_and_the_log_says_which_to_define(monkeypatch, caplog):
    from sparktune_airflow.core.notify import send

    monkeypatch.delenv("AIRFLOW_CONN_SPARKTUNE_SMTP", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_SPARKTUNE_WEBHOOK", raising=False)
    with caplog.at_level(logging.INFO, logger="sparktune_airflow.core.notify"):
        assert send(FAILURE) == []
    assert "define the connection 'sparktune_smtp' or 'sparktune_webhook'" in caplog.text


def test_a_mail_connection_without_recipients_says_what_to_add(monkeypatch, caplog):
    import json

    from sparktune_airflow.core.notify import send

    with SmtpReceiver() as smtp:
        conn = json.loads(smtp.connection())
        del conn["extra"]["to"]
        monkeypatch.setenv("AIRFLOW_CONN_SPARKTUNE_SMTP", json.dumps(conn))
        monkeypatch.delenv("AIRFLOW_CONN_SPARKTUNE_WEBHOOK", raising=False)
        with caplog.at_level(logging.WARNING, logger="sparktune_airflow.core.notify"):
            assert send(FAILURE) == []
        assert not smtp.messages
    assert 'add "to": "a@example.com,b@example.com" to its extra' in caplog.text


def test_other_connection_ids_come_from_the_environment(monkeypatch):
    from sparktune_airflow.core.notify import send

    with WebhookReceiver() as webhook:
        monkeypatch.delenv("AIRFLOW_CONN_SPARKTUNE_SMTP", raising=False)
        monkeypatch.delenv("AIRFLOW_CONN_SPARKTUNE_WEBHOOK", raising=False)
        monkeypatch.setenv("AIRFLOW_CONN_TEAM_CHAT", webhook.connection())
        monkeypatch.setenv("SPARKTUNE_NOTIFY_WEBHOOK_CONN_ID", "team_chat")
        assert send(FAILURE) == ["team_chat"]
        assert webhook.wait_for(lambda p: p["event"] == "task_failed")


class _TaskInstance:
    dag_id, run_id, task_id = "champion_guard", "scheduled__2026-11-26T10:17:00+00:00", "check_champion"


def test_the_guard_tells_the_team_of_a_champion_set_by_hand(receivers, tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient
    from sparktune.model.process_setup import using_tracking_uri
    from sparktune.release.registry import CHAMPION, move_alias, register_run_model
    from sparktune_airflow import ChampionGuardOperator

    smtp, webhook = receivers
    uri = new_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return model_input

    client = MlflowClient(uri)
    versions = []
    experiment = client.create_experiment("guard")
    for _ in range(2):
        # The fluent API, for the runs training would leave.
        with using_tracking_uri(uri), mlflow.start_run(experiment_id=experiment) as run:
            mlflow.pyfunc.log_model(name="model", python_model=Echo(), pip_requirements=[])
        versions.append(register_run_model(client, "guarded", run.info.run_id, {}))
    move_alias(
        client,
        "guarded",
        CHAMPION,
        versions[0],
        actor="t",
        reason="r",
        check_current=True,
        expected_current=None,
    )
    operator = ChampionGuardOperator(task_id="check_champion")
    context = {"ti": _TaskInstance()}

    operator.pre_execute(context)
    assert operator.execute(context) == [
        {"model_name": "guarded", "champion": versions[0], "audited": versions[0], "moved_outside": False}
    ]
    assert not webhook.payloads

    client.set_registered_model_alias("guarded", CHAMPION, versions[1])  # by hand, in the MLflow UI
    result = operator.execute(context)
    assert result[0]["moved_outside"] is True
    payload = webhook.wait_for(lambda p: p["event"] == "champion_moved_outside_pipeline")
    assert payload["summary"].startswith(
        f"guarded @champion is v{versions[1]}, but the audit trail's last move"
    )
    assert "rollback_champion" in payload["fix"]
    assert smtp.wait_for(lambda m: m["Subject"] == "[sparktune] guarded champion moved outside the pipeline")


def test_an_approval_request_names_the_model_its_approvers_the_deadline_and_the_required_actions_page(
    receivers,
):
    """What the HITL operator's notifier sends as it parks the task awaiting input."""
    from datetime import timedelta

    from sparktune_airflow import ChampionApprovalOperator
    from sparktune_airflow.core.notify import PipelineNotifier

    smtp, webhook = receivers
    operator = ChampionApprovalOperator(
        task_id="approve_champion",
        model_name="support-intent",
        version="7",
        evaluation={},
        gate_decision={"mode": "dry_run", "passed": False},
    )
    # As its execute() sets them from the run's approvers and approval_timeout_minutes.
    operator.assigned_users = [{"id": "alice", "name": "alice"}, {"id": "bob", "name": "bob"}]
    operator.response_timeout = timedelta(minutes=90)

    class TaskInstance:
        dag_id, run_id, task_id, map_index = "llm_finetune", "manual__1", "approve_champion", -1

    PipelineNotifier("approval_waiting").notify({"ti": TaskInstance(), "task": operator})

    payload = webhook.wait_for(lambda p: p["event"] == "approval_waiting")
    assert payload["summary"].startswith("support-intent v7 FAILED its gate (a dry run lets it through)")
    assert payload["details"]["Approvers"] == "alice, bob"
    assert payload["details"]["Answer by"]
    assert payload["url"].endswith(
        "/dags/llm_finetune/runs/manual__1/tasks/approve_champion/required_actions?map_index=-1"
    )
    assert smtp.wait_for(lambda m: m["Subject"] == "[sparktune] approve support-intent v7 as champion?")
