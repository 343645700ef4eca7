"""Where the embedded state lives, read from the environment in one place.

Everything the demo and the tests write goes under one folder, ``SPARKTUNE_HOME``
(``.local`` in the current directory by default), so that deleting it resets the
project. Scale-out deployments point the individual settings elsewhere
(``MLFLOW_TRACKING_URI``, ``SPARKTUNE_LAKE_URI``) without touching code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "SPARKTUNE_HOME"
LAKE_ENV = "SPARKTUNE_LAKE_URI"
FEEDBACK_ENV = "SPARKTUNE_FEEDBACK_URI"
SERVING_CAPTURES_ENV = "SPARKTUNE_SERVING_CAPTURES_URI"
MONITORING_ENV = "SPARKTUNE_MONITORING_URI"
MONITOR_CRON_ENV = "SPARKTUNE_MONITOR_CRON"
RETRAIN_CRON_ENV = "SPARKTUNE_RETRAIN_CRON"
CHAMPION_GUARD_CRON_ENV = "SPARKTUNE_CHAMPION_GUARD_CRON"
# Read by the Airflow package's DAG defaults (sparktune_airflow.core.dag_defaults).
TASK_TIMEOUT_ENV = "SPARKTUNE_TASK_TIMEOUT_MINUTES"
TASK_RETRIES_ENV = "SPARKTUNE_TASK_RETRIES"
TASK_RETRY_DELAY_ENV = "SPARKTUNE_TASK_RETRY_DELAY_SECONDS"
TASK_MAX_RETRY_DELAY_ENV = "SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS"
RUN_DEADLINE_ENV = "SPARKTUNE_RUN_DEADLINE_MINUTES"
ALLOWED_ROOTS_ENV = "SPARKTUNE_ALLOWED_ROOTS"
DEFAULT_MODEL_NAME = "support-intent"
# The name a user types in the trigger form to get the built-in tiny base model.
TINY_BASE_MODEL = "tiny-llama"


@dataclass(frozen=True)
class Settings:
    home: Path

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def data_dir(self) -> Path:
        """Raw source files (the demo generator writes here)."""
        return self.home / "data"

    @property
    def lake_uri(self) -> str:
        """Root of prepared data, quarantine and datasets; any URI driver and executors share."""
        return os.environ.get(LAKE_ENV) or str(self.home / "lake")

    @property
    def models_dir(self) -> Path:
        """Base models built here (the tiny default) and training outputs."""
        return self.home / "models"

    @property
    def gx_root(self) -> Path:
        return self.home / "gx"

    @property
    def mlflow_dir(self) -> Path:
        return self.home / "mlflow"

    @property
    def mlflow_tracking_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or self.embedded_mlflow_uri

    @property
    def embedded_mlflow_uri(self) -> str:
        """The SQLite store under this home, whatever the environment says."""
        return f"sqlite:///{self.mlflow_dir / 'mlflow.db'}"

    @property
    def mlflow_artifact_root(self) -> str:
        return os.environ.get("SPARKTUNE_MLFLOW_ARTIFACTS") or (self.mlflow_dir / "artifacts").as_uri()

    @property
    def feedback_uri(self) -> str:
        """The feedback table: scored rows for review and human corrections (see sparktune.serve.feedback)."""
        return os.environ.get(FEEDBACK_ENV) or f"{self.lake_uri}/feedback"

    @property
    def serving_captures_uri(self) -> str:
        """What the HTTP server answered, one row per text, Parquet by ``date=`` (see sparktune.serve)."""
        return os.environ.get(SERVING_CAPTURES_ENV) or f"{self.lake_uri}/serving_captures"

    @property
    def monitoring_uri(self) -> str:
        """The drift reports: ``<model>/<run id>/drift_report.html`` and ``drift_summary.json``
        (see sparktune.serve.drift)."""
        return os.environ.get(MONITORING_ENV) or f"{self.lake_uri}/monitoring"

    @property
    def monitor_cron(self) -> str | None:
        """When monitor_champion runs besides after each batch_inference (``off``: only then)."""
        raw = os.environ.get(MONITOR_CRON_ENV, "").strip()
        if raw.lower() in {"off", "none", "never"}:
            return None
        return raw or "@daily"

    @property
    def retrain_cron(self) -> str | None:
        """When llm_finetune runs on its own besides its asset triggers (default: Mondays 03:00 UTC);
        None (``SPARKTUNE_RETRAIN_CRON=off``) when only asset updates and people start it."""
        value = os.environ.get(RETRAIN_CRON_ENV) or "0 3 * * 1"
        return None if value.strip().lower() in ("off", "none") else value

    @property
    def champion_guard_cron(self) -> str | None:
        """When champion_guard checks that every champion got there through the pipeline (default:
        hourly at :17); None (``SPARKTUNE_CHAMPION_GUARD_CRON=off``) when only people start it."""
        value = os.environ.get(CHAMPION_GUARD_CRON_ENV) or "17 * * * *"
        return None if value.strip().lower() in ("off", "none") else value

    @property
    def allowed_roots(self) -> tuple[str, ...]:
        """Where params may point (``source_uri``, ``output_uri``, ``corrections_uri``, ...):
        ``SPARKTUNE_ALLOWED_ROOTS``, comma-separated URI prefixes (``/data,s3://bucket/lake``), plus
        the pipeline's own data locations (the lake, the feedback table, ``SPARKTUNE_HOME/data``),
        which it reads and writes itself. Unset or empty: ``()``, every location is allowed
        (see :mod:`sparktune.core.paths`)."""
        roots = parse_roots(os.environ.get(ALLOWED_ROOTS_ENV))
        if not roots:
            return ()
        own = (self.lake_uri, self.feedback_uri, str(self.data_dir))
        return tuple(dict.fromkeys((*roots, *own)))

    @property
    def incoming_source_path(self) -> Path:
        """New, unlabelled texts batch inference scores by default (the demo generator writes here)."""
        return self.data_dir / "incoming_tickets.jsonl"

    @property
    def demo_source_path(self) -> Path:
        return self.data_dir / "support_tickets.jsonl"

    @property
    def tiny_base_model_dir(self) -> Path:
        return self.models_dir / "base" / TINY_BASE_MODEL


def parse_roots(raw: str | None) -> tuple[str, ...]:
    """``SPARKTUNE_ALLOWED_ROOTS``'s comma-separated prefixes; empty or unset: ``()`` (no restriction)."""
    return tuple(part.strip() for part in (raw or "").split(",") if part.strip())


def settings() -> Settings:
    """Settings for this process, read from the environment each call (tests change it)."""
    return Settings(home=Path(os.environ.get(HOME_ENV, ".local")).expanduser().resolve())
