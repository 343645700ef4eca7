"""A Spark executor lost during ``prepare_data``, for real, on a standalone cluster.

PrepareDataOperator spark-submits the preparation job to a standalone Master with one two-core
Worker (the ``standalone_cluster`` fixture), as the DAG does through ``spark_default``. While a
stage after the dedupe shuffle runs, the test SIGKILLs the executor JVM the Worker launched for
the job. The Master has the Worker start a replacement; Spark re-runs the lost tasks and the map
output and cached blocks that died with the executor. What comes out must be what an undisturbed
run of the same input gives: the same rows in the same splits, the same quarantine, the same
fingerprint and counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    import tiny_model

pytestmark = pytest.mark.slow

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# Generated tickets, with every defect the recipe filters (duplicates, stubs, low quality, ...).
ROWS = 4_000  # enough for several tasks after the dedupe shuffle
# JVMs that live for one short job: the C1 compiler alone and the serial collector cut the CPU
# the driver and the executors burn at start-up by about a third on this 2-core machine.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="module")
def source_and_tokenizer(tmp_path_factory):
    from sparktune_dev.demo_data import write_demo_dataset

    root = tmp_path_factory.mktemp("prepare-faults")
    tokenizer = root / "tokenizer"
    tiny_model.build_tokenizer().save_pretrained(str(tokenizer))
    return write_demo_dataset(root / "tickets.jsonl", ROWS), tokenizer


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.load(reply)


def _operator(source: Path, tokenizer: Path, lake: Path, ui_port: int, events: Path):
    from sparktune_airflow import PrepareDataOperator

    events.mkdir(parents=True, exist_ok=True)
    return PrepareDataOperator(
        task_id="prepare_data",
        tokenizer=str(tokenizer),
        source={"source_uri": str(source)},
        lake_uri=str(lake),
        conf={
            "spark.log.level": "WARN",
            "spark.pyspark.python": sys.executable,
            "spark.driver.extraJavaOptions": SHORT_LIVED_JVM,
            "spark.executor.extraJavaOptions": SHORT_LIVED_JVM,
            # The driver's REST API, polled to time the kill; it must not move to another port.
            "spark.ui.port": str(ui_port),
            "spark.port.maxRetries": "0",
            # Spark's own record of the run, read after it: one plain JSON-lines file.
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        },
    )


def _executor_pids(cluster: dict, app_id: str) -> dict[str, int]:
    """Executor id -> pid of the live executor JVMs this cluster's Worker launched for ``app_id``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            words = [w.decode(errors="replace") for w in (proc / "cmdline").read_bytes().split(b"\0")]
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == cluster["worker_pid"] and EXECUTOR_CLASS in words and app_id in words:
            found[words[words.index("--executor-id") + 1]] = int(proc.name)
    return found


def _running_tasks(api: str, app_id: str, executor_id: str) -> list[tuple[int, int]]:
    """(stage id, partition) of every task the driver counts as running on ``executor_id``."""
    running = []
    for stage in _get(f"{api}/{app_id}/stages?status=active"):
        tasks = _get(f"{api}/{app_id}/stages/{stage['stageId']}/{stage['attemptId']}/taskList?length=10000")
        running += [
            (stage["stageId"], task.get("partitionId", task["index"]))
            for task in tasks
            if task["status"] == "RUNNING" and task["executorId"] == executor_id
        ]
    return sorted(running)


