"""The Models page's FastAPI app (sparktune_airflow.ui.models_app) through FastAPI's TestClient.

Real parts: the app as the plugin mounts it (under /sparktune, with the plugin's root middleware),
Airflow's SimpleAuthManager signing and checking the users' tokens (the UI's session cookie), and a
real MLflow registry read through ``MLflowHook().get_conn()`` (tests/models_registry.py). Airflow's
REST API is a stand-in that records each call the page makes (who, what conf, from where): the
native stack's browser test (tests/stack/test_models_page.py) triggers the real DAG. The metadata
database's revoked-token lookup answers "not revoked": this test has no Airflow database.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, FastAPI, Request
from fastapi.testclient import TestClient

try:
    from tests import models_registry
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import models_registry

# The REST API's own check of who calls (Airflow's get_user: a bearer token or the session cookie).
User = Annotated[Any, Depends(get_user)]
MODEL = models_registry.MODEL
RUN_ID = "manual__2026-11-24T09:00:00+00:00"
PAGE = "/sparktune/models/"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    return models_registry.build(tmp_path_factory.mktemp("mlflow-page-app"))


@pytest.fixture
def auth(monkeypatch):
    """Airflow's SimpleAuthManager; returns a function that signs a user's session token."""
    from airflow.api_fastapi.app import _AuthManagerState, create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.models.revoked_token import RevokedToken

    monkeypatch.setattr(RevokedToken, "is_revoked", classmethod(lambda cls, jti, session=None: False))
    manager = create_auth_manager()
    yield lambda name, role: manager.generate_jwt(SimpleAuthManagerUser(username=name, role=role))
    _AuthManagerState.instance = None


class AirflowApi:
    """A stand-in for the api-server's REST API: records what the page asks, as which user."""

    def __init__(self, paused: bool = True, refuse: tuple[int, str] | None = None) -> None:
        self.paused, self.refuse = paused, refuse
        self.calls: list[dict[str, Any]] = []

    def app(self) -> FastAPI:
        api = FastAPI()

        def record(request: Request, user: Any, body: Any = None) -> None:
            self.calls.append(
                {
                    "method": request.method,
                    "path": request.url.path,
                    "query": dict(request.query_params),
                    "user": user.get_name(),
                    "referer": request.headers.get("referer"),
                    "body": body,
                }
            )

        @api.get("/api/v2/dags/rollback_champion")
        def dag(request: Request, user: User):
            record(request, user)
            return {"dag_id": "rollback_champion", "is_paused": self.paused}

        @api.patch("/api/v2/dags/rollback_champion")
        def unpause(request: Request, body: dict, user: User):
            record(request, user, body)
            self.paused = bool(body["is_paused"])
            return {"dag_id": "rollback_champion", "is_paused": self.paused}

        @api.post("/api/v2/dags/rollback_champion/dagRuns")
        def trigger(request: Request, body: dict, user: User):
            from fastapi import HTTPException

            record(request, user, body)
            if self.refuse:
                raise HTTPException(self.refuse[0], self.refuse[1])
            return {"dag_run_id": RUN_ID, "state": "queued", "conf": body["conf"]}

        @api.get("/api/v2/dags/rollback_champion/dagRuns/{run_id}")
        def run(run_id: str, request: Request, user: User):
            record(request, user)
            trigger = next(c for c in self.calls if c["method"] == "POST")
            return {"dag_run_id": run_id, "state": "success", "triggering_user_name": trigger["user"],
                    "conf": trigger["body"]["conf"]}  # fmt: skip

        return api


def client_for(api: AirflowApi, **app_args) -> TestClient:
    """The api-server as the plugin makes it: the Models app mounted under /sparktune and the
    plugin's root middleware, beside the (stand-in) REST API."""
    from sparktune_airflow.ui.models_app import URL_PREFIX, ApiAppInScope, create_app

    root = api.app()
    root.mount(URL_PREFIX, create_app(**app_args))
    root.add_middleware(ApiAppInScope)
    return TestClient(root, base_url="http://airflow.test")


