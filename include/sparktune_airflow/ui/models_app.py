"""The Models page's FastAPI app, mounted by the project's Airflow plugin on the api-server
(``plugins/sparktune_plugin.py``: ``fastapi_apps`` under ``/sparktune``, an ``external_views`` entry
in the UI's Browse menu that shows ``/sparktune/models/`` in the UI's frame).

- ``GET /models/``: the page (:mod:`sparktune_airflow.ui.models_page`) of every registered model,
  read through ``MLflowHook().get_conn()`` (the ``mlflow_default`` connection, else
  ``MLFLOW_TRACKING_URI``).
- ``GET /models/drift?model=<name>[&run=<folder>]``: the Evidently drift report of a
  ``monitor_champion`` run of the model (without ``run``: its latest), read from the lake
  (``SPARKTUNE_MONITORING_URI``); the Models page and the monitor task's "Drift report" link open it.
- ``POST /models/rollback``: triggers the ``rollback_champion`` DAG with the form's model, version
  and reason, through Airflow's public REST API (``POST /api/v2/dags/rollback_champion/dagRuns``)
  called in this process as the signed-in user. The run's task moves the alias and writes the
  audit record, exactly as a run triggered from the DAG's form would; the page moves nothing.

Authentication: Airflow does not authenticate a plugin's app (a mounted app inherits none of the
core API's dependencies), so every route here does it with Airflow's own ``get_user`` (the UI's
session cookie, or a bearer token): no user, no page and no rollback. The rollback also needs the
auth manager's leave to trigger ``rollback_champion`` (checked here for a clear answer, and again
by the REST API, which records the user as the run's ``triggering_user_name``), and a form token
tied to the user (the session cookie is ``SameSite=Lax``; the token also stops a same-site page).

The REST API is reached in process: :class:`ApiAppInScope`, a root middleware of the same plugin,
leaves the api-server's own app in each request's scope, and the page calls it over an ASGI
transport, with no address, proxy or TLS between them.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sparktune_airflow.ui.models_page import (
    ROLLBACK_DAG,
    ModelsPage,
    RollbackControl,
    RunNotice,
    render_models_page,
)
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

URL_PREFIX = "/sparktune"  # where the plugin mounts the app
PAGE_PATH = "models/"  # the page, relative to URL_PREFIX (the external view's href)
API_APP_SCOPE_KEY = "sparktune.api_app"
PAGE_SOURCE = "the Models page"
# A drift report holds texts anyone could send the server, and Evidently writes them into its page's
# script unescaped ("</script>" included). Sandboxed, the page runs its charts' scripts in an origin
# of its own: no script in it reads the UI's session or calls Airflow's API as the signed-in user.
REPORT_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "sandbox allow-scripts",
    "X-Content-Type-Options": "nosniff",
}


@dataclass(frozen=True)
class SignedIn:
    """The user a request authenticated as, and the credential it presented (sent on to the REST API)."""

    user: Any  # the auth manager's BaseUser
    token: str

    @property
    def name(self) -> str:
        return str(self.user.get_name())


class ApiAppInScope:
    """Root middleware: keeps the api-server's app in the request scope (``sparktune.api_app``),
    where the mounted Models app finds it to call the public REST API in process."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and "app" in scope:
            scope.setdefault(API_APP_SCOPE_KEY, scope["app"])
        await self.app(scope, receive, send)


async def airflow_user(request: Request) -> SignedIn | None:
    """The signed-in Airflow user (Airflow's ``get_user``: a bearer token, else the UI's session
    cookie), or None."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import HTTPException
    from fastapi.security import HTTPAuthorizationCredentials
    from fastapi.security.utils import get_authorization_scheme_param

    scheme, credentials = get_authorization_scheme_param(request.headers.get("Authorization"))
    bearer = (
        HTTPAuthorizationCredentials(scheme=scheme, credentials=credentials)
        if scheme.lower() == "bearer" and credentials
        else None
    )
    try:
        user = await get_user(request, None, bearer)
    except HTTPException:
        return None
    token = bearer.credentials if bearer else request.cookies.get(COOKIE_NAME_JWT_TOKEN, "")
    return SignedIn(user, token)


def may_trigger_rollback(user: Any) -> bool:
    """Whether the auth manager lets ``user`` create runs of ``rollback_champion``."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return get_auth_manager().is_authorized_dag(
        method="POST", access_entity=DagAccessEntity.RUN, details=DagDetails(id=ROLLBACK_DAG), user=user
    )


def login_url(request: Request) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=str(request.url))


