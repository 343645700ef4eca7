"""MLflow experiments the pipeline writes to (training runs, the alias audit trail), found or created
in one way."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class DeletedExperimentError(ValueError):
    """The experiment exists but is deleted; the message says how to restore it."""


def default_artifact_location(tracking_uri: str) -> str | None:
    """Beside the database for a SQLite store; the server decides otherwise (None).

    MLflow's default for a database store is ./mlruns under the current directory, which scatters
    artifacts wherever the task happens to run (the repository for `make demo` and the tests)."""
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "artifacts").resolve().as_uri()
    return None


def get_or_create_experiment(client: Any, name: str, artifact_location: str | None = None) -> str:
    """The id of the active experiment ``name``, created (safe against a concurrent create) when
    missing, with ``artifact_location`` or :func:`default_artifact_location`."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise DeletedExperimentError(
                f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore "
                f"--experiment-id {experiment.experiment_id}) or use another name."
            )
        return experiment.experiment_id
    location = artifact_location or default_artifact_location(client.tracking_uri)
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:
        # Another task created it between our lookup and create.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id
