"""Registry functions against a real MLflow tracking store (SQLite) in a temp folder: versions, alias
moves and their audit log, rollback, approval decisions, and the guard that finds a champion moved
outside the pipeline."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from sparktune.model.process_setup import using_tracking_uri
from sparktune.release.approval import ApprovalDecision, decision_from_response, record_decision
from sparktune.release.champion_guard import check_champion, check_champions
from sparktune.release.registry import (
    AUDIT_EXPERIMENT,
    CHAMPION,
    PREVIOUS_CHAMPION,
    ChampionChangedError,
    RollbackError,
    alias_version,
    audit_log,
    move_alias,
    register_run_model,
    rollback_champion,
)

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # One database per module: creating MLflow's schema costs seconds.
    root = tmp_path_factory.mktemp("mlflow")
    uri = new_store(root / "mlflow.db")
    experiment = MlflowClient(uri).create_experiment(
        "registry-test", artifact_location=(root / "artifacts").as_uri()
    )
    return uri, experiment


@pytest.fixture()
def client(store):
    uri, _ = store
    return MlflowClient(uri)


@pytest.fixture()
def model(request) -> str:
    return f"registry-test-{request.node.name}"  # a fresh model per test, one shared database


class _EchoModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def _run_with_model(client: MlflowClient) -> str:
    # A real logged model: MLflow 3 registers LoggedModels, not bare artifact folders. Logging one
    # takes the fluent API, for this block only.
    experiment = client.get_experiment_by_name("registry-test").experiment_id
    with using_tracking_uri(client.tracking_uri), mlflow.start_run(experiment_id=experiment) as run:
        mlflow.pyfunc.log_model(name="model", python_model=_EchoModel(), pip_requirements=[])
    return run.info.run_id


def test_register_is_idempotent_per_run(client, model):
    run_id = _run_with_model(client)
    first = register_run_model(client, model, run_id, {"data_fingerprint": "abc"})
    again = register_run_model(client, model, run_id, {"data_fingerprint": "abc"})
    assert first == again == "1"
    assert len(client.search_model_versions(f"name = '{model}'")) == 1
    assert client.get_model_version(model, first).tags["data_fingerprint"] == "abc"
    other = register_run_model(client, model, _run_with_model(client), {})
    assert other == "2"


def test_champion_moves_keep_previous_and_are_audited(client, model):
    v1 = register_run_model(client, model, _run_with_model(client), {})
    v2 = register_run_model(client, model, _run_with_model(client), {})
    assert alias_version(client, model, CHAMPION) is None
    move_alias(
        client, model, CHAMPION, v1, actor="test", reason="first", check_current=True, expected_current=None
    )
    move = move_alias(
        client, model, CHAMPION, v2, actor="test", reason="better", check_current=True, expected_current=v1
    )
    assert move.changed and move.from_version == v1
    assert alias_version(client, model, CHAMPION) == v2
    assert alias_version(client, model, PREVIOUS_CHAMPION) == v1
    # A rerun of the same promotion changes nothing and writes no second audit record.
    rerun = move_alias(
        client, model, CHAMPION, v2, actor="test", reason="retry", check_current=True, expected_current=v1
    )
    assert not rerun.changed
    log = audit_log(client, model)
    assert [(e["from_version"], e["to_version"], e["reason"]) for e in log] == [
        ("", v1, "first"),
        (v1, v2, "better"),
    ]
    # The records sit beside the SQLite store, not in MLflow's default ./mlruns of the working directory.
    audit = client.get_experiment_by_name(AUDIT_EXPERIMENT)
    store_dir = Path(client.tracking_uri.removeprefix("sqlite:///")).parent
    assert audit.artifact_location == (store_dir / "artifacts").resolve().as_uri()


def test_promotion_stops_when_champion_moved_in_between(client, model):
    v1 = register_run_model(client, model, _run_with_model(client), {})
    v2 = register_run_model(client, model, _run_with_model(client), {})
    v3 = register_run_model(client, model, _run_with_model(client), {})
    move_alias(client, model, CHAMPION, v1, actor="t", reason="r")
    move_alias(client, model, CHAMPION, v2, actor="another run", reason="r")
    with pytest.raises(ChampionChangedError, match="another run promoted in between"):
        move_alias(
            client, model, CHAMPION, v3, actor="t", reason="r", check_current=True, expected_current=v1
        )
    assert alias_version(client, model, CHAMPION) == v2
    # The champion this run compared against, as Airflow's native rendering hands it over (an int):
    # still the same version, so the promotion goes ahead.
    moved = move_alias(
        client, model, CHAMPION, v3, actor="t", reason="r", check_current=True, expected_current=int(v2)
    )
    assert moved.changed and alias_version(client, model, CHAMPION) == v3


def _three_versions_v3_champion(client: MlflowClient, model: str) -> tuple[str, str, str]:
    versions = tuple(register_run_model(client, model, _run_with_model(client), {}) for _ in range(3))
    for version in versions:
        move_alias(client, model, CHAMPION, version, actor="pipeline", reason=f"promote v{version}")
    return versions


def test_rollback_restores_the_previous_champion_and_is_audited(client, model):
    v1, v2, v3 = _three_versions_v3_champion(client, model)
    move = rollback_champion(
        client, model, None, actor="airflow:rb/run1/rollback", reason="v3 misroutes refunds"
    )
    assert move.changed and (move.from_version, move.to_version, move.kind) == (v3, v2, "rollback")
    assert alias_version(client, model, CHAMPION) == v2
    assert alias_version(client, model, PREVIOUS_CHAMPION) == v3
    champion_moves = [e for e in audit_log(client, model) if e["alias"] == CHAMPION]
    assert len(champion_moves) == 4  # three promotions, one rollback: one record per move
    last = champion_moves[-1]
    assert (last["from_version"], last["to_version"], last["kind"]) == (v3, v2, "rollback")
    assert (last["actor"], last["reason"]) == ("airflow:rb/run1/rollback", "v3 misroutes refunds")
    assert last["at"]


def test_retry_of_the_same_rollback_changes_nothing(client, model):
    _, v2, v3 = _three_versions_v3_champion(client, model)
    rollback_champion(client, model, "", actor="airflow:rb/run1/rollback", reason="r")
    # Same DAG run and task (an Airflow retry after the move succeeded): no toggle back, no record.
    again = rollback_champion(client, model, "", actor="airflow:rb/run1/rollback", reason="r")
    assert not again.changed and again.to_version == v2 and again.from_version == v3
    assert alias_version(client, model, CHAMPION) == v2
    assert len([e for e in audit_log(client, model) if e.get("kind") == "rollback"]) == 1


def test_rolling_back_twice_toggles_and_to_version_goes_further_back(client, model):
    v1, v2, v3 = _three_versions_v3_champion(client, model)
    rollback_champion(client, model, None, actor="airflow:rb/run1/rollback", reason="first")
    rollback_champion(client, model, None, actor="airflow:rb/run2/rollback", reason="second")
    assert (alias_version(client, model, CHAMPION), alias_version(client, model, PREVIOUS_CHAMPION)) == (
        v3,
        v2,
    )
    move = rollback_champion(client, model, f" {v1} ", actor="airflow:rb/run3/rollback", reason="to v1")
    assert (move.from_version, move.to_version) == (v3, v1)
    assert (alias_version(client, model, CHAMPION), alias_version(client, model, PREVIOUS_CHAMPION)) == (
        v1,
        v3,
    )


def test_rollback_refuses_what_it_cannot_do_with_the_fix(client, model):
    with pytest.raises(RollbackError, match=r"no registered model .*check model_name"):
        rollback_champion(client, model, None, actor="t", reason="r")
    v1 = register_run_model(client, model, _run_with_model(client), {})
    with pytest.raises(RollbackError, match="has no champion.*Promote a version first"):
        rollback_champion(client, model, None, actor="t", reason="r")
    move_alias(client, model, CHAMPION, v1, actor="t", reason="first")
    with pytest.raises(
        RollbackError, match="no previous_champion alias.*Pass to_version with one of the versions: 1"
    ):
        rollback_champion(client, model, None, actor="t", reason="r")
    for bad in ("7", "v1", "latest"):
        with pytest.raises(RollbackError, match=f"has no version '{bad}'.*versions: 1, or leave it empty"):
            rollback_champion(client, model, bad, actor="t", reason="r")
    with pytest.raises(RollbackError, match="version 1 .* is already champion"):
        rollback_champion(client, model, v1, actor="t", reason="r")
    assert alias_version(client, model, CHAMPION) == v1
    assert [e["reason"] for e in audit_log(client, model)] == ["first"]  # no failed attempt recorded


def test_rollback_stops_when_a_promotion_lands_while_it_runs(client, model, monkeypatch):
    import sparktune.release.registry as registry

    v1, v2, v3 = _three_versions_v3_champion(client, model)
    v4 = register_run_model(client, model, _run_with_model(client), {})

    def promotion_lands(*args, **kwargs):  # between reading the champion and moving it
        move_alias(client, model, CHAMPION, v4, actor="another run", reason="promoted")

    monkeypatch.setattr(registry, "_move_already_made", promotion_lands)
    with pytest.raises(ChampionChangedError, match=f"moved away from version {v3} .*nothing was rolled back"):
        rollback_champion(client, model, v1, actor="airflow:rb/run1/rollback", reason="r")
    assert alias_version(client, model, CHAMPION) == v4
    assert alias_version(client, model, PREVIOUS_CHAMPION) == v3


class _Outage(ConnectionError):
    pass


def _dies_at(client: MlflowClient, monkeypatch, method: str, call: int) -> None:
    """``client.<method>`` raises at its ``call``-th call from now, as if the server went away."""
    real, calls = getattr(client, method), []

    def maybe_die(*args, **kwargs):
        calls.append(args)
        if len(calls) == call:
            raise _Outage(f"server gone at {method} #{call}")
        return real(*args, **kwargs)

    monkeypatch.setattr(client, method, maybe_die)


@pytest.mark.parametrize(
    ("method", "call"),
    [
        ("set_registered_model_alias", 1),  # previous_champion not moved yet
        ("set_registered_model_alias", 2),  # previous_champion moved, champion not
        ("log_text", 1),  # champion moved, its audit record not finished
        ("set_terminated", 1),
    ],
)
def test_a_retry_of_an_interrupted_rollback_finishes_it_instead_of_toggling(
    client, model, monkeypatch, method, call
):
    # tests/operators/test_registry_outage.py cuts a real server at every request of a promotion;
    # this is the same for rollback_champion, whose retry must not choose its target again.
    v1, v2, v3 = _three_versions_v3_champion(client, model)
    actor = "airflow:rb/run1/rollback"
    with monkeypatch.context() as outage:
        _dies_at(client, outage, method, call)
        with pytest.raises(_Outage):
            rollback_champion(client, model, None, actor=actor, reason="v3 misroutes refunds")
    assert alias_version(client, model, CHAMPION) in (v3, v2)
    move = rollback_champion(client, model, None, actor=actor, reason="v3 misroutes refunds")
    assert (move.from_version, move.to_version, move.kind) == (v3, v2, "rollback")
    assert (alias_version(client, model, CHAMPION), alias_version(client, model, PREVIOUS_CHAMPION)) == (
        v2,
        v3,
    )
    rollbacks = [e for e in audit_log(client, model) if e.get("kind") == "rollback"]
    assert [(e["from_version"], e["to_version"], e["actor"]) for e in rollbacks] == [(v3, v2, actor)]
    # and the next retry changes nothing
    again = rollback_champion(client, model, None, actor=actor, reason="v3 misroutes refunds")
    assert not again.changed and alias_version(client, model, CHAMPION) == v2


def test_the_audit_log_reads_every_page_of_a_long_history(client, model, monkeypatch):
    import sparktune.release.registry as registry

    # A page of 2 records stands in for the server's page size; a long history spans many pages.
    monkeypatch.setattr(registry, "_AUDIT_PAGE", 2)
    v1 = register_run_model(client, model, _run_with_model(client), {})
    v2 = register_run_model(client, model, _run_with_model(client), {})
    targets = [v1, v2, v1, v2, v1]
    for i, version in enumerate(targets):
        move_alias(client, model, CHAMPION, version, actor="pipeline", reason=f"move {i}")
    log = audit_log(client, model)
    assert [(e["to_version"], e["reason"]) for e in log] == [(v, f"move {i}") for i, v in enumerate(targets)]
    # A retried rollback finds the newest champion move among them, not the first page's.
    rollback_champion(client, model, None, actor="airflow:rb/run1/rollback", reason="r")
    again = rollback_champion(client, model, None, actor="airflow:rb/run1/rollback", reason="r")
    assert not again.changed and alias_version(client, model, CHAMPION) == v2


@pytest.mark.parametrize("actor", ["airflow:dag/run's/task", 'it\'s "ops"'], ids=["one-quote", "both-quotes"])
def test_an_interrupted_move_is_finished_by_its_actor_whatever_quotes_the_actor_holds(
    client, model, monkeypatch, actor
):
    # The audit search filters on the actor on the server; an actor no filter can quote (both quote
    # kinds) is matched on this side.
    v1 = register_run_model(client, model, _run_with_model(client), {})
    v2 = register_run_model(client, model, _run_with_model(client), {})
    move_alias(client, model, CHAMPION, v1, actor="pipeline", reason="first")
    with monkeypatch.context() as outage:
        _dies_at(client, outage, "set_registered_model_alias", 2)  # previous_champion moved, champion not
        with pytest.raises(_Outage):
            move_alias(client, model, CHAMPION, v2, actor=actor, reason="better")
    move = move_alias(client, model, CHAMPION, v2, actor=actor, reason="better")
    assert move.changed and (move.from_version, move.to_version) == (v1, v2)
    moves = [(e["to_version"], e["actor"]) for e in audit_log(client, model)]
    assert moves == [(v1, "pipeline"), (v2, actor)]


# --------------------------------------------------------------------------------------------
# The champion guard, adoption of a hand-set champion, approval decisions


def _versions(client: MlflowClient, model: str, count: int) -> list[str]:
    return [register_run_model(client, model, _run_with_model(client), {}) for _ in range(count)]


def _promote(client, model, version, expected):
    move_alias(
        client, model, CHAMPION, version, actor="llm_finetune/r/promote_champion", reason="gate passed",
        check_current=True, expected_current=expected,
    )  # fmt: skip


def test_champions_the_pipeline_moved_pass_and_one_set_by_hand_is_found(client, model):
    v1, v2, v3 = _versions(client, model, 3)
    _promote(client, model, v1, None)
    _promote(client, model, v2, v1)
    rollback_champion(client, model, actor="rollback_champion/r/rollback_champion", reason="bad v2")
    check = check_champion(client, model)
    assert (check.champion, check.audited, check.moved_outside) == (v1, v1, False)

    client.set_registered_model_alias(model, CHAMPION, v3)  # someone in the MLflow UI
    check = check_champion(client, model)
    assert (check.champion, check.audited, check.moved_outside) == (v3, v1, True)
    assert check.describe() == (
        f"{model}@champion is v{v3}, but the audit log's last move leaves v{v1}: "
        "it was moved outside the pipeline"
    )
    assert [c.model_name for c in check_champions(client, [model])] == [model]


def test_a_champion_set_by_hand_before_any_promotion_is_found(client, model):
    (v1,) = _versions(client, model, 1)
    client.set_registered_model_alias(model, CHAMPION, v1)
    check = check_champion(client, model)
    assert check.moved_outside and check.audited is None
    assert "leaves no champion" in check.describe()


def test_a_hand_set_champion_recorded_on_purpose_passes_and_moves_nothing(client, model):
    v1, v2 = _versions(client, model, 2)
    _promote(client, model, v1, None)
    client.set_registered_model_alias(model, CHAMPION, v2)
    actor = "rollback_champion/adopt/rollback_champion"
    move = rollback_champion(client, model, v2, actor=actor, reason="hotfix deployed by hand")
    assert (move.kind, move.from_version, move.to_version, move.changed) == ("adopted", v1, v2, False)
    assert alias_version(client, model, CHAMPION) == v2
    assert not check_champion(client, model).moved_outside
    assert audit_log(client, model)[-1]["kind"] == "adopted"
    # A retry of that task changes nothing and records nothing twice.
    again = rollback_champion(client, model, v2, actor=actor, reason="hotfix deployed by hand")
    assert again.kind == "adopted" and len(audit_log(client, model)) == 2
    # Naming the champion the log agrees with is still refused: there is nothing to record.
    with pytest.raises(RollbackError, match="already champion"):
        rollback_champion(client, model, v2, actor="rollback_champion/other/rollback_champion", reason="")


def test_an_approval_decision_is_tagged_and_audited_but_sets_no_champion(client, model):
    v1, v2 = _versions(client, model, 2)
    _promote(client, model, v1, None)
    decision = ApprovalDecision("rejected", "alice", "2026-11-26T10:00:00+00:00", "loss went up")
    actor = "llm_finetune/r2/approve_champion"
    record_decision(client, model, v2, decision, actor=actor, reason=decision.reason())
    record_decision(client, model, v2, decision, actor=actor, reason=decision.reason())  # a retry
    tags = client.get_model_version(model, v2).tags
    assert tags["approval_decision"] == "rejected" and tags["approval_by"] == "alice"
    assert tags["approval_comment"] == "loss went up" and tags["approval_at"] == "2026-11-26T10:00:00+00:00"
    (record,) = [r for r in audit_log(client, model) if r["kind"] == "approval"]
    assert (record["from_version"], record["to_version"]) == (v1, v2)
    assert record["reason"] == "rejected by alice: loss went up"
    assert not check_champion(client, model).moved_outside  # an approval record is not a move


@pytest.mark.parametrize(
    ("options", "user", "timed_out", "expected"),
    [
        (["Approve"], {"id": "alice", "name": "Alice"}, False, ("approved", "Alice")),
        (["Reject"], {"id": "bob", "name": ""}, False, ("rejected", "bob")),
        (["Reject"], None, True, ("timed_out", "")),
    ],
)
def test_the_decision_in_a_response(options, user, timed_out, expected):
    decision = decision_from_response(
        options, user, "2026-11-26T10:00:00+00:00", {"comment": " ok "}, timed_out
    )
    assert (decision.decision, decision.by) == expected
    assert decision.comment == "ok"
    if timed_out:
        assert decision.reason(60) == "no answer within 60 minutes: rejected, the champion stays"
