"""Benchmark: the fixed cost of an ``llm_finetune`` run, everything but training and evaluation.

    make bench-overhead                        # 2,500 generated support tickets
    BENCH_OVERHEAD_ROWS=10000 make bench-overhead

In a fresh home (``$SPARKTUNE_HOME/bench/overhead-home``) as a deployment has it before its first run
(the Airflow database migrated, the MLflow store created, the built-in base model built with its
token counter cached), ``llm_finetune`` runs twice through the embedded runner, as ``make run``
runs it (``airflow dags test``, Spark ``local[*]``):

1. **new data**: the first run on the generated source. Its fixed cost is the run's wall time
   (the runner's process, start to exit) minus what the Airflow database records for ``train``,
   ``evaluate`` and ``smoke_test``: the part of every run that does not grow with training. The run
   trains one step and promotes without rules (``gate_mode=disabled``, smoke test tolerance 1):
   training's and evaluation's own cost is what the training benchmarks measure, not this one.
2. **unchanged source**: the same run again, as a scheduled run on a source nobody touched: its
   whole wall time. It stops before any Spark job (``skip_unchanged_source``).
3. **new training params**: the same files with another learning rate, as when a user tunes a
   recipe: it trains again, and ``prepare_data`` takes the prepared data the first run published
   without a Spark job (``sparktune.data.prepare_reuse``). Its fixed cost is reported; no target.
   ``BENCH_OVERHEAD_RETUNE=0`` leaves this run out.

Right before and right after the run on new data, in the same home, environment and Airflow
database, it measures the **floor** of that fixed cost (``overhead_floor``): what the same process
starts cost with no work in them. ``airflow dags test`` of a no-op DAG with llm_finetune's tasks and
dependencies (through the same runner), one spark-submit of a no-op job with prepare_data's conf
(its driver importing what the preparation job's does), and the imports the tasks pay in the run's
process (the operators, MLflow's client and store, datasets). The floor is the mean of the two
measurements: the shared machine's load drifts within minutes.

Targets: the fixed cost of a run on new data at most 1.5x its floor (a ratio measured side by side
means the same on machines whose speed differs 1.6-1.9x), and at most 15 s, on this 2-core machine,
for a run that has nothing to do. Prints each run's task seconds, the floor's parts beside the fixed
cost, and writes ``$SPARKTUNE_HOME/bench/overhead.json``. Not a test.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import finish, target  # noqa: E402
from overhead_floor import dag_shape, mean_floor, measure_floor  # noqa: E402

DAG_ID = "llm_finetune"
# Tasks whose time grows with the model and data, not the run's fixed cost.
MODEL_TASKS = ("train", "evaluate", "smoke_test")
# The fixed cost of a run on new data, at most this many times the floor measured beside it.
TARGET_FLOOR_RATIO = 1.5
TARGET_UNCHANGED_S = 15.0
# What PrepareDataOperator's spark-submit gets (its name and conf): the floor's no-op job gets the same.
PREPARE_SUBMIT_NAME = "sparktune-prepare_data"
PREPARE_SUBMIT_CONF = {"spark.log.level": "WARN"}
# Variables a developer's shell may point elsewhere; the runs must use the bench home's state.
OWN_STATE = ("AIRFLOW_HOME", "MLFLOW_TRACKING_URI", "SPARKTUNE_LAKE_URI")


# The rest of what a deployment has before its first run, in the home's environment: MLflow's store
# created (a tracking server creates its database when it starts; the first run here would create
# it inside skip_unchanged_source), and the base model's token counter, which building the model in
# this home would have left in its cache (sparktune.model.base_model.cache_token_counter; the model is
# copied, not built, above).
_DEPLOYED = """
import sys
from sparktune.core.config import settings
from sparktune.core.mlflow_client import mlflow_client
from sparktune.data.prepare_tokens import backend_spec

