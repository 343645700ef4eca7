"""Steps of the browser tests (test_ui, test_approval) shared through tests/stack/conftest.py:
Playwright drives Debian's chromium (installed by `make test`; never a `playwright install`
download) against the stack's UI. Screenshots go to ``test-output/ui/`` at the repository root."""

from __future__ import annotations

import re
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "ui"
UI_TIMEOUT_MS = 60_000  # two cores shared with a training run: the React app can be slow to settle


def shot(page, name: str) -> None:
    """A screenshot of the whole page in ``test-output/ui/<name>.png``."""
    page.screenshot(path=SHOTS / f"{name}.png", full_page=True)


def log_in(page, stack) -> None:
    """SimpleAuthManager's login page, as a person fills it in."""
    from playwright.sync_api import expect

    page.goto(f"{stack.airflow_url}/")
    expect(page).to_have_url(re.compile(r"/auth/login"))
    page.get_by_label("Username").fill(stack.username)
    page.get_by_label("Password").fill(stack.password)
    shot(page, "01-login")
    page.get_by_role("button", name="Sign in").click()
    expect(page).not_to_have_url(re.compile(r"/auth/login"))
    expect(page.get_by_role("button", name="User")).to_be_visible()
    shot(page, "02-logged-in")
