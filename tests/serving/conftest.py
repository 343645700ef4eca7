"""Fixtures the serving tests share: a real MLflow registry with keyword-rule pyfunc versions, and
settings for a real server on it (the harness is in serving_harness.py)."""

from __future__ import annotations

import pytest

try:
    from tests.serving.serving_harness import KEYWORD_MODEL, V1_CONFIG, V2_CONFIG, LoggedVersion, Registry
except ImportError:  # tests/ is not a package: pytest put tests/ and this folder on sys.path
    from serving_harness import KEYWORD_MODEL, V1_CONFIG, V2_CONFIG, LoggedVersion, Registry

try:
    from tests.mlflow_store import new_store
except ImportError:  # tests/ is not a package: pytest put tests/ on sys.path
    from mlflow_store import new_store


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> Registry:
    """A SQLite registry with local artifacts holding the keyword model logged twice."""
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature
    from sparktune.model.process_setup import using_tracking_uri

    root = tmp_path_factory.mktemp("serving-registry")
    uri = new_store(root / "mlflow.db")
    signature = infer_signature(
        pd.DataFrame({"text": ["a refund please"]}), pd.DataFrame({"prediction": ["x"], "score": [0.5]})
    )
    uris = []
    with using_tracking_uri(uri):  # the fluent API (log_model takes no client), for this block only
        artifacts = (root / "artifacts").as_uri()
        experiment = mlflow.create_experiment("serving-tests", artifact_location=artifacts)
        for config in (V1_CONFIG, V2_CONFIG):
            with mlflow.start_run(experiment_id=experiment):
                info = mlflow.pyfunc.log_model(
                    name="model",
                    python_model=str(KEYWORD_MODEL),
                    model_config=config,
                    signature=signature,
                    pip_requirements=["mlflow", "pandas"],
                )
            logged = mlflow.get_logged_model(info.model_id)
            uris.append(LoggedVersion(logged.artifact_location, info.run_id, info.model_id))
    return Registry(uri, root, *uris)


@pytest.fixture
def serving_config(registry, tmp_path):
    """Settings for a server on ``registry`` with captures under ``tmp_path/captures``."""
    from sparktune.serve.settings import ServingSettings

    def make(model_name: str, **overrides) -> ServingSettings:
        values = {
            "model_name": model_name,
            "tracking_uri": registry.tracking_uri,
            "download_dir": str(tmp_path / "downloads"),
            "capture_uri": str(tmp_path / "captures"),
            "poll_seconds": 60.0,
            **overrides,
        }
        return ServingSettings(**values)

    return make