client = mlflow_client(settings().mlflow_tracking_uri)
client.search_experiments(max_results=1)
client.search_registered_models(max_results=1)
backend_spec(sys.argv[1])
"""


def _home() -> Path:
    return Path(os.environ.get("SPARKTUNE_HOME", ROOT / ".local")).expanduser().resolve()


def _source(home: Path) -> Path:
    """The generated source the runs read (the demo data's default location)."""
    return home / "data" / "support_tickets.jsonl"


def _prepare_home(home: Path, rows: int) -> dict[str, str]:
    """A new home with the demo data, the built-in base model and its token counter, a migrated Airflow
    database and an MLflow store: what a deployment has before its first run."""
    from sparktune.core.config import TINY_BASE_MODEL, Settings
    from sparktune.model.base_model import ensure_base_model
    from sparktune_dev.embedded.environment import embedded_env, ensure_airflow_db

    shutil.rmtree(home, ignore_errors=True)
    source = _source(home)
    subprocess.run(
        [sys.executable, "-m", "sparktune_dev.demo_data", "--rows", str(rows), "--out", str(source)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    # Built once into the user's own home (as make demo does), then copied: not a minute per bench.
    built = Path(ensure_base_model(TINY_BASE_MODEL, _home() / "models"))
    model = Settings(home=home).tiny_base_model_dir
    shutil.copytree(built, model)
    base = {k: v for k, v in os.environ.items() if k not in OWN_STATE}
    base["SPARKTUNE_HOME"] = str(home)
    env = embedded_env(home, base=base)
    ensure_airflow_db(env)
    deployed = subprocess.run(
        [sys.executable, "-c", _DEPLOYED, str(model)], env=env, capture_output=True, text=True
    )
    if deployed.returncode != 0:
        raise SystemExit(f"creating the MLflow store or the token counter failed:\n{deployed.stderr[-3000:]}")
    return base


def _run(env: dict[str, str], conf: dict[str, Any], log: Path, dag_id: str = DAG_ID) -> tuple[float, int]:
    """One DAG run through the embedded runner, as ``make run`` starts it: its seconds and exit code."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "sparktune_dev.embedded", "run", "--dag", dag_id, "--conf", json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    log.write_text(result.stdout + result.stderr)
    return seconds, result.returncode


def _task_seconds(home: Path) -> dict[str, dict[str, Any]]:
    """State and seconds of every task of the newest llm_finetune run, from the Airflow database."""
    with sqlite3.connect(home / "airflow" / "airflow.db") as db:
        [(run_id,)] = db.execute(
            "select run_id from dag_run where dag_id = 'llm_finetune' order by id desc limit 1"
        ).fetchall()
        rows = db.execute(
            "select task_id, state, duration from task_instance where dag_id = 'llm_finetune' and run_id = ?",
            (run_id,),
        ).fetchall()
    return {task: {"state": state, "seconds": round(duration or 0.0, 2)} for task, state, duration in rows}


class _Floor:
    """Measures the floor (``overhead_floor``) in this bench's home: a no-op DAG shaped like
    llm_finetune, a no-op spark-submit with prepare_data's conf for this source's size, and the
    imports the tasks pay in the run's process."""

    def __init__(self, env: dict[str, str], home: Path, folder: Path) -> None:
        from sparktune.data.spark_jvm import input_bytes, short_job_conf
        from sparktune_dev.embedded.environment import embedded_env

        shutil.rmtree(folder, ignore_errors=True)
        self.env, self.folder = embedded_env(home, base=env), folder
        self.conf = short_job_conf(PREPARE_SUBMIT_CONF, input_bytes(str(_source(home))))
        self.shape = dag_shape(self.env, ROOT / "dags" / f"{DAG_ID}.py", DAG_ID)
        self.measurements: list[dict[str, Any]] = []

    def measure(self) -> None:
        print(f"floor: the same process starts with no work in them ({len(self.measurements) + 1} of 2)...")
        self.measurements.append(
            measure_floor(
                self.env, self.folder, _run_noop, self.shape, DAG_ID, self.conf, PREPARE_SUBMIT_NAME
            )
        )

    def result(self) -> dict[str, Any]:
        return {**mean_floor(self.measurements), "tasks": len(self.shape)}


def _run_noop(env: dict[str, str], dag_id: str, log: Path) -> tuple[float, int]:
    return _run(env, {}, log, dag_id)


def _print_floor(floor: dict[str, Any], new: dict[str, Any], unchanged: dict[str, Any]) -> None:
    """The floor's parts as measured before and after the run on new data, their means, and the
    runs over the floor (a run on an unchanged source over the floor without its Spark job)."""
    measured = floor["measurements"]
    print(f"\n{'the floor (seconds)':<40}{'before':>10}{'after':>10}{'mean':>10}")
    for key, label in (
        ("dags_test_s", f"airflow dags test, {floor['tasks']} no-op tasks"),
        ("spark_submit_s", "spark-submit of a no-op job"),
        ("imports_s", "imports the tasks pay"),
        ("total_s", "floor"),
    ):
        print(f"{label:<40}" + "".join(f"{m[key]:>10.1f}" for m in measured) + f"{floor[key]:>10.1f}")
    fixed, wall, no_spark = new["fixed_s"], unchanged["wall_s"], floor["dags_test_s"] + floor["imports_s"]
    print(f"fixed cost of a run on new data: {fixed:.1f} s, {fixed / floor['total_s']:.2f}x the floor")
    print(
        f"a run on an unchanged source: {wall:.1f} s, {wall / no_spark:.2f}x the floor without spark-submit"
    )


def main() -> int:
    rows = int(os.environ.get("BENCH_OVERHEAD_ROWS", "2500"))
    out = _home() / "bench"
    home = out / "overhead-home"
    print(f"preparing {home} ({rows:,} rows, base model, Airflow database, MLflow store)...")
    env = _prepare_home(home, rows)
    conf = {"max_steps": 1, "gate_mode": "disabled", "smoke_max_invalid_rate": 1.0}

    runs: list[dict[str, Any]] = []
    retuned = {**conf, "learning_rate": 1e-3}  # the built-in recipe's 2e-3, halved
    plan = [("new data", conf), ("unchanged source", conf), ("new training params", retuned)]
    if os.environ.get("BENCH_OVERHEAD_RETUNE", "1") == "0":
        plan.pop()
    floor = _Floor(env, home, out / "overhead-floor")
    for name, run_conf in plan:
        if name == "new data":
            floor.measure()  # right before and right after the run it is compared with
        print(f"run: {name}...")
        seconds, code = _run(env, run_conf, out / f"overhead-{name.replace(' ', '-')}.log")
        if name == "new data":
            floor.measure()
        tasks = _task_seconds(home)
        model = sum(tasks.get(task, {}).get("seconds", 0.0) for task in MODEL_TASKS)
        runs.append(
            {
                "run": name,
                "exit_code": code,
                "wall_s": round(seconds, 2),
                "model_tasks_s": round(model, 2),
                "fixed_s": round(seconds - model, 2),
                "tasks": tasks,
            }
        )
    ran = all(r["exit_code"] == 0 for r in runs)

    task_ids = list(runs[0]["tasks"])
    print(f"\n{'task':<24}" + "".join(f"{r['run']:>20}" for r in runs))
    for task in task_ids:
        cells = []
        for r in runs:
            info = r["tasks"].get(task)
            cells.append(f"{info['seconds']:>13.1f} {info['state'][:6]:>6}" if info else f"{'-':>20}")
        print(f"{task:<24}" + "".join(cells))
    for key, label in (("wall_s", "wall (runner process)"), ("model_tasks_s", "train+evaluate+smoke"),
                       ("fixed_s", "fixed cost")):  # fmt: skip
        print(f"{label:<24}" + "".join(f"{r[key]:>20.1f}" for r in runs))

    new, unchanged = runs[:2]
    skipped_before_spark = unchanged["tasks"].get("prepare_data", {}).get("state") == "skipped"
    if len(runs) == 3:
        no_spark = "no Spark job" in (out / "overhead-new-training-params.log").read_text()
        runs[2]["prepare_data_without_spark"] = no_spark
        print(f"new training params: prepare_data {'started no' if no_spark else 'ran a'} Spark job")

    measured = floor.result()
    ratio = round(new["fixed_s"] / measured["total_s"], 2) if ran and measured["ran"] else None
    _print_floor(measured, new, unchanged)
    targets = [
        target("fixed cost of a run on new data over its floor", ratio, at_most=TARGET_FLOOR_RATIO, unit="x",
               note=f"{new['fixed_s']:.1f} s of wall minus train, evaluate and smoke_test, over a floor of "
                    f"{measured['total_s']:.1f} s measured beside it"),
        target("a run on an unchanged source", unchanged["wall_s"] if ran and skipped_before_spark else None,
               at_most=TARGET_UNCHANGED_S, unit="s", note="must stop before prepare_data"),
    ]  # fmt: skip
    report = {
        "benchmark": "overhead",
        "rows": rows,
        "runs": runs,
        "floor": measured,
        "fixed_over_floor": ratio,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    if not ran:
        for r in runs:
            log = out / f"overhead-{r['run'].replace(' ', '-')}.log"
            print(f"{r['run']}: exit code {r['exit_code']}; see {log}")
    return finish(out / "overhead.json", report, targets, ran=ran)


if __name__ == "__main__":
    sys.exit(main())
