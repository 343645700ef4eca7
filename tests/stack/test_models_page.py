"""The Models page in a real browser on the native stack (tests/stack/conftest.py): opened from
Airflow's own navigation (Browse -> Models), it shows the champion with its aliases and figures, and
its rollback button triggers ``rollback_champion`` as the signed-in user; the run's task moves
``champion`` back, and the page's audit log then shows the move with that run as the actor.

No training of its own: the champion ``rest_run`` made (or the approval tests after it) is given a
successor the way a retrain on unchanged data would, a new version of the same logged model and run
(with its tags), made champion by an audited alias move as ``promote_champion`` makes it. The
rollback returns to the champion the session had, so the tests after this one see it unchanged.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

try:
    from tests.stack.ui_steps import shot
except ImportError:  # rootdir-relative import, as pytest puts this folder on sys.path
    from ui_steps import shot

pytestmark = [pytest.mark.stack, pytest.mark.e2e]

MODEL = "support-intent"
DAG = "rollback_champion"
REASON = "page test: back to the champion the pipeline promoted"


def _client(stack):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=stack.mlflow_url, registry_uri=stack.mlflow_url)


def _champion(client) -> str:
    return str(client.get_model_version_by_alias(MODEL, "champion").version)


def _a_later_champion(client) -> tuple[str, str, str]:
    """(champion before, the later version now champion, its training run)."""
    from sparktune.release.registry import CHAMPION, move_alias

    champion = client.get_model_version_by_alias(MODEL, CHAMPION)
    # The server wants the logged model's id with a models:/ source; a version read back over REST
    # carries it only in its source (models:/<model id>, as register_run_model created it).
    model_id = champion.source.removeprefix("models:/")
    later = client.create_model_version(
        MODEL, champion.source, run_id=champion.run_id, tags=dict(champion.tags), model_id=model_id
    )
    move_alias(
        client, MODEL, CHAMPION, str(later.version), actor="test:models-page", reason="a later version"
    )
    return str(champion.version), str(later.version), champion.run_id


def _open_models_page(page):
    """Browse -> Models, as a person finds it; the page Airflow frames."""
    from playwright.sync_api import expect

    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Models").click()
    expect(page).to_have_url(re.compile(r"/plugin/sparktune-models"))
    return page.frame_locator('iframe[title="Models"]').locator(f'section[data-model="{MODEL}"]')


def test_the_models_page_shows_the_champion_and_rolls_it_back_through_rollback_champion(
    stack, rest_run, signed_in_page
):
    from playwright.sync_api import expect
    from sparktune.release.registry import audit_log

    assert rest_run["state"] == "success", {t: ti["state"] for t, ti in rest_run["tasks"].items()}
    client = _client(stack)
    before, later, run_id = _a_later_champion(client)
    page = signed_in_page

    # The page, from the UI's navigation: the champion, its aliases and its figures with intervals.
    section = _open_models_page(page)
    expect(section.get_by_test_id("champion-version")).to_have_text(f"v{later}")
    metrics = client.get_run(run_id).data.metrics
    accuracy = "{:.4f} [{:.4f}, {:.4f}]".format(
        *(metrics[f"eval_accuracy{end}"] for end in ("", "_ci_low", "_ci_high"))
    )
    champion_row = section.locator(f'tr[data-version="{later}"]')
    expect(champion_row).to_contain_text("champion")
    expect(champion_row).to_contain_text(accuracy)
    expect(section.locator(f'tr[data-version="{before}"]')).to_contain_text("previous_champion")
    details = section.locator(f'details[data-version="{later}"]')
    expect(details.locator('[data-reference="baseline"]')).to_contain_text("TF-IDF")
    expect(details.get_by_test_id("gate-decision")).to_have_text("promote")
    expect(details).to_contain_text(client.get_model_version(MODEL, later).tags["data_fingerprint"])
    expect(section.get_by_test_id("data-docs").first).to_be_visible()
    shot(page, "models-01-page")

    # Roll back to previous_champion, with a reason.
    form = section.get_by_test_id("rollback-form")
    expect(form.locator("select[name=to_version] option").first).to_have_text(
        f"previous_champion (v{before})"
    )
    form.locator("input[name=reason]").fill(REASON)
    form.get_by_test_id("rollback-button").click()
    notice = page.frame_locator('iframe[title="Models"]').get_by_test_id("rollback-run")
    expect(notice).to_contain_text(f"triggered by {stack.username}")
    triggered = notice.locator("code").inner_text()
    shot(page, "models-02-rollback-triggered")

    # A run of rollback_champion, created through Airflow as the signed-in user.
    run = stack.rest("GET", f"/dags/{DAG}/dagRuns/{quote(triggered, safe='')}")
    assert run["run_type"] == "manual" and run["triggered_by"] == "ui", run
    assert run["triggering_user_name"] == stack.username, run
    assert run["conf"] == {
        "model_name": MODEL,
        "to_version": "",
        "reason": f"{REASON} (requested by {stack.username} on the Models page)",
    }
    run = stack.wait_for_run(DAG, triggered, timeout=600)
    assert run["state"] == "success", run
    assert _champion(client) == before

    # The page again: champion moved back, and the audit log's newest record is this run's rollback.
    page.reload()
    section = page.frame_locator('iframe[title="Models"]').locator(f'section[data-model="{MODEL}"]')
    expect(section.get_by_test_id("champion-version")).to_have_text(f"v{before}")
    newest = section.get_by_test_id("audit-log").locator("tr").nth(1)
    for text in (f"{later} \u2192 {before}", "rollback", f"airflow:{DAG}/{triggered}/{DAG}", REASON):
        expect(newest).to_contain_text(text)
    shot(page, "models-03-rolled-back")
    record = audit_log(client, MODEL)[-1]
    assert (record["kind"], record["from_version"], record["to_version"]) == ("rollback", later, before)
    assert record["actor"] == f"airflow:{DAG}/{triggered}/{DAG}"
