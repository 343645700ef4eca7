"""The prepare_data job's work: read the source, apply the recipe, fingerprint and publish the
prepared rows and the quarantine, each atomically, under ``{lake_uri}/{prepared,quarantine}/{fingerprint}``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparktune.data.data_version import feedback_line, read_version
from sparktune.data.prepare import prepare
from sparktune.data.prepare_report import format_steps, no_rows_left_error, step_warnings, summarize
from sparktune.data.prepare_source import empty_source_error, hadoop_fs, read_source, resolve_source_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from sparktune.core.params import PipelineParams

log = logging.getLogger(__name__)


def publish(spark: SparkSession, write: Callable[[str], None], lake_uri: str, final_uri: str) -> bool:
    """Write through ``write`` into a temp folder, then rename it to ``final_uri``.

    Returns False (and writes nothing) when ``final_uri`` is already complete: its ``_SUCCESS``
    exists. A folder without ``_SUCCESS`` is a leftover of a crashed writer and is replaced.
    """
    jvm_path = spark._jvm.org.apache.hadoop.fs.Path
    fs, final = hadoop_fs(spark, final_uri)
    if fs.exists(jvm_path(final, "_SUCCESS")):
        return False
    tmp_uri = f"{lake_uri}/_tmp/{uuid.uuid4().hex}"
    write(tmp_uri)
    tmp_fs, tmp = hadoop_fs(spark, tmp_uri)
    marker = jvm_path(tmp, "_SUCCESS")
    if not tmp_fs.exists(marker):  # the cluster may turn Spark's own marker off
        tmp_fs.create(marker).close()
    if fs.exists(final):
        fs.delete(final, True)
    fs.mkdirs(final.getParent())
    # Hadoop's rename moves INTO an existing folder, hence the delete above.
    if not fs.rename(tmp, final):
        if fs.exists(jvm_path(final, "_SUCCESS")):  # a concurrent run published the same data
            tmp_fs.delete(tmp, True)
            return False
        raise OSError(f"Could not rename {tmp_uri} to {final_uri}; check permissions on the lake {lake_uri}")
    return True


def _sorted(frame: DataFrame, partitions: int, *columns: str) -> DataFrame:
    """``frame`` sorted by ``columns``, as one file per output folder when it is one partition.

    A single partition is sorted where it is: ``orderBy`` would first run a Spark job to sample it
    for a range shuffle, then shuffle it, only for adaptive execution to coalesce it back into one
    partition, the same rows in the same order.
    """
    return frame.sortWithinPartitions(*columns) if partitions == 1 else frame.orderBy(*columns)


def run_prepare(
    spark: SparkSession,
    params: PipelineParams,
    tokenizer_path: str,
    lake_uri: str,
    *,
    after_publish: Callable[[DataFrame, dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Load, prepare, fingerprint and publish; a rerun on the same data rewrites nothing.

    Writes ``{lake_uri}/prepared/{fingerprint}/split=*/part-*.parquet`` and
    ``{lake_uri}/quarantine/{fingerprint}/``; returns a small JSON-serializable summary. Bad input
    (missing source or column, empty source, undecodable bytes, no row surviving) raises a
    :class:`~sparktune.data.prepare_errors.DataPreparationError` subclass and publishes no prepared data.

    ``after_publish(source_df, summary)`` runs once the data is published, on the source as this
    call read it (the job's quality gate); what it returns joins the summary.
    """
    from sparktune.data.fingerprint import data_fingerprint, tokenizer_fingerprint

    lake_uri = lake_uri.rstrip("/")
    source_uri = resolve_source_uri(params)
    df, fmt = read_source(spark, source_uri, params.source_format)
    prepared = prepare(df, params, tokenizer_path, source=source_uri, check_decoding=fmt in ("csv", "json"))
    try:
        if prepared.steps[0].rows_in == 0:
            raise empty_source_error(
                source_uri,
                f"it has 0 rows (columns found: {', '.join(repr(c) for c in df.columns)})",
            )
        fingerprint = data_fingerprint(prepared.rows, params, tokenizer_fingerprint(tokenizer_path))
        counts = [
            (r["label"], r["split"], r["count"])
            for r in prepared.rows.groupBy("label", "split").count().collect()
        ]
        summary = summarize(prepared.steps, counts)
        prepared_uri = f"{lake_uri}/prepared/{fingerprint}"
        quarantine_uri = f"{lake_uri}/quarantine/{fingerprint}"
        publish(
            spark,
            lambda tmp: (
                _sorted(prepared.quarantine, prepared.partitions, "reject_reason", "example_id", "text")
                .write.mode("error")
                .parquet(tmp)
            ),
            lake_uri,
            quarantine_uri,
        )
        if summary["rows_out"] == 0:
            raise no_rows_left_error(source_uri, prepared.steps, prepared.findings, params, quarantine_uri)
        wrote_rows = publish(
            spark,
            lambda tmp: (
                _sorted(prepared.rows, prepared.partitions, "split", "example_id")
                .write.mode("error")
                .partitionBy("split")
                .parquet(tmp)
            ),
            lake_uri,
            prepared_uri,
        )
    finally:
        prepared.unpersist()
    summary = {
        "data_fingerprint": fingerprint,
        "prepared_uri": prepared_uri,
        "quarantine_uri": quarantine_uri,
        **summary,
        "warnings": step_warnings(prepared.steps, params),
        # The prepared dataset decides: the quarantine is a by-product of the same fingerprint.
        "reused": not wrote_rows,
        "tokenizer": tokenizer_path,
        "source_uri": source_uri,
        "source_format": fmt,
        "label_conflicts": prepared.label_conflicts,
        "prompt_template": prepared.prompt_template,
    }
    version = read_version(spark, source_uri)
    if version is not None:
        summary["feedback"] = version
    log.info("prepare_data %s -> %s (reused=%s)", source_uri, prepared_uri, summary["reused"])
    if version is not None:
        log.info("%s", feedback_line(version))
    for line in format_steps(prepared.steps):
        log.info("%s", line)
    log.info("split counts: %s", json.dumps(summary["split_counts"]))
    for warning in summary["warnings"]:
        log.warning("%s", warning)
    if after_publish is not None:
        summary.update(after_publish(df, summary))
    return summary
