"""The ``databricks`` backend of ``TrainModelOperator``: a one-time run on a new job cluster.

The run is a ``python_wheel_task`` calling the ``sparktune-train`` console script of the sparktune
wheel, i.e. the same entry point as the local and spark backends (``sparktune.jobs.train``). It is
submitted through the Databricks provider's ``DatabricksHook`` (``jobs/runs/submit``) with the train
key as ``idempotency_token``: a retry that submits again gets the run of its key back instead of a
second cluster. A run of the key that already ended without success is not reattached to (that would
fail every retry the same way): the retry submits under the next token of the key, ``<key>-1``,
``<key>-2``, ... so each attempt owns at most one run and the failed ones keep their logs.

Sync and deferrable paths end in the same ``execute_complete``, as in the provider's operators; the
result itself comes from MLflow (``_finish``), where the job logged it under the train key.
"""

from __future__ import annotations

import json
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

# The Databricks provider is imported where it is used: its operators module loads Airflow's ORM
# models and its hooks aiohttp, which every DAG file importing TrainModelOperator paid at parse time.
if TYPE_CHECKING:
    from airflow.providers.databricks.exceptions import DatabricksApiError
    from airflow.providers.databricks.hooks.databricks import DatabricksHook, RunState
    from sparktune.core.params import PipelineParams

TASK_KEY = "train"
PACKAGE_NAME = "sparktune"
ENTRY_POINT = "sparktune-train"  # [project.scripts] in pyproject.toml
# Runs of one key that ended without success before a retry gives up looking for a free token.
MAX_RUNS_PER_KEY = 50
# Databricks keeps an idempotency token to 64 characters.
MAX_TOKEN_LENGTH = 64
# Environment of the job cluster's driver and workers. PYSPARK_PYTHON is the runtime's own
# interpreter (what the Databricks UI sets on every new cluster); TorchDistributor forks tokenizers.
SPARK_ENV_VARS = {
    "PYSPARK_PYTHON": "/databricks/python3/bin/python3",
    "TOKENIZERS_PARALLELISM": "false",
}
# A cluster of 0 workers runs Spark only with the single-node profile (driver as executor).
SINGLE_NODE_SPARK_CONF = {"spark.databricks.cluster.profile": "singleNode", "spark.master": "local[*]"}
SINGLE_NODE_TAGS = {"ResourceClass": "SingleNode"}


def run_token(train_key: str, attempt: int = 0) -> str:
    """The ``idempotency_token`` of the ``attempt``-th run of a train key (0: the key itself)."""
    token = train_key if attempt == 0 else f"{train_key}-{attempt}"
    if len(token) > MAX_TOKEN_LENGTH:
        raise ValueError(f"idempotency token {token!r} is longer than {MAX_TOKEN_LENGTH} characters")
    return token


def build_run_payload(
    request: dict[str, Any],
    params: PipelineParams,
    *,
    idempotency_token: str | None = None,
    timeout_seconds: int | None = None,
) -> dict[str, Any]:
    """The ``jobs/runs/submit`` body: one ``python_wheel_task`` on a new job cluster.

    ``request`` is the train request (as the operator builds it); ``idempotency_token`` defaults
    to its ``train_key``. ``timeout_seconds`` (optional) makes Databricks end the run as TIMEDOUT.
    """
    new_cluster: dict[str, Any] = {
        "spark_version": params.databricks_runtime,
        "node_type_id": params.databricks_node_type,
        "num_workers": params.databricks_workers,
        "spark_env_vars": dict(SPARK_ENV_VARS),
    }
    if params.databricks_workers == 0:
        new_cluster["spark_conf"] = dict(SINGLE_NODE_SPARK_CONF)
        new_cluster["custom_tags"] = dict(SINGLE_NODE_TAGS)
    payload: dict[str, Any] = {
        "run_name": request["run_name"],
        "idempotency_token": idempotency_token or run_token(request["train_key"]),
        "tasks": [
            {
                "task_key": TASK_KEY,
                "new_cluster": new_cluster,
                "libraries": [{"whl": params.databricks_wheel}],
                "python_wheel_task": {
                    "package_name": PACKAGE_NAME,
                    "entry_point": ENTRY_POINT,
                    "parameters": [
                        "--request-json",
                        json.dumps(request, sort_keys=True),
                        "--num-workers",
                        str(params.num_workers),
                        "--distributor",
                        "spark" if params.num_workers > 1 else "none",
                    ],
                },
            }
        ],
    }
    if timeout_seconds:
        payload["timeout_seconds"] = int(timeout_seconds)
    return payload


def _api_error_detail(exc: DatabricksApiError) -> str:
    """``ERROR_CODE: message`` from the response body of a failed API call, else the exception text."""
    response = getattr(exc.__cause__, "response", None)
    try:
        body = response.json() if response is not None else None
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("message"):
        return f"{body.get('error_code', 'ERROR')}: {body['message']}"
    return str(exc)


