"""Operators of the fine-tuning pipeline, each a thin shell over one ``sparktune`` function.

Conventions (after the Airflow providers): keyword-only arguments, ``template_fields`` for every
value that comes from XCom or params, nothing computed from templated values in ``__init__``,
heavy imports inside ``execute``, small JSON-able return values (ids, URIs, fingerprints and
counts; never data). Deterministic failures (invalid params, bad data, a failed rule) raise
``AirflowFailException`` so they fail at once instead of waiting out retries.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow.configuration import conf
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.providers.standard.hooks.subprocess import SubprocessHook
from airflow.providers.standard.utils.skipmixin import SkipMixin
from airflow.sdk import BaseOperator
from airflow.sdk.bases.xcom import BaseXCom
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sparktune.config import settings
from sparktune.fingerprint import files_signature, list_source_files
from sparktune.params import RUN_SWITCHES, InvalidParamsError, PipelineParams, parse_params
from sparktune.prepare_reuse import (
    find_prepared,
    inputs_key,
    record_prepared,
    recorded_summary,
    reused_summary,
)
from sparktune.spark_jvm import DRIVER_JAVA_OPTIONS, input_bytes, short_job_conf
from sparktune_airflow import training_process
from sparktune_airflow.databricks_training import DatabricksTrainingMixin
from sparktune_airflow.lineage import ReportsLineage
from sparktune_airflow.links import (
    DatabricksRunLink,
    DataDocsLink,
    MLflowModelVersionLink,
    MLflowRunLink,
    SparkUILink,
)
from sparktune_airflow.mlflow_connection import UsesMLflowConnection
from sparktune_airflow.spark_submit import SparkSubmitOperator


def job_path(job: str) -> str:
    """The spark-submit application file of ``sparktune.jobs.<job>``, wherever sparktune is installed."""
    import importlib.util

    spec = importlib.util.find_spec(f"sparktune.jobs.{job}")
    if spec is None or spec.origin is None:
        raise AirflowFailException(f"sparktune.jobs.{job} is not installed; pip install the project")
    return spec.origin


def submit_and_read_summary(
    operator: SparkSubmitOperator, context: Any, summary_path: Path, job: str
) -> dict[str, Any]:
    """Run ``operator``'s spark-submit of ``sparktune.jobs.<job>`` and return the JSON summary the job
    wrote to ``summary_path``. Input errors the job recorded there fail the task at once
    (``AirflowFailException``); a fault it names as retryable, or a failure it left no record of
    (a lost executor), raises ``AirflowException`` and is retried."""
    try:
        SparkSubmitOperator.execute(operator, context)
    except AirflowException as exc:
        # A lost executor leaves no error record: that is worth a retry.
        if summary_path.exists():
            record = json.loads(summary_path.read_text())
            if record.get("error") and "retry" in record:  # a fault the job named (a full disk)
                failure = AirflowException if record["retry"] else AirflowFailException
                raise failure(f"{job} failed: {record['error']}") from exc
            if record.get("error"):
                raise AirflowFailException(f"{job} rejected its input: {record['error']}") from exc
        raise
    return json.loads(summary_path.read_text())


def _run_module(module: str, *args: str) -> Any:
    """``python -m module args`` on this worker's interpreter and environment, its output in the task log.

    The domain CLIs (evaluation, smoke test) run in a process of their own so torch and the model
    do not stay in the task runner.
    """
    return SubprocessHook().run_command([sys.executable, "-m", module, *args], env=dict(os.environ))


def pipeline_params(explicit: dict[str, Any] | None, context: Any) -> PipelineParams:
    """Typed params from an explicit dict or the DAG run's params; invalid ones fail the task at once."""
    raw = explicit if explicit is not None else dict(context["params"])
    try:
        return parse_params(raw)
    except InvalidParamsError as exc:
        raise AirflowFailException(str(exc)) from exc


