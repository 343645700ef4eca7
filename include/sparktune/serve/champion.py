"""The model the server answers with: the version an alias points at, swapped when the alias moves.

:meth:`ChampionWatcher.check` asks the registry which version ``NAME@alias`` is; when that is not
the version being served it downloads and loads the new one (in the caller's thread: the server
runs it off the event loop), and only then replaces :attr:`ChampionWatcher.current`. Replacing one
attribute is atomic, and a batch takes its model once before predicting, so batches in flight
finish on the model they started with and the next one uses the new model: a promotion or a
rollback fails no request. The version is loaded by number (``models:/NAME/<version>``), never by
alias, so what is served is exactly the version that was resolved, whatever the alias does during
the download.

A version that fails to load is not tried again until the alias moves or a reload is asked for;
the server keeps answering with the model it has.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class NoModelError(RuntimeError):
    """Nothing to answer with yet (no alias, or the version cannot load); the message says the fix."""


class ModelOutputError(RuntimeError):
    """The model answered in a shape the server cannot return (a fault of the model, not the client)."""


@dataclass(frozen=True)
class Scored:
    """One predict call's answers, in input order, and the version that gave them."""

    model_name: str
    model_version: str
    predictions: list[str]
    scores: list[float]


@dataclass(frozen=True)
class LoadedModel:
    name: str
    version: str
    model: Any  # an mlflow.pyfunc.PyFuncModel, or anything with .predict(DataFrame) -> DataFrame
    loaded_at: datetime
    load_seconds: float

    def predict(self, texts: Sequence[str]) -> Scored:
        """``model.predict`` on a DataFrame with a ``text`` column; checks the answer's shape."""
        import pandas as pd

        out = self.model.predict(pd.DataFrame({"text": list(texts)}))
        if not isinstance(out, pd.DataFrame) or not {"prediction", "score"} <= set(out.columns):
            got = list(out.columns) if isinstance(out, pd.DataFrame) else type(out).__name__
            raise ModelOutputError(
                f"{self.name} v{self.version} returned {got}, not a DataFrame with 'prediction' and "
                "'score' columns: register a version logged as the project's classifier pyfunc."
            )
        if len(out) != len(texts):
            raise ModelOutputError(
                f"{self.name} v{self.version} returned {len(out)} rows for {len(texts)} texts: "
                "its predict must answer one row per input row."
            )
        return Scored(
            model_name=self.name,
            model_version=self.version,
            predictions=[str(p) for p in out["prediction"].tolist()],
            scores=[float(s) for s in out["score"].tolist()],
        )


def _safe_name(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]", "_", name)