def _kill_the_executor_mid_job(cluster: dict, ui_port: int, done: threading.Event) -> dict:
    """SIGKILL the job's executor while it runs tasks of a stage that reads shuffle output.

    The map output of that shuffle lies on the executor (no external shuffle service), so its
    loss makes Spark re-run the map stage too. Polling a running job for that moment races it: on
    a loaded machine the stages after the shuffle can end between two polls. So once the executor
    is up the test steps it: it runs for a short slice, is frozen (SIGSTOP: none of its tasks can
    end), and the driver is asked, while nothing moves, whether a shuffle was written and which
    tasks the executor holds. Before the kill the executor stays frozen a second longer, so task
    ends it sent just before it froze reach the driver, and the driver is asked again. Returns the
    application, the executor, the stage and the tasks (stage id, partition) the executor held.
    """
    api = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    deadline = time.monotonic() + 300
    app_id, seen, pid, shuffled = None, "the driver's UI never answered", None, False
    while pid is None and not done.is_set() and time.monotonic() < deadline:
        try:
            if app_id is None:
                ours = {app["id"] for app in _get(f"{cluster['ui']}/json/")["activeapps"]}
                app_id = next((app["id"] for app in _get(api) if app["id"] in ours), None)
            else:
                pids = _executor_pids(cluster, app_id)
                seen = f"executors: {pids}"
                if len(pids) == 1:
                    [(executor_id, pid)] = pids.items()
        except (OSError, ValueError, KeyError):
            pass  # the driver's UI is not up yet
        time.sleep(0.05)
    while pid is not None and not done.is_set() and time.monotonic() < deadline:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            break  # the executor is gone: the job ended
        try:
            shuffled = shuffled or any(
                s["shuffleWriteBytes"] > 0 for s in _get(f"{api}/{app_id}/stages?status=complete")
            )
            seen = "no shuffle output yet"
            if shuffled and _running_tasks(api, app_id, executor_id):
                time.sleep(1.0)
                held = _running_tasks(api, app_id, executor_id)
                if held:
                    os.kill(pid, signal.SIGKILL)
                    return {"app_id": app_id, "executor_id": executor_id, "held": held}
            seen = "shuffle output written, and at no step was a task running on the executor"
        except (OSError, ValueError, KeyError):
            pass  # the driver answered slowly; the next step asks again
        finally:
            with contextlib.suppress(ProcessLookupError):  # the killed one may be reaped already
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)
    raise AssertionError(f"the executor of {app_id} was not killed mid-job; last seen: {seen}")


def _events(events: Path, app_id: str) -> list[dict]:
    [log] = [p for p in events.iterdir() if p.name.startswith(app_id)]
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _check_the_loss(log: list[dict], kill: dict) -> str:
    """What Spark's event log must show of the kill, as one line for the test's output.

    The killed executor was removed while a job ran and a replacement registered; it held running
    tasks when it died (the ones the driver listed while it was frozen, at least): each was launched
    on it and ended with ExecutorLostFailure naming it, no other executor lost a task, and every
    lost partition then succeeded on the replacement, launched after the loss.
    """
    removed = [e for e in log if e["Event"] == "SparkListenerExecutorRemoved"]
    assert [e["Executor ID"] for e in removed] == [kill["executor_id"]], removed
    lost_at = removed[0]["Timestamp"]
    jobs = {e["Job ID"]: [e["Submission Time"]] for e in log if e["Event"] == "SparkListenerJobStart"}
    for e in log:
        if e["Event"] == "SparkListenerJobEnd":
            jobs[e["Job ID"]].append(e["Completion Time"])
            assert e["Job Result"]["Result"] == "JobSucceeded", e
    assert any(start <= lost_at <= end for start, end in jobs.values()), (lost_at, jobs)
    added = [e["Executor ID"] for e in log if e["Event"] == "SparkListenerExecutorAdded"]
    assert len(added) == 2 and added[0] == kill["executor_id"], added
    task_ends = [e for e in log if e["Event"] == "SparkListenerTaskEnd"]
    lost = {
        (e["Stage ID"], e["Task Info"]["Partition ID"]): e
        for e in task_ends
        if e["Task End Reason"]["Reason"] == "ExecutorLostFailure"
        and e["Task End Reason"]["Executor ID"] == kill["executor_id"]
        and e["Task Info"]["Executor ID"] == kill["executor_id"]
    }
    assert lost, f"no task of executor {kill['executor_id']} ended with ExecutorLostFailure: it held none"
    assert set(kill["held"]) <= set(lost), (kill["held"], sorted(lost))
    lost_on = {
        e["Task End Reason"]["Executor ID"]
        for e in task_ends
        if e["Task End Reason"]["Reason"] == "ExecutorLostFailure"
    }
    assert lost_on == {kill["executor_id"]}, lost_on  # no other executor lost a task
    rerun = {}
    for e in task_ends:
        key = (e["Stage ID"], e["Task Info"]["Partition ID"])
        if (
            key in lost
            and e["Task End Reason"]["Reason"] == "Success"
            and e["Task Info"]["Executor ID"] == added[1]
            and e["Task Info"]["Launch Time"] >= lost_at
        ):
            rerun[key] = e
    assert set(lost) == set(rerun), (
        f"lost {sorted(lost)}, succeeded again on executor {added[1]}: {sorted(rerun)}"
    )
    reason = next(iter(lost.values()))["Task End Reason"].get("Loss Reason")
    return (
        f"killed executor {kill['executor_id']} holding tasks (stage, partition) {kill['held']}; "
        f"{len(lost)} tasks lost ({reason}), each succeeded again on executor {added[1]} "
        f"(stage attempts {sorted({e['Stage Attempt ID'] for e in rerun.values()})})"
    )


