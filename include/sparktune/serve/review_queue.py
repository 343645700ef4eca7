"""The review queue: the rows most worth a person's time, as one file a person fills in.

Two kinds of row, in this order:

1. **Label issues** (origin ``label_issue``; :mod:`sparktune.serve.label_issues`): rows of the
   training source whose given label cross-validated TF-IDF + logistic regression contradicts,
   lowest label quality first. The champion's doubt cannot find them: it learned around them. Up to
   ``label_issues`` of them; ``prediction`` is the suggested label, ``score`` its out-of-sample
   probability, ``given_label`` the source's label and ``label_quality`` cleanlab's score of it.
2. **Scored rows**: every scoring in the feedback loop (batch inference's review rows under
   ``<feedback_uri>/predictions`` and the serving endpoint's captured answers), one row per
   distinct text by :func:`~sparktune.data.prepare.content_key` (the key dedupe and feedback
   merging use; a text scored several times counts by its latest scoring), the ``size`` of lowest
   ``score``: the softmax probability of the predicted label over the label set
   (:mod:`sparktune.core.label_scoring`), so the lowest is the least confident answer. Ties go by
   id, so the same tables always make the same queue.

Texts already corrected under ``<feedback_uri>/corrections`` are left out of both; a text that is
both a label issue in the queue and a scored row appears once, as the label issue.

Doubt is the score alone: the scored rows do not record the runner-up label's probability, so the
margin between the top two labels (margin sampling) cannot be computed from them.

The queue is small (a person reads every row): it is collected to the driver and written as ONE
CSV file and ONE Parquet file (not Spark's folders of part files) through fsspec and pyarrow, so
any filesystem fsspec reaches works. Columns: :data:`QUEUE_COLUMNS`; ``label`` is empty, for the
reviewer. The filled file goes to ``record_corrections`` as it is: rows left without a label are
skipped as not reviewed, the other columns are ignored; a label issue's row carries its text, so
its id needs no scoring, and ``merge_feedback`` relabels the source's rows of that text.
"""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sparktune.serve.feedback import PREDICTIONS_DIR, FeedbackError, recorded_corrections, scored_rows
from sparktune.serve.label_issues import (
    DEFAULT_MAX_ROWS,
    LABEL_ISSUE_ORIGIN,
    LabelIssue,
    LabelIssues,
    source_label_issues,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

QUEUE_COLUMNS = (
    "id",
    "text",
    "prediction",
    "score",
    "model_version",
    "scored_at",
    "origin",
    "given_label",
    "label_quality",
    "label",
)
# The columns a scored row fills; the label-issue columns and the reviewer's label stay empty.
SCORED_QUEUE_COLUMNS = QUEUE_COLUMNS[:7]
CSV_NAME = "review_queue.csv"
PARQUET_NAME = "review_queue.parquet"
# Excel reads a CSV without a byte order mark as the machine's code page (mojibake for any accent)
# and may save it back so; with it, it reads (and "CSV UTF-8" saves) UTF-8. Spark's CSV reader,
# and so record_corrections, drops the mark.
CSV_ENCODING = "utf-8-sig"


@dataclass(frozen=True)
class LabelIssueSource:
    """The training source whose label issues lead the queue, as the pipeline reads it
    (:class:`~sparktune.core.params.DataSource`'s fields; ``source_uri`` resolved)."""

    source_uri: str
    source_format: str = "auto"
    text_column: str = "message"
    label_column: str = "intent_label"
    id_column: str = ""
    max_rows: int = DEFAULT_MAX_ROWS  # distinct texts judged at most; beyond, a fixed sample


@dataclass(frozen=True)
class ReviewQueueResult:
    """Where the queue was written and what it holds."""

    csv_uri: str
    parquet_uri: str
    rows: int  # rows in the queue: label issues, then scored rows
    candidates: int  # distinct scored texts of the model, before leaving out the corrected ones
    already_corrected: int  # of those, texts the feedback table already holds a correction of
    label_issues: int = 0  # rows of the queue that are label issues
    label_issues_found: int = 0  # label issues in the source, corrected texts left out
    label_issue_source_rows: int = 0  # distinct texts of the source looked at for label issues
    label_issue_sampled: bool = False  # more texts than max_rows: a fixed sample was judged

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
    label_issue_source: LabelIssueSource | None = None,
    label_issues: int = 0,
) -> ReviewQueueResult:
    """Write up to ``label_issues`` label issues of ``label_issue_source`` (None or 0: none), then
    the ``size`` scored texts of ``model_name`` (empty: of every model) the model is least sure of,
    none corrected and none queued as a label issue, to ``<output_uri>/review_queue.csv`` and
    ``.parquet``.

    ``captures_uri`` (None: none) holds the server's captured answers; the feedback table's
    predictions, the captures and the label issues may each be missing, not all. A rerun with the
    same tables writes the same files over the old ones (each is written under a hidden name and
    renamed into place).
    """
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

    if size < 1:
        raise FeedbackError(f"The review queue size is {size}. Fix: ask for at least 1 row.")
    if label_issues < 0:
        raise FeedbackError(f"label_issues is {label_issues}. Fix: 0 (none) or more rows.")
    corrections = recorded_corrections(spark, feedback_uri)
    corrected = None if corrections is None else corrections.select(content_key(F.col("text")).alias("_key"))
    found: LabelIssues | None = None
    issues: list[LabelIssue] = []
    if label_issue_source is not None and label_issues > 0:
        found = source_label_issues(
            spark,
            source_uri=label_issue_source.source_uri,
            source_format=label_issue_source.source_format,
            text_column=label_issue_source.text_column,
            label_column=label_issue_source.label_column,
            id_column=label_issue_source.id_column,
            exclude_keys=corrected,
            max_rows=label_issue_source.max_rows,
        )
        issues = found.issues[:label_issues]
    scored = scored_rows(spark, feedback_uri, captures_uri)
    if scored is None and not issues:
        served = f" nor answers captured by the server under {captures_uri}" if captures_uri else ""
        source = f", and no label issue in {label_issue_source.source_uri}" if found is not None else ""
        raise FeedbackError(
            f"Nothing to review: no rows scored by batch inference under {feedback_uri}/{PREDICTIONS_DIR}"
            f"{served}{source}. Fix: score texts with the champion first (the batch_inference DAG, "
            "`make score`) or serve it (`make serve`) and send it requests, then build the queue again."
        )
    candidates = already_corrected = 0
    queue = None
    if scored is not None:
        issues = _unclaimed_ids(spark, issues, scored)
        candidates, already_corrected, queue = _least_confident(
            spark, scored, corrected, [i.key for i in issues], model_name=model_name, size=size
        )
    table = _queue_table(issues, queue)
    csv_uri, parquet_uri = write_review_queue(table, output_uri)
    log.info(
        "Review queue: %d label issues (of %d found) and %d scored rows of %d candidate texts "
        "(%d already corrected, left out) -> %s and %s",
        len(issues),
        len(found.issues) if found else 0,
        table.num_rows - len(issues),
        candidates,
        already_corrected,
        csv_uri,
        parquet_uri,
    )
    return ReviewQueueResult(
        csv_uri=csv_uri,
        parquet_uri=parquet_uri,
        rows=table.num_rows,
        candidates=candidates,
        already_corrected=already_corrected,
        label_issues=len(issues),
        label_issues_found=len(found.issues) if found else 0,
        label_issue_source_rows=found.source_rows if found else 0,
        label_issue_sampled=found.sampled if found else False,
    )