def templated_bool(value: Any) -> bool:
    """A templated boolean: True/False, or the strings a non-native render gives ("True", "false")."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise AirflowFailException(f"expected true or false, got {value!r}")


def _trust_remote_code(explicit: dict[str, Any] | None, context: Any) -> bool:
    """The ``trust_remote_code`` param of the explicit params or of the run (default False)."""
    raw = explicit if explicit is not None else dict(context.get("params") or {})
    return pipeline_params({k: v for k, v in raw.items() if k == "trust_remote_code"}, {}).trust_remote_code


def check_allowed_location(param: str, value: Any, source_format: str | None = None) -> None:
    """Fail at once when ``value`` lies outside ``SPARKTUNE_ALLOWED_ROOTS`` (when the deployment sets
    it), ``..`` and symlinks resolved; ``source_format`` given: ``value`` may be a catalog table name.
    Empty values pass (each operator has its own default for them)."""
    from sparktune.paths import check_allowed_uri, check_source

    roots = settings().allowed_roots
    text = str(value or "").strip()
    if not roots or not text:
        return
    try:
        if source_format is None:
            check_allowed_uri(param, text, roots)
        else:
            check_source(param, text, source_format, roots)
    except ValueError as exc:
        raise AirflowFailException(str(exc)) from exc


def task_scratch_dir(context: Any) -> Path:
    """A per-try scratch folder for request/result files exchanged with subprocesses."""
    ti = context["ti"]
    safe_run_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in ti.run_id)
    path = settings().home / "runs" / ti.dag_id / safe_run_id / ti.task_id / str(ti.try_number)
    path.mkdir(parents=True, exist_ok=True)
    return path


def mlflow_client():
    """An ``MlflowClient`` on the deployment's tracking URI (``settings().mlflow_tracking_uri``); sets
    that URI as the process's MLflow tracking URI too, so ``mlflow.*`` calls after it go to the same
    server."""
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(settings().mlflow_tracking_uri)
    return MlflowClient()


def skip_downstream(operator: SkipMixin, context: Any) -> None:
    """Skip every task after this one (teardowns still run): the run ends cleanly, not failed."""
    downstream = [t for t in context["task"].get_flat_relatives(upstream=False) if not t.is_teardown]
    operator.skip(ti=context["ti"], tasks=downstream)


def audit_actor(context: Any) -> str:
    """Who moves an alias, as the audit log records it: ``airflow:<dag_id>/<run_id>/<task_id>``."""
    ti = context["ti"]
    return f"airflow:{ti.dag_id}/{ti.run_id}/{ti.task_id}"


class ValidateParamsOperator(BaseOperator):
    """Checks every param before any work starts; the error lists all problems at once.

    Returns ``{"config_hash": ...}``: the hash of what the run trains with.

    :param pipeline_params: (templated) the params to check, a dict of flat values; default (None):
        the DAG run's params. Missing names take their defaults from ``sparktune.params``.
    """

    template_fields: Sequence[str] = ("pipeline_params",)

    def __init__(self, *, pipeline_params: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline_params = pipeline_params

    def execute(self, context: Any) -> dict[str, Any]:
        params = pipeline_params(self.pipeline_params, context)
        self.log.info("params are valid: %s", json.dumps(params.to_dict(), sort_keys=True))
        return {"config_hash": config_hash(params)}


def config_hash(params: PipelineParams) -> str:
    """What the run trains with: every param but the run switches (force_retrain, merge_feedback)."""
    config = {k: v for k, v in params.to_dict().items() if k not in RUN_SWITCHES}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


class ResolveBaseModelOperator(BaseOperator):
    """Returns a loadable base model reference; builds the built-in tiny model once when it is asked for.

    :param base_model: (templated) a Hugging Face hub id (returned unchanged, nothing downloaded), a
        local model folder (checked for a ``config.json``, safetensors weights and no code of its own
        unless trusted), or ``tiny-llama``: the built-in model, built under
        ``$SPARKTUNE_HOME/models/base/`` the first time. An empty or unusable value fails the task at once.
    :param trust_remote_code: (templated) let a local folder that ships its own Python code
        (``auto_map``) through; default False (the DAG passes its ``trust_remote_code`` param).
    """

    template_fields: Sequence[str] = ("base_model", "trust_remote_code")

    def __init__(self, *, base_model: str, trust_remote_code: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_model = base_model
        self.trust_remote_code = trust_remote_code

    def execute(self, context: Any) -> str:
        from sparktune.base_model import ensure_base_model

        try:
            resolved = ensure_base_model(
                self.base_model, trust_remote_code=templated_bool(self.trust_remote_code)
            )
        except (ValueError, FileNotFoundError) as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("base model %r -> %s", self.base_model, resolved)
        return resolved


class PrepareDataOperator(ReportsLineage, SparkSubmitOperator):
    """Submits the preparation job (filter, dedupe, format, count tokens, split) through spark-submit.

    The job runs wherever the ``spark_default`` connection points (``local[*]``, a standalone
    master, YARN, Kubernetes) and writes a small summary file that this operator returns
    (``prepared_uri``, ``data_fingerprint``, ``labels``, rows in and out of every step).

    :param tokenizer: (templated) the tokenizer that counts tokens: a hub id or model folder,
        usually what ``ResolveBaseModelOperator`` returned.
    :param pipeline_params: (templated) columns and preparation recipe (filters, template, split
        seed); default (None): the DAG run's params. Missing names take their defaults.
    :param lake_uri: where the prepared splits and quarantined rows go, keyed by fingerprint;
        default ``$SPARKTUNE_LAKE_URI`` or ``$SPARKTUNE_HOME/lake``.
    :param source_uri: (templated) read this instead of the params' ``source_uri`` (for example
        ``MergeFeedbackOperator``'s new data version).
    :param source_format: (templated) the format of that source (``auto``, ``parquet``, ``csv``,
        ``json``, ``table``); default: the params'.
    :param validate_quality: also run the data quality gate (``sparktune.quality``: raw input,
        prepared rows, label counts) in the same Spark application once the data is published, and
        return its report under ``quality`` for ``SparkQualityGateOperator(quality_summary=...)``
        to decide on. One JVM and one read of the source instead of two. Needs a driver that can
        write ``gx_root`` (spark-submit's default client mode). Default False.
    :param gx_root: the Great Expectations project the gate writes to; default ``$SPARKTUNE_HOME/gx``.
    :param conn_id: the Spark connection spark-submit runs against (default ``spark_default``).

    Other keyword arguments go to ``SparkSubmitOperator`` (``conf``, ``executor_memory``, ...).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "pipeline_params",
        "tokenizer",
        "source_uri",
        "source_format",
    )
    operator_extra_links = (SparkUILink(),)

    def __init__(
        self,
        *,
        tokenizer: str,
        pipeline_params: dict[str, Any] | None = None,
        lake_uri: str | None = None,
        source_uri: str | None = None,
        source_format: str | None = None,
        validate_quality: bool = False,
        gx_root: str | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        """``source_uri``/``source_format`` override the params' (``MergeFeedbackOperator``'s output)."""
        kwargs.setdefault("name", "sparktune-prepare_data")
        # Spark's INFO chatter would bury the step table in the task log; pass conf to change it.
        kwargs.setdefault("conf", {"spark.log.level": "WARN"})
        super().__init__(conn_id=conn_id, **kwargs)
        self.tokenizer = tokenizer
        self.pipeline_params = pipeline_params
        self.lake_uri = lake_uri
        self.source_uri = source_uri
        self.source_format = source_format
        self.validate_quality = validate_quality
        self.gx_root = gx_root

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.prepare import DataPreparationError, resolve_source_uri

        params = pipeline_params(self.pipeline_params, context)
        try:
            source_uri = self.source_uri or resolve_source_uri(params)
        except DataPreparationError as exc:
            raise AirflowFailException(str(exc)) from exc
        check_allowed_location("source_uri", source_uri, self.source_format or params.source_format)
        # One listing of the source: its size picks the JVM options, its signature keys the reuse.
        listed = list_source_files(source_uri)
        self.conf = short_job_conf(self.conf, None if listed is None else listed.size)
        self.application = self.application or job_path("prepare_data")
        summary_path = task_scratch_dir(context) / "prepare_summary.json"
        summary_path.unlink(missing_ok=True)
        job_params = {**params.to_dict(), "source_uri": source_uri}
        if self.source_format:
            job_params["source_format"] = self.source_format
        self.application_args = [
            "--params-json",
            json.dumps(job_params),
            "--tokenizer",
            self.tokenizer,
            "--lake-uri",
            self.lake_uri or settings().lake_uri,
            "--summary-path",
            str(summary_path),
        ]
        if self.validate_quality:
            gx_root = self.gx_root or str(settings().gx_root)
            self.application_args += ["--gx-root", gx_root, "--quality-run-id", context["run_id"]]
        lake_uri = self.lake_uri or settings().lake_uri
        source_format = self.source_format or params.source_format
        effective = replace(params, source_uri=source_uri, source_format=source_format)
        key = inputs_key(files_signature(listed), effective, self.tokenizer)
        summary = self._reused(lake_uri, key, params)
        if summary is None:
            summary = submit_and_read_summary(self, context, summary_path, "prepare_data")
            if summary.get("quality_error"):
                self.log.warning("the job's quality gate did not run: %s", summary["quality_error"])
            if key:
                record_prepared(lake_uri, key, recorded_summary(summary, params))
        for step in summary["steps"]:
            self.log.info(
                "%-18s rows in %9d  out %9d%s",
                step["step"],
                step["rows_in"],
                step["rows_out"],
                "  (skipped)" if step.get("skipped") else "",
            )
        self.log.info("data fingerprint %s -> %s", summary["data_fingerprint"], summary["prepared_uri"])
        return self._keep(summary)

    def _reused(self, lake_uri: str, key: str | None, params: PipelineParams) -> dict[str, Any] | None:
        """The summary of the prepared data the lake holds for these very inputs, if it does
        (sparktune.prepare_reuse), with its quality report when this run's gate has the same rules."""
        found = find_prepared(lake_uri, key) if key else None
        if found is None:
            return None
        self.log.info(
            "The lake holds this run's prepared data already (same source files, preparation params, "
            "tokenizer and code as the run that published %s): no Spark job.",
            found["data_fingerprint"],
        )
        summary, report = reused_summary(found, params)
        reused = {**summary, "reused": True, "tokenizer": self.tokenizer}
        if self.validate_quality and report:
            self.log.info(
                "Its quality report holds for this run: the same data under the same rules (Data Docs: %s).",
                report.get("data_docs_uri"),
            )
            reused["quality"] = report
        elif self.validate_quality and found.get("quality"):
            self.log.info("The gate's rules changed since its report: validate_data checks it again.")
        return reused

    def _lineage(self):
        """The source -> the prepared train/validation/test splits, versioned by the fingerprint."""
        from sparktune_airflow.lineage import prepare_lineage

        return prepare_lineage(self._lineage_result)


def _quality_gate(
    prepared_uri: str | None,
    source_uri: str | None,
    pipeline_params_value: dict[str, Any] | None,
    gx_root: str,
    run_id: str,
    fail_on_error: bool | str = True,
    raw_suite_name: str | None = None,
    params: Any = None,
    spark: Any = None,
) -> dict[str, Any]:
    from sparktune.prepare import DataPreparationError, resolve_source_uri
    from sparktune.quality import RAW_INPUT, run_quality_gate

    # py4j logs a traceback at INFO for every socket the provider's session.stop() closes.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Great Expectations logs a few hundred lines of its own bookkeeping at INFO (registering functions).
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    fail = _fail_on_error(fail_on_error)
    typed = pipeline_params(pipeline_params_value, {"params": params})
    try:
        source = source_uri or resolve_source_uri(typed)
        report = run_quality_gate(
            spark,
            typed,
            prepared_uri=prepared_uri or None,
            source_uri=source,
            gx_root=Path(gx_root),
            run_id=run_id,
            raw_suite_name=raw_suite_name or RAW_INPUT,
        )
    except (DataPreparationError, ValueError) as exc:  # unreadable source, unknown rule name
        raise AirflowFailException(str(exc)) from exc
    return _enforce_quality(report, fail, source)


def _fail_on_error(value: bool | str) -> bool:
    # A templated flag renders as "True"/"False" unless the DAG renders native objects.
    fail = {"true": True, "false": False}.get(str(value).strip().lower())
    if fail is None:
        raise AirflowFailException(f"fail_on_error must be true or false, got {value!r}")
    return fail


def _enforce_quality(report: Any, fail: bool, source: str | None) -> dict[str, Any]:
    """Fail the task on a failed error rule (``fail``), else log what failed; the summary for XCom."""
    from sparktune.quality import format_failures

    print(f"quality: {report.evaluated} expectations, success={report.success}, docs {report.data_docs_uri}")
    print(f"Data Docs (every suite and run): {report.data_docs_index_uri}")
    if not report.success and fail:
        raise AirflowFailException(format_failures(report))
    if report.warnings or not report.success:
        logging.getLogger(__name__).warning("%s", format_failures(report))
    # The source actually validated, so a downstream task reads exactly what passed.
    return {**report.to_summary(), "source_uri": source}


class SparkQualityGateOperator(PySparkOperator):
    """Great Expectations on Spark over a source table and, optionally, its prepared rows.

    With ``prepared_uri`` (``llm_finetune``'s ``validate_data``) every rule of the gate runs: raw
    input, prepared rows, per-label counts. Without it only the raw-input rules run, over any table
    (the ``data_quality_report`` DAG). Each run updates Data Docs. Returns the quality summary
    (``success``, ``failures``, ``issues``, ``data_docs_uri``, ``data_docs_index_uri``, ...) and
    the ``source_uri`` it validated.

    Reuses the Spark provider's ``PySparkOperator`` for the session, so the master and Spark
    settings come from the ``spark_default`` connection like every other Spark task.

    :param prepared_uri: (templated) the prepared Parquet ``PrepareDataOperator`` wrote; None or
        empty: validate the source alone.
    :param source_uri: (templated) the raw table or path (Parquet, CSV, JSON Lines, or a catalog
        table); default (None): the params' ``source_uri`` (empty there: the demo data).
    :param pipeline_params: (templated) columns and rule thresholds (``text_column``,
        ``label_column``, ``min_rows``, ``max_null_rate``, ``quality_warning_rules``, ...);
        default (None): the DAG run's params. Missing names take their defaults.
    :param gx_root: (templated) the Great Expectations project folder; default ``$SPARKTUNE_HOME/gx``.
    :param fail_on_error: (templated) True (default): a failed error rule fails the task at once,
        without retries, in one message listing every failed rule. False: the task succeeds and the
        failures are in the log, the returned summary and Data Docs (a report). The strings
        ``"true"`` and ``"false"`` are accepted.
    :param raw_suite_name: (templated) the GX suite the raw input is validated under; default
        ``raw_input``. A name of its own keeps a report's runs apart from the pipeline's in Data Docs.
    :param quality_summary: (templated) the report a ``PrepareDataOperator(validate_quality=True)``
        job returned under ``quality``: the same rules, already run in the preparation's Spark
        application, so this task only decides (``fail_on_error``) and starts no Spark session.
        None or empty (a prepare step that reused published data, or ran no gate): validate here.
    :param conn_id: the Spark connection of the session (default ``spark_default``).
    """

    template_fields: Sequence[str] = (
        *PySparkOperator.template_fields,
        "prepared_uri",
        "source_uri",
        "quality_summary",
    )
    operator_extra_links = (DataDocsLink(),)

    def __init__(
        self,
        *,
        prepared_uri: str | None = None,
        source_uri: str | None = None,
        pipeline_params: dict[str, Any] | None = None,
        gx_root: str | None = None,
        fail_on_error: bool | str = True,
        raw_suite_name: str | None = None,
        quality_summary: dict[str, Any] | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            python_callable=_quality_gate,
            conn_id=conn_id,
            op_kwargs={
                "prepared_uri": prepared_uri,
                "source_uri": source_uri,
                "pipeline_params_value": pipeline_params,
                "gx_root": gx_root or str(settings().gx_root),
                "fail_on_error": fail_on_error,
                "raw_suite_name": raw_suite_name,
            },
            **kwargs,
        )
        self.prepared_uri = prepared_uri
        self.source_uri = source_uri
        self.quality_summary = quality_summary

    def execute(self, context: Any) -> Any:
        # Params and locations first: a bad value fails here, before a Spark session starts.
        typed = pipeline_params(
            self.op_kwargs.get("pipeline_params_value"), {"params": context.get("params") or {}}
        )
        source = self.op_kwargs.get("source_uri")
        check_allowed_location("source_uri", source, typed.source_format)
        report = _rendered_dict(self.quality_summary)
        if report:
            return self._decide_on(report, source)
        self.config_kwargs = session_jvm_conf(
            self.conn_id, self.config_kwargs, input_bytes(source or _default_source_uri(typed))
        )
        return super().execute(context)

    def _decide_on(self, summary: dict[str, Any], source: str | None) -> dict[str, Any]:
        """The gate on a report the preparation job wrote: the decision, no second validation."""
        from sparktune.quality import QualityReport

        fail = _fail_on_error(self.op_kwargs.get("fail_on_error", True))
        try:
            report = QualityReport.from_summary(summary)
        except (KeyError, TypeError, ValueError) as exc:
            raise AirflowFailException(
                f"quality_summary is not a quality report ({type(exc).__name__}: {exc}); pass the "
                "'quality' of a PrepareDataOperator(validate_quality=True) result, or None to validate here"
            ) from exc
        self.log.info(
            "The preparation job validated this data in its own Spark application (%s): deciding on "
            "its report, no Spark session here.",
            summary.get("summary_path"),
        )
        return _enforce_quality(report, fail, summary.get("source_uri") or source)


def _rendered_dict(value: Any) -> Any:
    """A templated dict: as is under native rendering, else its rendered repr read back ("None" and
    "" for none), like :func:`templated_bool` for booleans."""
    if not isinstance(value, str):
        return value
    if value.strip() in ("", "None"):
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value  # _decide_on names what was expected


def session_jvm_conf(conn_id: str | None, config: dict[str, Any] | None, size: int | None) -> dict[str, Any]:
    """A ``PySparkOperator``'s session conf with the driver's JVM options (``short_job_conf``) for an
    input of ``size`` bytes (None: unknown), unless the connection's extra sets them."""
    if DRIVER_JAVA_OPTIONS in _connection_extra(conn_id):
        return dict(config or {})
    return short_job_conf(config, size)


def _connection_extra(conn_id: str | None) -> dict[str, Any]:
    """The connection's extra (Spark conf for ``PySparkOperator``); empty when there is none."""
    if not conn_id:
        return {}
    from airflow.sdk import BaseHook

    try:
        return dict(BaseHook.get_connection(conn_id).extra_dejson)
    except Exception:  # PySparkOperator falls back to local[*] without a connection as well
        return {}


def _default_source_uri(params: PipelineParams) -> str | None:
    from sparktune.prepare import DataPreparationError, resolve_source_uri

    try:
        return resolve_source_uri(params)
    except DataPreparationError:
        return None  # _quality_gate reports it


def _disk_full_failure(exc: Any) -> AirflowException:
    """A full datasets volume: retried, unless the dataset is larger than the whole volume.

    Retry: the failed attempt removed its partial write, and the rest of the volume may be freed
    before the retry (a concurrent run's temp folder or checkpoints, a cleanup, an operator
    answering the alert). Fail at once when the dataset needs more than the volume holds in all:
    no retry can fit it, and waiting out the backoff only delays the message.
    """
    failure = AirflowException if exc.retry_may_help else AirflowFailException
    return failure(str(exc))


class MaterializeDatasetOperator(ReportsLineage, SparkSubmitOperator):
    """A table or path -> a Hugging Face DatasetDict at ``<datasets_root>/<data fingerprint>``.

    Spark executors write the Arrow shards (``sparktune.jobs.materialize_dataset`` through
    spark-submit, on whatever ``conn_id`` points at). A data version that is already published
    returns at once, before any Spark starts. Reusable on its own::

        MaterializeDatasetOperator(task_id="to_arrow", source="catalog.db.tickets",
                                   datasets_root="s3://bucket/datasets", label_column="intent")

    ``dataset_mode="streaming"`` builds nothing: training then streams the Parquet shards.

    Returns ``dataset_uri``, ``data_fingerprint``, rows and shards per split, ``labels``, ``reused``.

    :param source: (templated) a Parquet, CSV or JSON Lines path or URI, or a catalog table.
    :param datasets_root: (templated) where datasets go, any fsspec URI the driver and executors
        share; default ``<lake>/datasets``, the lake being ``$SPARKTUNE_LAKE_URI`` or
        ``$SPARKTUNE_HOME/lake``.
    :param data_fingerprint: (templated) the data version's key; a version already published
        returns at once. None: the content fingerprint is computed first (one Spark pass).
    :param label_column: the column typed as a ``ClassLabel``; None keeps labels as they are.
    :param label_names: (templated) the ``ClassLabel`` names, in order; default (None): the sorted
        distinct labels of the data. A label outside the list fails the task.
    :param split_column: the column naming each row's split, dropped from the features; None, or a
        source without that column: every row goes to ``train``.
    :param splits: the splits every dataset must have (a split with no rows is written empty);
        default (None): the splits found.
    :param source_format: ``auto`` (by extension; a name without a path separator is a table),
        ``parquet``, ``csv``, ``json`` or ``table``.
    :param dataset_mode: (templated) ``materialized`` (default) or ``streaming``.
    :param storage_options: fsspec options for the source and ``datasets_root`` (credentials
        come from the environment).
    :param conn_id: the Spark connection spark-submit runs against (default ``spark_default``).

    Other keyword arguments go to ``SparkSubmitOperator``.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "source",
        "datasets_root",
        "data_fingerprint",
        "label_names",
        "dataset_mode",
    )
    operator_extra_links = (SparkUILink(),)

    def __init__(
        self,
        *,
        source: str,
        datasets_root: str | None = None,
        data_fingerprint: str | None = None,
        label_column: str | None = "label",
        label_names: list[str] | None = None,
        split_column: str | None = "split",
        splits: list[str] | None = None,
        source_format: str = "auto",
        dataset_mode: str = "materialized",
        storage_options: dict[str, Any] | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "sparktune-materialize_dataset")
        kwargs.setdefault("conf", {"spark.log.level": "WARN"})
        super().__init__(conn_id=conn_id, **kwargs)
        self.source = source
        self.datasets_root = datasets_root
        self.data_fingerprint = data_fingerprint
        self.label_column = label_column
        self.label_names = label_names
        self.split_column = split_column
        self.splits = splits
        self.source_format = source_format
        self.dataset_mode = dataset_mode
        self.storage_options = storage_options

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.materialize import (
            DATASET_MODES,
            DiskFullError,
            MaterializeError,
            converts_without_spark,
            find_published,
            materialize_dataset,
        )
        from sparktune.streaming import describe_parquet_splits

        check_allowed_location("source", self.source, self.source_format)
        if self.dataset_mode not in DATASET_MODES:
            raise AirflowFailException(
                f"dataset_mode must be one of {list(DATASET_MODES)}, got {self.dataset_mode!r}"
            )
        if self.dataset_mode == "streaming":
            try:
                summary = describe_parquet_splits(
                    self.source, self.data_fingerprint, self.label_names, self.storage_options
                )
            except (FileNotFoundError, ValueError) as exc:
                raise AirflowFailException(str(exc)) from exc
            self.log.info("streaming mode: training reads %s directly, rows %s", self.source, summary["rows"])
            return self._keep(summary)
        root = self.datasets_root or f"{settings().lake_uri}/datasets"
        if self.data_fingerprint:
            found = find_published(root, self.data_fingerprint, self.storage_options)
            if found is not None:
                self.log.info("dataset %s already published: reused, no Spark job", found.dataset_uri)
                return self._keep(found.to_summary())
        if self.data_fingerprint and converts_without_spark(
            self.source, self.source_format, self.storage_options
        ):
            # Small Parquet: converting it here beats the seconds a spark-submit costs to start.
            try:
                result = materialize_dataset(
                    None,
                    self.source,
                    root,
                    data_fingerprint=self.data_fingerprint,
                    split_column=self.split_column,
                    label_column=self.label_column,
                    label_names=self.label_names,
                    splits=self.splits,
                    storage_options=self.storage_options,
                )
            except MaterializeError as exc:
                raise AirflowFailException(f"materialize_dataset rejected its input: {exc}") from exc
            except DiskFullError as exc:
                raise _disk_full_failure(exc) from exc
            self.log.info("dataset %s: rows %s, built in this process", result.dataset_uri, result.rows)
            return self._keep(result.to_summary())
        self.conf = short_job_conf(self.conf, input_bytes(self.source, self.storage_options))
        self.application = self.application or job_path("materialize_dataset")
        summary_path = task_scratch_dir(context) / "materialize_summary.json"
        summary_path.unlink(missing_ok=True)
        args = [
            "--source", self.source,
            "--source-format", self.source_format,
            "--datasets-root", root,
            "--split-column", self.split_column or "",
            "--label-column", self.label_column or "",
            "--summary-path", str(summary_path),
        ]  # fmt: skip
        if self.data_fingerprint:
            args += ["--data-fingerprint", self.data_fingerprint]
        if self.label_names is not None:
            args += ["--label-names", json.dumps(list(self.label_names))]
        if self.splits is not None:
            args += ["--splits", json.dumps(list(self.splits))]
        if self.storage_options:
            args += ["--storage-options", json.dumps(self.storage_options)]
        self.application_args = args
        summary = submit_and_read_summary(self, context, summary_path, "materialize_dataset")
        self.log.info(
            "dataset %s: rows %s in %s shards, %.1f MB, %s in %.1f s",
            summary["dataset_uri"],
            summary["rows"],
            summary.get("shards"),
            (summary.get("num_bytes") or 0) / 1e6,
            "reused" if summary["reused"] else "built",
            summary["seconds"],
        )
        return self._keep(summary)

    def _lineage(self):
        """The prepared splits (the source itself when it has no split folders) -> the dataset."""
        from sparktune_airflow.lineage import has_split_folders, materialize_lineage

        source = str(self.source)
        partitioned = bool(self.split_column) and has_split_folders(
            source, self.split_column, self.storage_options
        )
        return materialize_lineage(
            self._lineage_result, source, split_column=self.split_column, partitioned=partitioned
        )


class TrainModelOperator(UsesMLflowConnection, ReportsLineage, DatabricksTrainingMixin, BaseOperator):
    """Submits the training entry point (``sparktune.jobs.train``) to the run's ``train_backend``.

    - ``local``: a process on this worker, its log streamed into the task log.
    - ``spark``: ``spark-submit`` (client mode) to the ``spark_conn_id`` master; the job runs DDP
      over ``num_workers`` executor processes with ``TorchDistributor``.
    - ``databricks``: a one-time run on a new job cluster (``databricks_conn_id``), deferrable,
      with a link to the run page.

    The submission key is dag/run/task + data fingerprint + config hash. A retry reattaches to
    the live process or Databricks run of its key instead of starting a second one, reuses a
    finished MLflow run, and otherwise resumes from the key's last checkpoint into the same
    MLflow run. ``on_kill`` stops the process or cancels the Databricks run. Returns the finished
    MLflow run's ``train_result.json`` (``mlflow_run_id``, training metrics). MLflow is the one
    at ``MLFLOW_TRACKING_URI``.

    :param dataset_uri: (templated) the ``DatasetDict`` folder ``MaterializeDatasetOperator`` wrote
        (with ``dataset_mode=streaming``: the prepared Parquet).
    :param base_model: (templated) what ``ResolveBaseModelOperator`` returned.
    :param data_fingerprint: (templated) the data version: part of the submission key, tagged on
        the MLflow run.
    :param pipeline_params: (templated) the training recipe and ``train_backend``, ``num_workers``,
        ``databricks_*``; default (None): the DAG run's params. Missing names take their defaults.
    :param spark_conn_id: the Spark connection of ``train_backend=spark`` (default ``spark_default``).
    :param spark_conf: extra Spark conf for that spark-submit.
    :param databricks_conn_id: the Databricks connection of ``train_backend=databricks`` (default
        ``databricks_default``).
    :param deferrable: with ``train_backend=databricks``, wait in the triggerer instead of a worker
        slot; default: ``[operators] default_deferrable``.
    :param polling_period_seconds: how often a Databricks run's state is checked (default 30).
    """

    template_fields: Sequence[str] = ("dataset_uri", "base_model", "data_fingerprint", "pipeline_params")
    operator_extra_links = (DatabricksRunLink(), MLflowRunLink())

    def __init__(
        self,
        *,
        dataset_uri: str,
        base_model: str,
        data_fingerprint: str,
        pipeline_params: dict[str, Any] | None = None,
        spark_conn_id: str = "spark_default",
        spark_conf: dict[str, Any] | None = None,
        databricks_conn_id: str = "databricks_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        polling_period_seconds: int = 30,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dataset_uri = dataset_uri
        self.base_model = base_model
        self.data_fingerprint = data_fingerprint
        self.pipeline_params = pipeline_params
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.databricks_conn_id = databricks_conn_id
        self.deferrable = deferrable
        self.polling_period_seconds = polling_period_seconds
        self.databricks_run_id: int | None = None
        self._submission: training_process.Submission | None = None

    # -- the key and the request

    def _train_key(self, context: Any, params: PipelineParams) -> str:
        ti = context["ti"]
        key_source = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{self.data_fingerprint}/{config_hash(params)}"
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
            "params": params.to_dict(),
            "mlflow_tracking_uri": settings().mlflow_tracking_uri,
            "artifact_location": settings().mlflow_artifact_root,
            "experiment_name": experiment_name(params.model_name),
            "train_key": train_key,
            "run_name": f"{ti.dag_id}-{ti.run_id}"[:250],
            "tags": {
                "sparktune.data_fingerprint": self.data_fingerprint,
                "sparktune.config_hash": config_hash(params),
                "sparktune.train_backend": params.train_backend,
                "airflow.dag_id": ti.dag_id,
                "airflow.run_id": ti.run_id,
                "airflow.task_id": ti.task_id,
                "airflow.try_number": str(ti.try_number),
                "sparktune.base_model": self.base_model,
            },
        }

    # -- execution

    def execute(self, context: Any) -> dict[str, Any]:
        params = pipeline_params(self.pipeline_params, context)
        request = self._request(context, params)
        self.log.info(
            "train key %s, backend %s, work dir %s",
            request["train_key"],
            params.train_backend,
            request["output_dir"],
        )
        finished = self._finished_result(context)
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
        work = Path(request["output_dir"])
        live = training_process.live_submission(work)
        if live is not None:
            self._submission = live
            self.log.info(
                "Reattaching to training process %d (%s), started by an earlier attempt; its log follows.",
                live.pid,
                live.backend,
            )
            exit_code, last_line = training_process.follow(live, self.log.info)
        else:
            command = self._process_command(request, params, work)
            self.log.info("Starting: %s", " ".join(command))
            env = dict(os.environ)
            # spark-submit comes with the pyspark wheel, beside this interpreter, whether or not
            # the worker's PATH has the virtual environment on it.
            env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
            child = training_process.start(command, env, work, params.train_backend)
            self._submission = training_process.read_record(work)
            exit_code, last_line = training_process.follow(self._submission, self.log.info, child=child)
            _raise_for_exit_code("training", exit_code, last_line)
        return self._finish(context)

    def _finished_result(self, context: Any) -> dict[str, Any] | None:
        from sparktune.training import load_finished_result

        params = pipeline_params(self.pipeline_params, context)
        return load_finished_result(
            settings().mlflow_tracking_uri,
            experiment_name(params.model_name),
            self._train_key(context, params),
        )

    def _finish(self, context: Any) -> dict[str, Any]:
        """The result of the finished MLflow run of this task's train key, whatever ran it."""
        outcome = self._finished_result(context)
        if outcome is None:
            train_key = self._train_key(context, pipeline_params(self.pipeline_params, context))
            raise AirflowException(
                f"Training of key {train_key} ended without a finished MLflow run; the retry resumes "
                "from its last checkpoint."
            )
        self.log.info("training result: %s", json.dumps(outcome, sort_keys=True))
        return self._keep(outcome)

    def _lineage(self):
        """The dataset -> the model the MLflow run logged."""
        from sparktune_airflow.lineage import train_lineage

        return train_lineage(
            self._lineage_result, str(self.dataset_uri), self.data_fingerprint, settings().mlflow_tracking_uri
        )

    def on_kill(self) -> None:
        if self._submission is not None:
            self.log.info("Stopping training process %d.", self._submission.pid)
            training_process.stop(self._submission)
        if self.databricks_run_id is not None:
            self._cancel_databricks()


# The domain CLIs exit 2 on bad input (a retry would fail the same way), 1 on anything else.
EXIT_BAD_INPUT = 2


def _raise_for_exit_code(what: str, exit_code: int, last_line: str) -> None:
    if exit_code == EXIT_BAD_INPUT:
        raise AirflowFailException(f"{what} rejected its input: {last_line}")
    if exit_code != 0:
        raise AirflowException(f"{what} exited with code {exit_code}: {last_line}")


def experiment_name(model_name: str) -> str:
    return f"sparktune-{model_name}"


class RegisterModelOperator(UsesMLflowConnection, ReportsLineage, BaseOperator):
    """One registered version per training run (a retry finds it), lineage tags, alias ``candidate``.

    Returns ``model_name``, ``version`` and the alias move. MLflow is the one at ``MLFLOW_TRACKING_URI``.

    :param run_id: (templated) the MLflow run whose ``model`` is registered.
    :param model_name: (templated) the registered model name.
    :param tags: (templated) version tags (values made strings); the run's code version and the
        prepared labels are added when known.
    :param run_artifacts: (templated) name -> JSON-able record, logged to the run as
        ``pipeline/<name>.json``.
    :param run_files: (templated) artifact folder -> local files (a list, or a dict whose values are
        the files), logged to the run, e.g. the Data Docs pages; missing files are skipped.
    """

    template_fields: Sequence[str] = ("run_id", "model_name", "tags", "run_artifacts", "run_files")
    operator_extra_links = (MLflowModelVersionLink(),)

    def __init__(
        self,
        *,
        run_id: str,
        model_name: str,
        tags: dict[str, str] | None = None,
        run_artifacts: dict[str, Any] | None = None,
        run_files: dict[str, list[str] | dict[str, str]] | None = None,
        **kwargs: Any,
    ) -> None:
        """``run_artifacts``: name -> JSON-able record; ``run_files``: artifact folder -> local files
        (a list, or a dict whose values are the files), e.g. the run's Data Docs pages."""
        super().__init__(**kwargs)
        self.run_id = run_id
        self.model_name = model_name
        self.tags = tags or {}
        self.run_artifacts = run_artifacts or {}
        self.run_files = run_files or {}

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.registry import CANDIDATE, move_alias, register_run_model

        client = mlflow_client()
        for name, content in self.run_artifacts.items():
            client.log_dict(self.run_id, content, f"pipeline/{name}.json")
        for folder, files in self.run_files.items():
            for uri in (files.values() if isinstance(files, dict) else files) or []:
                path = uri.removeprefix("file://")
                if Path(path).is_file():
                    client.log_artifact(self.run_id, path, folder)
        prepare = self.run_artifacts.get("prepare_summary") or {}
        for step in prepare.get("steps", []):
            client.log_metric(self.run_id, f"rows_out.{step['step']}", step["rows_out"])
        # A value a run could not tell (a table's source signature) is left out, not tagged "None".
        tags = {k: str(v) for k, v in self.tags.items() if v is not None and str(v) != ""}
        from sparktune.training import CODE_FINGERPRINT_TAG, CODE_VERSION_TAG

        run_tags = client.get_run(self.run_id).data.tags
        code_version = run_tags.get(CODE_VERSION_TAG)
        if code_version:
            tags.setdefault("code_version", code_version)
        # With data_fingerprint: what a later run compares to skip retraining (sparktune.retrain).
        for run_tag, version_tag in (
            ("sparktune.config_hash", "config_hash"),
            (CODE_FINGERPRINT_TAG, "code_fingerprint"),
        ):
            if run_tags.get(run_tag):
                tags.setdefault(version_tag, run_tags[run_tag])
        if prepare.get("labels"):
            # The label set travels with the version: batch inference scores a causal LM's
            # candidates from it, and the smoke test checks answers against it.
            tags.setdefault("labels", json.dumps(list(prepare["labels"])))
        version = register_run_model(client, self.model_name, self.run_id, tags)
        move = move_alias(
            client,
            self.model_name,
            CANDIDATE,
            version,
            actor=audit_actor(context),
            reason=f"registered from run {self.run_id}",
        )
        self._data_fingerprint = run_tags.get("sparktune.data_fingerprint") or tags.get("data_fingerprint")
        return self._keep(
            {"model_name": self.model_name, "version": version, "alias_move": move.to_summary()}
        )

    def _lineage(self):
        """The MLflow run's model -> the registered model version."""
        from sparktune_airflow.lineage import register_lineage

        result = self._lineage_result
        return register_lineage(
            str(self.run_id),
            result["model_name"],
            result["version"],
            getattr(self, "_data_fingerprint", None),
            settings().mlflow_tracking_uri,
        )


class EvaluateModelOperator(UsesMLflowConnection, BaseOperator):
    """Challenger and current champion on the same frozen test split; metrics to the challenger's run.

    Returns both models' flat metrics and versions, and the paired comparison of the two on the same
    rows (differences of accuracy and macro F1 with their bootstrap intervals); the champion's
    metrics and the comparison are None when there is no champion. ``label_change`` says which
    labels the challenger added and removed against the champion (each model's label set from its
    evaluation, else its version's ``labels`` tag; None without a champion); when they differ, the
    comparison covers only the rows whose label both know (None when there is no such row), while
    the champion's own metrics stay those of every row. ``baseline`` holds the TF-IDF +
    logistic regression baseline's metrics and the paired differences to it.

    :param model_name: (templated) the registered model name; its ``champion`` alias is the baseline.
    :param version: (templated) the challenger's version.
    :param dataset_uri: (templated) the ``DatasetDict`` whose ``test`` split both are scored on.
    :param run_id: (templated) the MLflow run that receives the metrics (the champion's prefixed
        ``champion_``, the paired differences ``vs_champion_``), the result JSONs and confusion
        matrices under ``evaluation/``.
    :param pipeline_params: (templated) ``trust_remote_code``; default (None): the DAG run's params
        (none there: False, a model shipping its own code is refused).
    """

    template_fields: Sequence[str] = ("model_name", "version", "dataset_uri", "run_id", "pipeline_params")

    def __init__(
        self,
        *,
        model_name: str,
        version: str,
        dataset_uri: str,
        run_id: str,
        pipeline_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.version = version
        self.dataset_uri = dataset_uri
        self.run_id = run_id
        self.pipeline_params = pipeline_params

    @staticmethod
    def _files(work: Path, label: str) -> list[Path]:
        """Where a model's evaluation files go, in the order the run's ``evaluation/`` folder lists
        them: the result JSON (per-example outcomes included), the per-row predictions CSV
        (``example_id, label, prediction, score``: what the served model answers) and the confusion
        matrix PNG."""
        if label == "challenger":
            return [work / "eval_challenger.json", work / "predictions.csv", work / "confusion_matrix.png"]
        return [
            work / f"eval_{label}.json",
            work / f"{label}_predictions.csv",
            work / f"{label}_confusion_matrix.png",
        ]

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.registry import CHAMPION, alias_version

        client = mlflow_client()
        work = task_scratch_dir(context)
        trust = _trust_remote_code(self.pipeline_params, context)
        champion_version = alias_version(client, self.model_name, CHAMPION)
        against_champion = champion_version is not None and champion_version != str(self.version)
        challenger_uri = f"models:/{self.model_name}/{self.version}"
        files = self._files(work, "challenger")
        command = [
            *("--model-uri", challenger_uri, "--dataset-path", self.dataset_uri, "--split", "test"),
            *("--output", str(files[0]), "--predictions", str(files[1]), "--confusion-matrix", str(files[2])),
            *("--trust-remote-code", "true" if trust else "false"),
        ]
        # The cheap model it must beat, on the same rows, in the same process (sparktune.baseline).
        baseline_file = work / "eval_baseline.json"
        command += ["--baseline-output", str(baseline_file)]
        champion_files: list[Path] = []
        if against_champion:
            # Both models in one process, on the same rows: the imports are paid once.
            champion_files = self._files(work, "champion")
            command += [
                *("--champion-model-uri", f"models:/{self.model_name}/{champion_version}"),
                *("--champion-output", str(champion_files[0])),
                *("--champion-predictions", str(champion_files[1])),
                *("--champion-confusion-matrix", str(champion_files[2])),
            ]
        result = _run_module("sparktune.evaluation", *command)
        # Exit 2 (a refused model, an unusable dataset) fails at once: a retry would refuse it again.
        what = challenger_uri + (f" and champion v{champion_version}" if against_champion else "")
        _raise_for_exit_code(f"evaluating {what}", result.exit_code, result.output)
        challenger = json.loads(files[0].read_text())["metrics"]
        champion = comparison = change = None
        if against_champion:
            champion = json.loads(champion_files[0].read_text())["metrics"]
            comparison, change = _versus_champion(
                client, self.model_name, (str(self.version), champion_version), files[0], champion_files[0]
            )
            if change.changed:
                self.log.warning(
                    "label set changed vs champion v%s: added %s, removed %s; compared on the %d of %d "
                    "test rows whose label both know",
                    champion_version,
                    change.added,
                    change.removed,
                    change.n_shared_rows,
                    change.n_rows,
                )
            files += champion_files
        baseline = _baseline_metrics(files[0], baseline_file)
        files.append(baseline_file)
        for name, value in challenger.items():
            client.log_metric(self.run_id, name, value)
            self.log.info("challenger v%s %-22s %.4f", self.version, name, value)
        for name, value in baseline.items():
            client.log_metric(self.run_id, name, value)
            self.log.info("baseline (TF-IDF + logistic regression) %-28s %+.4f", name, value)
        for name, value in (champion or {}).items():
            client.log_metric(self.run_id, f"champion_{name}", value)
            self.log.info("champion   v%s %-22s %.4f", champion_version, name, value)
        for name, value in (comparison.metrics() if comparison else {}).items():
            client.log_metric(self.run_id, name, value)
            self.log.info("paired vs champion v%s %-30s %+.4f", champion_version, name, value)
        for name in ("eval_loss", "eval_accuracy", "eval_macro_f1"):
            if name in challenger:
                client.set_model_version_tag(
                    self.model_name, str(self.version), name, f"{challenger[name]:.6f}"
                )
        for path in files:
            if path.is_file():
                client.log_artifact(self.run_id, str(path), "evaluation")
            else:  # the CLI logged why; the metrics still decide the gate
                self.log.warning("evaluation left no %s to log", path.name)
        # XCom: the flat metrics and intervals only; per-example outcomes stay in the logged JSON.
        return {
            "model_name": self.model_name,
            "challenger_version": str(self.version),
            "champion_version": champion_version,
            "challenger": challenger,
            "champion": champion,
            "comparison": comparison.to_summary() if comparison else None,
            "label_change": change.to_summary() if change else None,
            "baseline": baseline,
        }


def _paired(challenger_json: Path, other_json: Path) -> Any:
    """The paired comparison of two result files the evaluation CLI wrote on one split."""
    from sparktune.comparison import ComparisonInputError, compare_result_files

    try:
        return compare_result_files(challenger_json, other_json)
    except ComparisonInputError as exc:  # both were scored on one split: a bug, not a fault
        raise AirflowFailException(str(exc)) from exc


def _versus_champion(
    client: Any, model_name: str, versions: tuple[str, str], challenger_json: Path, champion_json: Path
) -> tuple[Any, Any]:
    """(the paired comparison or None, the label change) of challenger and champion, ``versions``
    in that order. Models trained on different label sets are compared on the rows whose label both
    know; with no such row there is nothing to pair (None), and the gate says so."""
    from sparktune.comparison import ComparisonInputError, label_change, paired_comparison

    challenger, champion = (
        _with_model_labels(client, model_name, version, path)
        for version, path in zip(versions, (challenger_json, champion_json), strict=True)
    )
    try:
        change = label_change(challenger, champion)
        return (paired_comparison(challenger, champion) if change.n_shared_rows else None), change
    except ComparisonInputError as exc:  # both were scored on one split: a bug, not a fault
        raise AirflowFailException(str(exc)) from exc


def _with_model_labels(client: Any, model_name: str, version: str, result_json: Path) -> Any:
    """A result file the evaluation CLI wrote, with the model's label set: as the evaluation
    recorded it, else the version's ``labels`` tag (registration sets it from the prepared data)."""
    from sparktune.metrics import EvalResult

    result = EvalResult.from_dict(json.loads(result_json.read_text()))
    if result.model_labels:
        return result
    tag = client.get_model_version(model_name, version).tags.get("labels")
    try:
        labels = json.loads(tag) if tag else None
    except ValueError:  # a hand-edited tag: the split's labels stand in, as before label sets were compared
        labels = None
    return replace(result, model_labels=[str(v) for v in labels]) if isinstance(labels, list) else result


def _baseline_metrics(challenger_json: Path, baseline_json: Path) -> dict[str, float]:
    """The baseline's metrics and the paired (challenger - baseline) differences on the same rows."""
    from sparktune.baseline import baseline_metrics
    from sparktune.metrics import EvalResult

    baseline = EvalResult.from_dict(json.loads(baseline_json.read_text()))
    return baseline_metrics(baseline, _paired(challenger_json, baseline_json))


class PromotionGateOperator(UsesMLflowConnection, BaseOperator, SkipMixin):
    """Applies the gate rules; a failed gate skips promotion (the run still ends cleanly).

    Returns the decision, its reasons, the model name and challenger version, and the champion
    version it compared against (``make run`` reads it to exit 3 when promotion was blocked).

    :param evaluation: (templated) what ``EvaluateModelOperator`` returned.
    :param run_id: (templated) the MLflow run tagged with the decision, mode and reasons.
    :param pipeline_params: (templated) ``gate_mode``, ``min_accuracy``, ``max_eval_loss``,
        ``max_regression``, ``max_class_regression``, ``min_margin_over_baseline``,
        ``allow_label_change``; default (None): the DAG run's params.
    """

    template_fields: Sequence[str] = ("evaluation", "run_id", "pipeline_params")

    def __init__(
        self,
        *,
        evaluation: dict[str, Any],
        run_id: str,
        pipeline_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.evaluation = evaluation
        self.run_id = run_id
        self.pipeline_params = pipeline_params

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.comparison import LabelChange, PairedComparison
        from sparktune.gate import decide, gate_rules

        params = pipeline_params(self.pipeline_params, context)
        evaluation = self.evaluation
        comparison = evaluation.get("comparison")
        # Absent from what an evaluation before these rules returned: the rules then say so and pass.
        change = evaluation.get("label_change")
        decision = decide(
            gate_rules(params),
            evaluation["challenger"],
            evaluation["champion"],
            params.gate_mode,
            comparison=PairedComparison.from_summary(comparison) if comparison else None,
            champion_version=evaluation["champion_version"],
            baseline=evaluation.get("baseline"),
            label_change=LabelChange.from_summary(change) if change else None,
        )
        for reason in decision.reasons:
            self.log.info("gate: %s", reason)
        verdict = "promote" if decision.promote else "blocked"
        self.log.info("gate decision (%s mode): %s", decision.mode, verdict)
        client = mlflow_client()
        client.set_tag(self.run_id, "sparktune.gate.decision", verdict)
        client.set_tag(self.run_id, "sparktune.gate.mode", decision.mode)
        client.set_tag(self.run_id, "sparktune.gate.reasons", "\n".join(decision.reasons)[:5000])
        client.set_model_version_tag(
            evaluation["model_name"], evaluation["challenger_version"], "gate_decision", verdict
        )
        summary = {
            **decision.to_summary(),
            "model_name": evaluation["model_name"],
            "challenger_version": evaluation["challenger_version"],
            "champion_version": evaluation["champion_version"],
        }
        if not decision.promote:
            # Airflow 3's skip raises to end the task, so this return never happens: push it first,
            # or a blocked decision (the one worth reading) would be the one missing from XCom.
            context["ti"].xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=summary)
            skip_downstream(self, context)
        return summary


class PromoteModelOperator(UsesMLflowConnection, BaseOperator):
    """Moves one alias to the challenger; for ``champion`` it first checks nobody promoted in between.

    Every move is written to the audit log (MLflow experiment ``sparktune-registry-audit``) with
    this task as the actor. Returns the move.

    :param model_name: (templated) the registered model name.
    :param version: (templated) the version the alias moves to.
    :param alias: the alias to move (``staging``, ``champion``, ...); moving ``champion`` keeps
        the old one as ``previous_champion``.
    :param expected_champion: (templated) for ``champion``: the version the gate compared against;
        if the alias points elsewhere now, the task fails at once and nothing moves.
    :param reason: (templated) the audit reason; default: "promoted by" this task.
    :param gate_decision: (templated) the gate's summary; the audit reason then says what the gate
        decided and in which mode.
    """

    template_fields: Sequence[str] = ("model_name", "version", "expected_champion", "reason", "gate_decision")
    operator_extra_links = (MLflowModelVersionLink(),)

    def __init__(
        self,
        *,
        model_name: str,
        version: str,
        alias: str,
        expected_champion: str | None = None,
        reason: str = "",
        gate_decision: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """``gate_decision``: the gate task's summary; the audit record then says what the gate
        decided and in which mode (a dry_run that failed its rules says so)."""
        super().__init__(**kwargs)
        self.model_name = model_name
        self.version = version
        self.alias = alias
        self.expected_champion = expected_champion
        self.reason = reason
        self.gate_decision = gate_decision

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.gate import promotion_reason
        from sparktune.registry import CHAMPION, ChampionChangedError, move_alias

        client = mlflow_client()
        reason = self.reason or f"promoted by {audit_actor(context)}"
        if self.gate_decision:
            reason = promotion_reason(self.gate_decision, audit_actor(context))
        try:
            move = move_alias(
                client,
                self.model_name,
                self.alias,
                str(self.version),
                actor=audit_actor(context),
                reason=reason,
                check_current=self.alias == CHAMPION,
                expected_current=self.expected_champion,
            )
        except ChampionChangedError as exc:
            raise AirflowFailException(str(exc)) from exc
        # Each outlet (llm_finetune gives champion its asset) gets an event saying what moved, so
        # a consumer such as batch_inference knows which model and version to use.
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {
                "model_name": move.model_name,
                "alias": move.alias,
                "version": move.to_version,
                "previous_version": move.from_version,
                "reason": move.reason[:500],
            }
        return move.to_summary()


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
    :param pipeline_params: (templated) ``smoke_max_invalid_rate`` and ``trust_remote_code``; default
        (None): the DAG run's params.
    """

    template_fields: Sequence[str] = ("model_name", "version", "dataset_uri", "run_id", "pipeline_params")

    def __init__(
        self,
        *,
        model_name: str,
        version: str,
        dataset_uri: str,
        run_id: str,
        alias: str = "staging",
        rows: int = 16,
        pipeline_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.version = version
        self.dataset_uri = dataset_uri
        self.run_id = run_id
        self.alias = alias
        self.rows = rows
        self.pipeline_params = pipeline_params

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.registry import alias_version

        client = mlflow_client()
        current = alias_version(client, self.model_name, self.alias)
        if current != str(self.version):
            raise AirflowFailException(
                f"{self.model_name}@{self.alias} is version {current}, not {self.version} that this run "
                f"promoted; another run moved it. Re-run this DAG run's promotion from evaluate."
            )
        output = task_scratch_dir(context) / "smoke.json"
        model_uri = f"models:/{self.model_name}@{self.alias}"
        params = pipeline_params(self.pipeline_params, context)
        result = _run_module(
            "sparktune.smoke",
            *("--model-uri", model_uri, "--dataset-path", self.dataset_uri, "--rows", str(self.rows)),
            *("--max-invalid-rate", str(params.smoke_max_invalid_rate), "--output", str(output)),
            *("--trust-remote-code", "true" if params.trust_remote_code else "false"),
        )
        _raise_for_exit_code(f"smoke test of {model_uri}", result.exit_code, result.output)
        summary = json.loads(output.read_text())
        for name, value in summary["metrics"].items():
            client.log_metric(self.run_id, name, value)
            client.set_model_version_tag(self.model_name, str(self.version), name, f"{value:.3f}")
        self.log.info("smoke test of %s passed: %s", model_uri, json.dumps(summary["metrics"]))
        return {"model_uri": model_uri, "version": str(self.version), **summary["metrics"]}
