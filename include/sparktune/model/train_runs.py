"""The MLflow runs and checkpoints of one ``train_key``: the finished run to reuse, the run and checkpoint a
crashed attempt left to resume from, and the runs to close; the result a finished run recorded.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sparktune.model.train_request import TrainRequest, TrainResult
from sparktune.model.training_setup import CHECKPOINTS, TrainingInputError

logger = logging.getLogger(__name__)

TRAIN_KEY_TAG = "sparktune.train_key"
MODEL_URI_TAG = "sparktune.model_uri"
RESULT_ARTIFACT = "train_result.json"
RESUMED_FROM_TAG = "sparktune.resumed_from_step"


def experiment_id_for(client: Any, request: TrainRequest) -> str:
    """The id of the request's experiment, created when missing; a deleted one is a bad input."""
    from sparktune.core.experiments import (
        DeletedExperimentError,
        default_artifact_location,
        get_or_create_experiment,
    )

    location = request.artifact_location or default_artifact_location(request.mlflow_tracking_uri)
    try:
        return get_or_create_experiment(client, request.experiment_name, location)
    except DeletedExperimentError as exc:
        raise TrainingInputError(str(exc)) from exc


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def find_finished_run(client: Any, experiment_id: str, train_key: str) -> str | None:
    """The id of the newest FINISHED run tagged with ``train_key`` whose model was logged and verified."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TRAIN_KEY_TAG}` = '{_quote(train_key)}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=20,
    )
    for run in runs:
        # The tag is set only after the logged model was loaded back and matched.
        if run.data.tags.get(MODEL_URI_TAG):
            return run.info.run_id
    return None


def load_finished_result(client: Any, experiment_name: str, train_key: str) -> dict[str, Any] | None:
    """The ``TrainResult`` (as a dict) of the finished run of ``train_key``, or None if there is none;
    ``client``: an ``MlflowClient`` on the server the training logged to.

    This is how a caller learns the outcome whatever ran the training (a local process, a Spark
    application or a Databricks job): through the MLflow run, not through a local file.
    """
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    run_id = find_finished_run(client, experiment.experiment_id, train_key)
    if run_id is None:
        return None
    local = client.download_artifacts(run_id, RESULT_ARTIFACT)
    return TrainResult.from_dict(json.loads(Path(local).read_text())).to_dict()


def finished_result(run_id: str) -> TrainResult:
    """The result the finished run ``run_id`` recorded, marked reused."""
    import mlflow

    raw = mlflow.artifacts.load_dict(f"runs:/{run_id}/{RESULT_ARTIFACT}")
    result = TrainResult.from_dict(raw)
    result.reused = True
    return result


def unfinished_runs(client: Any, experiment_id: str, train_key: str) -> list[Any]:
    """Runs of this key that an earlier attempt left behind (RUNNING, FAILED or KILLED), newest first."""
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TRAIN_KEY_TAG}` = '{_quote(train_key)}' and attributes.status != 'FINISHED'",
        order_by=["attributes.start_time DESC"],
    )


def close_abandoned_runs(client: Any, runs: list[Any], train_key: str) -> None:
    """Mark runs a killed attempt left RUNNING as KILLED, so the UI shows one live run per key."""
    for run in runs:
        if run.info.status == "RUNNING":
            logger.warning(
                "Run %s of train_key %s was left RUNNING by an earlier attempt and has no checkpoint to "
                "resume from; marking it KILLED.",
                run.info.run_id,
                train_key,
            )
            client.set_terminated(run.info.run_id, status="KILLED")


def last_checkpoint(output_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint under ``output_dir/checkpoints`` and its global step.

    transformers' ``get_last_checkpoint`` returns the highest-numbered folder, even one a crash cut
    mid-save. The Trainer writes ``trainer_state.json`` after the weights, optimizer and scheduler,
    so a checkpoint whose state parses is whole; a newer one whose state does not is passed over.
    """
    folder = output_dir / CHECKPOINTS
    if not folder.is_dir():
        return None
    for path in _numbered_checkpoints(folder):
        try:
            return path, int(json.loads((path / "trainer_state.json").read_text())["global_step"])
        except (OSError, ValueError, KeyError):
            logger.warning("%s is incomplete (a crash cut its save); looking at the one before.", path)
    return None


def _numbered_checkpoints(folder: Path) -> list[Path]:
    """``checkpoint-<step>`` folders, newest step first."""
    steps = {}
    for path in folder.iterdir():
        step = path.name.removeprefix("checkpoint-")
        if path.is_dir() and path.name.startswith("checkpoint-") and step.isdigit():
            steps[int(step)] = path
    return [steps[step] for step in sorted(steps, reverse=True)]


def first_logged_loss(run_id: str) -> float | None:
    """The run's training loss at its first logged step, or None before any."""
    from mlflow import MlflowClient

    history = MlflowClient().get_metric_history(run_id, "train_loss")
    return min(history, key=lambda m: m.step).value if history else None


def write_result(output_dir: Path, result: TrainResult) -> None:
    """Write ``result`` to ``output_dir/result.json`` atomically."""
    path = output_dir / "result.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(result.to_json())
    tmp.replace(path)
