"""``make models``: every registered version with its aliases and key metrics, then the audit log.

Read from MLflow alone (the registry and the audit experiment ``sparktune-registry-audit``), so
what it prints is what the pipeline recorded::

    python -m sparktune.release.models_report                      # every registered model
    python -m sparktune.release.models_report --model-name support-intent
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sparktune.core.config import settings

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

KEY_METRICS = ("eval_accuracy", "eval_macro_f1", "eval_loss")
# The order aliases are listed in: the serving one first.
ALIAS_ORDER = ("champion", "previous_champion", "staging", "candidate")


@dataclass(frozen=True)
class VersionRow:
    version: str
    aliases: tuple[str, ...]
    metrics: dict[str, float]  # the KEY_METRICS that were recorded
    gate_decision: str
    data_fingerprint: str
    created: str  # UTC, "YYYY-MM-DD HH:MM:SS"


@dataclass(frozen=True)
class ModelReport:
    name: str
    versions: list[VersionRow]
    aliases: dict[str, str]  # alias -> version
    audit: list[dict[str, str]] = field(default_factory=list)  # oldest first


def registry_missing(tracking_uri: str) -> str | None:
    """Why there is nothing to read yet (an embedded SQLite store not created), or None."""
    if tracking_uri.startswith("sqlite:///"):
        path = Path(tracking_uri.removeprefix("sqlite:///"))
        if not path.exists():
            return f"No MLflow registry yet: {path} does not exist. Run `make demo` to register a model."
    return None


def models_report(client: MlflowClient, model_name: str | None = None) -> list[ModelReport]:
    """Versions, aliases and audit log of ``model_name`` (or of every registered model).

    Raises LookupError if ``model_name`` is not registered.
    """
    from sparktune.release.registry import audit_log

    names = _registered_names(client)
    if model_name is not None:
        if model_name not in names:
            raise LookupError(
                f"no registered model {model_name!r}; registered: {', '.join(names) or 'none yet'}"
            )
        names = [model_name]
    reports = []
    for name in names:
        aliases = {a: str(v) for a, v in (client.get_registered_model(name).aliases or {}).items()}
        by_version: dict[str, list[str]] = {}
        for alias, version in aliases.items():
            by_version.setdefault(version, []).append(alias)
        versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))
        rows = [_version_row(client, v, by_version.get(str(v.version), [])) for v in versions]
        reports.append(ModelReport(name, rows, aliases, audit_log(client, name)))
    return reports


def _registered_names(client: MlflowClient) -> list[str]:
    names: list[str] = []
    token = None
    while True:
        page = client.search_registered_models(max_results=1000, page_token=token)
        names += [m.name for m in page]
        token = page.token
        if not token:
            return sorted(names)


def _version_row(client: MlflowClient, version, aliases: list[str]) -> VersionRow:
    tags = dict(version.tags or {})
    metrics: dict[str, float] = {}
    for name in KEY_METRICS:  # the evaluate task copies these onto the version
        with contextlib.suppress(KeyError, ValueError):
            metrics[name] = float(tags[name])
    run_tags: dict[str, str] = {}
    if version.run_id and (len(metrics) < len(KEY_METRICS) or "data_fingerprint" not in tags):
        try:
            run = client.get_run(version.run_id)
        except Exception:  # a deleted run or another store: show what the version itself carries
            run = None
        if run is not None:
            run_tags = run.data.tags
            for name in KEY_METRICS:
                if name not in metrics and name in run.data.metrics:
                    metrics[name] = run.data.metrics[name]
    return VersionRow(
        version=str(version.version),
        aliases=tuple(sorted(aliases, key=_alias_rank)),
        metrics=metrics,
        gate_decision=tags.get("gate_decision") or run_tags.get("sparktune.gate.decision", ""),
        data_fingerprint=tags.get("data_fingerprint") or run_tags.get("sparktune.data_fingerprint", ""),
        created=_utc(version.creation_timestamp),
    )


def _alias_rank(alias: str) -> tuple[int, str]:
    return (ALIAS_ORDER.index(alias) if alias in ALIAS_ORDER else len(ALIAS_ORDER), alias)


def _utc(millis: int | None) -> str:
    if not millis:
        return ""
    return datetime.fromtimestamp(millis / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _audit_time(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return iso


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> list[str]:
    """Plain text columns, two spaces apart; the columns in ``right`` are right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def format_models_report(reports: list[ModelReport], tracking_uri: str = "") -> str:
    lines = [f"MLflow registry: {tracking_uri}"] if tracking_uri else []
    if not reports:
        lines.append("No registered models yet. Run `make demo` to train and register one.")
    for report in reports:
        held = ", ".join(
            f"{a} v{v}" for a, v in sorted(report.aliases.items(), key=lambda i: _alias_rank(i[0]))
        )
        lines += ["", f"Model {report.name}: {len(report.versions)} version(s); {held or 'no aliases'}", ""]
        rows = [
            [
                row.version,
                ", ".join(row.aliases) or "-",
                *(f"{row.metrics[m]:.4f}" if m in row.metrics else "-" for m in KEY_METRICS),
                row.gate_decision or "-",
                row.data_fingerprint or "-",
                row.created,
            ]
            for row in report.versions
        ]
        headers = ["version", "aliases", *KEY_METRICS, "gate", "data fingerprint", "created (UTC)"]
        lines += table(headers, rows, right=(0, 2, 3, 4))
        lines += ["", f"Audit log of {report.name} ({len(report.audit)} alias move(s), oldest first):", ""]
        if not report.audit:
            lines.append("(no alias moves recorded)")
            continue
        audit_rows = [
            [
                _audit_time(entry.get("at", "")),
                entry.get("alias", ""),
                f"{entry.get('from_version') or '-'} -> {entry.get('to_version', '')}",
                entry.get("kind", "move"),
                entry.get("actor", ""),
                " ".join(entry.get("reason", "").split()),
            ]
            for entry in report.audit
        ]
        lines += table(["time (UTC)", "alias", "from -> to", "kind", "actor", "reason"], audit_rows)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparktune.release.models_report", description=__doc__)
    parser.add_argument("--model-name", default="", help="one registered model (default: all of them)")
    args = parser.parse_args(argv)
    uri = settings().mlflow_tracking_uri
    missing = registry_missing(uri)
    if missing:
        print(missing)
        return 0
    from mlflow.tracking import MlflowClient

    try:
        reports = models_report(
            MlflowClient(tracking_uri=uri, registry_uri=uri), args.model_name.strip() or None
        )
    except LookupError as exc:
        print(f"{exc}. Pick one with MODEL=<name> (make models) or --model-name.", file=sys.stderr)
        return 1
    print(format_models_report(reports, uri))
    return 0


if __name__ == "__main__":
    sys.exit(main())
