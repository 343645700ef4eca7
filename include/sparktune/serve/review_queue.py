"""The review queue: the scored rows the model is least sure of, as one file a person fills in.

Reads every scoring in the feedback loop (batch inference's review rows under
``<feedback_uri>/predictions`` and the serving endpoint's captured answers), keeps one row per
distinct text, by :func:`~sparktune.data.prepare.content_key` (the key dedupe and feedback merging
use; a text scored several times counts by its latest scoring), leaves out the texts already
corrected under ``<feedback_uri>/corrections``, and keeps the ``size`` rows of lowest ``score``:
the softmax probability of the predicted label over the label set
(:mod:`sparktune.core.label_scoring`), so the lowest is the least confident answer. Ties go by id,
so the same tables always make the same queue.

Doubt is the score alone: the scored rows do not record the runner-up label's probability, so the
margin between the top two labels (margin sampling) cannot be computed from them.

The queue is small (a person reads every row): it is collected to the driver and written as ONE
CSV file and ONE Parquet file (not Spark's folders of part files) through fsspec and pyarrow, so
any filesystem fsspec reaches works. Columns: :data:`QUEUE_COLUMNS`; ``label`` is empty, for the
reviewer. The filled file goes to ``record_corrections`` as it is: rows left without a label are
skipped as not reviewed, the other columns are ignored.
"""

from __future__ import annotations

import csv
import io
import logging
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sparktune.serve.feedback import PREDICTIONS_DIR, FeedbackError, recorded_corrections, scored_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

QUEUE_COLUMNS = ("id", "text", "prediction", "score", "model_version", "scored_at", "origin", "label")
CSV_NAME = "review_queue.csv"
PARQUET_NAME = "review_queue.parquet"
# Excel reads a CSV without a byte order mark as the machine's code page (mojibake for any accent)
# and may save it back so; with it, it reads (and "CSV UTF-8" saves) UTF-8. Spark's CSV reader,
# and so record_corrections, drops the mark.
CSV_ENCODING = "utf-8-sig"


@dataclass(frozen=True)
class ReviewQueueResult:
    """Where the queue was written and what it holds."""

    csv_uri: str
    parquet_uri: str
    rows: int  # rows in the queue (at most the size asked for)
    candidates: int  # distinct scored texts of the model, before leaving out the corrected ones
    already_corrected: int  # of those, texts the feedback table already holds a correction of

    def to_summary(self) -> dict[str, Any]:
        return asdict(self)