def _rows(uri: str) -> dict[str, list[dict]]:
    """Every row of a prepared folder (per split) or of a quarantine, in a stable order."""
    import pyarrow.parquet as pq

    folder = Path(uri)
    return {
        part.name: sorted(
            pq.read_table(part, partitioning=None).to_pylist(),
            key=lambda row: json.dumps(row, sort_keys=True),
        )
        for part in sorted(folder.glob("split=*")) or [folder]
    }


def _comparable(summary: dict) -> dict:
    """A summary without the locations, which name the lake it was written to."""
    return {k: v for k, v in summary.items() if k not in ("prepared_uri", "quarantine_uri")}


@pytest.mark.spark
def test_a_lost_executor_in_prepare_data_is_replaced_and_the_output_and_fingerprint_do_not_change(
    standalone_cluster, source_and_tokenizer, spark, free_port, tmp_path, monkeypatch
):
    from sparktune.core.params import parse_params
    from sparktune.data.prepare_publish import run_prepare

    source, tokenizer = source_and_tokenizer
    # The undisturbed run: what the job runs (run_prepare), on the tests' local session.
    calm = run_prepare(
        spark, parse_params({"source_uri": str(source)}), str(tokenizer), str(tmp_path / "calm")
    )

    host, port = standalone_cluster["master"].rsplit(":", 1)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": host, "port": int(port)})
    )
    # spark-submit comes with the pyspark wheel; the driver binds to loopback, as on the stack.
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    ui_port, events = free_port(), tmp_path / "events"
    operator = _operator(source, tokenizer, tmp_path / "lake", ui_port, events)
    ti = SimpleNamespace(dag_id="llm_finetune", run_id="lost-executor", task_id="prepare_data", try_number=1)
    outcome: dict = {}
    done = threading.Event()

    def run():
        try:
            outcome["summary"] = operator.execute({"ti": ti, "params": {}})
        except BaseException as exc:  # reported below
            outcome["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        kill = _kill_the_executor_mid_job(standalone_cluster, ui_port, done)
    finally:
        thread.join(600)
        if thread.is_alive():
            operator.on_kill()
    assert "summary" in outcome, f"the job did not survive the lost executor: {outcome.get('error')}"
    summary = outcome["summary"]

    # Spark's own record of the kill (see _check_the_loss).
    print(_check_the_loss(_events(events, kill["app_id"]), kill))

    # The output: the same fingerprint, rows, splits, quarantine and counts as the undisturbed run.
    assert summary["data_fingerprint"] == calm["data_fingerprint"]
    assert _comparable(summary) == _comparable(calm)
    assert _rows(summary["prepared_uri"]) == _rows(calm["prepared_uri"])
    assert _rows(summary["quarantine_uri"]) == _rows(calm["quarantine_uri"])
