"""Session-wide test environment: state in a temp folder, Spark workers on this interpreter."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path

import pytest

# Set before any sparktune/airflow import so nothing a test does can touch the user's .local/.
_SESSION_HOME = Path(tempfile.mkdtemp(prefix="sparktune-test-"))
# Forced, not defaults: `make test` inherits the Makefile's SPARKTUNE_HOME (the user's .local/), and a
# user's shell may point AIRFLOW_HOME or MLFLOW_TRACKING_URI at real servers.
os.environ["SPARKTUNE_HOME"] = str(_SESSION_HOME)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["AIRFLOW_HOME"] = str(_SESSION_HOME / "airflow")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# The Spark JVMs the tests start (the session's driver, the standalone clusters, spark-submit jobs)
# listen on loopback, as `make test` has them (Makefile): Spark's default binds its UIs to every
# interface and its RPC to the address the host name resolves to.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# MLflow's own default is sqlite:///mlflow.db in the working directory (the repository root): a
# test that reaches MLflow without a store of its own gets this one. A test that sets
# SPARKTUNE_HOME and wants that home's store sets MLFLOW_TRACKING_URI too (settings() prefers the
# variable); tests/e2e strips it so DAG runs use their SPARKTUNE_HOME's embedded store.
(_SESSION_HOME / "mlflow").mkdir()
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_HOME / 'mlflow' / 'mlflow.db'}"
# Under xdist each worker gets its share of the cores for torch and every process it starts (DAG
# runs' training, evaluation, Spark's Python workers). Left at torch's default (all cores) two
# trainings on two cores spin on each other's threads: a step of the tiny model went from 0.09 s to
# 2-7 s, and the e2e chain's training from 9 s to 49 s.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))

# Airflow's first import puts $AIRFLOW_HOME/config and /plugins on sys.path, once per process: done
# here, before any test.
import airflow  # noqa: E402, F401

# py4j logs "Closing down clientserver connection" from __del__ at exit, after pytest closed the streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


# Parallel runs (`make test`: pytest-xdist, `-n 2 --dist loadscope --no-loadscope-reorder`). A worker
# takes a group whole: by default a group is one module, so a module's fixtures (a DAG run's home,
# a trained model) are built once; modules that share a session fixture share a group. Groups go
# out in the order below, the longest first, so that no long one starts when the rest is done.
SHARED_GROUPS = {
    "tests/stack/": "stack",  # one native stack per session
    "tests/serving/": "serving",  # one registry of the keyword model's versions per session
    "tests/operators/test_spark_faults.py": "standalone-cluster",
    "tests/operators/test_train_backends.py": "standalone-cluster",
    # tests/unit/tiny_model.trained keeps a trained model per process: one worker trains it once;
    # tiny_model.workspace (the tiny model, its data, an MLflow store), which the classification and
    # training-method tests train from too, is built once per process.
    **dict.fromkeys(
        (
            "tests/unit/test_training.py",
            "tests/unit/test_evaluation.py",
            "tests/unit/test_inference.py",
            "tests/unit/test_smoke.py",
            "tests/unit/test_classification.py",
            "tests/unit/test_training_methods.py",
        ),
        "tiny-model-trained",
    ),
    # Evidently's import costs a process 4 s of CPU: one worker pays it.
    "tests/unit/test_drift.py": "drift",
    "tests/operators/test_monitor_operator.py": "drift",
}
# make test-fast's groups are ordered by their time there (test-output/suite_timing.json), below the
# longer ones only make test runs; the groups left out take seconds each and fill in at the end.
LONGEST_FIRST = (
    "tests/e2e/test_llm_finetune_dag.py",
    "stack",
    "tests/e2e/test_real_models.py",
    "tests/e2e/test_llm_finetune_failures.py",
    "standalone-cluster",
    "tests/operators/test_registry_outage.py",
    "tests/operators/test_databricks_token.py",
    "tests/e2e/test_example_dags.py",
    "tests/e2e/test_rollback_champion_dag.py",
    "tests/operators/test_train_databricks.py",
    "tiny-model-trained",
    "tests/unit/test_prepare.py",
    "tests/unit/test_feedback.py",
    "tests/unit/test_review_queue.py",
    "drift",
    "tests/unit/test_bad_inputs.py",
    "tests/unit/test_registry.py",
    "tests/unit/test_quality.py",
    "serving",
    "tests/unit/test_materialize.py",
    "tests/unit/test_base_model.py",
    "tests/operators/test_plugin.py",
    "tests/operators/test_spark_submit.py",
)


# Last in their group: the approval runs move the stack's aliases, which the other stack modules check
# on the REST run's model version.
LAST_IN_GROUP = ("tests/stack/test_approval.py",)


def _group(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return next((group for prefix, group in SHARED_GROUPS.items() if path.startswith(prefix)), path)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controlling process, which sees every worker's reports
        try:
            from tests.suite_timing import SuiteTiming
        except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
            from suite_timing import SuiteTiming
        config.pluginmanager.register(SuiteTiming(_group), "sparktune-suite-timing")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}

    def order(item: pytest.Item) -> tuple[int, bool]:
        return rank.get(_group(item.nodeid), len(rank)), item.nodeid.split("::")[0] in LAST_IN_GROUP

    items.sort(key=order)  # stable: a group's order kept otherwise


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` with a scope per group (above) instead of per module.

    pytest-xdist's own ``--dist loadgroup`` (``xdist_group`` marks) does not group under pytest 9:
    it renames ``item._nodeid``, which pytest 9 no longer reads. Its documented scheduler hook
    does the same job without pytest's internals.
    """
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

        def _reschedule(self, node) -> None:
            # xdist hands a worker its next group once two of its tests are left; with two long
            # tests left (a DAG run each) the group waited behind them while the other worker ran
            # out of work. A worker runs a test only once it knows the next one, so the next group
            # goes out when one test is left: the least that keeps the worker going.
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return GroupScheduling(config, log)


