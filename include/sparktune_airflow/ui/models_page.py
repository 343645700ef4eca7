"""The Models page as HTML: one server-rendered document, no script, no assets of its own.

Everything shown comes from :func:`sparktune.release.model_views.model_views` (MLflow) and from
Airflow's REST API (the rollback DAG's state, a run the page started); Jinja2 escapes every value
(``autoescape``), registry names, tags, reasons and audit actors included. Links to MLflow and to
the Data Docs are the ones the operators' extra links build (:mod:`sparktune_airflow.core.links`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jinja2
from sparktune.release.model_views import (
    BASE_MODEL,
    BASELINE,
    CHAMPION,
    FIGURES,
    PAIRED,
    Estimate,
    ModelView,
    VersionView,
)
from sparktune_airflow.core.links import data_docs_url, mlflow_run_url, model_version_url

ROLLBACK_DAG = "rollback_champion"
FIGURE_LABELS = {"accuracy": "accuracy", "macro_f1": "macro F1", "loss": "loss"}
REFERENCE_LABELS = {
    BASELINE: "Baseline (TF-IDF + logistic regression)",
    BASE_MODEL: "Base model before fine-tuning",
    CHAMPION: "Champion at evaluation",
}
PREVIOUS_CHAMPION = "previous_champion"


@dataclass(frozen=True)
class RollbackControl:
    """What the page offers for ``rollback_champion``: whether this user may trigger it (else
    ``why_not``), whether the DAG is paused (None: Airflow does not know it, ``dag_problem`` says
    why), and the form's CSRF token."""

    allowed: bool
    csrf_token: str = ""
    why_not: str = ""
    dag_paused: bool | None = None
    dag_problem: str = ""


@dataclass(frozen=True)
class RunNotice:
    """A rollback_champion run the page triggered, as Airflow's REST API reports it now."""

    run_id: str
    state: str
    triggered_by: str = ""  # the user Airflow recorded
    conf: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelsPage:
    user: str
    models: list[ModelView]
    mlflow_ui: str  # the MLflow UI's base URL (sparktune_airflow.core.links.mlflow_ui_base)
    rollback: RollbackControl
    notice: RunNotice | None = None
    error: str = ""  # shown first (MLflow unreachable, a refused rollback)
    # The page's own address, said when the UI frames it: Airflow 3.3 frames a plugin's page in a
    # sandbox without allow-popups, so a link to MLflow or the Data Docs opens only from there.
    own_url: str = ""
    # Model name -> the summary of its latest monitor_champion run (sparktune.serve.drift).
    drift: dict[str, dict[str, Any]] = field(default_factory=dict)


def number(value: Any, signed: bool = False) -> str:
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def estimate(value: Estimate | None, signed: bool = False) -> str:
    """``0.8125 [0.7800, 0.8450]``: the figure and its 95% interval, when one was logged."""
    if value is None:
        return "-"
    text = number(value.value, signed)
    if value.low is not None and value.high is not None:
        text += f" [{number(value.low, signed)}, {number(value.high, signed)}]"
    return text


def rollback_targets(model: ModelView) -> list[tuple[str, str]]:
    """The choices of the rollback form: ("", "previous_champion (vN)") first when that alias is
    set, then every other shown version that is not champion, newest first."""
    choices = []
    previous = model.aliases.get(PREVIOUS_CHAMPION)
    if previous and previous != model.champion:
        choices.append(("", f"{PREVIOUS_CHAMPION} (v{previous})"))
    choices += [(v.version, f"v{v.version}") for v in model.versions if v.version != model.champion]
    return choices


def version_links(model: ModelView, version: VersionView, mlflow_ui: str) -> list[tuple[str, str]]:
    """(label, URL) of the version's pages in MLflow: its training run and the version itself."""
    links = []
    if version.run_id:
        links.append(("training run", mlflow_run_url({"mlflow_run_id": version.run_id}, mlflow_ui)))
    links.append(
        (
            "model version",
            model_version_url({"model_name": model.name, "version": version.version}, mlflow_ui),
        )
    )
    return links


