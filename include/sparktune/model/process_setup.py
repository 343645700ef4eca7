"""Process-wide state a model process (training, evaluation, smoke test, serving) sets: where its logs
go, and which MLflow tracking server the fluent API talks to for a block.
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
    """Point MLflow's fluent API at ``uri`` for a block, then restore what the caller had.

    ``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI`` in the environment, which would
    otherwise leak into everything the process does afterwards.
    """
    import mlflow

    saved = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        # None also unsets the environment variable.
        mlflow.set_tracking_uri(saved)
