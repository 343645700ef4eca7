"""The Models page's data (``sparktune_airflow.ui.models_page``): ``make models``' report
(:func:`sparktune.release.models_report.models_report`) with what the pipeline recorded of each
version, read back from MLflow alone.

Per version, beside the report's row (aliases, key metrics, gate decision, data fingerprint):
``evaluate``'s figures with their 95% bootstrap intervals, the TF-IDF baseline, the base model
before fine-tuning and the champion it was scored beside (their figures and the paired
differences), ``gate``'s mode and reasons, the Data Docs of the data it trained on (the quality
summary ``register`` logs with the run), the approval and the smoke test. Per model, the audit log,
newest first. Plain typed values: the page escapes and formats them.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.release.models_report import VersionRow, models_report

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# The evaluation's figures, by short name: eval_<name> on the training run, its interval
# eval_<name>_ci_low / _ci_high; <kind>_<name> of the models it was scored beside.
FIGURES = ("accuracy", "macro_f1", "loss")
# The paired differences, the version minus the other model on the same rows: vs_<kind>_<name>_diff.
PAIRED = ("accuracy", "macro_f1")
BASELINE, BASE_MODEL, CHAMPION = "baseline", "base_model", "champion"
# What register logs of validate_data's result with the run, and what of it the page shows.
QUALITY_SUMMARY_ARTIFACT = "pipeline/quality_summary.json"
QUALITY_SUMMARY_KEYS = (
    *("data_docs_uri", "data_docs_index_uri", "data_docs_dir"),
    *("success", "evaluated", "failed", "warned"),
)
APPROVAL_TAGS = ("approval_decision", "approval_by", "approval_at", "approval_comment")
SMOKE_TAG_PREFIX = "smoke_"
GATE_TAGS = ("sparktune.gate.decision", "sparktune.gate.mode", "sparktune.gate.reasons")


@dataclass(frozen=True)
class Estimate:
    """A figure and its 95% bootstrap interval (``low``/``high`` None when none was logged)."""

    value: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Reference:
    """A model the version was scored beside, on the same test rows: :data:`BASELINE` (TF-IDF +
    logistic regression), :data:`BASE_MODEL` (before fine-tuning) or :data:`CHAMPION` (the one in
    production then). ``figures``: its own (by :data:`FIGURES` name); ``versus``: the version minus
    it (by :data:`PAIRED` name); ``note``: which base model, or why it has no figures."""

    kind: str
    figures: dict[str, Estimate]
    versus: dict[str, Estimate]
    note: str = ""


@dataclass(frozen=True)
class GateView:
    decision: str  # "promote", "blocked", or "" (the version was never gated)
    mode: str  # the gate_mode it ran in ("enabled", "dry_run", ...), "" when not recorded
    reasons: tuple[str, ...]  # one line per rule, as in the gate task's log


@dataclass(frozen=True)
class VersionView:
    row: VersionRow  # what `make models` prints of it: version, aliases, created, fingerprint
    run_id: str
    figures: dict[str, Estimate]  # its own, by FIGURES name
    references: tuple[Reference, ...]  # the ones recorded, in the order baseline, base model, champion
    gate: GateView
    # Of the data it trained on: data_docs_uri (that run's page), data_docs_index_uri, data_docs_dir
    # and the quality gate's counts (success, evaluated, failed, warned); {} when not recorded.
    data_quality: dict[str, Any]
    approval: dict[str, str]  # the APPROVAL_TAGS that are set
    smoke: dict[str, str]  # the smoke test's figures (version tags smoke_*)
    base_model: str  # what training started from

    @property
    def version(self) -> str:
        return self.row.version

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.row.aliases


@dataclass(frozen=True)
class ModelView:
    name: str
    aliases: dict[str, str]  # alias -> version
    versions: list[VersionView]  # newest first, at most max_versions
    versions_not_shown: int  # older versions left out
    audit: list[dict[str, str]]  # the audit log, newest first, at most max_audit records
    audit_not_shown: int

    @property
    def champion(self) -> str | None:
        return self.aliases.get(CHAMPION)


def model_views(
    client: MlflowClient, model_name: str | None = None, *, max_versions: int = 20, max_audit: int = 100
) -> list[ModelView]:
    """The Models page of ``model_name`` (or of every registered model): the newest
    ``max_versions`` versions in detail and the newest ``max_audit`` records of the audit log.

    Raises LookupError if ``model_name`` is not registered. A version whose training run is gone
    shows what the version itself carries (its tags).
    """
    views = []
    for report in models_report(client, model_name):
        registered = {str(v.version): v for v in client.search_model_versions(f"name = '{report.name}'")}
        shown = report.versions[::-1][:max_versions]
        audit = report.audit[::-1]
        views.append(
            ModelView(
                name=report.name,
                aliases=report.aliases,
                versions=[_version_view(client, row, registered.get(row.version)) for row in shown],
                versions_not_shown=len(report.versions) - len(shown),
                audit=audit[:max_audit],
                audit_not_shown=max(0, len(audit) - max_audit),
            )
        )
    return views


def _version_view(client: MlflowClient, row: VersionRow, version: Any) -> VersionView:
    from sparktune.release import base_model_eval

    tags = dict(getattr(version, "tags", None) or {})
    run_id = getattr(version, "run_id", None) or ""
    run = _run(client, run_id)
    metrics = dict(run.data.metrics) if run is not None else {}
    run_tags = dict(run.data.tags) if run is not None else {}
    figures = {}
    for name in FIGURES:  # the run's metric with its interval, else what the report found
        found = _estimate(metrics, f"eval_{name}")
        if found is None and f"eval_{name}" in row.metrics:
            found = Estimate(row.metrics[f"eval_{name}"])
        if found is not None:
            figures[name] = found
    status = run_tags.get(base_model_eval.RUN_TAG, "")
    base_note = run_tags.get(base_model_eval.TRAINED_FROM_TAG, "")
    if status and status != base_model_eval.SCORED:
        with contextlib.suppress(ValueError):  # a status this version of the code does not know
            reason = run_tags.get(base_model_eval.RUN_REASON_TAG, "")
            base_note = base_model_eval.status_text(base_model_eval.BaseModelOutcome(status, reason=reason))
    references = (
        _reference(metrics, BASELINE),
        _reference(metrics, BASE_MODEL, note=base_note, keep=bool(status)),
        _reference(metrics, CHAMPION, stem="champion_eval_"),
    )
    decision, mode, reasons = (run_tags.get(tag, "") for tag in GATE_TAGS)
    return VersionView(
        row=row,
        run_id=run_id,
        figures=figures,
        references=tuple(ref for ref in references if ref is not None),
        gate=GateView(
            decision=decision or row.gate_decision,
            mode=mode,
            reasons=tuple(line for line in reasons.splitlines() if line.strip()),
        ),
        data_quality=_data_quality(client, run_id) if run is not None else {},
        approval={k: tags[k] for k in APPROVAL_TAGS if tags.get(k)},
        smoke={k: v for k, v in sorted(tags.items()) if k.startswith(SMOKE_TAG_PREFIX)},
        base_model=tags.get("base_model") or run_tags.get(base_model_eval.TRAINED_FROM_TAG, ""),
    )


def _run(client: MlflowClient, run_id: str) -> Any:
    if not run_id:
        return None
    try:
        return client.get_run(run_id)
    except Exception:  # a deleted run or another store: the version's own tags still show
        return None


def _estimate(metrics: dict[str, float], name: str) -> Estimate | None:
    if name not in metrics:
        return None
    return Estimate(metrics[name], metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high"))


def _reference(
    metrics: dict[str, float], kind: str, *, stem: str = "", note: str = "", keep: bool = False
) -> Reference | None:
    """The other model's figures (``<stem><name>``, the stem ``<kind>_`` by default) and the paired
    ``vs_<kind>_<name>_diff``; None when nothing of it was logged, unless ``keep`` (a base model
    that was not scored still says why)."""
    stem = stem or f"{kind}_"
    figures = {name: e for name in FIGURES if (e := _estimate(metrics, f"{stem}{name}")) is not None}
    versus = {}
    for name in PAIRED:
        diff = f"vs_{kind}_{name}"
        if f"{diff}_diff" in metrics:
            versus[name] = Estimate(
                metrics[f"{diff}_diff"], metrics.get(f"{diff}_ci_low"), metrics.get(f"{diff}_ci_high")
            )
    if not figures and not versus and not keep:
        return None
    return Reference(kind, figures, versus, note)


def _data_quality(client: MlflowClient, run_id: str) -> dict[str, Any]:
    """The Data Docs pages and the quality gate's counts of the data the run trained on, from the
    quality summary ``register`` logged with it ({} when the run has none)."""
    try:
        with tempfile.TemporaryDirectory(prefix="sparktune-models-page-") as tmp:
            path = client.download_artifacts(run_id, QUALITY_SUMMARY_ARTIFACT, tmp)
            summary = json.loads(Path(path).read_text())
    except Exception:  # no such artifact (a run registered without it), or unreadable
        return {}
    if not isinstance(summary, dict):
        return {}
    return {k: summary[k] for k in QUALITY_SUMMARY_KEYS if summary.get(k) is not None}