def data_docs(version: VersionView) -> tuple[str, bool]:
    """Where the Data Docs of the version's training data are, and whether a browser can open it
    from here (http(s): ``SPARKTUNE_DATA_DOCS_URL`` publishes them; else a file on Airflow's hosts)."""
    url = data_docs_url(version.data_quality)
    return url, url.startswith(("http://", "https://"))


def quality_text(version: VersionView) -> str:
    """``passed, 23 expectations, 1 warning(s)``: the quality gate over the training data."""
    q = version.data_quality
    if q.get("evaluated") is None:
        return ""
    verdict = "passed" if q.get("success") else "failed"
    return f"{verdict}, {q['evaluated']} expectations, {q.get('warned', 0)} warning(s)"


def approval_text(version: VersionView) -> str:
    """``approved by alice at 2026-11-23T18:02:11+00:00: looks good``, or "" without an approval."""
    a = version.approval
    if not a:
        return ""
    text = a.get("approval_decision", "")
    text += f" by {a['approval_by']}" if a.get("approval_by") else ""
    text += f" at {a['approval_at']}" if a.get("approval_at") else ""
    return text + (f": {a['approval_comment']}" if a.get("approval_comment") else "")


def audit_time(at: str) -> str:
    """An audit record's ISO time as ``YYYY-MM-DD HH:MM:SS`` in UTC (as ``make models`` prints it)."""
    try:
        return datetime.fromisoformat(at).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return at


def notice_text(notice: RunNotice) -> str:
    """What the run the page triggered asks for: ``model support-intent, to previous_champion``."""
    model = notice.conf.get("model_name")
    if not model:
        return ""
    target = f"version {notice.conf['to_version']}" if notice.conf.get("to_version") else PREVIOUS_CHAMPION
    return f"model {model}, to {target}"


_ENV = jinja2.Environment(
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
)
_ENV.filters.update(estimate=estimate)
_ENV.globals.update(
    FIGURES=FIGURES,
    PAIRED=PAIRED,
    FIGURE_LABELS=FIGURE_LABELS,
    REFERENCE_LABELS=REFERENCE_LABELS,
    ROLLBACK_DAG=ROLLBACK_DAG,
    rollback_targets=rollback_targets,
    version_links=version_links,
    data_docs=data_docs,
    quality_text=quality_text,
    approval_text=approval_text,
    notice_text=notice_text,
    audit_time=audit_time,
)

