"""Process-global state a test may change only if it puts it back (used by tests/conftest.py).

Every test runs in the one pytest process, so what one test leaves set, every later test inherits:
an environment variable, MLflow's global tracking URI (``mlflow.set_tracking_uri`` sets a module
global that wins over ``MLFLOW_TRACKING_URI``, so a later ``monkeypatch.setenv`` of the variable is
silently ignored), the active experiment or run, the working directory, ``sys.path``, a setting of
the shared Spark session. :func:`snapshot` reads all of it as one flat dict, :func:`differences`
names what changed, :func:`restore` puts it back, and :func:`mlflow_restored` is the context
manager a test or fixture uses around code that sets MLflow's globals (the operators' MLflow client
does, on purpose: ``mlflow.register_model`` uses the fluent API).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")
# Set by pytest or by libraries for themselves, once or on their own schedule; none is a test's
# doing: pytest names the running test; pyspark's first SparkContext sets two variables for its
# Python workers (and puts its userFiles folder on sys.path, see _spark_files); importing sklearn
# sets the KMP_ ones; torch's inductor records its cache folder; MLflow's telemetry its session.
_NOT_GUARDED = {
    "PYTEST_CURRENT_TEST",
    "SPARK_AUTH_SOCKET_TIMEOUT",
    "SPARK_BUFFER_SIZE",
    "KMP_DUPLICATE_LIB_OK",
    "KMP_INIT_AT_FORK",
    "TORCHINDUCTOR_CACHE_DIR",
    "_MLFLOW_TELEMETRY_SESSION_ID",
}
# The session's name: every job's main() asks the builder for one (sparktune-prepare_data, ...) and
# getOrCreate gives the tests' shared session that name; nothing reads it.
_SPARK_NOT_GUARDED = {"spark.app.name"}
# Values of these are never printed: connections and credentials.
_SECRET = re.compile(r"CONN|PASSWORD|TOKEN|SECRET|KEY|CREDENTIAL", re.IGNORECASE)


def _mlflow_globals() -> dict[str, Any]:
    """MLflow's module globals (what ``set_tracking_uri``, ``set_registry_uri``, ``set_experiment``
    and ``start_run`` change), or all None while mlflow is not imported (its import sets none)."""
    if "mlflow" not in sys.modules:
        return dict.fromkeys(("tracking_uri", "registry_uri", "experiment_id", "active_run"))
    # Private names, read because the public getters fall back to the environment and would hide
    # the difference between "set globally" and "taken from MLFLOW_TRACKING_URI".
    from mlflow.tracking import fluent
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    run = fluent.active_run()
    return {
        "tracking_uri": tracking_utils._tracking_uri,
        "registry_uri": registry_utils._registry_uri,
        "experiment_id": fluent._active_experiment_id,
        "active_run": run.info.run_id if run is not None else None,
    }


def snapshot(spark: Any = None) -> dict[tuple[str, str], Any]:
    """Everything guarded, as ``{(kind, name): value}``; ``spark``: a session whose runtime settings
    count too (the tests' shared one)."""
    state: dict[tuple[str, str], Any] = {
        ("env", k): v for k, v in os.environ.items() if k not in _NOT_GUARDED
    }
    state.update({("mlflow", k): v for k, v in _mlflow_globals().items()})
    state[("process", "cwd")] = os.getcwd()
    state[("process", "sys.path")] = tuple(p for p in sys.path if not _spark_files(p))
    if spark is not None:
        state.update(
            {("spark conf", k): v for k, v in spark.conf.getAll.items() if k not in _SPARK_NOT_GUARDED}
        )
    return state


def _spark_files(path: str) -> bool:
    """The folder a SparkContext puts on sys.path when it starts (its files from ``addFile``)."""
    return os.sep + "userFiles-" in path


def _show(key: tuple[str, str], value: Any) -> str:
    if value is None:
        return "unset"
    if key[0] == "env" and _SECRET.search(key[1]):
        return "<hidden>"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def differences(before: dict, after: dict) -> list[str]:
    """One line per guarded item that differs, naming it and both values."""
    lines = []
    for key in sorted(set(before) | set(after), key=str):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if key == ("process", "sys.path"):
            added = [p for p in new if p not in old]
            removed = [p for p in old if p not in new]
            lines.append(
                f"process sys.path: added {added}, removed {removed}"
                + ("" if added or removed else ", reordered")
            )
        else:
            lines.append(f"{key[0]} {key[1]}: {_show(key, old)} -> {_show(key, new)}")
    return lines


def _set_mlflow_globals(values: dict[str, Any]) -> None:
    if "mlflow" not in sys.modules:
        return
    import mlflow
    from mlflow.tracking import fluent
    from mlflow.tracking._model_registry import utils as registry_utils

    while mlflow.active_run() is not None and mlflow.active_run().info.run_id != values["active_run"]:
        mlflow.end_run()
    # The public setter, so that what hangs off the URI (the tracer provider) is reset too; it also
    # writes MLFLOW_TRACKING_URI, which the caller restores with the rest of the environment.
    mlflow.set_tracking_uri(values["tracking_uri"])
    registry_utils._registry_uri = values["registry_uri"]
    fluent._active_experiment_id = values["experiment_id"]


def restore(state: dict[tuple[str, str], Any], spark: Any = None) -> None:
    """Put back what :func:`snapshot` read (the environment last: MLflow's setters write it)."""
    _set_mlflow_globals({k[1]: v for k, v in state.items() if k[0] == "mlflow"})
    env = {k[1]: v for k, v in state.items() if k[0] == "env"}
    for name in set(os.environ) - set(env) - _NOT_GUARDED:
        del os.environ[name]
    os.environ.update(env)
    if os.getcwd() != state[("process", "cwd")]:
        os.chdir(state[("process", "cwd")])
    saved = list(state[("process", "sys.path")])
    sys.path[:] = saved[:1] + [p for p in sys.path if _spark_files(p)] + saved[1:]
    if spark is not None:
        conf = {k[1]: v for k, v in state.items() if k[0] == "spark conf"}
        now = {k: v for k, v in spark.conf.getAll.items() if k not in _SPARK_NOT_GUARDED}
        for name in set(now) - set(conf):
            spark.conf.unset(name)
        for name, value in conf.items():
            if now.get(name) != value:
                spark.conf.set(name, value)


@contextlib.contextmanager
def restored(spark: Any = None) -> Iterator[None]:
    """Everything :func:`snapshot` reads as it was before the block, after it (for a module-scoped
    fixture, which cannot use monkeypatch)."""
    state = snapshot(spark)
    try:
        yield
    finally:
        restore(state, spark)


@contextlib.contextmanager
def mlflow_restored() -> Iterator[None]:
    """MLflow's globals (tracking and registry URI, active experiment and run) and the variables
    its setters write (``MLFLOW_TRACKING_URI``, ...) as they were before the block, after it."""
    saved_env = {name: os.environ.get(name) for name in MLFLOW_ENV}
    saved = _mlflow_globals()
    try:
        yield
    finally:
        _set_mlflow_globals(saved)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
