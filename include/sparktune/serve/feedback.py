"""The feedback loop: scored rows and human corrections in one feedback table, merged into training data.

Layout of the feedback table (``feedback_uri``, default ``<lake>/feedback``; an Airflow Asset):

- ``predictions/date=<day>/``: what batch inference scored that day, with the text, so a reviewer
  (or a labelling tool) can correct it: ``id, text, prediction, score, model_name, model_version,
  scored_at``. Written by :func:`write_review_rows`, overwriting its own day like the predictions.
- ``corrections/batch=<id>/``: human corrections, ``id, text, label, corrected_at, prediction,
  model_version``. Written by :func:`record_corrections` from a file of ``id, label`` rows (the text
  is looked up in ``predictions/`` when the file has none); a batch id is written once, so a rerun
  replaces its own batch. A filled review queue (``sparktune.serve.review_queue``) is such a file:
  its rows left without a label are skipped as not reviewed.

:func:`merge_feedback` builds the next training data version: the training source with the
corrections applied, compared by the dedupe key of ``sparktune.data.prepare``
(:func:`~sparktune.data.prepare.content_key`) over ALL splits. The newest correction of a text
wins: a text the source holds with another label is relabelled in place (it keeps its split, so
evaluation sets do not move, and the version lists every relabelled row in
:data:`OVERRIDES_FILE`); a text the source lacks is added. The result is written once per content
under ``<versions_root>/<version>`` as Parquet; when no correction changes anything the source is
returned unchanged, so its data fingerprint, and the decision to skip training, stay the same.
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

from sparktune.core.paths import path_segment
from sparktune.data.data_version import OVERRIDES_FILE, VERSION_MARKER, write_small_file

log = logging.getLogger(__name__)

PREDICTIONS_DIR = "predictions"
CORRECTIONS_DIR = "corrections"
REVIEW_COLUMNS = ("id", "text", "prediction", "score", "model_name", "model_version", "scored_at")
SCORED_COLUMNS = (*REVIEW_COLUMNS, "origin")
# Where a scored row comes from: batch inference's review rows, or an answer the server captured.
BATCH_ORIGIN = "batch"
SERVING_ORIGIN = "serving"
# How many refused rows an error lists by name; the count covers the rest.
LISTED_ROWS = 20
CORRECTION_COLUMNS = ("id", "text", "label", "corrected_at", "corrected_by", "prediction", "model_version")
OVERRIDE_COLUMNS = ("text_key", "text", "old_label", "new_label", "corrected_by", "corrected_at", "rows")


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
    # Rows of the file without a label: not reviewed (a review queue's untouched rows), skipped.
    not_reviewed: int = 0

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
    corrected_by: str | None = None,
) -> CorrectionsResult:
    """Validate a file of human corrections and add it to the feedback table as batch ``batch_id``.

    The file needs ``id`` and ``label`` columns; ``text``, ``corrected_at`` and ``corrected_by``
    (who; default ``corrected_by``) are optional and any
    other column (a review queue's ``prediction``, ``score``, ``origin`` ...) is ignored. A row with
    a blank label was not reviewed: it is skipped and counted (``not_reviewed``), so a partly filled
    review queue can be recorded as it is; a file where no row has a label is an error. A missing
    text is looked up by id among the rows batch inference scored into the feedback table and,
    given ``captures_uri``, the serving endpoint's captured answers (their ids are
    ``<request_id>:<row>``); a missing time is ``corrected_at``. Every problem is reported at
    once: missing columns, labelled rows without an id, labels outside ``known_labels`` (when
    given; the rows are listed by id), ids that were never scored and have no text.
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

    def blank(column: str):
        return F.col(column).isNull() | (F.col(column) == "")

    given = raw.select(
        F.trim(F.col(columns["id"]).cast("string")).alias("id"),
        F.trim(F.col(columns["label"]).cast("string")).alias("label"),
        optional("text", "string").alias("given_text"),
        F.coalesce(optional("corrected_at", "timestamp"), F.lit(corrected_at).cast("timestamp")).alias(
            "corrected_at"
        ),
        F.coalesce(
            F.when(
                F.trim(optional("corrected_by", "string")) != "", F.trim(optional("corrected_by", "string"))
            ),
            F.lit(corrected_by).cast("string"),
        ).alias("corrected_by"),
    ).persist()
    corrections = given.where(~blank("label"))
    try:
        labelled = corrections.count()
        not_reviewed = given.count() - labelled
        if labelled == 0:
            raise FeedbackError(
                f"Cannot record the corrections at {corrections_uri}: no row has a label ({not_reviewed} "
                "rows, every 'label' blank). Fix: fill in the 'label' column of the rows you reviewed "
                "(rows left blank are skipped as not reviewed), save the file and record it again."
            )
        problems: list[str] = []
        no_id = corrections.where(blank("id")).count()
        if no_id:
            problems.append(
                f"{no_id} rows have a label but a blank id; give each the id of the scored row it corrects"
            )
        if known_labels:
            problems.extend(_unknown_labels(corrections, known_labels))
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
        # The text as it was scored wins over the file's copy: a spreadsheet that re-saved the file
        # may have changed it (quotes, dates, spaces), and the text is what corrections are keyed on.
        joined = joined.withColumn("text", F.coalesce("text", "given_text"))
        # A row without an id is reported above, not once more as never scored.
        textless = joined.where(F.col("text").isNull() & ~blank("id"))
        orphans = [r["id"] for r in textless.select("id").limit(5).collect()]
        if orphans:
            n = textless.count()
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
        batch_uri = f"{feedback_uri.rstrip('/')}/{CORRECTIONS_DIR}/batch={path_segment(batch_id)}"
        rows.write.mode("overwrite").parquet(batch_uri)
        counts = {r["label"]: int(r["count"]) for r in rows.groupBy("label").count().collect()}
        rows.unpersist()
    finally:
        given.unpersist()
    total = sum(counts.values())
    log.info(
        "Recorded %d corrections from %s into %s; %d rows without a label skipped as not reviewed",
        total,
        corrections_uri,
        batch_uri,
        not_reviewed,
    )
    return CorrectionsResult(
        corrections_uri=corrections_uri,
        batch_uri=batch_uri,
        rows=total,
        labels=counts,
        not_reviewed=not_reviewed,
    )