_TEMPLATE = _ENV.from_string(
    """\
{% macro alias_chip(alias, version="") %}
<span class="alias alias-{{ alias }}">{{ alias }}{{ " v" ~ version if version else "" }}</span>
{% endmacro %}

{% macro rollback_form(model) %}
{% set r = page.rollback %}
{% set targets = rollback_targets(model) %}
{% if not targets %}
<p class="muted">Nothing to roll back to: the model has no other version.</p>
{% elif r.dag_paused is none %}
<p class="muted">Rollback unavailable: {{ r.dag_problem }}</p>
{% else %}
<form class="rollback" method="post" action="rollback" data-testid="rollback-form">
<input type="hidden" name="model_name" value="{{ model.name }}">
<input type="hidden" name="csrf_token" value="{{ r.csrf_token }}">
<label>Move champion back to <select name="to_version">
{% for value, label in targets %}<option value="{{ value }}">{{ label }}</option>{% endfor %}
</select></label>
<label>Reason <input type="text" name="reason" maxlength="500" size="40"
 placeholder="why (kept in the audit log)"></label>
{% if r.dag_paused %}
<label><input type="checkbox" name="unpause" value="1" checked>
 unpause {{ ROLLBACK_DAG }} (it is paused)</label>
{% endif %}
<button type="submit" data-testid="rollback-button"{{ "" if r.allowed else " disabled" }}>
Roll back champion</button>
<div class="muted">Triggers the {{ ROLLBACK_DAG }} DAG as you: its task moves the alias and writes
the audit record. {{ "" if r.allowed else r.why_not }}</div>
</form>
{% endif %}
{% endmacro %}

{% macro figures_row(label, figures, versus=none, note="") %}
<td>{{ label }}{% if note %}<br><span class="muted">{{ note }}</span>{% endif %}</td>
{% for f in FIGURES %}<td class="num">{{ figures.get(f) | estimate }}</td>{% endfor %}
{% for f in PAIRED %}<td class="num">{{ versus.get(f) | estimate(true) if versus else "" }}</td>{% endfor %}
{% endmacro %}

{% macro version_details(model, v) %}
<details data-version="{{ v.version }}"{{ " open" if v.version == model.champion else "" }}>
<summary>v{{ v.version }}: evaluation, gate, data
{%- if v.aliases %} ({{ v.aliases | join(", ") }}){% endif %}</summary>
<p>Base model: <code>{{ v.base_model or "-" }}</code>. MLflow:
{% for label, url in version_links(model, v, page.mlflow_ui) %}
<a href="{{ url }}" target="_blank" rel="noopener noreferrer">{{ label }}</a>{{ "," if not loop.last }}
{% endfor %}</p>
{% if v.references %}
<table data-testid="references">
<tr><th>scored on the same test rows</th>
{% for f in FIGURES %}<th>{{ FIGURE_LABELS[f] }}</th>{% endfor %}
{% for f in PAIRED %}<th>v{{ v.version }} minus it: {{ FIGURE_LABELS[f] }}</th>{% endfor %}</tr>
<tr>{{ figures_row("v" ~ v.version, v.figures) }}</tr>
{% for ref in v.references %}
<tr data-reference="{{ ref.kind }}">
{{ figures_row(REFERENCE_LABELS.get(ref.kind, ref.kind), ref.figures, ref.versus, ref.note) }}</tr>
{% endfor %}
</table>
{% endif %}
<p>Gate: <strong data-testid="gate-decision">{{ v.gate.decision or "not gated" }}</strong>
{%- if v.gate.mode %} ({{ v.gate.mode }} mode){% endif %}</p>
{% if v.gate.reasons %}
<ul data-testid="gate-reasons">{% for reason in v.gate.reasons %}<li>{{ reason }}</li>{% endfor %}</ul>
{% endif %}
{% set docs, docs_is_link = data_docs(v) %}
<p>Data fingerprint: <code>{{ v.row.data_fingerprint or "-" }}</code>
{% if docs and docs_is_link %}
&middot; <a href="{{ docs }}" target="_blank" rel="noopener noreferrer" data-testid="data-docs">Data Docs</a>
{% elif docs %}
&middot; Data Docs: <code data-testid="data-docs">{{ docs }}</code>
<span class="muted">(a file on the Airflow hosts; SPARKTUNE_DATA_DOCS_URL publishes it)</span>
{% endif %}
{% if quality_text(v) %}&middot; quality gate: {{ quality_text(v) }}{% endif %}</p>
{% if approval_text(v) %}<p>Approval: {{ approval_text(v) }}</p>{% endif %}
{% if v.smoke %}
<p>Smoke test: {% for k, value in v.smoke | dictsort %}{{ k }} {{ value }}{{ ", " if not loop.last }}
{% endfor %}</p>
{% endif %}
</details>
{% endmacro %}
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Models - sparktune</title>
<style>
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 16px; color: #1a202c; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f7fafc; } td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.champion td { background: #f0fff4; }
.alias { display: inline-block; border: 1px solid #a0aec0; border-radius: 9px; padding: 0 7px; margin: 1px; }
.alias-champion { border-color: #2f855a; color: #22543d; font-weight: 600; }
.notice { border-left: 4px solid #3182ce; background: #ebf8ff; padding: 8px 12px; margin: 8px 0; }
.error { border-left: 4px solid #c53030; background: #fff5f5; padding: 8px 12px; margin: 8px 0; }
.muted { color: #718096; } code { font-size: 12px; } details { margin: 6px 0 12px; }
form.rollback { border: 1px solid #e2e8f0; padding: 8px 12px; margin: 8px 0; display: inline-block; }
</style>
</head>
<body>
<h1>Models</h1>
<p class="muted">Registered models in MLflow, as the pipeline recorded them. Signed in as
<span data-testid="user">{{ page.user }}</span>.</p>
{% if page.own_url %}
<p class="muted" data-testid="own-url">Links to MLflow and the Data Docs open in a new tab from this
page's own address, <code>{{ page.own_url }}</code>: the Airflow UI shows it in a frame that may not
open tabs.</p>
{% endif %}
{% if page.error %}<div class="error" role="alert" data-testid="error">{{ page.error }}</div>{% endif %}
{% if page.notice %}
<div class="notice" data-testid="rollback-run">{{ ROLLBACK_DAG }} run <code>{{ page.notice.run_id }}</code>:
<strong data-testid="rollback-run-state">{{ page.notice.state }}</strong>
{%- if page.notice.triggered_by %}, triggered by {{ page.notice.triggered_by }}{% endif %}
{%- if notice_text(page.notice) %}, {{ notice_text(page.notice) }}{% endif %}.
Reload this page to follow it; the DAG's runs in Airflow have its log.</div>
{% endif %}
{% if not page.models and not page.error %}
<p>No registered models yet. Run <code>make demo</code> (or <code>llm_finetune</code>) to register one.</p>
{% endif %}
{% for model in page.models %}
<section class="model" data-model="{{ model.name }}">
<h2>{{ model.name }}</h2>
<p>{% for alias, version in model.aliases | dictsort %}{{ alias_chip(alias, version) }}
{% else %}<span class="muted">no aliases</span>{% endfor %}</p>
{% if model.champion %}
<p>Champion: <strong data-testid="champion-version">v{{ model.champion }}</strong></p>
{{ rollback_form(model) }}
{% endif %}
{% set drift = page.drift.get(model.name) %}
{% if drift %}
<p data-testid="drift">Drift (monitor_champion, window to {{ audit_time(drift.window_end) }} UTC):
<strong>{{ drift.status | replace("_", " ") }}</strong>. {{ drift.message }}
{% if drift.report_uri %}<a href="drift?model={{ model.name | urlencode }}">Drift report</a>{% endif %}</p>
{% endif %}
<h3>Versions</h3>
<table data-testid="versions">
<tr><th>version</th><th>aliases</th><th>created (UTC)</th>
{% for f in FIGURES %}<th>{{ FIGURE_LABELS[f] }} [95% interval]</th>{% endfor %}
<th>gate</th><th>data fingerprint</th></tr>
{% for v in model.versions %}
<tr class="{{ 'champion' if v.version == model.champion else '' }}" data-version="{{ v.version }}">
<td>v{{ v.version }}</td>
<td>{% for a in v.aliases %}{{ alias_chip(a) }}{% else %}-{% endfor %}</td>
<td class="num">{{ v.row.created }}</td>
{% for f in FIGURES %}<td class="num">{{ v.figures.get(f) | estimate }}</td>{% endfor %}
<td>{{ v.gate.decision or "-" }}</td>
<td><code>{{ v.row.data_fingerprint or "-" }}</code></td>
</tr>
{% endfor %}
</table>
{% if model.versions_not_shown %}
<p class="muted">{{ model.versions_not_shown }} older version(s) not shown
(<code>make models MODEL={{ model.name }}</code> lists them all).</p>
{% endif %}
{% for v in model.versions %}{{ version_details(model, v) }}{% endfor %}
<h3>Audit log</h3>
<table data-testid="audit-log">
<tr><th>time (UTC)</th><th>alias</th><th>from &rarr; to</th><th>kind</th><th>actor</th><th>reason</th></tr>
{% for e in model.audit %}
<tr><td class="num">{{ audit_time(e.get("at", "")) }}</td><td>{{ e.get("alias", "") }}</td>
<td>{{ e.get("from_version") or "-" }} &rarr; {{ e.get("to_version", "") }}</td>
<td>{{ e.get("kind", "move") }}</td><td><code>{{ e.get("actor", "") }}</code></td>
<td>{{ e.get("reason", "") }}</td></tr>
{% else %}
<tr><td colspan="6" class="muted">no alias moves recorded</td></tr>
{% endfor %}
</table>
{% if model.audit_not_shown %}
<p class="muted">{{ model.audit_not_shown }} older record(s) not shown.</p>
{% endif %}
</section>
{% endfor %}
</body>
</html>
"""
)


def render_models_page(page: ModelsPage) -> str:
    """The whole page; every value escaped."""
    return _TEMPLATE.render(page=page)
