"""MLflow model registry: one version per training run, aliases, and an audit trail of alias moves.

Aliases (``candidate`` -> ``staging`` -> ``champion``, with ``previous_champion`` kept for
rollback) replace MLflow's deprecated stages. Every function checks the registry's current
state first, so a rerun or a retry changes nothing twice.
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from urllib.parse import urlparse

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST
from mlflow.tracking import MlflowClient
from sparktune.core.experiments import get_or_create_experiment

CANDIDATE, STAGING, CHAMPION, PREVIOUS_CHAMPION = "candidate", "staging", "champion", "previous_champion"
AUDIT_EXPERIMENT = "sparktune-registry-audit"
# The audit record of an approval decision (sparktune.release.approval); moves are "move" or "rollback".
APPROVAL_KIND = "approval"
# A champion someone set by hand, recorded on purpose through rollback_champion (see audited_champion).
ADOPTED_KIND = "adopted"
_CHAMPION_SETTING_KINDS = ("move", "rollback", ADOPTED_KIND)
# One search request reads at most this many audit records; more are read page by page.
_AUDIT_PAGE = 1000
log = logging.getLogger(__name__)


class ChampionChangedError(RuntimeError):
    """The champion moved after the gate compared against it; promoting now would skip that comparison."""


class RollbackError(ValueError):
    """A rollback that cannot be done as asked; trying again changes nothing (deterministic)."""


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
    kind: str = "move"  # "rollback" for rollback_champion; recorded in the audit trail

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
    existing = client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    if existing:
        version = str(min(int(v.version) for v in existing))
        log.info("run %s is already registered as %s version %s", run_id, model_name, version)
    else:
        registered = _create_version(client, model_name, run_id, artifact_path, tags)
        version = _one_version_of_run(client, model_name, run_id, registered)
        log.info("registered run %s as %s version %s", run_id, model_name, version)
    for key, value in tags.items():
        client.set_model_version_tag(model_name, version, key, value)
    return version


def _create_version(
    client: MlflowClient, model_name: str, run_id: str, artifact_path: str, tags: dict[str, str]
) -> str:
    """A new version of ``model_name`` from the model ``run_id`` logged as ``artifact_path``.

    What ``mlflow.register_model("runs:/<run>/<artifact_path>")`` does, through ``client``: the
    version's source is ``models:/<model id>`` of the run's LoggedModel of that name (the one logged
    last if a resumed run logged two; MLflow 3 keeps it outside the run's artifact folder).
    """
    try:
        client.create_registered_model(model_name)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    run = client.get_run(run_id)
    logged, page_token = [], None
    while True:
        page = client.search_logged_models(
            experiment_ids=[run.info.experiment_id],
            filter_string=f"name = '{artifact_path}' AND source_run_id = '{run_id}'",
            page_token=page_token,
        )
        logged.extend(m for m in page if m.source_run_id == run_id)
        page_token = page.token
        if not page_token:
            break
    if not logged:
        raise MlflowException(
            f"run {run_id} logged no model named {artifact_path!r}", error_code=RESOURCE_DOES_NOT_EXIST
        )
    steps = {o.model_id: o.step for o in (run.outputs.model_outputs if run.outputs else [])}
    model = max(logged, key=lambda m: (steps.get(m.model_id, -1), m.creation_timestamp or 0))
    # A SQL registry in this process (the embedded store) looks a models:/ source up through MLflow's
    # process-wide tracking URI, not this client's (SqlAlchemyStore.create_model_version); a server
    # looks it up in its own store. For this one call, a local store gets the process pointed at it.
    from sparktune.model.process_setup import using_tracking_uri

    server = urlparse(client.tracking_uri).scheme in ("http", "https", "databricks")
    with nullcontext() if server else using_tracking_uri(client.tracking_uri):
        created = client.create_model_version(
            model_name, f"models:/{model.model_id}", run_id=run_id, tags=tags, model_id=model.model_id
        )
    return str(created.version)


def _one_version_of_run(client: MlflowClient, model_name: str, run_id: str, registered: str) -> str:
    """The first version of ``run_id``, deleting any later one that no alias points at.

    MLflow's client re-sends a POST whose answer was lost (its HTTP retries cover every method):
    when the server had applied the first ``create``, the run gets a second version.
    """
    versions = sorted(
        int(v.version) for v in client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    )
    if len(versions) <= 1:
        return str(versions[0]) if versions else registered
    for extra in versions[1:]:
        if client.get_model_version(model_name, str(extra)).aliases:
            continue
        log.warning(
            "run %s was registered twice (a create re-sent after its answer was lost): deleting %s "
            "version %s, keeping version %s",
            run_id, model_name, extra, versions[0],
        )  # fmt: skip
        client.delete_model_version(model_name, str(extra))
    return str(versions[0])


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
    kind: str = "move",
) -> AliasMove:
    """Point ``alias`` at ``version`` and write the move to the audit trail.

    With ``check_current``, ``expected_current`` is the version the caller believes the alias holds
    now (None: no version); if another run moved it in between, :class:`ChampionChangedError` stops the move.

    The MLflow server can go away between any two of the requests a move takes, so the audit
    record is written first, unfinished (an MLflow run left RUNNING: the move's intent, with its
    from and to versions), then ``previous_champion`` (for ``champion``), then the alias, and the
    record is finished last. ``actor`` asking again (an Airflow retry of the same task) finds its
    unfinished record and completes that move: one record per move, ``previous_champion`` the
    version that was champion before it, whatever request the earlier attempt died on.
    :func:`audit_log` lists finished records only. An interrupted move leaves ``champion`` on the old
    version (``previous_champion`` may already point at that same version) or on the new one with
    ``previous_champion`` the old one, never on a version that was not promoted to it.
    """
    version = str(version)
    current = alias_version(client, model_name, alias)
    # Templated callers may hand over 1 for "1" (Airflow's native rendering turns "1" into an int).
    expected = None if expected_current is None else str(expected_current)
    pending = _unfinished_move(client, model_name, alias, actor)
    if check_current and current != expected and current != version:
        if pending is not None:
            _abandon(client, pending[0])
        raise ChampionChangedError(
            f"{model_name}@{alias} is version {current}, but this run compared against "
            f"{expected_current}; another run promoted in between. Re-run evaluation against the new {alias}."
        )
    if pending is not None and pending[1].to_version != version:
        _abandon(client, pending[0])  # an earlier request of this actor for another version
        pending = None
    if pending is not None:
        record_id, move = pending
        log.info(
            "resuming the move %s@%s %s -> %s that an earlier attempt of %s started at %s",
            model_name, alias, move.from_version, version, actor, move.at,
        )  # fmt: skip
    elif current == version:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        log.info("%s@%s already points at version %s: nothing to do", model_name, alias, version)
        return AliasMove(model_name, alias, current, version, actor, reason, at, False, kind)
    else:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        move = AliasMove(model_name, alias, current, version, actor, reason, at, True, kind)
        record_id = _audit_intent(client, move)
        # A create_run re-sent after its answer was lost leaves a twin record behind: not a move.
        for twin in _unfinished_records(client, model_name, alias, actor):
            if twin.info.run_id != record_id:
                _abandon(client, twin.info.run_id)
    if alias == CHAMPION and move.from_version is not None:
        client.set_registered_model_alias(model_name, PREVIOUS_CHAMPION, move.from_version)
    client.set_registered_model_alias(model_name, alias, version)
    client.log_text(record_id, json.dumps(move.to_summary(), indent=2), "alias_move.json")
    client.set_terminated(record_id)
    log.info("%s@%s: %s -> %s (%s)", model_name, alias, move.from_version, version, move.reason)
    return move


def _audit_intent(client: MlflowClient, move: AliasMove) -> str:
    # An MLflow run per move: queryable with search_runs, visible in the UI, kept with the registry.
    # Created RUNNING with every field as a tag in one request; finished once the alias moved.
    run = client.create_run(
        get_or_create_experiment(client, AUDIT_EXPERIMENT),
        run_name=f"{move.model_name}@{move.alias} -> v{move.to_version}",
        tags={
            "sparktune.audit.model": move.model_name,
            "sparktune.audit.alias": move.alias,
            "sparktune.audit.from_version": move.from_version or "",
            "sparktune.audit.to_version": move.to_version,
            "sparktune.audit.actor": move.actor,
            "sparktune.audit.reason": move.reason[:4000],
            "sparktune.audit.at": move.at,
            "sparktune.audit.kind": move.kind,
        },
    )
    return run.info.run_id


def _filter_literal(value: str) -> str | None:
    """``value`` quoted for an MLflow search filter; None if it holds both quote kinds."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return None


def _audit_runs(
    client: MlflowClient,
    model_name: str,
    *,
    alias: str | None = None,
    actor: str | None = None,
    status: str | None = None,
    newest_first: bool = False,
    limit: int | None = None,
) -> list:
    """The audit records of ``model_name`` that the MLflow server finds, oldest first (or newest).

    Every page is read: a registry with a long history must not lose any of its moves. Values that
    cannot be quoted in a filter (both quote kinds in an actor) are filtered here instead.
    """
    experiment = client.get_experiment_by_name(AUDIT_EXPERIMENT)
    if experiment is None:
        return []
    wanted = {"sparktune.audit.model": model_name}
    if alias is not None:
        wanted["sparktune.audit.alias"] = alias
    if actor is not None:
        wanted["sparktune.audit.actor"] = actor
    clauses = [f"attributes.status = '{status}'"] if status else []
    unquotable = {}
    for tag, value in wanted.items():
        literal = _filter_literal(value)
        if literal is None:
            unquotable[tag] = value
        else:
            clauses.append(f"tags.`{tag}` = {literal}")
    runs: list = []
    page_token = None
    while True:
        page = client.search_runs(
            [experiment.experiment_id],
            filter_string=" AND ".join(clauses),
            order_by=[f"attributes.start_time {'DESC' if newest_first else 'ASC'}"],
            max_results=min(limit or _AUDIT_PAGE, _AUDIT_PAGE),
            page_token=page_token,
        )
        runs.extend(r for r in page if unquotable.items() <= r.data.tags.items())
        page_token = page.token
        if not page_token or (limit is not None and len(runs) >= limit):
            return runs[:limit] if limit is not None else runs


def _record(run) -> dict[str, str]:
    prefix = "sparktune.audit."
    return {k[len(prefix) :]: v for k, v in run.data.tags.items() if k.startswith(prefix)}


def _unfinished_records(client: MlflowClient, model_name: str, alias: str, actor: str) -> list:
    """Audit records ``actor`` started for ``alias`` and did not finish, oldest first."""
    return _audit_runs(client, model_name, alias=alias, actor=actor, status="RUNNING")


def _unfinished_move(
    client: MlflowClient, model_name: str, alias: str, actor: str
) -> tuple[str, AliasMove] | None:
    """The newest audit record ``actor`` started for ``alias`` and did not finish, with its move."""
    unfinished = _unfinished_records(client, model_name, alias, actor)
    if not unfinished:
        return None
    for older in unfinished[:-1]:  # superseded by the newest (a twin, or an earlier request)
        _abandon(client, older.info.run_id)
    record = _record(unfinished[-1])
    move = AliasMove(
        model_name,
        alias,
        record.get("from_version") or None,
        record["to_version"],
        actor,
        record.get("reason", ""),
        record.get("at", ""),
        True,
        record.get("kind", "move"),
    )
    return unfinished[-1].info.run_id, move


def _abandon(client: MlflowClient, record_id: str) -> None:
    """An unfinished record whose move will not be made: out of the audit log (FAILED)."""
    client.set_terminated(record_id, status="FAILED")


def audit_log(client: MlflowClient, model_name: str) -> list[dict[str, str]]:
    """Every alias move of ``model_name`` that was made, and every approval decision (``kind``
    ``approval``), oldest first (finished records)."""
    return [_record(r) for r in _audit_runs(client, model_name, status="FINISHED")]


def record_approval(
    client: MlflowClient, model_name: str, version: str, *, decision: str, actor: str, reason: str, at: str
) -> None:
    """A person's decision on moving ``champion`` to ``version`` as an audit record of kind
    ``approval`` (no alias moves). A retry of the same actor finds its record and adds none."""
    version = str(version)
    done = [
        r
        for r in _audit_runs(client, model_name, alias=CHAMPION, actor=actor, status="FINISHED")
        if _record(r).get("kind") == APPROVAL_KIND and _record(r).get("to_version") == version
    ]
    if not done:
        champion = alias_version(client, model_name, CHAMPION)
        move = AliasMove(model_name, CHAMPION, champion, version, actor, reason, at, False, APPROVAL_KIND)
        record_id = _audit_intent(client, move)
        client.set_tag(record_id, "sparktune.audit.decision", decision)
        client.set_terminated(record_id)
    log.info("%s v%s: %s (%s)", model_name, version, decision, reason)


def rollback_champion(
    client: MlflowClient, model_name: str, to_version: str | None = None, *, actor: str, reason: str
) -> AliasMove:
    """Point ``champion`` back at ``to_version`` (default: the ``previous_champion`` alias).

    The move goes through :func:`move_alias`, so it writes one audit record (actor, time, from, to,
    reason) and sets ``previous_champion`` to the version that was champion: rolling back twice
    with the default target toggles between the two versions; pass ``to_version`` to go further back.

    The same ``actor`` asking again (an Airflow retry of the same DAG run and task) gets back the
    move it already made, with ``changed=False``, instead of toggling the champion back.
    Raises :class:`RollbackError` (deterministic: no champion, no previous champion, unknown
    version, target already champion) and :class:`ChampionChangedError` if another run moved
    ``champion`` while this one was validating.
    """
    requested = (to_version or "").strip() or None
    champion = alias_version(client, model_name, CHAMPION)
    if champion is None:
        raise RollbackError(_no_champion_message(client, model_name))
    pending = _unfinished_move(client, model_name, CHAMPION, actor)
    if pending is not None:
        started = pending[1]
        if champion in (started.from_version, started.to_version) and requested in (None, started.to_version):
            # An earlier attempt of this rollback died between its requests (previous_champion may
            # already name the champion): finish that move instead of choosing a target again.
            return move_alias(
                client,
                model_name,
                CHAMPION,
                started.to_version,
                actor=actor,
                reason=started.reason,
                check_current=True,
                expected_current=started.from_version,
                kind="rollback",
            )
    done = _move_already_made(client, model_name, champion, requested, actor)
    if done is not None:
        log.info(
            "%s already rolled %s@%s back to version %s: nothing to do", actor, model_name, CHAMPION, champion
        )
        return done
    if requested is None:
        target = alias_version(client, model_name, PREVIOUS_CHAMPION)
        if target is None:
            raise RollbackError(
                f"{model_name} has no {PREVIOUS_CHAMPION} alias, so there is nothing to roll back to "
                f"(champion is version {champion}). Pass to_version with one of the versions: "
                f"{_versions_text(client, model_name)}."
            )
    else:
        target = requested
        if not target.isdigit() or not _version_exists(client, model_name, target):
            raise RollbackError(
                f"{model_name} has no version {target!r}. Pass to_version as one of the versions: "
                f"{_versions_text(client, model_name)}, or leave it empty for {PREVIOUS_CHAMPION}."
            )
    if target == champion and requested is not None and audited_champion(client, model_name)[0] != champion:
        return _adopt(client, model_name, champion, actor=actor, reason=reason)
    if target == champion:
        raise RollbackError(
            f"version {target} of {model_name} is already {CHAMPION}: a rollback would change nothing. "
            f"Pass to_version with another version ({_versions_text(client, model_name)})."
        )
    try:
        return move_alias(
            client,
            model_name,
            CHAMPION,
            target,
            actor=actor,
            reason=reason,
            check_current=True,
            expected_current=champion,
            kind="rollback",
        )
    except ChampionChangedError as exc:
        raise ChampionChangedError(
            f"{model_name}@{CHAMPION} moved away from version {champion} while this rollback ran "
            f"(another run promoted); nothing was rolled back. Check `make models` and trigger the "
            f"rollback again if it is still needed."
        ) from exc


def audited_champion(client: MlflowClient, model_name: str) -> tuple[str | None, bool]:
    """The version the audit trail says is ``champion`` (the last finished move, rollback or
    adoption of it; None when there was none), and whether a move to the current champion is under
    way (an unfinished record of this pipeline: the alias moves before its record is closed)."""
    finished = [
        _record(r)
        for r in _audit_runs(client, model_name, alias=CHAMPION, status="FINISHED")
        if _record(r).get("kind", "move") in _CHAMPION_SETTING_KINDS
    ]
    audited = finished[-1]["to_version"] if finished else None
    current = alias_version(client, model_name, CHAMPION)
    under_way = any(
        _record(r).get("to_version") == current
        for r in _audit_runs(client, model_name, alias=CHAMPION, status="RUNNING")
    )
    return audited, under_way


def _adopt(client: MlflowClient, model_name: str, champion: str, *, actor: str, reason: str) -> AliasMove:
    """Record a champion someone set by hand as meant: an audit record from the audited version to it;
    no alias moves."""
    audited, _ = audited_champion(client, model_name)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    move = AliasMove(model_name, CHAMPION, audited, champion, actor, reason, at, False, ADOPTED_KIND)
    record_id = _audit_intent(client, move)
    client.log_text(record_id, json.dumps(move.to_summary(), indent=2), "alias_move.json")
    client.set_terminated(record_id)
    log.info(
        "%s@%s v%s (set outside the pipeline) recorded as meant: %s", model_name, CHAMPION, champion, reason
    )
    return move


def _move_already_made(
    client: MlflowClient, model_name: str, champion: str, requested: str | None, actor: str
) -> AliasMove | None:
    """The last champion move if it was a rollback (or an adoption) by ``actor`` that still holds and
    matches ``requested``."""
    newest = _audit_runs(client, model_name, alias=CHAMPION, status="FINISHED", newest_first=True, limit=1)
    if not newest:
        return None
    last = _record(newest[0])
    kind = last.get("kind")
    if (
        kind not in ("rollback", ADOPTED_KIND)
        or last.get("actor") != actor
        or last.get("to_version") != champion
    ):
        return None
    if requested is not None and requested != champion:
        return None
    return AliasMove(
        model_name,
        CHAMPION,
        last.get("from_version") or None,
        champion,
        actor,
        last.get("reason", ""),
        last.get("at", ""),
        changed=False,
        kind=kind,
    )


def _version_numbers(client: MlflowClient, model_name: str) -> list[int]:
    return sorted(int(v.version) for v in client.search_model_versions(f"name = '{model_name}'"))


def _versions_text(client: MlflowClient, model_name: str) -> str:
    return ", ".join(str(v) for v in _version_numbers(client, model_name)) or "(none)"


def _version_exists(client: MlflowClient, model_name: str, version: str) -> bool:
    return int(version) in _version_numbers(client, model_name)


def _no_champion_message(client: MlflowClient, model_name: str) -> str:
    if not _version_numbers(client, model_name):
        names = sorted(m.name for m in client.search_registered_models(max_results=1000))
        return (
            f"there is no registered model {model_name!r}; check model_name "
            f"(registered models: {', '.join(names) or 'none yet, run llm_finetune first'})."
        )
    return (
        f"{model_name} has no {CHAMPION}, so there is nothing to roll back from. Promote a version "
        f"first (run llm_finetune), then roll back."
    )
