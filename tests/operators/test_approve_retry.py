"""A retried ``approve_champion`` keeps the answer its earlier try received instead of asking again.

Airflow 3.3 retries a Human-in-the-loop task whose answer lands before the scheduler has seen it
park (an answer over REST within a second of the request): the stack's Reject test hit it. The
HITL detail of the task instance still holds the answer; the retry must use it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store


class TaskInstance:
    dag_id, run_id, task_id, map_index = "llm_finetune", "manual__1", "approve_champion", -1

    def __init__(self, try_number: int) -> None:
        self.id = uuid.uuid4()
        self.try_number = try_number


def _operator():
    from sparktune_airflow import ChampionApprovalOperator

    return ChampionApprovalOperator(
        task_id="approve_champion",
        model_name="support-intent",
        version="7",
        evaluation={},
        gate_decision={"mode": "enforce", "passed": True},
        policy={"approval": "required", "approvers": "alice"},
    )


@pytest.fixture
def recorded(monkeypatch):
    """The decisions the operator records (the registry is MLflow's: not here), and a guard that
    fails the test if the operator writes a new request."""
    import sparktune.release.approval as approval
    from airflow.providers.standard.operators import hitl

    decisions: list = []
    monkeypatch.setattr(
        approval,
        "record_decision",
        lambda client, model, version, decision, **kw: decisions.append((version, decision, kw)),
    )

    def no_new_request(**kwargs):
        raise AssertionError("a new approval request was written")

    monkeypatch.setattr(hitl, "upsert_hitl_detail", no_new_request)
    return decisions


def _detail(**response):
    from airflow.sdk.api.datamodels._generated import HITLDetailResponse

    return HITLDetailResponse(**response)


def test_a_retry_uses_the_answer_its_earlier_try_received(monkeypatch, recorded, tmp_path):
    import airflow.sdk.execution_time.hitl as sdk_hitl

    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path / "mlflow.db"))

    answered_at = datetime(2026, 11, 27, 5, 49, 53, tzinfo=UTC)
    monkeypatch.setattr(
        sdk_hitl,
        "get_hitl_detail_content_detail",
        lambda ti_id: _detail(
            response_received=True,
            responded_by_user={"id": "alice", "name": "alice"},
            responded_at=answered_at,
            chosen_options=["Reject"],
            params_input={"comment": "loss went up on billing tickets"},
        ),
    )
    operator = _operator()
    ti = TaskInstance(try_number=2)
    result = operator.execute({"ti": ti, "task_instance": ti})

    assert result["chosen_options"] == ["Reject"]
    ((version, decision, kw),) = recorded
    assert version == "7" and decision.decision == "rejected" and decision.by == "alice"
    assert decision.comment == "loss went up on billing tickets"
    assert kw["reason"] == "rejected by alice: loss went up on billing tickets"
