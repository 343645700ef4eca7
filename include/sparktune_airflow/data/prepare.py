"""``PrepareDataOperator``: the preparation job (``sparktune.jobs.prepare_data``) through
spark-submit, or the prepared data the lake already holds for the same inputs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException
from sparktune.core.config import settings
from sparktune.core.params import PipelineParams
from sparktune.data.fingerprint import files_signature, list_source_files
from sparktune.data.prepare_reuse import (
    find_prepared,
    inputs_key,
    record_prepared,
    recorded_summary,
    reused_summary,
)
from sparktune.data.spark_jvm import short_job_conf
from sparktune_airflow.core.lineage import ReportsLineage
from sparktune_airflow.core.links import SparkUILink
from sparktune_airflow.core.spark_jobs import job_path, submit_and_read_summary
from sparktune_airflow.core.spark_submit import SparkSubmitOperator
from sparktune_airflow.core.task_context import check_allowed_location, task_scratch_dir, typed_params


class PrepareDataOperator(ReportsLineage, SparkSubmitOperator):
    """Submits the preparation job (filter, dedupe, format, count tokens, split) through spark-submit.

    The job runs wherever the ``spark_default`` connection points (``local[*]``, a standalone
    master, YARN, Kubernetes) and writes a small summary file that this operator returns
    (``prepared_uri``, ``data_fingerprint``, ``labels``, rows in and out of every step).

    :param tokenizer: (templated) the tokenizer that counts tokens: a hub id or model folder,
        usually what ``ResolveBaseModelOperator`` returned.
    :param source: (templated) the source and its columns (:class:`sparktune.core.params.DataSource`
        or a dict of its fields); missing names (or None) take their defaults.
    :param preparation: (templated) the recipe: filters, template, split seed
        (:class:`sparktune.core.params.PreparationRecipe` or a dict); missing names take defaults.
    :param quality: (templated) the quality gate's thresholds, used with ``validate_quality``
        (:class:`sparktune.core.params.QualityRules` or a dict); missing names take defaults.
    :param lake_uri: where the prepared splits and quarantined rows go, keyed by fingerprint;
        default ``$SPARKTUNE_LAKE_URI`` or ``$SPARKTUNE_HOME/lake``.
    :param source_uri: (templated) read this instead of the params' ``source_uri`` (for example
        ``MergeFeedbackOperator``'s new data version).
    :param source_format: (templated) the format of that source (``auto``, ``parquet``, ``csv``,
        ``json``, ``table``); default: the params'.
    :param validate_quality: also run the data quality gate (``sparktune.data.quality``: raw input,
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
        "source",
        "preparation",
        "quality",
        "tokenizer",
        "source_uri",
        "source_format",
    )
    operator_extra_links = (SparkUILink(),)

    def __init__(
        self,
        *,
        tokenizer: str,
        source: Any = None,
        preparation: Any = None,
        quality: Any = None,
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
        kwargs.setdefault("multiple_outputs", True)  # prepared_uri, data_fingerprint, labels, quality
        # Spark's INFO chatter would bury the step table in the task log; pass conf to change it.
        kwargs.setdefault("conf", {"spark.log.level": "WARN"})
        super().__init__(conn_id=conn_id, **kwargs)
        self.tokenizer = tokenizer
        self.source = source
        self.preparation = preparation
        self.quality = quality
        self.lake_uri = lake_uri
        self.source_uri = source_uri
        self.source_format = source_format
        self.validate_quality = validate_quality
        self.gx_root = gx_root

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.core.params import DataSource, PreparationRecipe, QualityRules, combined
        from sparktune.data.prepare_errors import DataPreparationError
        from sparktune.data.prepare_source import resolve_source_uri

        # The job's functions read these three sections only.
        sections = (
            typed_params(DataSource, self.source, "source"),
            typed_params(PreparationRecipe, self.preparation, "preparation"),
            typed_params(QualityRules, self.quality, "quality"),
        )
        params = combined(*sections)
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
        # The job is sent the three sections it reads, not defaults of the others.
        job_params = {k: v for s in sections for k, v in s.to_dict().items()} | {"source_uri": source_uri}
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
        effective = params.model_copy(update={"source_uri": source_uri, "source_format": source_format})
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
        (sparktune.data.prepare_reuse), with its quality report when this run's gate has the same rules."""
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
        from sparktune_airflow.core.lineage import prepare_lineage

        return prepare_lineage(self._lineage_result)