def _shared_base_model(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The built-in base model (``tiny-llama``), built once per machine for this code and shared by
    every test run and clone on it.

    Building it is about 50 s of CPU (a tokenizer and 400 pre-training steps; minutes on a busy
    machine), and the first DAG run of a test run waited for it. The build is deterministic for the
    same ``sparktune`` sources and torch, transformers and tokenizers releases, so those name its
    folder in the user's cache: another clone or test run of the same code reuses it, and a change
    to the builder builds anew. Building it is tested in tests/unit/test_base_model.py.
    """
    from importlib.metadata import version

    from sparktune.core.config import TINY_BASE_MODEL
    from sparktune.core.provenance import code_fingerprint
    from sparktune.model.base_model import ensure_base_model

    releases = "-".join(version(name) for name in ("torch", "transformers", "tokenizers"))
    key = hashlib.sha256(f"{code_fingerprint()}|{releases}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparktune"
    # ensure_base_model builds under a file lock and renames a finished folder into place: concurrent
    # workers and test runs build it once, and a build cut short leaves nothing to reuse.
    return Path(ensure_base_model(TINY_BASE_MODEL, cache / "test-base-models" / key))


@pytest.fixture(scope="session")
def install_base_model(tmp_path_factory, worker_id):
    """A function that copies the session's built-in base model into a SPARKTUNE_HOME, where
    ``resolve_base_model`` looks, as on a deployment that built it before.

    The model is built (or waited for) at the first call, not when the fixture is set up: the
    worker that does not build it starts its own work meanwhile (the stack starts its services
    first, and installs the model before its first run).
    """
    import shutil

    from sparktune.core.config import Settings

    def install(home: Path) -> None:
        built = _shared_base_model(tmp_path_factory, worker_id)
        shutil.copytree(built, Settings(home=home).tiny_base_model_dir)

    return install


def shared_real_model(tmp_path_factory: pytest.TempPathFactory, worker_id: str, base_model: str) -> Path:
    """A real checkpoint (a name of sparktune.model.packaged_models or a .gguf path) resolved once per
    test run into a folder the workers share: converting SmolLM2's GGUF file costs 25-80 s.

    One models folder for every value: ensure_base_model keys a GGUF conversion by the file's content,
    so ``smollm2-135m-instruct`` and the path of its file share one conversion."""
    from filelock import FileLock
    from sparktune.model.base_model import ensure_base_model

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent
    with FileLock(str(shared / "shared-real-models.lock")):
        return Path(ensure_base_model(base_model, shared / "shared-real-models"))


@pytest.fixture(scope="session")
def real_base_model(tmp_path_factory, worker_id):
    """A function: base_model value -> its folder, built once per test run (see shared_real_model)."""
    return lambda base_model: shared_real_model(tmp_path_factory, worker_id, base_model)


def _shared_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A folder every xdist worker of this test run sees (each has a basetemp of its own under it)."""
    shared = tmp_path_factory.getbasetemp()
    return shared.parent if worker_id != "master" else shared


# Variables the test session set for unit tests; an embedded home uses its own state instead.
_SESSION_STATE = ("AIRFLOW_HOME", "MLFLOW_TRACKING_URI", "SPARKTUNE_LAKE_URI")


def _embedded_home_template(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A SPARKTUNE_HOME with a migrated Airflow database (and the runner's stamp of its schema) and a
    created MLflow store, made once per test run: ``airflow db migrate`` and MLflow's first schema
    migration cost each end-to-end home about 15 s of CPU otherwise. A deployment has both before its
    first run. A first run in an empty home, which makes them itself as ``make demo`` does, is
    tests/e2e/test_example_dags.py's (its home is not made from this one)."""
    from filelock import FileLock

    shared = _shared_dir(tmp_path_factory, worker_id)
    template = shared / "embedded-home-template"
    with FileLock(str(shared / "embedded-home-template.lock")):
        if not (template / ".ready").is_file():
            from sparktune.core.config import Settings
            from sparktune.core.mlflow_client import mlflow_client
            from sparktune_dev.embedded.environment import embedded_env, ensure_airflow_db

            base = {k: v for k, v in os.environ.items() if k not in _SESSION_STATE}
            ensure_airflow_db(embedded_env(template, base=base))
            client = mlflow_client(Settings(home=template).embedded_mlflow_uri)
            client.search_experiments(max_results=1)  # creates the store's tables
            client.search_registered_models(max_results=1)
            (template / ".ready").touch()
    return template


@pytest.fixture(scope="session")
def embedded_home(tmp_path_factory, worker_id):
    """A function: name -> a new SPARKTUNE_HOME for DAG runs on embedded defaults, its Airflow
    database migrated and its MLflow store created (copied from one made once per test run)."""
    import shutil

    from sparktune.core.config import Settings
    from sparktune_dev.embedded.environment import MIGRATED_STAMP

    def make(name: str) -> Path:
        template = Settings(home=_embedded_home_template(tmp_path_factory, worker_id))
        home = tmp_path_factory.mktemp(name)
        settings = Settings(home=home)
        settings.airflow_home.mkdir(parents=True)
        for file in ("airflow.db", MIGRATED_STAMP):
            shutil.copy2(template.airflow_home / file, settings.airflow_home / file)
        settings.mlflow_dir.mkdir(parents=True)
        shutil.copy2(template.mlflow_dir / "mlflow.db", settings.mlflow_dir / "mlflow.db")
        return home

    return make


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every test that needs one (a JVM start costs seconds)."""
    from pyspark.sql import SparkSession
    from sparktune.data.spark_jvm import short_job_conf

    session = (
        SparkSession.builder.master("local[1]")
        # What the pipeline's drivers take on a small input (every input here is): C1 alone, the
        # serial collector and the class archive. With the JVM's defaults this driver, which lives
        # for the whole run, spent ~45 % more CPU (test_prepare.py: 90 s of JVM CPU, 50 s with these).
        .config(map=short_job_conf({}, 0))
        .appName("sparktune-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


# --- MLflow's process state: no test leaves it changed --------------------------------------------
# The operators' MLflow client carries its server and credentials itself, and the domain points
# MLflow's fluent API at a server only inside sparktune.model.process_setup.using_tracking_uri, which
# puts it back. A global tracking URI or MLFLOW_* variable left behind would quietly send every later
# test's MLflow calls in this process elsewhere (the global wins over a monkeypatched variable).


def _mlflow_state() -> dict[str, object]:
    state: dict[str, object] = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
    if "mlflow" in sys.modules:  # importing it sets none of these
        from mlflow.tracking import fluent
        from mlflow.tracking._tracking_service import utils

        run = fluent.active_run()
        state["tracking URI (mlflow.set_tracking_uri)"] = utils._tracking_uri
        state["active experiment"] = fluent._active_experiment_id
        state["active run"] = run.info.run_id if run else None
    return {k: v for k, v in state.items() if v is not None}


@pytest.fixture(autouse=True)
def _mlflow_state_unchanged():
    before = _mlflow_state()
    yield
    after = _mlflow_state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"the test left MLflow's process state changed (names only): {changed}"
