"""The feedback loop: scored rows and human corrections in one feedback table, merged into training data.

Layout of the feedback table (``feedback_uri``, default ``<lake>/feedback``; an Airflow Asset):

- ``predictions/date=<day>/``: what batch inference scored that day, with the text, so a reviewer
  (or a labelling tool) can correct it: ``id, text, prediction, score, model_name, model_version,
  scored_at``. Written by :func:`write_review_rows`, overwriting its own day like the predictions.
- ``corrections/batch=<id>/``: human corrections, ``id, text, label, corrected_at, prediction,
  model_version``. Written by :func:`record_corrections` from a file of ``id, label`` rows (the text
  is looked up in ``predictions/`` when the file has none); a batch id is written once, so a rerun
  replaces its own batch.

:func:`merge_feedback` builds the next training data version: the training source plus every
corrected row whose text the source does not already hold (compared by the dedupe key of
``sparktune.data.prepare``, :func:`~sparktune.data.prepare.content_key`, over ALL splits: a corrected text
that sits in the test split is never added again, so nothing leaks from test into train). Among
several corrections of one text the latest wins. The result is written once per content under
``<versions_root>/<version>`` as Parquet; without new rows the source is returned unchanged, so
its data fingerprint, and the decision to skip training, stay the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

PREDICTIONS_DIR = "predictions"
CORRECTIONS_DIR = "corrections"
REVIEW_COLUMNS = ("id", "text", "prediction", "score", "model_name", "model_version", "scored_at")
CORRECTION_COLUMNS = ("id", "text", "label", "corrected_at", "prediction", "model_version")
VERSION_MARKER = "_SPARKTUNE_SOURCE.json"


class FeedbackError(ValueError):
    """Corrections or a feedback table that cannot be used; the message says how to fix it."""


def _path_exists(spark: SparkSession, uri: str) -> bool:
    from sparktune.data.prepare_source import hadoop_fs

    fs, path = hadoop_fs(spark, uri)
    return bool(fs.exists(path))


def _has_parquet(spark: SparkSession, uri: str) -> bool:
    from sparktune.data.prepare_source import hadoop_fs

    fs, path = hadoop_fs(spark, uri)
    if not fs.exists(path):
        return False
    files = fs.listFiles(path, True)
    while files.hasNext():
        if files.next().getPath().getName().endswith(".parquet"):
            return True
    return False


# ------------------------------------------------------------------------------------ review rows


def write_review_rows(
    spark: SparkSession,
    predictions: DataFrame,
    source: DataFrame,
    feedback_uri: str,
    run_date: date,
) -> int:
    """Predictions of one run with their texts -> ``feedback_uri/predictions/date=<run_date>``.

    ``predictions`` has :data:`sparktune.serve.inference.OUTPUT_COLUMNS`; ``source`` has ``id`` and
    ``text`` (strings). The day's partition is overwritten, other days stay. Returns the rows written.
    """
    from pyspark.sql import functions as F
    from sparktune.serve.inference import write_dated_partition

    texts = source.select("id", "text").dropDuplicates(["id"])
    rows = (
        predictions.select("id", "prediction", "score", "model_name", "model_version", "scored_at")
        .join(texts, "id", "left")
        .select(*REVIEW_COLUMNS)
        .withColumn("date", F.lit(run_date.isoformat()).cast("date"))
    )
    count = write_dated_partition(rows, f"{feedback_uri.rstrip('/')}/{PREDICTIONS_DIR}")
    log.info("Wrote %d rows for review to %s/%s/date=%s", count, feedback_uri, PREDICTIONS_DIR, run_date)
    return count


# ------------------------------------------------------------------------------------ corrections


@dataclass(frozen=True)
class CorrectionsResult:
    corrections_uri: str
    batch_uri: str
    rows: int
    labels: dict[str, int]

    def to_summary(self) -> dict[str, Any]:
        return asdict(self)


def record_corrections(
    spark: SparkSession,
    corrections_uri: str,
    feedback_uri: str,
    batch_id: str,
    *,
    source_format: str = "auto",
    known_labels: list[str] | None = None,
    corrected_at: datetime,
    captures_uri: str | None = None,
) -> CorrectionsResult:
    """Validate a file of human corrections and add it to the feedback table as batch ``batch_id``.

    The file needs ``id`` and ``label`` columns; ``text`` and ``corrected_at`` are optional. A
    missing text is looked up by id among the rows batch inference scored into the feedback table
    and, given ``captures_uri``, the serving endpoint's captured answers (their ids are
    ``<request_id>:<row>``); a missing time is ``corrected_at``. Every problem is reported at
    once: missing columns, blank labels, labels outside ``known_labels`` (when given), ids that
    were never scored and have no text.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from sparktune.data.prepare_source import load_source

    raw = load_source(spark, corrections_uri, source_format)
    columns = {c.lower(): c for c in raw.columns}
    missing = [c for c in ("id", "label") if c not in columns]
    if missing:
        raise FeedbackError(
            f"The corrections at {corrections_uri} have no column {' and no '.join(map(repr, missing))} "
            f"(it has {raw.columns}). Fix: one row per corrected example with the scored row's 'id' and the "
            "right 'label' (optional: 'text', 'corrected_at')."
        )

    def optional(name: str, cast: str):
        return F.col(columns[name]).cast(cast) if name in columns else F.lit(None).cast(cast)

    corrections = raw.select(
        F.trim(F.col(columns["id"]).cast("string")).alias("id"),
        F.trim(F.col(columns["label"]).cast("string")).alias("label"),
        optional("text", "string").alias("given_text"),
        F.coalesce(optional("corrected_at", "timestamp"), F.lit(corrected_at).cast("timestamp")).alias(
            "corrected_at"
        ),
    ).persist()
    try:
        problems: list[str] = []
        blank = corrections.where(
            F.col("id").isNull() | (F.col("id") == "") | F.col("label").isNull() | (F.col("label") == "")
        ).count()
        if blank:
            problems.append(f"{blank} rows have a blank id or label")
        if known_labels:
            unknown = [
                r["label"]
                for r in corrections.where(~F.col("label").isin(list(known_labels)) & (F.col("label") != ""))
                .select("label")
                .distinct()
                .limit(10)
                .collect()
            ]
            if unknown:
                problems.append(
                    f"labels the model does not know: {sorted(unknown)} (known: {sorted(known_labels)}); "
                    "a new label needs a training source that has examples of it"
                )
        scored = _latest_scored(spark, feedback_uri, captures_uri)
        if scored is None:
            joined = corrections.select(
                "*",
                F.lit(None).cast("string").alias("text"),
                F.lit(None).cast("string").alias("prediction"),
                F.lit(None).cast("string").alias("model_version"),
            )
        else:
            joined = corrections.join(scored, "id", "left")
        joined = joined.withColumn("text", F.coalesce("given_text", "text"))
        orphans = [r["id"] for r in joined.where(F.col("text").isNull()).select("id").limit(5).collect()]
        if orphans:
            n = joined.where(F.col("text").isNull()).count()
            served = f" nor answered by the server into {captures_uri}" if captures_uri else ""
            problems.append(
                f"{n} ids were never scored into {feedback_uri}/{PREDICTIONS_DIR}{served} and have no "
                f"'text' column value (e.g. {orphans}); add a 'text' column or correct scored rows only"
            )
        if problems:
            raise FeedbackError(
                f"Cannot record the corrections at {corrections_uri}:\n- " + "\n- ".join(problems)
            )
        # One row per id in a batch: the latest correction of an id wins.
        latest = Window.partitionBy("id").orderBy(F.col("corrected_at").desc(), F.col("label"))
        rows = (
            joined.withColumn("_n", F.row_number().over(latest))
            .where("_n = 1")
            .select(*CORRECTION_COLUMNS)
            .coalesce(_input_partitions(raw))
            .persist()
        )
        batch_uri = f"{feedback_uri.rstrip('/')}/{CORRECTIONS_DIR}/batch={_safe(batch_id)}"
        rows.write.mode("overwrite").parquet(batch_uri)
        counts = {r["label"]: int(r["count"]) for r in rows.groupBy("label").count().collect()}
        rows.unpersist()
    finally:
        corrections.unpersist()
    total = sum(counts.values())
    log.info("Recorded %d corrections from %s into %s", total, corrections_uri, batch_uri)
    return CorrectionsResult(corrections_uri=corrections_uri, batch_uri=batch_uri, rows=total, labels=counts)