def load_models() -> tuple[list[Any], str]:
    """Every registered model's view, and the MLflow UI's address for its links."""
    from sparktune.release.model_views import model_views
    from sparktune_airflow.core.links import mlflow_ui_base
    from sparktune_airflow.core.mlflow import MLflowHook

    client = MLflowHook().get_conn()
    return model_views(client), mlflow_ui_base(str(client.tracking_uri))


def latest_drift_summary(model_name: str) -> dict[str, Any] | None:
    """The summary of the model's latest monitor run, from the lake."""
    from sparktune.core.config import settings
    from sparktune.serve.drift import latest_summary

    return latest_summary(settings().monitoring_uri, model_name)


def _drift_summaries(
    drift: Callable[[str], dict[str, Any] | None], names: list[str]
) -> dict[str, dict[str, Any]]:
    summaries = {}
    for name in names:
        try:
            summary = drift(name)
        except Exception:  # an unreadable lake must not take the page with it
            log.exception("the drift summary of %s could not be read", name)
            continue
        if summary:
            summaries[name] = summary
    return summaries


def drift_report_html(model_name: str, run_folder: str | None) -> str | None:
    """A monitor run's report from the lake (see :func:`sparktune.serve.drift.read_report`)."""
    from sparktune.core.config import settings
    from sparktune.serve.drift import read_report

    return read_report(settings().monitoring_uri, model_name, run_folder) if model_name else None


def form_token(user_name: str) -> str:
    """The rollback form's token: an HMAC of the user under the api-server's secret key."""
    from airflow.configuration import conf

    key = (conf.get("api", "secret_key", fallback="") or "").encode()
    return hmac.new(key, f"sparktune-rollback:{user_name}".encode(), hashlib.sha256).hexdigest()


def rollback_reason(reason: str, user_name: str) -> str:
    """The audit reason the run records: the user's words and who asked, from where."""
    asked = f"requested by {user_name} on {PAGE_SOURCE}"
    reason = " ".join(reason.split())
    return f"{reason} ({asked})" if reason else asked


class ApiError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