def _local_paths(request: dict[str, Any]) -> list[str]:
    """Request fields that point at this machine's disk, which a job cluster cannot read."""
    shared_prefixes = ("/dbfs/", "/Volumes/", "/Workspace/")
    found = []
    uri = request.get("mlflow_tracking_uri", "")
    if uri.startswith(("sqlite:", "file:")) or uri.startswith("/"):
        found.append(f"mlflow_tracking_uri={uri}")
    for name in ("dataset_path", "output_dir"):
        value = str(request.get(name, ""))
        if value.startswith("/") and not value.startswith(shared_prefixes):
            found.append(f"{name}={value}")
    return found


class DatabricksTrainingMixin:
    """Adds the databricks backend to ``TrainModelOperator`` (which sets the attributes below)."""

    databricks_conn_id: str
    deferrable: bool
    polling_period_seconds: int
    databricks_run_id: int | None
    # The hook's own retries of one API call (connection errors, 429, 5xx).
    databricks_retry_limit: int = 3
    databricks_retry_delay: float = 1.0

    @cached_property
    def _databricks_hook(self) -> DatabricksHook:
        from airflow.providers.databricks.hooks.databricks import DatabricksHook

        return DatabricksHook(
            self.databricks_conn_id,
            retry_limit=self.databricks_retry_limit,
            retry_delay=self.databricks_retry_delay,
            caller=type(self).__name__,
        )

    # -- execution

    def _execute_databricks(
        self, context: Any, request: dict[str, Any], params: PipelineParams
    ) -> dict[str, Any]:
        from airflow.providers.databricks.hooks.databricks import RunState
        from airflow.providers.databricks.operators.databricks import XCOM_RUN_ID_KEY, XCOM_RUN_PAGE_URL_KEY
        from airflow.providers.databricks.triggers.databricks import DatabricksExecutionTrigger

        hook = self._databricks_hook
        self._require_connection(hook)
        local = _local_paths(request)
        if local:
            self.log.warning(
                "The Databricks run reads these from the cluster, where local paths of this worker do "
                "not exist: %s. Point SPARKTUNE_HOME, SPARKTUNE_LAKE_URI and MLFLOW_TRACKING_URI at "
                "storage the cluster shares (/Volumes, /dbfs, s3://..., an MLflow server).",
                ", ".join(local),
            )
        run_id, run = self._submit_or_reattach(hook, request, params)
        self.databricks_run_id = run_id
        run_page_url = run.get("run_page_url") or hook.get_run_page_url(run_id)
        ti = context["ti"]
        ti.xcom_push(key=XCOM_RUN_ID_KEY, value=run_id)
        ti.xcom_push(key=XCOM_RUN_PAGE_URL_KEY, value=run_page_url)
        state = RunState(**run["state"])
        self.log.info(
            "Databricks run %s is %s; logs and Spark UI: %s", run_id, state.life_cycle_state, run_page_url
        )
        if not state.is_terminal:
            if self.deferrable:
                self.defer(
                    trigger=DatabricksExecutionTrigger(
                        run_id=run_id,
                        databricks_conn_id=self.databricks_conn_id,
                        polling_period_seconds=self.polling_period_seconds,
                        retry_limit=self.databricks_retry_limit,
                        retry_delay=self.databricks_retry_delay,
                        run_page_url=run_page_url,
                        caller=type(self).__name__,
                    ),
                    method_name="execute_complete",
                )
            state = self._poll_until_terminal(hook, run_id, run_page_url)
            run = hook.get_run(run_id)
        return self.execute_complete(context, self._completion_event(hook, run_id, run_page_url, run, state))

    def _require_connection(self, hook: DatabricksHook) -> None:
        try:
            hook.databricks_conn  # noqa: B018 - resolves (and caches) the connection
        except AirflowNotFoundException as exc:
            conn_id = self.databricks_conn_id
            raise AirflowFailException(
                f"train_backend=databricks needs the Airflow connection {conn_id!r}, which is not "
                f"defined. Create it (type databricks, host = the workspace URL, password = a "
                f'personal access token), e.g. AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": '
                f'"databricks", "host": "https://<workspace>.cloud.databricks.com", "password": '
                f'"<token>"}}\', or pass databricks_conn_id= an existing connection.'
            ) from exc

    def _submit_or_reattach(
        self, hook: DatabricksHook, request: dict[str, Any], params: PipelineParams
    ) -> tuple[int, dict[str, Any]]:
        """The run of this key that is live or succeeded, submitting one when there is none."""
        from airflow.providers.databricks.hooks.databricks import RunState

        execution_timeout = getattr(self, "execution_timeout", None)
        timeout = int(execution_timeout.total_seconds()) if execution_timeout else None
        for attempt in range(MAX_RUNS_PER_KEY):
            token = run_token(request["train_key"], attempt)
            payload = build_run_payload(request, params, idempotency_token=token, timeout_seconds=timeout)
            run_id = self._submit(hook, payload, params)
            run = hook.get_run(run_id)
            state = RunState(**run["state"])
            self.log.info(
                "Databricks run %s for idempotency token %s: %s (the same token always returns this run)",
                run_id,
                token,
                state.life_cycle_state,
            )
            if not state.is_terminal or state.is_successful:
                return run_id, run
            self.log.warning(
                "Run %s of token %s ended %s: %s (%s). Submitting a new run under the next token.",
                run_id,
                token,
                state.result_state or state.life_cycle_state,
                state.state_message,
                run.get("run_page_url"),
            )
        raise AirflowFailException(
            f"{MAX_RUNS_PER_KEY} Databricks runs of train key {request['train_key']} ended without "
            "success; see their run pages before clearing this task again."
        )

    def _submit(self, hook: DatabricksHook, payload: dict[str, Any], params: PipelineParams) -> int:
        from airflow.providers.databricks.exceptions import DatabricksApiError

        try:
            return hook.submit_run(payload)
        except DatabricksApiError as exc:
            detail = _api_error_detail(exc)
            if exc.http_status_code == 400:
                raise AirflowFailException(
                    f"Databricks rejected the run (HTTP 400, {detail}). A retry would send the same "
                    f"payload: fix the databricks params (databricks_runtime={params.databricks_runtime!r}, "
                    f"databricks_node_type={params.databricks_node_type!r}, databricks_workers="
                    f"{params.databricks_workers}, databricks_wheel={params.databricks_wheel!r}) so the "
                    f"workspace accepts them, then clear the task."
                ) from exc
            if exc.http_status_code in (401, 403):
                raise AirflowFailException(
                    f"Databricks refused the credentials of connection {self.databricks_conn_id!r} "
                    f"(HTTP {exc.http_status_code}, {detail}). Put a valid token in the connection's "
                    "password, with permission to create job runs, then clear the task."
                ) from exc
            raise

    def _poll_until_terminal(self, hook: DatabricksHook, run_id: int, run_page_url: str) -> RunState:
        while True:
            time.sleep(self.polling_period_seconds)
            state = hook.get_run_state(run_id)
            if state.is_terminal:
                return state
            self.log.info(
                "Databricks run %s: %s %s (%s)",
                run_id,
                state.life_cycle_state,
                state.state_message,
                run_page_url,
            )

    @staticmethod
    def _completion_event(
        hook: DatabricksHook, run_id: int, run_page_url: str, run: dict[str, Any], state: RunState
    ) -> dict[str, Any]:
        """The event ``DatabricksExecutionTrigger`` fires, built for a run that ended already."""
        from airflow.providers.databricks.utils.databricks import extract_failed_task_errors

        return {
            "run_id": run_id,
            "run_page_url": run_page_url,
            "run_state": state.to_json(),
            "repair_run": False,
            "errors": extract_failed_task_errors(hook, run, state),
        }

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """The end of both paths: raise for a run that did not succeed, else read its MLflow result."""
        from airflow.providers.databricks.hooks.databricks import RunState
        from airflow.providers.databricks.utils.databricks import validate_trigger_event

        validate_trigger_event(event)
        self.databricks_run_id = event["run_id"]
        state = RunState.from_json(event["run_state"])
        # As the provider's own operators end a deferred run (without repair): its page, then its state.
        self.log.info("View run status, Spark UI, and logs at %s", event["run_page_url"])
        if not state.is_successful:
            errors = "; ".join(f"{e.get('task_key')}: {e.get('error')}" for e in event.get("errors") or [])
            cause = state.state_message.rstrip(".") + (f" ({errors})" if errors else "")
            raise AirflowException(
                f"Databricks run {event['run_id']} ended {state.result_state or state.life_cycle_state}: "
                f"{cause}. Run page (logs, Spark UI): {event['run_page_url']}. A retry submits a new "
                "run; a live run of the key is reattached."
            )
        self.log.info("Job run completed successfully.")
        # A deferred task resumes in a new process: its params are parsed again, once.
        request = self._request(context, self._params())
        try:
            return self._finish(request)
        except AirflowException as exc:
            # Another submit of the key returns this same successful run: a retry cannot help.
            raise AirflowFailException(
                f"Databricks run {event['run_id']} succeeded, but this worker finds no finished MLflow "
                "run tagged with its train key. The job logs to the request's MLflow tracking URI as "
                "the cluster resolves it: point MLFLOW_TRACKING_URI at a server both the cluster and "
                f"the Airflow workers reach ('databricks' or http(s)://...). "
                f"Run page: {event['run_page_url']}"
            ) from exc

    def _cancel_databricks(self) -> None:
        run_id = self.databricks_run_id
        self.log.info("Cancelling Databricks run %s.", run_id)
        try:
            self._databricks_hook.cancel_run(run_id)
        except AirflowException as exc:
            self.log.warning("Could not cancel Databricks run %s: %s", run_id, exc)