def captured_row_id(request_id: Any, row: Any) -> Any:
    """The id a served answer is corrected by: ``<request_id>:<row>`` (Spark columns or values)."""
    if isinstance(request_id, str):
        return f"{request_id}:{row}"
    from pyspark.sql import functions as F

    return F.concat_ws(":", request_id, row.cast("string"))


def _latest_scored(
    spark: SparkSession, feedback_uri: str, captures_uri: str | None = None
) -> DataFrame | None:
    """id -> text, prediction and model version of the latest scoring of that id (batch inference's
    review rows, and the server's captured answers), or None when there are none."""
    from functools import reduce

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    frames = []
    uri = f"{feedback_uri.rstrip('/')}/{PREDICTIONS_DIR}"
    if _has_parquet(spark, uri):
        frames.append(
            spark.read.parquet(uri).select("id", "text", "prediction", "model_version", "scored_at")
        )
    if captures_uri and _has_parquet(spark, captures_uri):
        captured = spark.read.parquet(captures_uri)
        frames.append(
            captured.select(
                captured_row_id(F.col("request_id"), F.col("row")).alias("id"),
                "text",
                "prediction",
                F.col("model_version").cast("string").alias("model_version"),
                F.col("requested_at").alias("scored_at"),
            )
        )
    if not frames:
        return None
    latest = Window.partitionBy("id").orderBy(F.col("scored_at").desc())
    return (
        reduce(lambda a, b: a.unionByName(b), frames)
        .withColumn("_n", F.row_number().over(latest))
        .where("_n = 1")
        .select("id", "text", "prediction", "model_version")
    )