def _least_confident(
    spark: SparkSession,
    scored: DataFrame,
    corrected: DataFrame | None,
    queued_keys: list[str],
    *,
    model_name: str,
    size: int,
) -> tuple[int, int, Any]:
    """(candidates, already corrected, the ``size`` least confident rows as Arrow) of the scored
    texts of ``model_name``, one per text, leaving out the texts with keys in ``queued_keys``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

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
    if corrected is None:
        texts = texts.withColumn("_corrected", F.lit(False))
    else:
        texts = texts.join(corrected.distinct().withColumn("_corrected", F.lit(True)), "_key", "left")
    if queued_keys:
        # A text already in the queue as a label issue is not queued twice.
        queued = spark.createDataFrame([(k,) for k in queued_keys], "_key string")
        texts = texts.join(F.broadcast(queued), "_key", "left_anti")
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
        if candidates == 0 and model_name and not queued_keys:
            _refuse_unknown_model(scored, model_name)
        already_corrected = texts.where("_corrected").count()
        queue = (
            texts.where(~F.col("_corrected"))
            # Least confident first; the id settles a tie, so the same tables make the same queue.
            .orderBy(F.col("score").asc_nulls_last(), F.col("id"))
            .limit(size)
            .select(*SCORED_QUEUE_COLUMNS)
            .toArrow()
        )
    finally:
        texts.unpersist()
    return candidates, already_corrected, queue


def _unclaimed_ids(spark: SparkSession, issues: list[LabelIssue], scored: DataFrame) -> list[LabelIssue]:
    """``issues`` with the id of any that a scored row of another text uses replaced by its content
    key: record_corrections takes a scored row's text over the file's, so a correction of that
    label issue would land on the other text."""
    from dataclasses import replace

    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

    if not issues:
        return issues
    by_id = spark.createDataFrame([(i.id, i.key) for i in issues], "id string, _issue_key string")
    taken = {
        r["id"]
        for r in scored.join(F.broadcast(by_id), "id")
        .where(content_key(F.col("text")) != F.col("_issue_key"))
        .select("id")
        .distinct()
        .collect()
    }
    if taken:
        log.warning(
            "Review queue: %d label issues have the id of a scored row of another text (e.g. %s): "
            "they are queued by their content key instead",
            len(taken),
            sorted(taken)[:5],
        )
    return [replace(i, id=i.key) if i.id in taken else i for i in issues]


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


def _queue_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("text", pa.string()),
            ("prediction", pa.string()),
            ("score", pa.float64()),
            ("model_version", pa.string()),
            # UTC whatever the Spark session's time zone: the same instants, one way of writing them.
            ("scored_at", pa.timestamp("us", tz="UTC")),
            ("origin", pa.string()),
            ("given_label", pa.string()),
            ("label_quality", pa.float64()),
            ("label", pa.string()),
        ]
    )


def _queue_table(issues: list[LabelIssue], scored: Any) -> Any:
    """The label issues, then the scored rows (an Arrow table of :data:`SCORED_QUEUE_COLUMNS`, or
    None), as one Arrow table of :data:`QUEUE_COLUMNS`."""
    import pyarrow as pa

    first = pa.Table.from_pylist(
        [
            {
                "id": i.id,
                "text": i.text,
                "prediction": i.suggested_label,
                "score": i.suggested_probability,
                "origin": LABEL_ISSUE_ORIGIN,
                "given_label": i.given_label,
                "label_quality": i.label_quality,
            }
            for i in issues
        ],
        schema=_queue_schema(),
    )
    return first if scored is None else pa.concat_tables([first, _as_queue(scored)])


def _as_queue(table: Any) -> Any:
    """``table`` with every column of :data:`QUEUE_COLUMNS` it lacks empty, in their order and types."""
    import pyarrow as pa

    schema = _queue_schema()
    for name in QUEUE_COLUMNS:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
    return table.select(list(QUEUE_COLUMNS)).cast(schema)


def write_review_queue(queue: Any, output_uri: str) -> tuple[str, str]:
    """The queue (an Arrow table of :data:`QUEUE_COLUMNS`; a column it lacks is written empty, so a
    table of :data:`SCORED_QUEUE_COLUMNS`, like the monitor's drifted texts, is one too) as one CSV
    and one Parquet file under ``output_uri``; their URIs."""
    import fsspec
    import pyarrow.parquet as pq
    from sparktune.core.files import publish_file

    table = _as_queue(queue)
    root = output_uri.rstrip("/")
    fs, path = fsspec.core.url_to_fs(root)

    def publish(name: str, write: Any) -> str:
        publish_file(fs, f"{path}/{name}", write)
        return f"{root}/{name}"

    csv_uri = publish(CSV_NAME, lambda stream: stream.write(_csv_text(table).encode(CSV_ENCODING)))
    parquet_uri = publish(PARQUET_NAME, lambda stream: pq.write_table(table, stream))
    return csv_uri, parquet_uri


def _csv_text(table: Any) -> str:
    """The queue as CSV: a header, every field a spreadsheet could split quoted (commas, quotes,
    newlines in texts), ``scored_at`` in ISO 8601 with its offset, an empty cell for a missing
    value (the reviewer's ``label`` among them)."""
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
