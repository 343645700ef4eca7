"""``SparkQualityGateOperator``: the Great Expectations data quality gate in a Spark session, or
the decision on the report the preparation job already wrote."""

from __future__ import annotations

import ast
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune.core.config import settings
from sparktune.core.params import PipelineParams
from sparktune.data.spark_jvm import input_bytes
from sparktune_airflow.core.links import DataDocsLink
from sparktune_airflow.core.spark_jobs import session_jvm_conf
from sparktune_airflow.core.task_context import check_allowed_location, typed_params


def _quality_gate(
    prepared_uri: str | None,
    source_uri: str | None,
    typed_params: PipelineParams,
    gx_root: str,
    run_id: str,
    fail_on_error: bool | str = True,
    raw_suite_name: str | None = None,
    spark: Any = None,
) -> dict[str, Any]:
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_source import resolve_source_uri
    from sparktune.data.quality import run_quality_gate
    from sparktune.data.quality_rules import RAW_INPUT

    # py4j logs a traceback at INFO for every socket the provider's session.stop() closes.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Great Expectations logs a few hundred lines of its own bookkeeping at INFO (registering functions).
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    fail = _fail_on_error(fail_on_error)
    typed = typed_params
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
    from sparktune.data.quality_report import format_failures

    print(f"quality: {report.evaluated} expectations, success={report.success}, docs {report.data_docs_uri}")
    print(f"Data Docs (every suite and run): {report.data_docs_index_uri}")
    feedback = report.statistics.get("feedback")
    if feedback:
        print(
            f"feedback: the corrections changed {feedback['labels_changed']} label(s) of the source and "
            f"added {feedback['added_rows']} text(s); relabelled rows: {feedback['overrides_uri']}"
        )
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
    :param source: (templated) the columns and how to read the source
        (:class:`sparktune.core.params.DataSource` or a dict: ``text_column``, ``label_column``,
        ``source_format``, ...); missing names (or None) take their defaults.
    :param rules: (templated) the rule thresholds (:class:`sparktune.core.params.QualityRules` or a
        dict: ``min_rows``, ``max_null_rate``, ``quality_warning_rules``, ...); missing names (or
        None) take their defaults.
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
        "source",
        "rules",
        "quality_summary",
    )
    operator_extra_links = (DataDocsLink(),)

    def __init__(
        self,
        *,
        prepared_uri: str | None = None,
        source_uri: str | None = None,
        source: Any = None,
        rules: Any = None,
        gx_root: str | None = None,
        fail_on_error: bool | str = True,
        raw_suite_name: str | None = None,
        quality_summary: dict[str, Any] | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("multiple_outputs", True)  # source_uri, validation_pages: read downstream
        super().__init__(
            python_callable=_quality_gate,
            conn_id=conn_id,
            op_kwargs={
                "prepared_uri": prepared_uri,
                "source_uri": source_uri,
                "gx_root": gx_root or str(settings().gx_root),
                "fail_on_error": fail_on_error,
                "raw_suite_name": raw_suite_name,
            },
            **kwargs,
        )
        self.prepared_uri = prepared_uri
        self.source_uri = source_uri
        self.source = source
        self.rules = rules
        self.quality_summary = quality_summary

    def execute(self, context: Any) -> Any:
        # Params and locations first: a bad value fails here, before a Spark session starts.
        from sparktune.core.params import DataSource, QualityRules, combined

        typed = combined(
            typed_params(DataSource, self.source, "source"), typed_params(QualityRules, self.rules, "rules")
        )
        # Parsed once: the Spark callable gets the typed params, not the raw ones again.
        self.op_kwargs["typed_params"] = typed
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
        from sparktune.data.quality_report import QualityReport

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
    "" for none), like :func:`~sparktune_airflow.core.task_context.templated_bool` for booleans."""
    if not isinstance(value, str):
        return value
    if value.strip() in ("", "None"):
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value  # _decide_on names what was expected


def _default_source_uri(params: PipelineParams) -> str | None:
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_source import resolve_source_uri

    try:
        return resolve_source_uri(params)
    except DataPreparationError:
        return None  # _quality_gate reports it