def _unknown_labels(corrections: DataFrame, known_labels: list[str]) -> list[str]:
    """The problem of rows whose label is not in ``known_labels``: every such row by id (the first
    :data:`LISTED_ROWS`) and their count, so a reviewer finds each one in the file; [] when none."""
    from pyspark.sql import functions as F

    unknown = corrections.where(~F.col("label").isin(list(known_labels)))
    listed = unknown.select("id", "label").orderBy("id", "label").limit(LISTED_ROWS).collect()
    if not listed:
        return []
    total = unknown.count()
    rows = ", ".join(f"{r['id']!r}: {r['label']!r}" for r in listed)
    more = f" and {total - len(listed)} more" if total > len(listed) else ""
    return [
        f"{total} rows have a label the model does not know (known: {sorted(known_labels)}): "
        f"{rows}{more}. Fix: use one of the known labels (spelled exactly so); a new label needs a "
        "training source that has examples of it"
    ]


def recorded_corrections(spark: SparkSession, feedback_uri: str) -> DataFrame | None:
    """Every correction recorded in the feedback table (:data:`CORRECTION_COLUMNS`), or None."""
    uri = f"{feedback_uri.rstrip('/')}/{CORRECTIONS_DIR}"
    if not _has_parquet(spark, uri):
        return None
    # Batches recorded before a column was added lack it: read them all by the union of their schemas.
    return spark.read.option("mergeSchema", "true").parquet(uri)


def captured_row_id(request_id: Any, row: Any) -> Any:
    """The id a served answer is corrected by: ``<request_id>:<row>`` (Spark columns or values)."""
    if isinstance(request_id, str):
        return f"{request_id}:{row}"
    from pyspark.sql import functions as F

    return F.concat_ws(":", request_id, row.cast("string"))


def scored_rows(spark: SparkSession, feedback_uri: str, captures_uri: str | None = None) -> DataFrame | None:
    """Every scoring of a text: batch inference's review rows (``feedback_uri/predictions``) and,
    given ``captures_uri``, the server's captured answers (id ``<request_id>:<row>``, scored at
    ``requested_at``), as :data:`SCORED_COLUMNS`, ``origin`` telling which; None when neither
    holds any."""
    from functools import reduce

    from pyspark.sql import functions as F

    frames = []
    uri = f"{feedback_uri.rstrip('/')}/{PREDICTIONS_DIR}"
    if _has_parquet(spark, uri):
        frames.append(spark.read.parquet(uri).select(*REVIEW_COLUMNS, F.lit(BATCH_ORIGIN).alias("origin")))
    if captures_uri and _has_parquet(spark, captures_uri):
        captured = spark.read.parquet(captures_uri)
        frames.append(
            captured.select(
                captured_row_id(F.col("request_id"), F.col("row")).alias("id"),
                "text",
                "prediction",
                F.col("score").cast("double").alias("score"),
                "model_name",
                F.col("model_version").cast("string").alias("model_version"),
                F.col("requested_at").alias("scored_at"),
                F.lit(SERVING_ORIGIN).alias("origin"),
            )
        )
    if not frames:
        return None
    return reduce(lambda a, b: a.unionByName(b), frames)


