"""Session-wide test environment: state in a temp folder, Spark workers on this interpreter."""

from __future__ import annotations

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
# MLflow's own default is sqlite:///mlflow.db in the working directory (the repository root): a
# test that reaches MLflow without a store of its own gets this one. A test that sets
# SPARKTUNE_HOME and wants that home's store sets MLFLOW_TRACKING_URI too (settings() prefers the
# variable); tests/e2e strips it so DAG runs use their SPARKTUNE_HOME's embedded store.
(_SESSION_HOME / "mlflow").mkdir()
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_HOME / 'mlflow' / 'mlflow.db'}"
# py4j logs "Closing down clientserver connection" from __del__ at exit, after pytest closed the streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every test that needs one (a JVM start costs seconds)."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("sparktune-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


# --- Leak guard: a test or test module that leaves process-global state changed fails ------------
# What is guarded and why: tests/leak_guard.py. Each test is compared after its function-scoped
# fixtures (monkeypatch included) are torn down with the state before they were set up; each module
# after its module- and class-scoped fixtures are torn down (a fixture may hand the undoing to one it
# depends on, like a module-scoped MonkeyPatch). A session-scoped fixture may set state for the whole
# session: what its setup changes becomes part of what the open module check expects.
try:
    from tests import leak_guard
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import leak_guard

_LEAK_HELP = (
    "restore it: monkeypatch (setenv, chdir, syspath_prepend), or `with leak_guard.mlflow_restored():` "
    "around code that sets MLflow's globals (mlflow.set_tracking_uri, set_experiment, start_run, the "
    "operators' MLflow client), or `with leak_guard.restored():` in a module fixture"
)
_module_checks: dict[str, dict] = {}  # module node id -> the state its fixtures must leave


def _leak_report(what: str, changed: list[str]) -> str:
    return f"{what} left process-global state changed ({_LEAK_HELP}):\n  " + "\n  ".join(changed)


@pytest.fixture(scope="module", autouse=True)
def _no_leaked_process_state_per_module(request):
    module = request.node.nodeid
    _module_checks[module] = leak_guard.snapshot()
    yield
    before = _module_checks.pop(module)
    changed = leak_guard.differences(before, leak_guard.snapshot())
    if changed:
        leak_guard.restore(before)  # so that the next module starts clean and only this one fails
        pytest.fail(_leak_report(f"the module-scoped fixtures of {module}", changed), pytrace=False)


@pytest.fixture(autouse=True)
def _no_leaked_process_state(request):
    spark = request.getfixturevalue("spark") if "spark" in request.fixturenames else None
    before = leak_guard.snapshot(spark)
    yield
    changed = leak_guard.differences(before, leak_guard.snapshot(spark))
    if changed:
        leak_guard.restore(before, spark)  # so that the next test starts clean and only this one fails
        pytest.fail(_leak_report(request.node.nodeid, changed), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope != "session" or not _module_checks:
        return (yield)
    before = leak_guard.snapshot()
    result = yield
    after = leak_guard.snapshot()
    for expected in _module_checks.values():
        for key in set(before) | set(after):
            if before.get(key) != after.get(key):
                if key in after:
                    expected[key] = after[key]
                else:
                    expected.pop(key, None)
    return result


@pytest.fixture
def restore_mlflow_globals():
    """For a test whose code sets MLflow's globals (the operators' MLflow client, training or
    evaluation run in this process): they are put back after it (tests/leak_guard.py)."""
    with leak_guard.mlflow_restored():
        yield
