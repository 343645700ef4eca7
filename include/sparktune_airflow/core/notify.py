"""Tell the team: one Airflow notifier for every sparktune event, sent by e-mail and to a webhook
through the SMTP and HTTP providers' own notifiers, each configured by an Airflow connection, not
by code.

- E-mail: the SMTP connection ``sparktune_smtp`` (the SMTP provider's type: host, port, login,
  password, extra ``from_email``), recipients in its extra ``to`` (comma-separated).
- Webhook: the HTTP connection ``sparktune_webhook``, host = the URL to POST to; the extra holds
  headers (an ``Authorization`` token). The body is the notification as JSON
  (:meth:`sparktune.core.notifications.Notification.payload`), with a ``text`` field for chat tools.

A channel whose connection is not defined is left out; with neither, notifying does nothing and says
so once in the task log. A channel that fails is logged and never fails the task it reports on.
``SPARKTUNE_NOTIFY_SMTP_CONN_ID`` / ``SPARKTUNE_NOTIFY_WEBHOOK_CONN_ID`` name other connections.

The messages are :mod:`sparktune.core.notifications`; this module reads the Airflow context they
are about and sends them.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from airflow.providers.common.compat.notifier import BaseNotifier
from sparktune.core import notifications
from sparktune.core.notifications import Notification

log = logging.getLogger(__name__)

SMTP_CONN_ENV = "SPARKTUNE_NOTIFY_SMTP_CONN_ID"
WEBHOOK_CONN_ENV = "SPARKTUNE_NOTIFY_WEBHOOK_CONN_ID"
DEFAULT_SMTP_CONN_ID = "sparktune_smtp"
DEFAULT_WEBHOOK_CONN_ID = "sparktune_webhook"


def _connection(conn_id: str):
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def _send_email(conn_id: str, connection: Any, notification: Notification) -> None:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    to = [
        address.strip()
        for address in str(connection.extra_dejson.get("to", "")).split(",")
        if address.strip()
    ]
    if not to:
        raise ValueError(
            f'connection {conn_id!r} has no recipients: add "to": "a@example.com,b@example.com" to its extra'
        )
    # The providers' notifiers send: the sender address comes from the connection as the SMTP
    # provider reads it (extra from_email), the POST goes through the HTTP provider's hook.
    SmtpNotifier(
        to=to,
        subject=notification.subject,
        html_content=f"<pre>{html.escape(notification.text())}</pre>",
        custom_headers={"X-Sparktune-Event": notification.event},
        smtp_conn_id=conn_id,
    ).notify({})


def _post_webhook(conn_id: str, notification: Notification) -> None:
    from airflow.providers.http.notifications.http import HttpNotifier

    HttpNotifier(
        http_conn_id=conn_id, method="POST", json=notification.payload(), extra_options={"timeout": 10}
    ).notify({})


def send(notification: Notification) -> list[str]:
    """Send ``notification`` on every configured channel; the channels it reached."""
    reached = []
    smtp_id = os.environ.get(SMTP_CONN_ENV) or DEFAULT_SMTP_CONN_ID
    webhook_id = os.environ.get(WEBHOOK_CONN_ENV) or DEFAULT_WEBHOOK_CONN_ID
    channels = [
        (smtp_id, lambda connection: _send_email(smtp_id, connection, notification)),
        (webhook_id, lambda connection: _post_webhook(webhook_id, notification)),
    ]
    for conn_id, deliver in channels:
        connection = _connection(conn_id)
        if connection is None:
            continue
        try:
            deliver(connection)
        except Exception as exc:  # a broken channel must not hide the event from the other one
            log.warning(
                "could not send the %s notification through connection %r: %s",
                notification.event,
                conn_id,
                exc,
            )
        else:
            reached.append(conn_id)
    if reached:
        log.info("notified %s: %s", ", ".join(reached), notification.subject)
    else:
        log.info(
            "no notification channel reached for %r (define the connection %r or %r to be told)",
            notification.subject,
            smtp_id,
            webhook_id,
        )
    return reached


def ui_base() -> str:
    """The Airflow UI's address ([api] base_url), for the links in messages."""
    from airflow.sdk.configuration import conf

    return conf.get("api", "base_url", fallback="http://localhost:8080/")