def _latest_scored(
    spark: SparkSession, feedback_uri: str, captures_uri: str | None = None
) -> DataFrame | None:
    """id -> text, prediction and model version of the latest scoring of that id (batch inference's
    review rows, and the server's captured answers), or None when there are none."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    scored = scored_rows(spark, feedback_uri, captures_uri)
    if scored is None:
        return None
    latest = Window.partitionBy("id").orderBy(F.col("scored_at").desc())
    return (
        scored.withColumn("_n", F.row_number().over(latest))
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
    """The source the next training run reads, and what feedback changed in it."""

    source_uri: str
    source_format: str
    base_source_uri: str
    corrections: int  # corrected texts (the newest correction of each)
    already_in_source: int  # of those, texts the source holds
    added_rows: int  # corrected texts the source lacked, added as rows
    version: str
    labels_changed: int = 0  # source rows whose label a correction replaced
    overrides_uri: str = ""  # the list of those rows (OVERRIDES_FILE in the version folder)

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
    """The training source with the human corrections applied, as a new data version.

    ``source`` is the training source as read from ``source_uri``. Texts are matched by
    :func:`~sparktune.data.prepare.content_key` and the newest correction of a text wins:

    - a text the source holds with another label gets the corrected label on every row that holds
      it (its quality, when mapped, becomes 1.0: a person checked it). The row keeps its text and
      so its example_id and split: evaluation sets do not move. Each such row is listed in
      ``<version>/`` :data:`OVERRIDES_FILE` (text key, text, old label, new label, who, when, rows);
    - a text the source lacks is added as a row with the source's column names: the text and label
      columns, ``quality_column`` = 1.0, ``id_column`` = the scored row's id, ``timestamp_column`` =
      the correction time; the source's other columns are null.

    Nothing changed (no correction, or every one agrees with the source): the source itself comes
    back, so its data fingerprint, and the decision to skip training, stay the same.
    """
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
    recorded = spark.read.option("mergeSchema", "true").parquet(corrections_uri)
    corrections = _newest_per_text(recorded).persist()
    source_label = F.trim(F.col(label_column).cast("string"))
    # Only the source rows of corrected texts cross the join: the corrections are broadcast.
    touched = (
        source.select(content_key(F.col(text_column)).alias("_key"), source_label.alias("old_label"))
        .join(F.broadcast(corrections.select("_key", "label")), "_key")
        .groupBy("_key", "old_label", "label")
        .count()
        .persist()
    )
    try:
        total = corrections.count()
        changed = touched.where(~F.col("old_label").eqNullSafe(F.col("label")))
        overrides = (
            changed.join(corrections.drop("label"), "_key")
            .select(
                F.col("_key").alias("text_key"),
                "text",
                "old_label",
                F.col("label").alias("new_label"),
                "corrected_by",
                "corrected_at",
                F.col("count").alias("rows"),
            )
            .orderBy("text_key", "old_label")
            .collect()
        )
        new = corrections.join(touched.select("_key").distinct(), "_key", "left_anti").coalesce(
            _input_partitions(recorded)
        )
        new_keys = sorted(r["_key"] + ":" + r["label"] for r in new.select("_key", "label").collect())
        labels_changed = sum(r["rows"] for r in overrides)
        added = len(new_keys)
        if not (added or overrides):
            log.info(
                "All %d corrected texts are in %s with the corrected label: nothing changes.",
                total,
                source_uri,
            )
            return MergeResult.unchanged(source_uri, source_format, total)
        override_keys = sorted({f"{r['text_key']}:{r['new_label']}" for r in overrides})
        signature = _source_identity(source_uri)
        version = hashlib.sha256(
            json.dumps([source_uri, signature, new_keys, override_keys]).encode()
        ).hexdigest()[:16]
        target = f"{versions_root.rstrip('/')}/{version}"
        if signature is None or not _path_exists(spark, f"{target}/{VERSION_MARKER}"):
            merged = _apply_corrections(
                source,
                corrections,
                new,
                text_column=text_column,
                label_column=label_column,
                quality_column=quality_column,
                id_column=id_column,
                timestamp_column=timestamp_column,
            )
            merged.write.mode("overwrite").parquet(target)
            write_small_file(spark, f"{target}/{OVERRIDES_FILE}", _overrides_csv(overrides))
            record = {
                "base_source_uri": source_uri,
                "corrections": total,
                "added_rows": added,
                "labels_changed": labels_changed,
                "overrides": OVERRIDES_FILE,
            }
            # Last: a folder without the marker is a crashed write, rebuilt by the next merge.
            write_small_file(spark, f"{target}/{VERSION_MARKER}", json.dumps(record))
        else:
            log.info("Data version %s already written: reused.", target)
    finally:
        touched.unpersist()
        corrections.unpersist()
    log.info(
        "Feedback: %d corrected texts, %d already in the source, %d added, %d source rows relabelled -> %s",
        total,
        total - added,
        added,
        labels_changed,
        target,
    )
    return MergeResult(
        target,
        "parquet",
        source_uri,
        total,
        total - added,
        added,
        version,
        labels_changed=labels_changed,
        overrides_uri=f"{target}/{OVERRIDES_FILE}",
    )


def _newest_per_text(recorded: DataFrame) -> DataFrame:
    """One correction per text (by content key): the newest, ties broken by label."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

    if "corrected_by" not in recorded.columns:  # batches recorded before corrections named their author
        recorded = recorded.withColumn("corrected_by", F.lit(None).cast("string"))
    newest = Window.partitionBy("_key").orderBy(F.col("corrected_at").desc(), F.col("label"))
    return (
        recorded.withColumn("_key", content_key(F.col("text")))
        .withColumn("_n", F.row_number().over(newest))
        .where("_n = 1")
        .select("_key", "id", "text", "label", "corrected_at", "corrected_by")
    )


