"""A person signs off the champion (``approval=required``) on the native stack with Airflow's
Human-in-the-loop: the request shows the evidence and waits in ``awaiting_input``; the team is told
with a link to its page. Approve, clicked in a real browser from that link, moves ``champion``;
Reject, clicked the same way, leaves it, and so does no answer before ``approval_timeout_minutes``.
The request and the answer are read over the HITL REST API; each decision is on the model version's
tags and in the audit log.

The runs train a few steps with ``gate_mode=dry_run`` (the gate records its decision and lets the
run through), so they reach the approval fast after the champion ``rest_run`` made. The one approved
is the run the browser test triggered from the form (tests/stack/test_ui.py), when it did.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

try:
    from tests.stack.ui_steps import log_in, shot
except ImportError:  # rootdir-relative import, as pytest puts this folder on sys.path
    from ui_steps import log_in, shot

pytestmark = [pytest.mark.stack, pytest.mark.e2e]

MODEL = "support-intent"
DAG = "llm_finetune"
TASK = "approve_champion"


def _ti_path(run_id: str, task_id: str) -> str:
    return f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"


def _start(stack, max_steps: int, **extra) -> str:
    conf = {
        "approval": "required",
        "approvers": stack.username,
        "gate_mode": "dry_run",
        "max_steps": max_steps,
        **extra,
    }
    return stack.rest("POST", f"/dags/{DAG}/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]


def _wait_for_the_request(stack, run_id: str, timeout: float = 1200) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = stack.rest("GET", f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances")
        states = {t["task_id"]: t["state"] for t in tasks["task_instances"]}
        if states.get(TASK) == "awaiting_input":
            return
        failed = [t for t, state in states.items() if state in ("failed", "upstream_failed", "skipped")]
        assert not failed, f"the run ended before asking for approval: {states}"
        time.sleep(3)
    raise AssertionError(f"{TASK} of {run_id} was not awaiting input after {timeout:.0f} s")


def _version_of(stack, run_id: str) -> str:
    entry = stack.rest("GET", f"{_ti_path(run_id, 'register')}/xcomEntries/return_value")
    value = entry["value"]
    return str(value["version"] if isinstance(value, dict) else value)


def _version_tags(stack, version: str) -> dict[str, str]:
    found = stack.mlflow("/model-versions/get", name=MODEL, version=version)["model_version"]
    return {t["key"]: t["value"] for t in found.get("tags", [])}


def _champion(stack) -> str:
    return stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]["version"]


def _approval_records(stack, version: str) -> list[dict]:
    from mlflow.tracking import MlflowClient
    from sparktune.release.registry import audit_log

    records = audit_log(MlflowClient(tracking_uri=stack.mlflow_url), MODEL)
    return [r for r in records if r.get("kind") == "approval" and r["to_version"] == version]


def _answer_in_the_browser(page, stack, url: str, version: str, option: str, comment: str) -> None:
    """The approver signs in and follows the notification's link: it opens the task's Required
    Actions tab (Airflow 3.3's UI), the request's subject and body, the comment field (a task param:
    ``element_comment``) and one button per option.

    Signed in only once the request waits: a signed-in page left open polls the API and re-renders
    every few seconds, the CPU of a training run's minute taken from the other test worker."""
    from playwright.sync_api import expect

    name = option.lower()
    log_in(page, stack)
    page.goto(url)
    expect(page.get_by_text(f"Make {MODEL} v{version} the champion?").first).to_be_visible()
    expect(page.get_by_text("Smoke test").first).to_be_visible()  # the body, rendered
    shot(page, f"approval-{name}-01-request")
    comment_field = page.locator('[name="element_comment"]')
    comment_field.fill(comment)
    comment_field.press("Tab")
    shot(page, f"approval-{name}-02-comment")
    page.get_by_role("button", name=option, exact=True).click()
    expect(page.get_by_text(f"{TASK} response successful").first).to_be_visible()
    shot(page, f"approval-{name}-03-answered")


def test_approve_in_the_browser_moves_the_champion_and_records_who_when_and_why(
    stack, rest_run, form_runs, notification_receivers, page
):
    smtp, webhook = notification_receivers
    before = _champion(stack)
    # The form's run (test_ui) has the same conf; alone, this module starts its own over REST.
    run_id = form_runs.get("approval") or _start(stack, max_steps=5)
    _wait_for_the_request(stack, run_id)
    version = _version_of(stack, run_id)

    # The request: assigned to the approver, with the evidence and the links.
    detail = stack.rest("GET", f"{_ti_path(run_id, TASK)}/-1/hitlDetails")
    assert detail["subject"] == f"Make {MODEL} v{version} the champion?"
    assert detail["options"] == ["Approve", "Reject"] and detail["defaults"] == ["Reject"]
    assert [u["id"] for u in detail["assigned_users"]] == [stack.username]
    body = detail["body"]
    for evidence in (
        "eval_accuracy",
        f"champion v{before}",
        "Gate",
        "min_accuracy",
        "Smoke test",
        "Data fingerprint",
    ):
        assert evidence in body, (evidence, body)
    assert f"{stack.mlflow_url}/#/runs/" in body  # the MLflow run, its confusion matrix
    # The team was told a request waits.
    waiting = webhook.wait_for(lambda p: p["event"] == "approval_waiting" and p["run_id"] == run_id)
    assert waiting["subject"] == f"[sparktune] approve {MODEL} v{version} as champion?"
    assert smtp.wait_for(lambda m: m["X-Sparktune-Event"] == "approval_waiting")
    # Nothing moves while it waits.
    assert _champion(stack) == before

    assert waiting["url"].startswith(f"{stack.airflow_url}/dags/{DAG}/runs/")
    _answer_in_the_browser(page, stack, waiting["url"], version, "Approve", "metrics hold up; ship it")
    answer = stack.rest("GET", f"{_ti_path(run_id, TASK)}/-1/hitlDetails")
    assert answer["chosen_options"] == ["Approve"] and answer["responded_by_user"]["id"] == stack.username
    run = stack.wait_for_run(DAG, run_id, timeout=900)
    assert run["state"] == "success"
    assert _champion(stack) == version
    tags = _version_tags(stack, version)
    assert tags["approval_decision"] == "approved" and tags["approval_by"] == stack.username
    assert tags["approval_comment"] == "metrics hold up; ship it" and tags["approval_at"]
    (record,) = _approval_records(stack, version)
    assert record["reason"] == f"approved by {stack.username}: metrics hold up; ship it"
    assert record["from_version"] == before and record["actor"] == f"airflow:{DAG}/{run_id}/{TASK}"
    assert webhook.wait_for(lambda p: p["event"] == "promoted" and p["run_id"] == run_id)


def _waiting_url(webhook, run_id: str) -> str:
    return webhook.wait_for(lambda p: p["event"] == "approval_waiting" and p["run_id"] == run_id)["url"]


def _states(stack, run_id: str) -> dict[str, str]:
    tasks = stack.rest("GET", f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances")
    return {t["task_id"]: t["state"] for t in tasks["task_instances"]}


def test_reject_in_the_browser_leaves_the_champion_and_records_the_rejection(
    stack, rest_run, notification_receivers, page
):
    _, webhook = notification_receivers
    before = _champion(stack)
    run_id = _start(stack, max_steps=6)  # another config than the run before: trains again
    _wait_for_the_request(stack, run_id)
    version = _version_of(stack, run_id)
    # The same source and preparation params as rest_run: prepare_data takes its output and starts
    # no Spark job, and validate_data decides on its quality report, made under the same rules.
    prepare_log = "\n".join(stack.task_logs(DAG, run_id, "prepare_data").values())
    assert "no Spark job" in prepare_log and "Spark-Submit cmd" not in prepare_log, prepare_log
    assert "Its quality report holds for this run" in prepare_log, prepare_log
    validate_log = "\n".join(stack.task_logs(DAG, run_id, "validate_data").values())
    assert "deciding on its report, no Spark session here" in validate_log, validate_log

    comment = "loss went up on billing tickets"
    _answer_in_the_browser(page, stack, _waiting_url(webhook, run_id), version, "Reject", comment)
    answer = stack.rest("GET", f"{_ti_path(run_id, TASK)}/-1/hitlDetails")
    assert answer["chosen_options"] == ["Reject"] and answer["responded_by_user"]["id"] == stack.username
    run = stack.wait_for_run(DAG, run_id, timeout=600)
    assert run["state"] == "success"  # a rejection is an answer, not a failure
    states = _states(stack, run_id)
    assert states[TASK] == "success" and states["promote_champion"] == "skipped"
    assert _champion(stack) == before
    tags = _version_tags(stack, version)
    assert tags["approval_decision"] == "rejected" and tags["approval_by"] == stack.username
    assert tags["approval_comment"] == comment
    (record,) = _approval_records(stack, version)
    assert record["reason"] == f"rejected by {stack.username}: {comment}"


def test_no_answer_in_time_leaves_the_champion_and_records_the_timeout(stack, rest_run):
    """``approval_timeout_minutes`` passes with no answer: the scheduler answers with the request's
    default, Reject, as no one; recorded as ``timed_out``, never as a person's rejection."""
    before = _champion(stack)
    run_id = _start(stack, max_steps=7, approval_timeout_minutes=0.25)  # the least it takes
    run = stack.wait_for_run(DAG, run_id, timeout=1200)
    assert run["state"] == "success", _states(stack, run_id)
    states = _states(stack, run_id)
    assert states[TASK] == "success" and states["promote_champion"] == "skipped"
    assert _champion(stack) == before
    version = _version_of(stack, run_id)
    tags = _version_tags(stack, version)
    assert tags["approval_decision"] == "timed_out" and not tags.get("approval_by")
    (record,) = _approval_records(stack, version)
    assert record["reason"] == "no answer within 0.25 minutes: rejected, the champion stays", record
