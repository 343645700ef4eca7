"""``SmokeTestOperator``: loads the promoted alias as a user would and predicts on sample rows, before
``champion`` moves to it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow.core.domain_cli import raise_for_exit_code, run_module
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.task_context import task_scratch_dir, templated_bool


class SmokeTestOperator(UsesMLflowConnection, BaseOperator):
    """Loads ``models:/NAME@alias`` with ``mlflow.pyfunc`` as a user would and predicts on sample rows.

    Every answer must be a label; load time and per-row latency go to the training run and to the
    version's tags. A model that fails stops here (``AirflowFailException``): the alias after it
    (``champion``) never moves to a model users could not call.

    :param model_name: (templated) the registered model name.
    :param version: (templated) the version ``alias`` must point at; if another run moved it,
        the task fails at once.
    :param dataset_uri: (templated) the ``DatasetDict`` the sample rows come from.
    :param run_id: (templated) the MLflow run that receives the latency metrics.
    :param alias: the alias loaded, as a user would load it (default ``staging``).
    :param rows: how many rows are predicted, one by one and as a batch (default 16).
    :param max_invalid_rate: (templated) the share of rows whose answer may be no label or differ
        between the row alone and in a batch (default 0: none may).
    :param trust_remote_code: (templated) load a model that ships its own code (default False).
    """

    template_fields: Sequence[str] = (
        "model_name",
        "version",
        "dataset_uri",
        "run_id",
        "max_invalid_rate",
        "trust_remote_code",
    )

    def __init__(
        self,
        *,
        model_name: str,
        version: str,
        dataset_uri: str,
        run_id: str,
        alias: str = "staging",
        rows: int = 16,
        max_invalid_rate: float = 0.0,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.version = version
        self.dataset_uri = dataset_uri
        self.run_id = run_id
        self.alias = alias
        self.rows = rows
        self.max_invalid_rate = max_invalid_rate
        self.trust_remote_code = trust_remote_code

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.release.registry import alias_version

        client = self.mlflow_hook.get_conn()
        current = alias_version(client, self.model_name, self.alias)
        if current != str(self.version):
            raise AirflowFailException(
                f"{self.model_name}@{self.alias} is version {current}, not {self.version} that this run "
                f"promoted; another run moved it. Re-run this DAG run's promotion from evaluate."
            )
        output = task_scratch_dir(context) / "smoke.json"
        model_uri = f"models:/{self.model_name}@{self.alias}"
        trust = templated_bool(self.trust_remote_code)
        result = run_module(
            "sparktune.jobs.smoke_test",
            *("--model-uri", model_uri, "--dataset-path", self.dataset_uri, "--rows", str(self.rows)),
            *("--max-invalid-rate", str(float(self.max_invalid_rate)), "--output", str(output)),
            *("--trust-remote-code", "true" if trust else "false"),
            env=self.mlflow_hook.process_env(),
        )
        raise_for_exit_code(f"smoke test of {model_uri}", result.exit_code, result.output)
        summary = json.loads(output.read_text())
        for name, value in summary["metrics"].items():
            client.log_metric(self.run_id, name, value)
            client.set_model_version_tag(self.model_name, str(self.version), name, f"{value:.3f}")
        self.log.info("smoke test of %s passed: %s", model_uri, json.dumps(summary["metrics"]))
        return {"model_uri": model_uri, "version": str(self.version), **summary["metrics"]}