def _apply_corrections(
    source: DataFrame,
    corrections: DataFrame,
    new: DataFrame,
    *,
    text_column: str,
    label_column: str,
    quality_column: str,
    id_column: str,
    timestamp_column: str,
) -> DataFrame:
    """The source with corrected labels in place, plus the corrected texts it lacked."""
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

    schema = dict(source.dtypes)

    def as_source(value: Any, column: str):
        return value.cast(source.schema[column].dataType) if column in schema else value

    fixes = F.broadcast(corrections.select("_key", F.col("label").alias("_fixed")))
    relabelled = source.withColumn("_key", content_key(F.col(text_column))).join(fixes, "_key", "left")
    differs = F.col("_fixed").isNotNull() & ~F.trim(F.col(label_column).cast("string")).eqNullSafe(
        F.col("_fixed")
    )
    replaced = {
        label_column: F.when(differs, as_source(F.col("_fixed"), label_column)).otherwise(F.col(label_column))
    }
    if quality_column:
        replaced[quality_column] = F.when(differs, as_source(F.lit(1.0), quality_column)).otherwise(
            F.col(quality_column)
        )
    relabelled = relabelled.select(*[replaced.get(c, F.col(c)).alias(c) for c in source.columns])

    mapped = {text_column: F.col("text"), label_column: F.col("label")}
    if quality_column:
        mapped[quality_column] = F.lit(1.0)
    if id_column:
        mapped[id_column] = F.col("id")
    if timestamp_column:
        mapped[timestamp_column] = F.col("corrected_at")
    added_rows = new.select(*[as_source(value, name).alias(name) for name, value in mapped.items()])
    return relabelled.unionByName(added_rows, allowMissingColumns=True)


def _overrides_csv(overrides: list[Any]) -> str:
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(OVERRIDE_COLUMNS)
    for r in overrides:
        at = r["corrected_at"]
        writer.writerow(
            [
                r["text_key"],
                r["text"],
                r["old_label"] if r["old_label"] is not None else "",
                r["new_label"],
                r["corrected_by"] or "",
                at.isoformat() if at is not None else "",
                r["rows"],
            ]
        )
    return out.getvalue()


def _source_identity(source_uri: str) -> str | None:
    """The source files' signature (path, size, modification time): a source rewritten in place
    makes a new version. None (a catalog table): the version is rewritten every time."""
    from sparktune.data.fingerprint import source_signature

    try:
        return source_signature(source_uri)
    except (OSError, ValueError, ImportError):
        return None
