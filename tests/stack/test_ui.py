"""The Airflow UI in a real browser, against the running native stack (tests/stack/conftest.py).

Playwright drives Debian's chromium (``/usr/bin/chromium``, installed by ``make test``; never a
``playwright install`` download) the way an operator does: log in on SimpleAuthManager's page,
open ``llm_finetune``, check its trigger form (typed fields, bounds, descriptions, defaults) and
that it refuses bad input, fill in the fields of a run that asks for approval and trigger it (the
run it creates is the one tests/stack/test_approval.py approves in the browser), then follow the
``train`` task's "MLflow run" extra link of the REST-triggered run (``rest_run``) to the MLflow
server. Every step leaves a screenshot in ``test-output/ui/`` at the repository root.

The selectors come from Airflow 3.3's React UI as it renders (what an upgrade may break:
docs/known-issues.md, "Operations and testing"): form fields are ``input[name=element_<param>]``
inside accordion sections named by the params' ``section``; the trigger button has
``data-testid=trigger-dag-button``; extra links are ``<a>`` elements named after the link under
the task instance's Details tab.
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import quote, unquote

import pytest

try:
    from tests.stack.ui_steps import UI_TIMEOUT_MS, shot
except ImportError:  # rootdir-relative import, as pytest puts this folder on sys.path
    from ui_steps import UI_TIMEOUT_MS, shot

pytestmark = [pytest.mark.stack, pytest.mark.e2e]

DAG = "llm_finetune"
# What the form run changes, field by field (the rest stays at its default): a run that trains a few
# steps, records its gate decision without blocking (the champion is the REST run's, trained longer),
# and asks the session's user to approve it. test_approval answers Approve.
APPROVAL_RUN_STEPS = 5


def _open_trigger_form(page, stack):
    """The DAG page, then its trigger dialog; returns the dialog."""
    from playwright.sync_api import expect

    page.goto(f"{stack.airflow_url}/dags/{DAG}")
    page.get_by_test_id("trigger-dag-button").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text(f"Trigger Dag - {DAG}")).to_be_visible()
    return dialog


def _open_section(dialog, name: str) -> None:
    """Expand one accordion section of the form (a param's ``section``; "Advanced Options")."""
    dialog.get_by_role("button", name=name, exact=True).click()


def _field(dialog, param: str):
    return dialog.locator(f'[name="element_{param}"]')


def _field_root(field):
    return field.locator("xpath=ancestor::div[@data-scope='field'][@data-part='root']")


def _trigger_button(dialog):
    return dialog.get_by_role("button", name="Trigger", exact=True)


def _runs(stack) -> list[dict]:
    return stack.rest("GET", f"/dags/{DAG}/dagRuns?limit=100")["dag_runs"]


def test_trigger_form_run_and_mlflow_link_in_a_browser(stack, rest_run, form_runs, signed_in_page):
    page = signed_in_page
    started = time.monotonic()
    # A user's DAG is unpaused already (the REST test did it); make sure without changing anything else.
    stack.rest("PATCH", f"/dags/{DAG}", {"is_paused": False})
    _form_shows_typed_fields_with_bounds_descriptions_and_defaults(page, stack)
    _form_refuses_bad_input_before_a_run_starts(page, stack)
    # The form's part ends with the run it created and the conf it sent. The run goes on to ask for
    # approval: test_approval answers it in the browser (one run for both, not one thrown away).
    run_id = _trigger_an_approval_run(page, stack)
    form_runs["approval"] = run_id
    assert rest_run["state"] == "success", {t: ti["state"] for t, ti in rest_run["tasks"].items()}
    page.goto(f"{stack.airflow_url}/dags/{DAG}/runs/{quote(rest_run['dag_run_id'], safe='')}")
    shot(page, "10-run-succeeded")

    mlflow_run_id = _follow_the_mlflow_run_link_of_train(page, stack, rest_run["dag_run_id"])
    print(f"UI test: form run {run_id}; MLflow run {mlflow_run_id} in {time.monotonic() - started:.0f} s")


def _form_shows_typed_fields_with_bounds_descriptions_and_defaults(page, stack) -> None:
    from playwright.sync_api import expect

    dialog = _open_trigger_form(page, stack)
    shot(page, "03-trigger-form")
    _open_section(dialog, "Training")
    lora_r = _field(dialog, "lora_r")
    expect(lora_r).to_have_attribute("role", "spinbutton")
    expect(lora_r).to_have_value("16")
    expect(lora_r).to_have_attribute("aria-valuemin", "1")
    expect(lora_r).to_have_attribute("aria-valuemax", "1024")
    expect(_field_root(lora_r)).to_contain_text("LoRA rank.")
    expect(_field_root(_field(dialog, "peft_method"))).to_contain_text("lora: train low-rank adapters")
    expect(_trigger_button(dialog)).to_be_enabled()  # the defaults are a valid run
    shot(page, "04-training-section")


def _form_refuses_bad_input_before_a_run_starts(page, stack) -> None:
    from playwright.sync_api import expect

    runs_before = {run["dag_run_id"] for run in _runs(stack)}

    # a) A number field does not keep a value outside the param's bounds: it snaps back to the
    # minimum when it loses focus (the field's own behaviour; it shows no message).
    dialog = _open_trigger_form(page, stack)
    _open_section(dialog, "Training")
    lora_r = _field(dialog, "lora_r")
    lora_r.fill("0")
    lora_r.press("Tab")
    expect(lora_r).to_have_value("1")
    shot(page, "05-lora-r-0-snaps-to-minimum")

    # b) A required field left empty: a message under it and Trigger disabled.
    page.reload()  # the form keeps its values in memory until the page reloads
    dialog = _open_trigger_form(page, stack)
    _open_section(dialog, "Data")
    text_column = _field(dialog, "text_column")
    text_column.fill("")
    text_column.press("Tab")
    expect(_field_root(text_column)).to_contain_text("This field is required")
    expect(_trigger_button(dialog)).to_be_disabled()
    shot(page, "06-required-field-empty")

    # c) The run conf typed as JSON (Advanced Options) with lora_r = 0: Airflow checks it against the
    # param's schema, refuses it and the dialog says why.
    page.reload()
    dialog = _open_trigger_form(page, stack)
    _open_section(dialog, "Advanced Options")
    dialog.locator(".monaco-editor").first.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(json.dumps({"lora_r": 0}))
    # Monaco closes brackets and quotes as they are typed: drop what it added after the text.
    page.keyboard.press("Shift+Control+End")
    page.keyboard.press("Delete")
    # The form takes the JSON when the editor loses focus and re-renders with the conf's params only
    # (the Data section goes). A click on Trigger while the editor has focus lands on the re-render
    # and sends nothing: leave the editor first, as a person's eye does, and wait for the form.
    dialog.get_by_text(f"Trigger Dag - {DAG}").click()
    expect(dialog.get_by_role("button", name="Data", exact=True)).to_have_count(0)
    _trigger_button(dialog).click()
    expect(dialog.get_by_test_id("error-alert")).to_contain_text(
        "Invalid input for param lora_r: 0 is less than the minimum of 1"
    )
    shot(page, "07-lora-r-0-refused")
    assert {run["dag_run_id"] for run in _runs(stack)} == runs_before, "a refused trigger started a run"


def _choose(page, dialog, param: str, option: str) -> None:
    """Pick ``option`` in an enum param's dropdown (a react-select whose container has the field's id)."""
    from playwright.sync_api import expect

    dialog.locator(f"#element_{param}").click()
    page.get_by_role("option", name=option, exact=True).click()
    expect(dialog.locator(f'input[name="element_{param}"]')).to_have_value(option)


def _trigger_an_approval_run(page, stack) -> str:
    """Fill in a run that asks for approval (a number, two dropdowns, a text field) and trigger it;
    the UI opens the new run's page. Its run id."""
    from playwright.sync_api import expect

    page.reload()
    dialog = _open_trigger_form(page, stack)
    _open_section(dialog, "Training")
    steps = _field(dialog, "max_steps")
    steps.fill(str(APPROVAL_RUN_STEPS))
    steps.press("Tab")
    expect(steps).to_have_value(str(APPROVAL_RUN_STEPS))
    _open_section(dialog, "Promotion")
    _choose(page, dialog, "gate_mode", "dry_run")
    _open_section(dialog, "Approval")
    _choose(page, dialog, "approval", "required")
    approvers = _field(dialog, "approvers")
    approvers.fill(stack.username)
    approvers.press("Tab")
    shot(page, "08-approval-run-filled-in")
    _trigger_button(dialog).click()
    expect(page).to_have_url(re.compile(rf"/dags/{DAG}/runs/[^/?]+"))
    run_id = unquote(re.search(rf"/dags/{DAG}/runs/([^/?]+)", page.url).group(1))
    expect(page.get_by_text(run_id).first).to_be_visible()  # the URL changes before the page renders
    shot(page, "09-triggered")

    run = stack.rest("GET", f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}")
    assert run["run_type"] == "manual" and run["triggered_by"] == "ui", run
    conf = run["conf"]
    assert conf["max_steps"] == APPROVAL_RUN_STEPS and conf["gate_mode"] == "dry_run", conf
    assert conf["approval"] == "required" and conf["approvers"] == stack.username, conf
    assert conf["lora_r"] == 16  # the form sent the defaults of what was not changed
    return run_id


def _follow_the_mlflow_run_link_of_train(page, stack, run_id: str) -> str:
    """The train task instance's "MLflow run" extra link (Details tab), followed to the MLflow
    server's page of the run that task logged. The MLflow run id."""
    from playwright.sync_api import expect

    run_path = f"/dags/{DAG}/runs/{quote(run_id, safe='')}"  # the UI's
    train_xcom = f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/train/xcomEntries/return_value"
    value = stack.rest("GET", train_xcom)["value"]
    mlflow_run_id = (json.loads(value) if isinstance(value, str) else value)["mlflow_run_id"]

    page.goto(f"{stack.airflow_url}{run_path}/tasks/train")
    page.locator('a[title="Details"][href$="/tasks/train/details"]').click()  # the task's Details tab
    link = page.get_by_role("link", name="MLflow run", exact=True)
    expect(link).to_be_visible()
    href = link.get_attribute("href")
    assert href.startswith(stack.mlflow_url) and mlflow_run_id in href, href
    # train_backend=local started no Databricks run: no button to a page that does not exist.
    expect(page.get_by_role("link", name=re.compile("Databricks"))).to_have_count(0)
    shot(page, "11-train-extra-links")

    with page.context.expect_page() as opened:  # another origin: the UI opens it in a new tab
        link.click()
    mlflow_page = opened.value
    mlflow_page.set_default_timeout(UI_TIMEOUT_MS)
    # MLflow redirects #/runs/<id> to #/experiments/<experiment>/runs/<id>.
    expect(mlflow_page).to_have_url(re.compile(rf"^{re.escape(stack.mlflow_url)}/.*runs/{mlflow_run_id}"))
    expect(mlflow_page.get_by_text(mlflow_run_id).first).to_be_visible()  # "Run ID"
    expect(mlflow_page.get_by_text(f"{DAG}-{run_id}").first).to_be_visible()  # its name
    shot(mlflow_page, "12-mlflow-run")
    return mlflow_run_id