def build_review_queue(
    spark: SparkSession,
    *,
    feedback_uri: str,
    captures_uri: str | None,
    model_name: str,
    size: int,
    output_uri: str,
) -> ReviewQueueResult:
    """Write the ``size`` scored texts of ``model_name`` (empty: of every model) the model is least
    sure of, not yet corrected, to ``<output_uri>/review_queue.csv`` and ``.parquet``.

    ``captures_uri`` (None: none) holds the server's captured answers; either it or the feedback
    table's predictions may be missing, not both. A rerun with the same tables writes the same
    files over the old ones (each is written under a hidden name and renamed into place).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

    if size < 1:
        raise FeedbackError(f"The review queue size is {size}. Fix: ask for at least 1 row.")
    scored = scored_rows(spark, feedback_uri, captures_uri)
    if scored is None:
        served = f" nor answers captured by the server under {captures_uri}" if captures_uri else ""
        raise FeedbackError(
            f"Nothing to review: no rows scored by batch inference under {feedback_uri}/{PREDICTIONS_DIR}"
            f"{served}. Fix: score texts with the champion first (the batch_inference DAG, `make score`) "
            "or serve it (`make serve`) and send it requests, then build the queue again."
        )
    of_model = scored.where(F.col("model_name") == model_name) if model_name else scored
    # A row without text cannot be reviewed (batch inference found no text for its id).
    of_model = of_model.where(F.col("text").isNotNull() & (F.trim(F.col("text")) != ""))
    # The latest scoring of a text speaks for it; origin and id settle a tie, so reruns agree.
    latest = Window.partitionBy("_key").orderBy(
        F.col("scored_at").desc_nulls_last(), F.col("origin"), F.col("id")
    )
    texts = (
        of_model.withColumn("_key", content_key(F.col("text")))
        .withColumn("_n", F.row_number().over(latest))
        .where("_n = 1")
        .drop("_n")
    )
    corrections = recorded_corrections(spark, feedback_uri)
    if corrections is None:
        texts = texts.withColumn("_corrected", F.lit(False))
    else:
        corrected = corrections.select(content_key(F.col("text")).alias("_key")).distinct()
        texts = texts.join(corrected.withColumn("_corrected", F.lit(True)), "_key", "left")
    # Persisted: both counts and the queue come from one pass over the tables. As many partitions
    # as the input has: adaptive execution does not coalesce a persisted plan's shuffles, and 200
    # tasks per stage (spark.sql.shuffle.partitions) took most of a queue's time on small tables.
    texts = (
        texts.withColumn("_corrected", F.coalesce("_corrected", F.lit(False)))
        .coalesce(max(1, scored.rdd.getNumPartitions()))
        .persist()
    )
    try:
        candidates = texts.count()
        if candidates == 0 and model_name:
            _refuse_unknown_model(scored, model_name)
        already_corrected = texts.where("_corrected").count()
        queue = (
            texts.where(~F.col("_corrected"))
            # Least confident first; the id settles a tie, so the same tables make the same queue.
            .orderBy(F.col("score").asc_nulls_last(), F.col("id"))
            .limit(size)
            .select(*QUEUE_COLUMNS[:-1])
            .toArrow()
        )
    finally:
        texts.unpersist()
    csv_uri, parquet_uri = write_review_queue(queue, output_uri)
    log.info(
        "Review queue: %d rows of %d candidate texts (%d already corrected, left out) -> %s and %s",
        queue.num_rows,
        candidates,
        already_corrected,
        csv_uri,
        parquet_uri,
    )
    return ReviewQueueResult(
        csv_uri=csv_uri,
        parquet_uri=parquet_uri,
        rows=queue.num_rows,
        candidates=candidates,
        already_corrected=already_corrected,
    )


def _refuse_unknown_model(scored: DataFrame, model_name: str) -> None:
    """No scored text of ``model_name``: unless the model scored rows without text, a wrong name,
    so say which models there are instead of writing an empty queue."""
    names = sorted(
        r["model_name"] for r in scored.select("model_name").distinct().limit(20).collect() if r["model_name"]
    )
    if model_name in names:
        return
    raise FeedbackError(
        f"No scored row of model {model_name!r} to review (the scored rows are of {names or 'no model'}). "
        "Fix: set model_name to one of those (empty: every model), or score texts with that model first."
    )


def write_review_queue(queue: Any, output_uri: str) -> tuple[str, str]:
    """The queue (an Arrow table of :data:`QUEUE_COLUMNS` but ``label``; the monitor's drifted
    texts are one too) as one CSV and one Parquet file under ``output_uri``; their URIs."""
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("text", pa.string()),
            ("prediction", pa.string()),
            ("score", pa.float64()),
            ("model_version", pa.string()),
            # UTC whatever the Spark session's time zone: the same instants, one way of writing them.
            ("scored_at", pa.timestamp("us", tz="UTC")),
            ("origin", pa.string()),
            ("label", pa.string()),
        ]
    )
    table = queue.append_column("label", pa.nulls(queue.num_rows, pa.string())).cast(schema)
    root = output_uri.rstrip("/")
    fs, path = fsspec.core.url_to_fs(root)
    fs.makedirs(path, exist_ok=True)

    def publish(name: str, write: Any) -> str:
        # Written under a hidden name, then renamed: a reader (or a rerun's crash) never leaves half a file.
        temporary = f"{path}/.{name}.{uuid.uuid4().hex}.tmp"
        try:
            with fs.open(temporary, "wb") as stream:
                write(stream)
            fs.mv(temporary, f"{path}/{name}")
        finally:
            if fs.exists(temporary):
                fs.rm(temporary)
        return f"{root}/{name}"

    csv_uri = publish(CSV_NAME, lambda stream: stream.write(_csv_text(table).encode(CSV_ENCODING)))
    parquet_uri = publish(PARQUET_NAME, lambda stream: pq.write_table(table, stream))
    return csv_uri, parquet_uri


def _csv_text(table: Any) -> str:
    """The queue as CSV: a header, every field a spreadsheet could split quoted (commas, quotes,
    newlines in texts), ``scored_at`` in ISO 8601 with its offset, an empty ``label``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(QUEUE_COLUMNS)
    for row in table.to_pylist():
        writer.writerow(
            [
                "" if row[c] is None else row[c].isoformat() if c == "scored_at" else row[c]
                for c in QUEUE_COLUMNS
            ]
        )
    return out.getvalue()