@pytest.fixture
def mlflow_env(registry, monkeypatch):
    """MLFLOW_TRACKING_URI on the test registry and no mlflow_default connection: MLflowHook's
    fallback, as on an embedded api-server."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry.uri)
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)
    return registry


def signed_in(client: TestClient, token: str) -> TestClient:
    client.cookies.set("_token", token)
    return client


def csrf(html: str) -> str:
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', html).group(1)


def test_without_a_session_there_is_no_page_and_no_rollback(mlflow_env, auth):
    api = AirflowApi()
    client = client_for(api)
    page = client.get(PAGE)
    assert page.status_code == 401 and "Sign in to Airflow" in page.text and "/auth/login" in page.text
    assert MODEL not in page.text
    rollback = client.post(f"{PAGE}rollback", data={"model_name": MODEL, "csrf_token": "x"})
    assert rollback.status_code == 401 and api.calls == []
    # A token Airflow did not sign is no session either.
    assert signed_in(client, "not-a-jwt").get(PAGE).status_code == 401


def test_the_page_shows_the_champion_its_figures_gate_data_and_audit_escaped(mlflow_env, auth):
    api = AirflowApi()
    client = signed_in(client_for(api), auth("admin", "admin"))
    assert client.get("/sparktune/models", follow_redirects=False).headers["location"] == "models/"
    page = client.get(PAGE)
    assert page.status_code == 200, page.text
    html = page.text
    assert 'data-testid="user">admin<' in html
    assert 'data-testid="champion-version">v1<' in html
    for alias in ("champion v1", "previous_champion v2", "candidate v3"):
        assert alias in html
    # v1's row: the figures with their 95% intervals; the baseline and the base model beside them.
    row = re.search(r'<tr class="champion" data-version="1">(.*?)</tr>', html, re.S).group(1)
    assert "0.8125 [0.7500, 0.8750]" in row and "0.8000 [0.7000, 0.8600]" in row and "fp-one" in row
    assert "Baseline (TF-IDF + logistic regression)" in html and "0.7000 [0.6200, 0.7700]" in html
    assert "+0.1125 [+0.0500, +0.1700]" in html  # v1 minus the baseline
    assert "not applicable: task=sequence_classification: no trained head" in html
    assert "+0.6875 [+0.6200, +0.7500]" in html  # v2 minus its base model
    assert "min_accuracy: 0.8125 &gt;= 0.6 holds" in html  # the gate's reasons
    docs = (mlflow_env.data_docs_dir / models_registry.DATA_DOCS_PAGE).as_uri()
    assert f'<code data-testid="data-docs">{docs}</code>' in html  # a file: shown, not linked
    assert "passed, 23 expectations, 1 warning(s)" in html
    assert "approved by alice at 2026-11-23T18:39:00+00:00" in html
    assert f"http://127.0.0.1:5000/#/runs/{mlflow_env.run_ids['1']}" in html  # make mlflow-ui
    # The audit log, newest first: the rollback and who made it.
    audit = re.search(r'data-testid="audit-log">(.*?)</table>', html, re.S).group(1)
    first = audit.split("</tr>")[1]
    assert (
        "2 &rarr; 1" in first and "rollback" in first and models_registry.ROLLBACK.replace("+", "+") in first
    )
    # What people typed (gate reason, comment, audit reason) is text, never markup.
    assert "<script" not in html
    assert html.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") >= 3
    # The rollback form: previous_champion first, then the other versions; the DAG is paused.
    form = re.search(r'<form class="rollback".*?</form>', html, re.S).group(0)
    assert re.findall(r'<option value="(\d*)">([^<]*)</option>', form) == [
        ("", "previous_champion (v2)"),
        ("3", "v3"),
        ("2", "v2"),
    ]
    assert 'name="unpause" value="1" checked' in form and "disabled" not in form
    assert [c["path"] for c in api.calls] == ["/api/v2/dags/rollback_champion"]  # as admin
    assert api.calls[0]["user"] == "admin"
    # In the UI's frame (no new tabs from there), the page names its own address for the links.
    assert 'data-testid="own-url"' not in html
    framed = client.get(PAGE, headers={"Sec-Fetch-Dest": "iframe"}).text
    assert f"<code>http://airflow.test{PAGE}</code>" in framed


def test_rollback_triggers_rollback_champion_through_the_rest_api_as_the_user(mlflow_env, auth):
    api = AirflowApi()
    client = signed_in(client_for(api), auth("alice", "user"))
    token = csrf(client.get(PAGE).text)
    api.calls.clear()
    form = {"model_name": MODEL, "to_version": "", "reason": "  v1 <b>misroutes</b> ", "unpause": "1"}
    reply = client.post(f"{PAGE}rollback", data={**form, "csrf_token": token}, follow_redirects=False)
    assert reply.status_code == 303, reply.text
    assert reply.headers["location"] == "./?rollback_run=manual__2026-11-24T09%3A00%3A00%2B00%3A00"
    unpause, trigger = api.calls
    assert unpause["method"] == "PATCH" and unpause["body"] == {"is_paused": False}
    assert unpause["query"] == {"update_mask": "is_paused"} and unpause["user"] == "alice"
    assert trigger["path"] == "/api/v2/dags/rollback_champion/dagRuns" and trigger["user"] == "alice"
    assert trigger["body"] == {
        "logical_date": None,
        "conf": {
            "model_name": MODEL,
            "to_version": "",
            "reason": "v1 <b>misroutes</b> (requested by alice on the Models page)",
        },
        "note": "Triggered by alice on the Models page.",
    }
    assert trigger["referer"] == f"http://airflow.test{PAGE}rollback"  # Airflow records a UI trigger
    # The page it redirects to shows the run as the REST API reports it.
    html = client.get(PAGE + reply.headers["location"].removeprefix("./")).text
    notice = re.search(r'data-testid="rollback-run">(.*?)</div>', html, re.S).group(1)
    assert "manual__2026-11-24T09:00:00+00:00" in notice and ">success<" in notice
    assert "triggered by alice" in notice and f"model {MODEL}, to previous_champion" in notice


def test_rollback_needs_the_users_form_token_and_leave_to_trigger(mlflow_env, auth):
    api = AirflowApi(paused=False)
    alice = signed_in(client_for(api), auth("alice", "user"))
    bob_token = csrf(signed_in(client_for(api), auth("bob", "user")).get(PAGE).text)
    # Another user's token (a page that posts the form for someone else) is refused.
    refused = alice.post(f"{PAGE}rollback", data={"model_name": MODEL, "csrf_token": bob_token})
    assert refused.status_code == 403 and "The form expired" in refused.text
    # A viewer sees the page and a disabled button, and may not trigger.
    viewer = signed_in(client_for(api), auth("vera", "viewer"))
    html = viewer.get(PAGE).text
    assert (
        'data-testid="rollback-button" disabled' in html and "vera may not trigger rollback_champion" in html
    )
    assert 'name="csrf_token" value=""' in html and 'name="unpause"' not in html  # not paused
    # Even with a form token of her own (the page gives her none), the rollback is refused.
    from sparktune_airflow.ui.models_app import form_token

    refused = viewer.post(f"{PAGE}rollback", data={"model_name": MODEL, "csrf_token": form_token("vera")})
    assert refused.status_code == 403 and "vera may not trigger rollback_champion" in refused.text
    assert all(c["method"] == "GET" for c in api.calls), api.calls
    # A version that is no number never reaches Airflow.
    token = csrf(alice.get(PAGE).text)
    for version in ("2; x", "\u00b2"):  # not a number; a digit, but not 0-9
        bad = alice.post(
            f"{PAGE}rollback", data={"model_name": MODEL, "to_version": version, "csrf_token": token}
        )
        assert bad.status_code == 400 and all(c["method"] == "GET" for c in api.calls)
    # A form token that is no ASCII is a wrong token, not a server error.
    odd = alice.post(f"{PAGE}rollback", data={"model_name": MODEL, "csrf_token": "\u00e9t\u00e9"})
    assert odd.status_code == 403


def test_airflows_refusal_and_an_unreadable_registry_are_shown_on_the_page(mlflow_env, auth):
    api = AirflowApi(paused=False, refuse=(409, "DAG run <already> exists"))
    client = signed_in(client_for(api), auth("admin", "admin"))
    token = csrf(client.get(PAGE).text)
    reply = client.post(f"{PAGE}rollback", data={"model_name": MODEL, "to_version": "2", "csrf_token": token})
    assert reply.status_code == 409
    assert (
        "Airflow refused to trigger rollback_champion (HTTP 409): DAG run &lt;already&gt; exists"
        in reply.text
    )

    def unreadable() -> Any:
        raise ConnectionError("MLflow at http://mlflow:5000 did not answer")

    broken = signed_in(client_for(api, models=unreadable), auth("admin", "admin"))
    page = broken.get(PAGE)
    assert page.status_code == 502 and "MLflow could not be read: ConnectionError" in page.text


def test_the_latest_drift_summary_shows_and_its_report_opens_for_signed_in_users(
    mlflow_env, auth, tmp_path, monkeypatch
):
    monitoring = tmp_path / "monitoring"
    monkeypatch.setenv("SPARKTUNE_MONITORING_URI", str(monitoring))
    run_folder = monitoring / MODEL / "scheduled__2026-11-28T00_00_00_00_00"
    run_folder.mkdir(parents=True)
    (run_folder / "drift_report.html").write_text("<html><body>the Evidently report</body></html>")
    summary = {
        "status": "drift",
        "message": "Drift in 300 texts scored by page-intent: texts 0.97 > 0.6.",
        "window_end": "2026-11-28T00:00:00+00:00",
        "report_uri": str(run_folder / "drift_report.html"),
    }
    (monitoring / MODEL / "latest_summary.json").write_text(json.dumps(summary))
    client = client_for(AirflowApi())
    assert client.get(f"{PAGE}drift?model={MODEL}").status_code == 401  # no session, no report
    signed_in(client, auth("alice", "user"))
    line = re.search(r'<p data-testid="drift">(.*?)</p>', client.get(PAGE).text, re.S).group(1)
    assert "window to 2026-11-28 00:00:00 UTC" in line and "<strong>drift</strong>" in line
    assert "page-intent: texts 0.97 &gt; 0.6." in line and f'href="drift?model={MODEL}"' in line
    report = client.get(f"{PAGE}drift?model={MODEL}")
    assert report.status_code == 200 and "the Evidently report" in report.text
    # Served texts are in the report unescaped: its scripts run sandboxed, outside the UI's origin.
    assert report.headers["content-security-policy"] == "sandbox allow-scripts"
    same = client.get(f"{PAGE}drift", params={"model": MODEL, "run": run_folder.name})
    assert same.text == report.text
    missing = client.get(f"{PAGE}drift", params={"model": MODEL, "run": ".."})
    assert missing.status_code == 404 and "No drift report of" in missing.text
