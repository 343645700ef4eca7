"""RegisterModelOperator's version tags: a value the run could not tell is left out, not "None"."""

from __future__ import annotations

from types import SimpleNamespace

import mlflow
from mlflow.tracking import MlflowClient
from sparktune_airflow import RegisterModelOperator

try:
    from tests import leak_guard
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import leak_guard


class _EchoModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def test_a_tag_without_a_value_is_left_out(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with leak_guard.mlflow_restored():
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("register-tags")
        with mlflow.start_run() as run:
            mlflow.pyfunc.log_model(name="model", python_model=_EchoModel(), pip_requirements=[])
        # A catalog table has no source signature: the DAG's template renders None.
        tags = {"data_fingerprint": "fp1", "source_signature": None, "base_model": ""}
        task = RegisterModelOperator(task_id="register", run_id=run.info.run_id, model_name="m", tags=tags)
        ti = SimpleNamespace(dag_id="llm_finetune", run_id="manual__1", task_id="register", try_number=1)
        context = {"ti": ti, "params": {}, "task": task}
        task.pre_execute(context)
        version = task.execute(context)["version"]
        registered = MlflowClient(uri).get_model_version("m", version).tags
    assert registered["data_fingerprint"] == "fp1"
    assert "source_signature" not in registered and "base_model" not in registered
