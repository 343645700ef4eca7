"""RegisterModelOperator's version tags: a value the run could not tell is left out, not "None"."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
from mlflow.tracking import MlflowClient
from sparktune.model.process_setup import using_tracking_uri
from sparktune_airflow import RegisterModelOperator

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store


class _EchoModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def _trained_run(uri: str, experiment: str) -> str:
    """A run with a logged model, as training leaves one; the operator then runs without MLflow's
    globals pointing anywhere."""
    experiment_id = MlflowClient(uri).create_experiment(experiment)
    with using_tracking_uri(uri), mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.pyfunc.log_model(name="model", python_model=_EchoModel(), pip_requirements=[])
    return run.info.run_id


def test_a_tag_without_a_value_is_left_out(tmp_path, monkeypatch):
    uri = new_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run_id = _trained_run(uri, "register-tags")
    # A catalog table has no source signature: the DAG's template renders None.
    tags = {"data_fingerprint": "fp1", "source_signature": None, "base_model": ""}
    task = RegisterModelOperator(task_id="register", run_id=run_id, model_name="m", tags=tags)
    ti = SimpleNamespace(dag_id="llm_finetune", run_id="manual__1", task_id="register", try_number=1)
    context = {"ti": ti, "params": {}, "task": task}
    task.pre_execute(context)
    version = task.execute(context)["version"]
    registered = MlflowClient(uri).get_model_version("m", version).tags
    assert registered["data_fingerprint"] == "fp1"
    assert "source_signature" not in registered and "base_model" not in registered


def test_the_feedback_counts_and_overrides_file_reach_the_run_from_any_filesystem(tmp_path, monkeypatch):
    import fsspec

    uri = new_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # The overrides file of a data version in a lake fsspec reaches (memory:// stands in for s3://).
    with fsspec.open("memory://lake/sources/v1/_label_overrides.csv", "w") as remote:
        remote.write("text_key,text,old_label,new_label\nk,where is my parcel,billing,shipping\n")
    run_id = _trained_run(uri, "register-feedback")
    task = RegisterModelOperator(
        task_id="register",
        run_id=run_id,
        model_name="m",
        run_artifacts={"feedback_summary": {"labels_changed": 3, "added_rows": 2}},
        # An unchanged source has no overrides file: its empty URI is skipped.
        run_files={"feedback": ["memory://lake/sources/v1/_label_overrides.csv", ""]},
    )
    ti = SimpleNamespace(dag_id="llm_finetune", run_id="manual__1", task_id="register", try_number=1)
    context = {"ti": ti, "params": {}, "task": task}
    task.pre_execute(context)
    task.execute(context)
    client = MlflowClient(uri)
    logged = [f.path for f in client.list_artifacts(run_id, "feedback")]
    metrics = client.get_run(run_id).data.metrics
    copied = client.download_artifacts(run_id, "feedback/_label_overrides.csv", str(tmp_path))
    assert logged == ["feedback/_label_overrides.csv"]
    assert "where is my parcel,billing,shipping" in Path(copied).read_text()
    assert (metrics["feedback.labels_changed"], metrics["feedback.added_rows"]) == (3, 2)
