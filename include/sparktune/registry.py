"""MLflow model registry: one version per training run, aliases, and an audit trail of alias moves.

Aliases (``candidate`` -> ``staging`` -> ``champion``, with ``previous_champion`` kept for
rollback) replace MLflow's deprecated stages. Every function checks the registry's current
state first, so a rerun or a retry changes nothing twice.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

CANDIDATE, STAGING, CHAMPION, PREVIOUS_CHAMPION = "candidate", "staging", "champion", "previous_champion"
AUDIT_EXPERIMENT = "sparktune-registry-audit"
log = logging.getLogger(__name__)


class ChampionChangedError(RuntimeError):
    """The champion moved after the gate compared against it; promoting now would skip that comparison."""


@dataclass(frozen=True)
class AliasMove:
    model_name: str
    alias: str
    from_version: str | None
    to_version: str
    actor: str
    reason: str
    at: str
    changed: bool

    def to_summary(self) -> dict:
        return asdict(self)


def alias_version(client: MlflowClient, model_name: str, alias: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(model_name, alias).version)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def register_run_model(
    client: MlflowClient, model_name: str, run_id: str, tags: dict[str, str], artifact_path: str = "model"
) -> str:
    """Register the model logged by ``run_id``; a retry finds the version it made instead of adding one."""
    import mlflow

    existing = client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    if existing:
        version = str(min(int(v.version) for v in existing))
        log.info("run %s is already registered as %s version %s", run_id, model_name, version)
    else:
        # mlflow.register_model resolves runs:/ to the LoggedModel the run produced (MLflow 3 keeps
        # those outside the run's artifact folder), so the version's source is what the run logged.
        registered = mlflow.register_model(f"runs:/{run_id}/{artifact_path}", model_name, tags=tags)
        version = str(registered.version)
        log.info("registered run %s as %s version %s", run_id, model_name, version)
    for key, value in tags.items():
        client.set_model_version_tag(model_name, version, key, value)
    return version


def move_alias(
    client: MlflowClient,
    model_name: str,
    alias: str,
    version: str,
    *,
    actor: str,
    reason: str,
    check_current: bool = False,
    expected_current: str | None = None,
) -> AliasMove:
    """Point ``alias`` at ``version`` and write the move to the audit trail.

    With ``check_current``, ``expected_current`` is the version the caller believes the alias holds
    now (None: no version); if another run moved it in between, :class:`ChampionChangedError` stops the move.
    """
    current = alias_version(client, model_name, alias)
    if check_current and current != expected_current and current != version:
        raise ChampionChangedError(
            f"{model_name}@{alias} is version {current}, but this run compared against "
            f"{expected_current}; another run promoted in between. Re-run evaluation against the new {alias}."
        )
    at = datetime.now(UTC).isoformat(timespec="seconds")
    move = AliasMove(model_name, alias, current, str(version), actor, reason, at, current != str(version))
    if not move.changed:
        log.info("%s@%s already points at version %s: nothing to do", model_name, alias, version)
        return move
    if alias == CHAMPION and current is not None:
        client.set_registered_model_alias(model_name, PREVIOUS_CHAMPION, current)
    client.set_registered_model_alias(model_name, alias, str(version))
    _audit(client, move)
    log.info("%s@%s: %s -> %s (%s)", model_name, alias, current, version, reason)
    return move


def _audit(client: MlflowClient, move: AliasMove) -> None:
    # An MLflow run per move: queryable with search_runs, visible in the UI, kept with the registry.
    experiment = client.get_experiment_by_name(AUDIT_EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(AUDIT_EXPERIMENT)
    run = client.create_run(
        experiment_id,
        run_name=f"{move.model_name}@{move.alias} -> v{move.to_version}",
        tags={
            "sparktune.audit.model": move.model_name,
            "sparktune.audit.alias": move.alias,
            "sparktune.audit.from_version": move.from_version or "",
            "sparktune.audit.to_version": move.to_version,
            "sparktune.audit.actor": move.actor,
            "sparktune.audit.reason": move.reason[:4000],
            "sparktune.audit.at": move.at,
        },
    )
    client.log_text(run.info.run_id, json.dumps(move.to_summary(), indent=2), "alias_move.json")
    client.set_terminated(run.info.run_id)


def audit_log(client: MlflowClient, model_name: str) -> list[dict[str, str]]:
    """Every recorded alias move of ``model_name``, oldest first."""
    experiment = client.get_experiment_by_name(AUDIT_EXPERIMENT)
    if experiment is None:
        return []
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=f"tags.`sparktune.audit.model` = '{model_name}'",
        order_by=["attributes.start_time ASC"],
        max_results=10_000,
    )
    prefix = "sparktune.audit."
    return [{k[len(prefix) :]: v for k, v in r.data.tags.items() if k.startswith(prefix)} for r in runs]
