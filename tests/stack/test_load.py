"""Five ``llm_finetune`` runs on five different datasets, triggered over REST at the same moment.

`make test-load` runs this module (about 18 minutes on a 2-core machine); `make test` leaves it out
for its time budget (see docs/operations.md, "Reliability"). The runs share one registered model.
What must hold:

- every run finishes (a run whose gate says no ends cleanly, promotion skipped);
- promotions are serialized: no two runs are ever between ``evaluate`` and ``promote_champion`` at
  the same time, so each gate compares against the champion the previous promotion left;
- the final champion is the last challenger that passed its gate: with ``max_regression`` 0 each
  promotion's paired accuracy interval against the champion it replaced lay at or above 0, and each
  challenger turned down for regression had an interval reaching below 0;
- the audit log holds every alias move of every run, exactly once, with its run as the actor.

``llm_finetune`` has ``max_active_runs=1``: the scheduler queues the runs and starts them one after
another in the order they were triggered; the test shows that the guarantee holds end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from urllib.parse import quote

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.e2e, pytest.mark.load]

DAG = "llm_finetune"
MODEL = "load-intent"
ROWS = 1000
# Optimizer steps per run, in trigger order: how well each challenger learns differs (10 and 30 steps
# stay below the gate's min_accuracy; 120 and more reach it), and the best is not the last triggered.
STEPS = (120, 10, 200, 30, 120)
RUNS_TIMEOUT = 45 * 60


def _conf(source: str, steps: int) -> dict:
    return {
        "source_uri": source,
        "model_name": MODEL,
        "max_steps": steps,
        "max_regression": 0.0,
        "merge_feedback": False,
    }


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _evaluation(stack, run_id: str) -> dict:
    """What ``evaluate`` returned (XCom): both versions and both models' metrics."""
    path = f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/evaluate/xcomEntries/return_value"
    value = stack.rest("GET", path)["value"]
    return json.loads(value) if isinstance(value, str) else value


def _gate(stack, version: str) -> dict:
    """The gate's decision and reasons, as it recorded them in MLflow on the challenger's run."""
    model_version = stack.mlflow("/model-versions/get", name=MODEL, version=version)["model_version"]
    run = stack.mlflow("/runs/get", run_id=model_version["run_id"])["run"]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    return {
        "promote": tags["sparktune.gate.decision"] == "promote",
        "reasons": tags["sparktune.gate.reasons"],
    }


@pytest.fixture(scope="module")
def load_runs(stack) -> list[dict]:
    sources = []
    for index in range(len(STEPS)):
        path = stack.home / "data" / f"load_{index}.jsonl"
        subprocess.run(
            [sys.executable, "-m", "sparktune_dev.demo_data", "--rows", str(ROWS), "--seed", str(100 + index),
             "--out", str(path)],
            check=True,
        )  # fmt: skip
        sources.append(str(path))
    stack.rest("PATCH", f"/dags/{DAG}", {"is_paused": False})
    started = time.monotonic()
    triggered = [
        stack.rest("POST", f"/dags/{DAG}/dagRuns", {"logical_date": None, "conf": _conf(source, steps)})
        for source, steps in zip(sources, STEPS, strict=True)
    ]
    runs = []
    for run in triggered:
        left = RUNS_TIMEOUT - (time.monotonic() - started)
        run = stack.wait_for_run(DAG, run["dag_run_id"], timeout=max(left, 1))
        tasks = stack.rest("GET", f"/dags/{DAG}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances")
        run["tasks"] = {t["task_id"]: t for t in tasks["task_instances"]}
        run["evaluate"] = _evaluation(stack, run["dag_run_id"])
        run["gate"] = _gate(stack, run["evaluate"]["challenger_version"])
        runs.append(run)
    print(f"load: {len(runs)} runs in {time.monotonic() - started:.0f} s")
    return runs


def test_all_five_runs_finish(load_runs):
    states = {r["dag_run_id"]: {t: ti["state"] for t, ti in r["tasks"].items()} for r in load_runs}
    assert all(r["state"] == "success" for r in load_runs), states
    assert all(r["tasks"]["train"]["state"] == "success" for r in load_runs), states


def test_promotions_are_serialized(load_runs):
    """No two runs overlap between evaluate's start and promote_champion's end (or the gate's end
    when the gate said no): each decision sees the registry as the previous one left it."""
    windows = []
    for run in load_runs:
        tasks = run["tasks"]
        last = tasks["promote_champion"] if tasks["promote_champion"]["state"] == "success" else tasks["gate"]
        windows.append((_time(tasks["evaluate"]["start_date"]), _time(last["end_date"]), run["dag_run_id"]))
    windows.sort()
    for (_, end, first), (start, _, second) in zip(windows, windows[1:], strict=False):
        assert end <= start, f"{first} and {second} were deciding promotions at the same time"


def test_each_gate_compared_against_the_champion_the_previous_promotion_left(load_runs):
    champion = None
    for run in sorted(load_runs, key=lambda r: _time(r["tasks"]["evaluate"]["start_date"])):
        assert run["evaluate"]["champion_version"] == champion, run["dag_run_id"]
        if run["gate"]["promote"]:
            champion = run["evaluate"]["challenger_version"]


def test_the_final_champion_is_the_best_challenger_that_passed_its_gate(stack, load_runs):
    version = stack.mlflow("/registered-models/alias", name=MODEL, alias="champion")["model_version"]
    promoted = [r for r in load_runs if r["gate"]["promote"]]
    assert promoted, [r["gate"] for r in load_runs]
    # The last promotion is the champion now...
    last = max(promoted, key=lambda r: _time(r["tasks"]["promote_champion"]["end_date"]))
    assert version["version"] == last["evaluate"]["challenger_version"]
    assert {t["key"]: t["value"] for t in version["tags"]}["gate_decision"] == "promote"
    # ...and with max_regression 0 each promotion beat or matched the champion it replaced, shown by
    # the paired interval of the accuracy difference on that challenger's test split; each challenger
    # the gate turned down for regression could not show it was no worse.
    for run in load_runs:
        if run["evaluate"]["champion"] is None:
            continue
        challenger = run["evaluate"]["challenger"]["eval_accuracy"]
        champion = run["evaluate"]["champion"]["eval_accuracy"]
        lower_bound = run["evaluate"]["comparison"]["accuracy"]["ci_low"]
        if run["gate"]["promote"]:
            assert challenger >= champion and lower_bound >= 0.0, run["evaluate"]
        elif "max_regression: FAIL" in run["gate"]["reasons"]:
            assert lower_bound < 0.0, run["evaluate"]


def test_the_audit_log_holds_every_alias_move_once(stack, load_runs):
    from mlflow.tracking import MlflowClient
    from sparktune.release.registry import audit_log

    moves = audit_log(MlflowClient(tracking_uri=stack.mlflow_url), MODEL)
    expected = []
    for run in load_runs:
        version = run["evaluate"]["challenger_version"]
        expected.append(("candidate", version))
        if run["gate"]["promote"]:
            expected += [("staging", version), ("champion", version)]
    recorded = sorted((m["alias"], m["to_version"]) for m in moves)
    assert recorded == sorted(expected), moves
    run_ids = {r["dag_run_id"] for r in load_runs}
    for move in moves:
        assert move["actor"].split("/")[1] in run_ids, move  # airflow:<dag>/<run id>/<task>
