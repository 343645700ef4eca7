"""Process-wide state a model process (training, evaluation, smoke test, serving) sets: where its logs
go, and which MLflow tracking server the fluent API talks to for a block (and nothing after it).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def configure_process_logging() -> None:
    """Send this process's logs, the libraries' included, to stdout, which the Airflow task streams."""
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from datasets.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    # Progress bars redraw with carriage returns, which a task log shows as noise.
    disable_progress_bars()
    hf_logging.disable_progress_bar()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


@contextmanager
def using_tracking_uri(uri: str) -> Iterator[None]:
    """Point MLflow's fluent API at ``uri`` for a block, then put MLflow's global tracking URI back.

    The one place the domain sets MLflow's globals: ``mlflow.start_run`` and the logging calls under
    it, ``mlflow.pyfunc.log_model``, and loading or downloading a ``models:/`` URI
    (``mlflow.pyfunc.load_model``, ``mlflow.artifacts.download_artifacts``) reach the server the
    process points at and take no client; everything else takes an ``MlflowClient``. After the block
    the global and ``MLFLOW_TRACKING_URI`` (which ``mlflow.set_tracking_uri`` writes) are as before:
    a global that was only the variable's value is left unset, not pinned. The block passes
    ``experiment_id=`` rather than calling ``mlflow.set_experiment``, which would outlive it.
    """
    import mlflow

    saved_env = os.environ.get("MLFLOW_TRACKING_URI")
    # The global, if one is set: what get_tracking_uri answers other than the variable's value.
    saved = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None if saved == saved_env else saved)
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env