def _error_text(context: Mapping[str, Any]) -> str:
    exception = context.get("exception")
    if exception is None:
        return "(the task ended failed without an exception: killed, timed out or marked failed)"
    if isinstance(exception, BaseException):
        return f"{type(exception).__name__}: {exception}"
    return str(exception)


def notification_for(event: str, context: Mapping[str, Any]) -> Notification:
    """The notification of ``event`` from the Airflow context of the task callback (or, for
    ``run_overdue``, of the deadline callback: ``dag_run`` and ``deadline`` as JSON)."""
    base = ui_base()
    if event == notifications.RUN_OVERDUE:
        dag_run = context["dag_run"]
        dag_id, run_id = dag_run["dag_id"], dag_run["dag_run_id"]
        return notifications.run_overdue(
            dag_id=dag_id,
            run_id=run_id,
            deadline=str(context.get("deadline", {}).get("deadline_time", "")),
            state=str(dag_run.get("state", "running")),
            url=notifications.run_url(base, dag_id, run_id),
        )
    ti = context["ti"]
    dag_id, run_id, task_id = ti.dag_id, ti.run_id, ti.task_id
    if event == notifications.TASK_FAILED:
        return notifications.task_failed(
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            try_number=ti.try_number,
            error=_error_text(context),
            url=notifications.run_url(base, dag_id, run_id, task_id),
        )
    if event in (notifications.PROMOTED, notifications.ROLLED_BACK):
        # The task's own return value: the AliasMove summary of PromoteModelOperator or
        # RollbackChampionOperator (whose kind says promotion or rollback).
        move = ti.xcom_pull(task_ids=task_id)
        return notifications.alias_moved(
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            move=move,
            url=notifications.run_url(base, dag_id, run_id),
        )
    if event == notifications.APPROVAL_WAITING:
        # Called by the HITL operator as it parks the task: context["task"] is the
        # ChampionApprovalOperator with this run's approvers and timeout already set.
        task = context["task"]
        gate = task.gate_decision
        timeout = getattr(task, "response_timeout", None)
        answer_by = (datetime.now(UTC) + timeout).isoformat(timespec="minutes") if timeout else None
        return notifications.approval_waiting(
            dag_id=dag_id,
            run_id=run_id,
            task_id=task_id,
            model_name=str(task.model_name),
            version=str(task.version),
            url=task.generate_link_to_ui(task_instance=ti, base_url=base),
            approvers=[user["id"] for user in (getattr(task, "assigned_users", None) or [])],
            deadline=answer_by,
            gate_passed=not isinstance(gate, Mapping) or bool(gate.get("passed", True)),
        )
    raise ValueError(
        f"no notification from a task callback for event {event!r}; events: {notifications.EVENTS}"
    )


class PipelineNotifier(BaseNotifier):
    """``on_failure_callback=PipelineNotifier("task_failed")``, ``on_success_callback=
    PipelineNotifier("promoted")`` on a task returning an alias move, or a deadline alert's
    ``SyncCallback(PipelineNotifier, kwargs={"event": "run_overdue"})``."""

    def __init__(self, event: str, context: Any = None) -> None:
        if event not in notifications.EVENTS:
            raise ValueError(f"unknown notification event {event!r}; choose one of {notifications.EVENTS}")
        super().__init__(context=context)
        self.event = event

    def notify(self, context: Any) -> None:
        if self.event in (notifications.PROMOTED, notifications.ROLLED_BACK):
            move = context["ti"].xcom_pull(task_ids=context["ti"].task_id) or {}
            if not move.get("changed", True):
                return  # the alias pointed there already (a retry, a dry run's repeat): nothing moved
        send(notification_for(self.event, context))
