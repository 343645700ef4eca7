"""The server's settings: command-line flags over ``SPARKTUNE_SERVING_*`` variables over defaults.

Every limit a client can hit (rows per request, characters per text, body size) is a setting, so
a deployment that serves long documents raises it without touching code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from sparktune.core.config import DEFAULT_MODEL_NAME, settings

ENV_PREFIX = "SPARKTUNE_SERVING_"
CHAMPION_ALIAS = "champion"


class ServingSettingsError(ValueError):
    """A setting out of its range; the message names the setting, its variable and what it accepts."""


@dataclass(frozen=True)
class ServingSettings:
    host: str = "127.0.0.1"
    port: int = 5001
    model_name: str = DEFAULT_MODEL_NAME
    alias: str = CHAMPION_ALIAS
    # None: the project's store (MLFLOW_TRACKING_URI, else SPARKTUNE_HOME's SQLite registry).
    tracking_uri: str | None = None
    # Where model versions are downloaded, one folder per version (versions never change).
    download_dir: str | None = None
    poll_seconds: float = 10.0
    # A batch of at most this many texts goes to one predict call; a request with more runs alone.
    max_batch_rows: int = 64
    # How long the first request of a batch waits for others: the latency a lone request pays.
    max_wait_ms: float = 3.0
    # A batch is predicted in groups whose longest text is at most this many times the shortest:
    # a model pads a call to its longest text, and one long text would slow the whole call.
    max_length_ratio: float = 2.0
    # Requests waiting for a batch at most (four full batches of one-text requests); one more is
    # answered 503 with Retry-After at once instead of queueing without limit.
    max_queued_requests: int = 256
    # Batches predicted at once, each on its own thread; 0: as many as fill the cores, the cores over
    # the torch threads a call uses (OMP_NUM_THREADS, else all cores: then 1). One by default: on
    # this 2-core machine one batch of 8 beat two of 4 on both models (bench-serve, docs/benchmarks.md).
    predict_workers: int = 1
    max_rows_per_request: int = 256
    max_text_chars: int = 8192
    max_body_bytes: int = 4 * 1024 * 1024
    capture: bool = True
    # None: settings().serving_captures_uri (``<lake>/serving_captures``).
    capture_uri: str | None = None
    capture_flush_rows: int = 1000
    capture_flush_seconds: float = 5.0
    # Rows held while the capture table cannot be written; beyond this the oldest are dropped (and counted).
    capture_max_pending_rows: int = 200_000

    def __post_init__(self) -> None:
        problems = []
        positive = (
            "port",
            "poll_seconds",
            "max_batch_rows",
            "max_queued_requests",
            "max_rows_per_request",
            "max_text_chars",
            "max_body_bytes",
            "capture_flush_rows",
            "capture_flush_seconds",
            "capture_max_pending_rows",
        )
        if self.max_length_ratio < 1:
            name = env_name("max_length_ratio")
            problems.append(f"max_length_ratio ({name}) must be >= 1, got {self.max_length_ratio!r}")
        for name in positive:
            if getattr(self, name) <= 0:
                problems.append(f"{name} ({env_name(name)}) must be > 0, got {getattr(self, name)!r}")
        if self.predict_workers < 0:
            name = env_name("predict_workers")
            problems.append(
                f"predict_workers ({name}) must be >= 0 (0: one per core), got {self.predict_workers!r}"
            )
        if self.max_wait_ms < 0:
            problems.append(f"max_wait_ms ({env_name('max_wait_ms')}) must be >= 0, got {self.max_wait_ms!r}")
        if not 0 < self.port < 65536:
            problems.append(f"port ({env_name('port')}) must be 1-65535, got {self.port!r}")
        for name in ("model_name", "alias", "host"):
            if not str(getattr(self, name)).strip():
                problems.append(f"{name} ({env_name(name)}) must not be empty")
        if problems:
            raise ServingSettingsError("Invalid serving settings: " + "; ".join(problems))

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model_name}@{self.alias}"

    def resolved_predict_workers(self, environ: Mapping[str, str] | None = None) -> int:
        """``predict_workers``, or for 0 the cores over the torch threads one call uses: with
        ``OMP_NUM_THREADS=1`` a batch runs on one core, and as many batches at once fill the cores."""
        if self.predict_workers:
            return self.predict_workers
        environ = os.environ if environ is None else environ
        cores = os.cpu_count() or 1
        raw = environ.get("OMP_NUM_THREADS", "").strip()
        threads = int(raw) if raw.isdigit() and int(raw) > 0 else cores
        return max(1, cores // threads)

    def resolved_tracking_uri(self) -> str:
        return self.tracking_uri or settings().mlflow_tracking_uri

    def resolved_capture_uri(self) -> str:
        return self.capture_uri or settings().serving_captures_uri

    def resolved_download_dir(self) -> Path:
        return Path(self.download_dir) if self.download_dir else settings().models_dir / "serving"

    def with_overrides(self, **overrides: Any) -> ServingSettings:
        """A copy with the given fields changed; ``None`` values leave a field as it is."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _parse(name: str, kind: Any, raw: str) -> Any:
    text = raw.strip()
    try:
        if kind in (bool, "bool"):
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError
        if kind in (int, "int"):
            return int(text)
        if kind in (float, "float"):
            return float(text)
    except ValueError:
        raise ServingSettingsError(
            f"{env_name(name)}={raw!r} is not a valid {getattr(kind, '__name__', kind)}: "
            f"set it to one (or unset it for the default)"
        ) from None
    return text or None


def settings_from_env(environ: Mapping[str, str] | None = None) -> ServingSettings:
    """Defaults overridden by every ``SPARKTUNE_SERVING_<FIELD>`` set in ``environ`` (the process's)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in fields(ServingSettings):
        raw = environ.get(env_name(field.name))
        if raw is None or not raw.strip():
            continue
        kind = str(field.type).split(" ")[0]  # "int", "float", "bool", "str", "str | None"
        values[field.name] = _parse(field.name, kind, raw)
    return ServingSettings(**values)