def _input_partitions(df: DataFrame) -> int:
    """As many partitions as ``df``'s input has, for a shuffled result about to be persisted.

    A shuffle (window, join) makes spark.sql.shuffle.partitions (200) partitions, and adaptive
    execution does not coalesce a persisted plan: recording 40 corrections ran 200-task stages
    for the write and each count that followed (about 6 s of a 16 s job here, and 70 s of CPU
    under load). Corrections are small; their input's partitioning is the right size.
    """
    return max(1, df.rdd.getNumPartitions())


def _safe(value: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in value)[:200]


# ------------------------------------------------------------------------------------ merge


def corrections_present(feedback_uri: str) -> bool:
    """Whether the feedback table holds any correction, asked of the filesystem (no Spark start).

    A filesystem fsspec cannot open here answers True: Spark, which can, then decides.
    """
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(f"{feedback_uri.rstrip('/')}/{CORRECTIONS_DIR}")
        return fs.exists(path) and any(str(p).endswith(".parquet") for p in fs.find(path))
    except (ImportError, ValueError, OSError):
        return True


@dataclass(frozen=True)
class MergeResult:
    """The source the next training run reads, and what feedback added to it."""

    source_uri: str
    source_format: str
    base_source_uri: str
    corrections: int
    already_in_source: int
    added_rows: int
    version: str

    def to_summary(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def unchanged(cls, source_uri: str, source_format: str, corrections: int = 0) -> MergeResult:
        return cls(source_uri, source_format, source_uri, corrections, corrections, 0, "")


def merge_feedback(
    spark: SparkSession,
    source: DataFrame,
    *,
    source_uri: str,
    source_format: str,
    feedback_uri: str,
    versions_root: str,
    text_column: str,
    label_column: str,
    quality_column: str = "",
    id_column: str = "",
    timestamp_column: str = "",
) -> MergeResult:
    """The training source plus the corrected rows it does not hold yet, as a new data version.

    ``source`` is the training source as read from ``source_uri``. Corrected rows get the source's
    column names: the text and label columns, ``quality_column`` = 1.0 (a person checked the
    label), ``id_column`` = the scored row's id, ``timestamp_column`` = the correction time; the
    source's other columns are null. Nothing new: the source itself comes back, unchanged.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

    unchanged = MergeResult.unchanged(source_uri, source_format)
    corrections_uri = f"{feedback_uri.rstrip('/')}/{CORRECTIONS_DIR}"
    if not _has_parquet(spark, corrections_uri):
        log.info("No corrections under %s: the training source is used as it is.", corrections_uri)
        return unchanged
    # Spark resolves column names case-insensitively, and so does prepare_data: so do we.
    by_lower = {c.lower(): c for c in source.columns}
    text_column, label_column, quality_column, id_column, timestamp_column = (
        by_lower.get(name.lower(), "") if name else ""
        for name in (text_column, label_column, quality_column, id_column, timestamp_column)
    )
    if not (text_column and label_column):
        # prepare_data reports a missing column with what the source has and the fix: leave it to it.
        log.warning("The source lacks the text or label column: feedback not merged; prepare_data says more.")
        return unchanged
    recorded = spark.read.parquet(corrections_uri)
    corrections = recorded.withColumn("_key", content_key(F.col("text")))
    latest = Window.partitionBy("_key").orderBy(F.col("corrected_at").desc(), F.col("label"))
    corrections = corrections.withColumn("_n", F.row_number().over(latest)).where("_n = 1").drop("_n")
    known = source.select(content_key(F.col(text_column)).alias("_key")).distinct()
    new = corrections.join(known, "_key", "left_anti").coalesce(_input_partitions(recorded)).persist()
    try:
        total = corrections.count()
        added = new.count()
        if added == 0:
            log.info("All %d corrected texts are already in %s: nothing to add.", total, source_uri)
            return MergeResult.unchanged(source_uri, source_format, total)
        keys = sorted(r["_key"] + ":" + r["label"] for r in new.select("_key", "label").collect())
        version = hashlib.sha256(json.dumps([source_uri, keys]).encode()).hexdigest()[:16]
        target = f"{versions_root.rstrip('/')}/{version}"
        if not _path_exists(spark, f"{target}/{VERSION_MARKER}"):
            schema = dict(source.dtypes)

            def as_source(value: Any, column: str):
                return value.cast(source.schema[column].dataType) if column in schema else value

            mapped = {
                text_column: F.col("text"),
                label_column: F.col("label"),
            }
            if quality_column and quality_column in schema:
                mapped[quality_column] = F.lit(1.0)
            if id_column and id_column in schema:
                mapped[id_column] = F.col("id")
            if timestamp_column and timestamp_column in schema:
                mapped[timestamp_column] = F.col("corrected_at")
            added_rows = new.select(*[as_source(value, name).alias(name) for name, value in mapped.items()])
            merged = source.unionByName(added_rows, allowMissingColumns=True)
            merged.write.mode("overwrite").parquet(target)
            _write_marker(spark, target, source_uri, total, added)
        else:
            log.info("Data version %s already written: reused.", target)
    finally:
        new.unpersist()
    log.info(
        "Feedback: %d corrected texts, %d already in the source, %d added -> %s",
        total,
        total - added,
        added,
        target,
    )
    return MergeResult(target, "parquet", source_uri, total, total - added, added, version)


def _write_marker(spark: SparkSession, target: str, source_uri: str, corrections: int, added: int) -> None:
    """Written last: a version folder without it is a crashed write and is rebuilt."""
    from sparktune.data.prepare_source import hadoop_fs

    record = json.dumps({"base_source_uri": source_uri, "corrections": corrections, "added_rows": added})
    fs, path = hadoop_fs(spark, f"{target}/{VERSION_MARKER}")
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(record.encode()))
    finally:
        stream.close()