def load_version(model_name: str, version: str, tracking_uri: str, download_dir: Path) -> Any:
    """Download ``models:/model_name/version`` once under ``download_dir`` and load it as a pyfunc.

    A version never changes, so a folder downloaded before (by this server or an earlier one) is
    loaded again as it is; a download lands in a hidden folder first and is renamed into place.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    target = download_dir / _safe_name(model_name) / version
    if not (target / "MLmodel").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.parent / f".{version}.{uuid.uuid4().hex}.partial"
        # The version's storage location from this client: a models:/ URI would be resolved through
        # MLflow's process-wide registry URI instead of ``tracking_uri``.
        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        source = client.get_model_version_download_uri(model_name, version)
        try:
            # The folder lands inside dst_path under its own name (the location's last part).
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=str(partial), tracking_uri=tracking_uri
            )
            if not (Path(local) / "MLmodel").is_file():
                raise ValueError(
                    f"models:/{model_name}/{version} (stored at {source}) holds no MLmodel file, so it is "
                    "not an MLflow model; register a version from a logged model"
                )
            try:
                Path(local).rename(target)
            except OSError:  # another server downloaded it meanwhile
                if not (target / "MLmodel").is_file():
                    raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return mlflow.pyfunc.load_model(str(target))


@dataclass(frozen=True)
class Check:
    """What one :meth:`ChampionWatcher.check` found and did."""

    version: str | None  # the version the alias points at (None: no such alias)
    previous_version: str | None
    changed: bool
    error: str | None = None


class ChampionWatcher:
    """Holds the loaded version of ``model_name@alias``; :meth:`check` follows the alias."""

    def __init__(
        self,
        model_name: str,
        alias: str,
        tracking_uri: str,
        download_dir: Path,
        *,
        loader: Callable[[str, str, str, Path], Any] = load_version,
    ) -> None:
        self.model_name = model_name
        self.alias = alias
        self.tracking_uri = tracking_uri
        self.download_dir = download_dir
        self._loader = loader
        self.current: LoadedModel | None = None
        self.last_error: str | None = None
        self.last_checked_at: datetime | None = None
        self._failed_version: str | None = None
        # Only one check at a time: a poll and a reload must not load the same version twice.
        self._lock = threading.Lock()

    def require_current(self) -> LoadedModel:
        model = self.current
        if model is None:
            raise NoModelError(self.unavailable_message())
        return model

    def unavailable_message(self) -> str:
        why = self.last_error or f"the model {self.model_name}@{self.alias} is still loading"
        return f"No model is loaded: {why}"

    def check(self, *, force: bool = False) -> Check:
        """Resolve the alias; load and swap in its version when it is not the one served.

        ``force``: try a version that failed to load before again. Never raises for a registry
        or model fault: the error is kept in :attr:`last_error` and the served model stays.
        """
        with self._lock:
            previous = self.current.version if self.current else None
            try:
                version = self._resolve()
            except Exception as exc:  # the registry is down or refused: keep serving what we have
                self.last_error = (
                    f"the MLflow registry at {self.tracking_uri} could not be asked for "
                    f"{self.model_name}@{self.alias} ({type(exc).__name__}: {exc}); check that it is "
                    "reachable (MLFLOW_TRACKING_URI or --tracking-uri)"
                )
                log.warning("%s", self.last_error)
                return Check(None, previous, False, self.last_error)
            finally:
                self.last_checked_at = datetime.now(UTC)
            if version is None:
                self.last_error = self._no_alias_message()
                if previous is not None:
                    log.warning("%s; still serving v%s", self.last_error, previous)
                return Check(None, previous, False, self.last_error)
            if version == previous or (version == self._failed_version and not force):
                if version == previous:
                    self.last_error = None
                return Check(version, previous, False, self.last_error)
            return self._swap_in(version, previous)

    def _resolve(self) -> str | None:
        from mlflow.tracking import MlflowClient
        from sparktune.release.registry import alias_version

        client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        return alias_version(client, self.model_name, self.alias)

    def _swap_in(self, version: str, previous: str | None) -> Check:
        moved = f"{self.alias} moved from v{previous}" if previous else f"{self.alias} points at it"
        log.info("Loading %s v%s (%s)", self.model_name, version, moved)
        started = time.perf_counter()
        try:
            model = self._loader(self.model_name, version, self.tracking_uri, self.download_dir)
        except Exception as exc:
            self._failed_version = version
            self.last_error = (
                f"{self.model_name} v{version} ({self.alias}) failed to load ({type(exc).__name__}: {exc}); "
                f"fix or replace that version and move {self.alias!r} to a loadable one, then "
                "POST /admin/reload"
            )
            log.error("%s%s", self.last_error, f"; still serving v{previous}" if previous else "")
            return Check(version, previous, False, self.last_error)
        seconds = time.perf_counter() - started
        self.current = LoadedModel(self.model_name, version, model, datetime.now(UTC), seconds)
        self._failed_version, self.last_error = None, None
        log.info("Serving %s v%s (loaded in %.1f s)", self.model_name, version, seconds)
        return Check(version, previous, True)

    def _no_alias_message(self) -> str:
        return (
            f"the registry at {self.tracking_uri} has no version of {self.model_name!r} with the alias "
            f"{self.alias!r}; promote one (the llm_finetune DAG's promote_champion step, or "
            f"MlflowClient().set_registered_model_alias({self.model_name!r}, {self.alias!r}, <version>)), "
            "then POST /admin/reload or wait for the next poll"
        )