async def call_api(
    request: Request, method: str, path: str, token: str, *, json: Any = None, params: Any = None
) -> Any:
    """Airflow's public REST API (``/api/v2`` + ``path``) in this process, as the token's user;
    the page's URL goes as the Referer (Airflow then records a trigger as the UI's)."""
    import httpx

    api_app = request.scope.get(API_APP_SCOPE_KEY)
    if api_app is None:
        raise ApiError(500, "the sparktune plugin's root middleware is not installed: no REST API to call")
    headers = {"Authorization": f"Bearer {token}", "Referer": str(request.url)}
    transport = httpx.ASGITransport(app=api_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://airflow-api-server") as client:
        reply = await client.request(method, f"/api/v2{path}", json=json, params=params, headers=headers)
    if reply.status_code >= 400:
        try:
            detail = reply.json().get("detail", reply.text)
        except ValueError:
            detail = reply.text
        raise ApiError(reply.status_code, str(detail))
    return reply.json() if reply.content else None


def create_app(
    *,
    authenticate: Callable[[Request], Awaitable[SignedIn | None]] = airflow_user,
    authorize: Callable[[Any], bool] = may_trigger_rollback,
    models: Callable[[], tuple[list[Any], str]] = load_models,
    login: Callable[[Request], str] = login_url,
    report: Callable[[str, str | None], str | None] = drift_report_html,
    drift: Callable[[str], dict[str, Any] | None] = latest_drift_summary,
) -> FastAPI:
    """The Models app. The defaults are Airflow's and MLflow's; tests may pass their own."""
    app = FastAPI(title="sparktune Models page", docs_url=None, redoc_url=None, openapi_url=None)

    async def page(request: Request, signed: SignedIn, *, notice=None, error="", status=200) -> Response:
        control = await _rollback_control(request, signed, authorize)
        try:
            views, mlflow_ui = await run_in_threadpool(models)
        except Exception as exc:  # MLflow down or misconfigured: say so on the page
            log.exception("the Models page could not read MLflow")
            views, mlflow_ui = [], ""
            error = error or f"MLflow could not be read: {type(exc).__name__}: {exc}"
            status = max(status, 502)
        summaries = await run_in_threadpool(_drift_summaries, drift, [v.name for v in views])
        # Sec-Fetch-Dest: the browser says the UI framed the page (Chromium and Firefox send it).
        framed = request.headers.get("sec-fetch-dest") == "iframe"
        own_url = str(request.url.replace(query="", fragment="")).removesuffix("rollback") if framed else ""
        html = render_models_page(
            ModelsPage(signed.name, views, mlflow_ui, control, notice, error, own_url, summaries)
        )
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})

    @app.get("/models", include_in_schema=False)
    async def no_slash() -> Response:
        return RedirectResponse(PAGE_PATH, status_code=307)  # relative: the page's links resolve under it

    @app.get("/models/", response_class=HTMLResponse)
    async def models_page(request: Request, rollback_run: str = "") -> Response:
        signed = await authenticate(request)
        if signed is None:
            return _sign_in_first(login(request))
        notice = await _run_notice(request, signed, rollback_run) if rollback_run else None
        return await page(request, signed, notice=notice)

    @app.get("/models/drift", response_class=HTMLResponse)
    async def drift_report(request: Request, model: str = "", run: str = "") -> Response:
        signed = await authenticate(request)
        if signed is None:
            return _sign_in_first(login(request))
        html = await run_in_threadpool(report, model, run or None)
        if html is None:
            return await page(
                request, signed, error=f"No drift report of {model!r} (run {run or 'latest'!r}).", status=404
            )
        return HTMLResponse(html, headers=REPORT_HEADERS)

    @app.post("/models/rollback")
    async def rollback(
        request: Request,
        model_name: str = Form(...),
        csrf_token: str = Form(""),
        to_version: str = Form(""),
        reason: str = Form(""),
        unpause: str = Form(""),
    ) -> Response:
        signed = await authenticate(request)
        if signed is None:
            return _sign_in_first(login(request))
        if not hmac.compare_digest(csrf_token.encode(), form_token(signed.name).encode()):
            return await page(
                request, signed, error="The form expired: reload the page and try again.", status=403
            )
        if not authorize(signed.user):
            error = f"{signed.name} may not trigger {ROLLBACK_DAG}: nothing was rolled back."
            return await page(request, signed, error=error, status=403)
        to_version = to_version.strip()
        if not model_name.strip() or (to_version and not (to_version.isascii() and to_version.isdigit())):
            error = f"Not a rollback: model {model_name!r}, version {to_version!r}."
            return await page(request, signed, error=error, status=400)
        conf = {
            "model_name": model_name.strip(),
            "to_version": to_version,
            "reason": rollback_reason(reason, signed.name),
        }
        try:
            if unpause:
                await call_api(
                    request, "PATCH", f"/dags/{ROLLBACK_DAG}", signed.token,
                    json={"is_paused": False}, params={"update_mask": "is_paused"},
                )  # fmt: skip
            note = f"Triggered by {signed.name} on {PAGE_SOURCE}."
            run = await call_api(
                request, "POST", f"/dags/{ROLLBACK_DAG}/dagRuns", signed.token,
                json={"logical_date": None, "conf": conf, "note": note},
            )  # fmt: skip
        except ApiError as exc:
            error = f"Airflow refused to trigger {ROLLBACK_DAG} (HTTP {exc.status}): {exc.detail}"
            return await page(request, signed, error=error, status=exc.status)
        log.info("%s triggered %s run %s: %s", signed.name, ROLLBACK_DAG, run["dag_run_id"], conf)
        # Post/redirect/get: a reload shows the run again instead of triggering another.
        return RedirectResponse(f"./?rollback_run={quote(run['dag_run_id'], safe='')}", status_code=303)

    return app


async def _rollback_control(
    request: Request, signed: SignedIn, authorize: Callable[[Any], bool]
) -> RollbackControl:
    allowed = authorize(signed.user)
    paused, problem = None, ""
    try:
        paused = bool((await call_api(request, "GET", f"/dags/{ROLLBACK_DAG}", signed.token))["is_paused"])
    except ApiError as exc:
        problem = f"Airflow cannot show the {ROLLBACK_DAG} DAG (HTTP {exc.status}): {exc.detail}"
    return RollbackControl(
        allowed=allowed,
        csrf_token=form_token(signed.name) if allowed else "",
        why_not="" if allowed else f"{signed.name} may not trigger {ROLLBACK_DAG}.",
        dag_paused=paused,
        dag_problem=problem,
    )


async def _run_notice(request: Request, signed: SignedIn, run_id: str) -> RunNotice:
    path = f"/dags/{ROLLBACK_DAG}/dagRuns/{quote(run_id, safe='')}"
    try:
        run = await call_api(request, "GET", path, signed.token)
    except ApiError as exc:
        return RunNotice(run_id, f"unknown (HTTP {exc.status}: {exc.detail})")
    return RunNotice(
        run_id, str(run.get("state")), str(run.get("triggering_user_name") or ""), run.get("conf") or {}
    )


def _sign_in_first(url: str) -> Response:
    import html

    body = (
        "<!doctype html><title>Models - sparktune</title><p>Sign in to Airflow to see the Models page: "
        f'<a href="{html.escape(url)}">sign in</a>.</p>'
    )
    return HTMLResponse(body, status_code=401, headers={"Cache-Control": "no-store"})
