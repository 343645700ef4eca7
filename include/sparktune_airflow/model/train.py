"""``TrainModelOperator``: the training entry point (``sparktune.jobs.train``) on the run's backend
(a local process, spark-submit or Databricks), reattached to by a retry."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.configuration import conf
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseOperator, ResumableJobMixin
from airflow.sdk.exceptions import AirflowException
from sparktune.core.config import DEFAULT_MODEL_NAME, settings
from sparktune.core.params import (
    PipelineParams,
    PreparationRecipe,
    TrainingBackend,
    TrainingRecipe,
    combined,
    config_hash,
)
from sparktune.data.spark_jvm import short_job_conf
from sparktune_airflow.core.domain_cli import raise_for_exit_code
from sparktune_airflow.core.lineage import ReportsLineage
from sparktune_airflow.core.links import DatabricksRunLink, MLflowRunLink
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.spark_jobs import job_path
from sparktune_airflow.core.task_context import typed_params
from sparktune_airflow.model import training_process
from sparktune_airflow.model.databricks_training import DatabricksTrainingMixin

# What get_job_status reports of a training process on this host.
_RUNNING = "running"
_ENDED = "ended"


# What the training process is sent (and logs as the run's params): the sections it reads.
_TRAINING_FIELDS = frozenset(
    (*TrainingRecipe.model_fields, *TrainingBackend.model_fields, *PreparationRecipe.model_fields)
)


class TrainModelOperator(
    UsesMLflowConnection, ReportsLineage, DatabricksTrainingMixin, ResumableJobMixin, BaseOperator
):
    """Submits the training entry point (``sparktune.jobs.train``) to the run's ``train_backend``.

    - ``local``: a process on this worker, its log streamed into the task log.
    - ``spark``: ``spark-submit`` (client mode) to the ``spark_conn_id`` master; the job runs DDP
      over ``num_workers`` executor processes with ``TorchDistributor``.
    - ``databricks``: a one-time run on a new job cluster (``databricks_conn_id``), deferrable,
      with a link to the run page.

    The submission key is dag/run/task + data fingerprint + config hash. A retry reuses a
    finished MLflow run of its key; otherwise it reattaches to the live training instead of
    starting a second one: the process, found through Airflow's task state store
    (``ResumableJobMixin``, key ``sparktune_training``: host, pid, start time, log), or the
    Databricks run, found through the key's idempotency token. A process on another host cannot
    be reattached to: the retry fails saying where it runs and how to go on. Otherwise training
    resumes from the key's last checkpoint into the same MLflow run. ``on_kill`` stops the process
    or cancels the Databricks run. Returns the finished MLflow run's ``train_result.json``
    (``mlflow_run_id``, training metrics). MLflow is the ``mlflow_conn_id`` connection's server.

    :param dataset_uri: (templated) the ``DatasetDict`` folder ``MaterializeDatasetOperator`` wrote
        (with ``dataset_mode=streaming``: the prepared Parquet).
    :param base_model: (templated) what ``ResolveBaseModelOperator`` returned.
    :param data_fingerprint: (templated) the data version: part of the submission key, tagged on
        the MLflow run.
    :param model_name: (templated) the registered model: its MLflow experiment receives the run.
    :param training: (templated) the recipe (:class:`sparktune.core.params.TrainingRecipe` or a
        dict of its fields); missing names (or None) take their defaults, unset recipe fields come
        from the base model's recipe.
    :param backend: (templated) ``train_backend``, ``num_workers``, ``databricks_*``,
        ``train_timeout_minutes`` (:class:`sparktune.core.params.TrainingBackend` or a dict).
    :param preparation: (templated) the data's ``prompt_template`` and ``max_length``, which the
        logged model scores with (:class:`sparktune.core.params.PreparationRecipe` or a dict).
    :param config_hash: (templated) the run's config hash (``ValidateParamsOperator``'s), part of
        the submission key and tagged on the run; None: the hash of the sections given here.
    :param spark_conn_id: the Spark connection of ``train_backend=spark`` (default ``spark_default``).
    :param spark_conf: extra Spark conf for that spark-submit.
    :param databricks_conn_id: the Databricks connection of ``train_backend=databricks`` (default
        ``databricks_default``).
    :param deferrable: with ``train_backend=databricks``, wait in the triggerer instead of a worker
        slot; default: ``[operators] default_deferrable``.
    :param polling_period_seconds: how often a Databricks run's state is checked (default 30).
    """

    # Where the task state store keeps the training process of this task (ResumableJobMixin).
    external_id_key = "sparktune_training"
    template_fields: Sequence[str] = (
        "dataset_uri",
        "base_model",
        "data_fingerprint",
        "model_name",
        "training",
        "backend",
        "preparation",
        "config_hash",
    )
    operator_extra_links = (DatabricksRunLink(), MLflowRunLink())

    def __init__(
        self,
        *,
        dataset_uri: str,
        base_model: str,
        data_fingerprint: str,
        model_name: str = DEFAULT_MODEL_NAME,
        training: Any = None,
        backend: Any = None,
        preparation: Any = None,
        config_hash: str | None = None,
        spark_conn_id: str = "spark_default",
        spark_conf: dict[str, Any] | None = None,
        databricks_conn_id: str = "databricks_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        polling_period_seconds: int = 30,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("multiple_outputs", True)  # mlflow_run_id is read by the tasks after it
        super().__init__(**kwargs)
        self.dataset_uri = dataset_uri
        self.base_model = base_model
        self.data_fingerprint = data_fingerprint
        self.model_name = model_name
        self.training = training
        self.backend = backend
        self.preparation = preparation
        self.config_hash = config_hash
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.databricks_conn_id = databricks_conn_id
        self.deferrable = deferrable
        self.polling_period_seconds = polling_period_seconds
        self.databricks_run_id: int | None = None
        self._submission: training_process.Submission | None = None
        self._child: subprocess.Popen | None = None
        self._state_store: Any = None
        self._process_request: tuple[dict[str, Any], PipelineParams] | None = None
        self._result: dict[str, Any] | None = None

    # -- the key and the request

    def _params(self) -> PipelineParams:
        """The three sections as one typed set, for the training code, which reads only them."""
        return combined(
            typed_params(TrainingRecipe, self.training, "training"),
            typed_params(TrainingBackend, self.backend, "backend"),
            typed_params(PreparationRecipe, self.preparation, "preparation"),
        )

    def _config_hash(self, params: PipelineParams) -> str:
        return str(self.config_hash or "").strip() or config_hash(params)

    def _train_key(self, context: Any, params: PipelineParams) -> str:
        ti = context["ti"]
        key_source = (
            f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{self.data_fingerprint}/{self._config_hash(params)}"
        )
        return hashlib.sha256(key_source.encode()).hexdigest()[:24]

    def _work_dir(self, train_key: str) -> Path:
        """Checkpoints, the process record and the log of one train key; shared by its attempts."""
        return settings().models_dir / "runs" / train_key

    def _request(self, context: Any, params: PipelineParams) -> dict[str, Any]:
        ti = context["ti"]
        train_key = self._train_key(context, params)
        return {
            "dataset_path": self.dataset_uri,
            "base_model": self.base_model,
            "output_dir": str(self._work_dir(train_key)),
            "params": {k: v for k, v in params.to_dict().items() if k in _TRAINING_FIELDS},
            "mlflow_tracking_uri": self.mlflow_hook.tracking_uri(),
            "artifact_location": settings().mlflow_artifact_root,
            "experiment_name": experiment_name(str(self.model_name)),
            "train_key": train_key,
            "run_name": f"{ti.dag_id}-{ti.run_id}"[:250],
            "tags": {
                "sparktune.data_fingerprint": self.data_fingerprint,
                "sparktune.config_hash": self._config_hash(params),
                "sparktune.train_backend": params.train_backend,
                "airflow.dag_id": ti.dag_id,
                "airflow.run_id": ti.run_id,
                "airflow.task_id": ti.task_id,
                "airflow.try_number": str(ti.try_number),
                "sparktune.base_model": self.base_model,
            },
        }

    # -- execution

    def pre_execute(self, context: Any) -> None:
        super().pre_execute(context)
        # A DAG file is parsed before a run has params, so the time limit comes from the run's
        # train_timeout_minutes here: Airflow reads execution_timeout after pre_execute.
        minutes = self._params().train_timeout_minutes
        self.execution_timeout = timedelta(minutes=minutes)
        self.log.info("time limit of this training: %g minutes (train_timeout_minutes)", minutes)

    def execute(self, context: Any) -> dict[str, Any]:
        params = self._params()
        request = self._request(context, params)
        self.log.info(
            "train key %s, backend %s, work dir %s",
            request["train_key"],
            params.train_backend,
            request["output_dir"],
        )
        finished = self._finished_result(request)
        if finished is not None:
            # Nothing to submit: an earlier attempt trained this key to the end.
            self.log.info("Reusing finished MLflow run %s: nothing trained.", finished["mlflow_run_id"])
            return self._keep({**finished, "reused": True})
        if params.train_backend == "databricks":
            return self._execute_databricks(context, request, params)
        return self._execute_process(context, request, params)

    def _process_command(self, request: dict[str, Any], params: PipelineParams, work: Path) -> list[str]:
        work.mkdir(parents=True, exist_ok=True)
        request_path = work / "train_request.json"
        request_path.write_text(json.dumps(request, indent=2))
        if params.train_backend == "local":
            return [sys.executable, "-m", "sparktune.jobs.train", "--request", str(request_path)]
        hook = SparkSubmitHook(
            conn_id=self.spark_conn_id,
            name=f"sparktune-train-{request['train_key']}",
            # The class archive only: training is long, so the JVM keeps its compiler and collector.
            conf=short_job_conf({"spark.log.level": "WARN", **(self.spark_conf or {})}, None),
            application_args=[
                "--request",
                str(request_path),
                "--num-workers",
                str(params.num_workers),
                "--distributor",
                "spark",
            ],
        )
        # The hook resolves the connection (master, deploy mode, spark-submit binary, queue,
        # principal) into the command; the process itself is started here so that a retry can
        # find it again (see training_process).
        return hook._build_spark_submit_command(job_path("train"))

    def _execute_process(
        self, context: Any, request: dict[str, Any], params: PipelineParams
    ) -> dict[str, Any]:
        self._process_request = (request, params)
        self._state_store = context.get("task_state_store")
        return self.execute_resumable(context)

    # -- ResumableJobMixin: the external id is the Submission (host, pid, start time, log)

    def submit_job(self, context: Any) -> dict[str, Any]:
        request, params = self._process_request
        work = Path(request["output_dir"])
        command = self._process_command(request, params, work)
        self.log.info("Starting: %s", " ".join(command))
        env = self.mlflow_hook.process_env()  # the MLflow connection's server and credentials
        # spark-submit comes with the pyspark wheel, beside this interpreter, whether or not
        # the worker's PATH has the virtual environment on it.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        self._child, self._submission = training_process.start(command, env, work, params.train_backend)
        return self._submission.to_json()

    def get_job_status(self, external_id: Any, context: Any) -> str:
        submission = training_process.Submission.from_json(external_id)
        if submission.ended:
            return _ENDED
        if not submission.on_this_host():
            # A finished MLflow run was looked for first: this one has not finished, and starting
            # here would train the key a second time beside a process this host cannot see.
            request, _ = self._process_request
            raise AirflowException(self._elsewhere_message(context, request, submission))
        return _RUNNING if submission.process() is not None else _ENDED

    def is_job_active(self, status: str) -> bool:
        return status == _RUNNING

    def is_job_succeeded(self, status: str) -> bool:
        # A training that finished left its MLflow run, which execute() reuses before asking here;
        # an ended process without one is resumed from its last checkpoint by a new submission.
        return False

    def poll_until_complete(self, external_id: Any, context: Any) -> dict[str, Any]:
        submission = training_process.Submission.from_json(external_id)
        child = self._child if self._submission == submission else None
        if child is None:
            self.log.info(
                "Reattaching to training process %d (%s) on %s, started by an earlier attempt; "
                "its log follows.",
                submission.pid,
                submission.backend,
                submission.host,
            )
        self._submission = submission
        exit_code, last_line = training_process.follow(submission, self.log.info, child=child)
        self._mark_ended()
        if child is not None:
            raise_for_exit_code("training", exit_code, last_line)
        # The mixin returns what this returns when it reattached, and get_job_result's otherwise.
        return self.get_job_result(external_id, context)

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, Any]:
        if self._result is None:
            request, _ = self._process_request
            self._result = self._finish(request)
        return self._result

    def _mark_ended(self) -> None:
        """The process exited (or was stopped): a retry on any host may train the key again."""
        if self._submission is not None and self._state_store is not None:
            self._state_store.set(self.external_id_key, self._submission.ended_now().to_json())

    def _elsewhere_message(
        self, context: Any, request: dict[str, Any], submission: training_process.Submission
    ) -> str:
        ti = context["ti"]
        key_path = (
            f"/api/v2/dags/{ti.dag_id}/dagRuns/{quote(ti.run_id, safe='')}/taskInstances/{ti.task_id}"
            f"/state-store/{self.external_id_key}"
        )
        return (
            f"Training of key {request['train_key']} was started on host {submission.host} (pid "
            f"{submission.pid}, log {submission.log_path}) by an earlier attempt, and this attempt runs on "
            f"{training_process.this_host()}, which cannot reattach to it. While it runs, each retry fails "
            "here; once it has finished its MLflow run, the next retry (or a clear of this task) reuses it. "
            f"If it no longer runs there (or host {submission.host} is gone), delete the task state key "
            f"(DELETE {key_path}) and clear this task: training resumes from the last checkpoint."
        )

    def _finished_result(self, request: dict[str, Any]) -> dict[str, Any] | None:
        from sparktune.model.train_runs import load_finished_result

        return load_finished_result(
            self.mlflow_hook.get_conn(), request["experiment_name"], request["train_key"]
        )

    def _finish(self, request: dict[str, Any]) -> dict[str, Any]:
        """The result of the finished MLflow run of this task's train key, whatever ran it."""
        outcome = self._finished_result(request)
        if outcome is None:
            raise AirflowException(
                f"Training of key {request['train_key']} ended without a finished MLflow run; the retry "
                "resumes from its last checkpoint."
            )
        self.log.info("training result: %s", json.dumps(outcome, sort_keys=True))
        return self._keep(outcome)

    def _lineage(self):
        """The dataset -> the model the MLflow run logged."""
        from sparktune_airflow.core.lineage import train_lineage

        return train_lineage(
            self._lineage_result,
            str(self.dataset_uri),
            self.data_fingerprint,
            self.mlflow_hook.tracking_uri(),
        )

    def on_kill(self) -> None:
        submission = self._submission
        if submission is not None:
            self.log.info("Stopping training process %d.", submission.pid)
            training_process.stop(submission)
            # Stopped for good: a retry on another worker host may train the key again.
            self._mark_ended()
        if self.databricks_run_id is not None:
            self._cancel_databricks()


def experiment_name(model_name: str) -> str:
    """The MLflow experiment of a registered model's training runs."""
    return f"sparktune-{model_name}"
