"""The data preparation recipe: labelled text rows -> prompt/completion rows split 80/10/10.

Every step is a named filter with row counts (``read``, ``min_quality_score``, ``null_label``,
``length``, ``dedupe``, ``label_conflict``, ``format``, ``max_length``, ``split``). Rejected rows
are not lost: they go to a quarantine DataFrame with their original values and the step that
rejected them.

The recipe runs as ONE pass over the source: each row is annotated with the first step that
rejects it, the annotated DataFrame is persisted, and one aggregation yields every step's counts.
That is what keeps a multi-million-row run from re-reading the source once per step.

``example_id`` and the dedupe key are the ``id_column`` value when one is mapped and set, else a
sha256 of the normalized text. Among copies of one key the kept one is the most recent by
``timestamp_column`` (when mapped), then the one with the smallest hash of its values.

Copies of one normalized text that disagree on the label are a label conflict, not duplicates
(with an id column: rows of different ids, among those dedupe kept). ``label_conflicts``
decides: ``keep_newest`` keeps the copy dedupe would keep and sets the copies labelled otherwise
aside; ``quarantine`` sets every copy aside. Both count them and quarantine them with reason
``label_conflict``; :func:`label_conflicts_report` names a few.

Reading the source is :mod:`sparktune.data.prepare_source`, counting tokens
:mod:`sparktune.data.prepare_tokens`, the stable split :mod:`sparktune.data.prepare_split`, the
step counts :mod:`sparktune.data.prepare_report`, and the job that publishes the result
:mod:`sparktune.data.prepare_publish`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparktune.data.prepare_report import REJECTING_STEPS, StepCount, step_counts
from sparktune.data.prepare_source import (
    check_columns,
    decoding_error,
    decoding_problem,
    find_column,
    quoted_column,
)
from sparktune.data.prepare_split import SPLITS, base_split, split_bucket, split_fixups
from sparktune.data.prepare_tokens import load_tokenizer, token_counter

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from sparktune.core.params import PipelineParams

log = logging.getLogger(__name__)

# Input bytes per dedupe partition, and at most this many partitions per input split.
BYTES_PER_PARTITION = 32 << 20
# Up to this many input bytes the dedupe keeps one partition whatever the cores: counting the
# tokens of a few thousand rows takes a fraction of a second, while each partition's task starts a
# Python worker of its own (pandas, pyarrow and the tokenizer imported: about a second of CPU).
SINGLE_PARTITION_MAX_BYTES = 2 << 20
MAX_PARTITIONS_PER_SPLIT = 4
OUTPUT_COLUMNS = ("example_id", "text", "label", "prompt", "completion", "n_tokens", "split")
QUARANTINE_COLUMNS = ("example_id", "text", "label", "quality", "reject_reason", "reject_detail")
# Java regex; (?U) makes \s match Unicode whitespace (no-break space etc.) like Python's str.strip.
_TRIM_RE = r"(?U)^\s+|\s+$"
_SPACES_RE = r"(?U)\s+"


@dataclass
class PreparedData:
    """The result of :func:`prepare`. ``rows`` and ``quarantine`` read from a persisted frame."""

    rows: DataFrame
    quarantine: DataFrame
    steps: list[StepCount]
    quality_used: bool = True
    # What some steps saw in the rows they rejected, for messages (e.g. "length": "2 to 6 chars").
    findings: dict[str, str] = field(default_factory=dict)
    # label_conflicts_report(): the texts labelled differently in the source, and what was done.
    label_conflicts: dict[str, Any] = field(default_factory=dict)
    # The template the prompts were built with (the run's, or the base model's chat template rendered).
    prompt_template: str = ""
    # Partitions of rows and quarantine (the dedupe's, _dedupe_partitions).
    partitions: int = 0
    _persisted: list[DataFrame] = field(default_factory=list, repr=False)

    def unpersist(self) -> None:
        for frame in self._persisted:
            frame.unpersist()


def split_template(template: str) -> tuple[list[str], str, str]:
    """Split the prompt template into (literal pieces around {text}, whitespace before {label}, tail).

    The prompt is the part before ``{label}`` with ``{text}`` filled in, right-stripped; the
    completion is that stripped whitespace + the label + what follows ``{label}``.
    """
    before, _, after = template.partition("{label}")
    pieces = before.split("{text}")
    last = pieces[-1]
    stripped = last.rstrip()
    pieces[-1] = stripped
    return pieces, last[len(stripped) :], after


def _format_columns(template: str, text: Column, label: Column) -> tuple[Column, Column]:
    from pyspark.sql import functions as F

    pieces, whitespace, after = split_template(template)
    parts: list[Column] = [F.lit(pieces[0])]
    for piece in pieces[1:]:
        parts += [text, F.lit(piece)]
    # Texts are trimmed and non-empty here, so stripping only the template's tail is exact.
    return F.concat(*parts), F.concat(F.lit(whitespace), label, F.lit(after))


class _PromptFormat:
    """The run's prompt template for a label set (``prompt_format.effective_prompt_template``).

    The tokenizer is loaded on the driver only when its chat template is needed: a set template or
    a local folder without a chat template costs no transformers import (about 5 s per job)."""

    def __init__(self, prompt_template: str, tokenizer_path: str, trust_remote_code: bool) -> None:
        from sparktune.core.prompt_format import folder_has_chat_template

        self.prompt_template = prompt_template
        self.tokenizer_path = tokenizer_path
        self.trust_remote_code = trust_remote_code
        self.chat = not prompt_template and folder_has_chat_template(tokenizer_path) is not False

    def template(self, labels: Callable[[], list[str]]) -> str:
        from sparktune.core.prompt_format import effective_prompt_template

        if not self.chat and "{labels}" not in self.prompt_template:
            return effective_prompt_template(self.prompt_template, None, [])
        tokenizer = load_tokenizer(self.tokenizer_path, self.trust_remote_code) if self.chat else None
        return effective_prompt_template(self.prompt_template, tokenizer, labels())


def content_key(text: Column) -> Column:
    """sha256 of the trimmed, lower-cased, space-collapsed text: the dedupe key of a text row.

    Feedback merging uses the same key, so a corrected text already in the source is recognised
    whatever split it landed in.
    """
    from pyspark.sql import functions as F

    trimmed = F.regexp_replace(text, _TRIM_RE, "")
    return F.sha2(F.lower(F.regexp_replace(trimmed, _SPACES_RE, " ")), 256)


def _timestamp_key(df: DataFrame, column: str) -> Column:
    """An orderable key for ``column``: native for times and numbers, parsed for ISO-8601 strings."""
    from pyspark.sql import types as T

    if isinstance(df.schema[column].dataType, T.StringType):
        return quoted_column(column).try_cast("timestamp")
    return quoted_column(column)


def _labels_differ(window: Any) -> Column:
    """Whether the rows of ``window``'s partition carry more than one label."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    whole = window.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    return F.min("label").over(whole) != F.max("label").over(whole)


def _conflict_detail(keep_newest: bool, ts_col: str | None, kept_ts: str) -> Column:
    from pyspark.sql import functions as F

    if not keep_newest:
        return F.lit(
            "label conflict: copies of this text carry different labels; label_conflicts=quarantine "
            "sets every copy aside"
        )
    kept_copy = (
        [F.concat(F.lit(f" (the copy with {ts_col} "), F.coalesce(kept_ts, F.lit("null")), F.lit(")"))]
        if ts_col
        else []
    )
    return F.concat(
        F.lit("label conflict: the copy of this text kept"),
        *kept_copy,
        F.lit(" is labelled "),
        F.col("_conflict_kept"),
        F.lit(" (label_conflicts=keep_newest)"),
    )


def label_conflicts_report(annotated: DataFrame, rows: int, policy: str, examples: int = 5) -> dict[str, Any]:
    """How many texts carried different labels, and a few of them with their labels, from the
    rows ``prepare`` set aside for it (``rows`` of them)."""
    from pyspark.sql import functions as F

    report: dict[str, Any] = {"policy": policy, "texts": 0, "rows": rows, "examples": []}
    if not rows:
        return report
    per_text = (
        annotated.where(F.col("reject_reason") == "label_conflict")
        .groupBy("_conflict_key")
        .agg(
            F.min("_src_text").alias("text"),
            F.array_sort(
                F.array_distinct(
                    F.concat(F.collect_set("label"), F.array(F.first("_conflict_kept", ignorenulls=True)))
                )
            ).alias("labels"),
        )
        .persist()
    )
    try:
        report["texts"] = per_text.count()
        report["examples"] = [
            {"text": r["text"][:200], "labels": [label for label in r["labels"] if label is not None]}
            for r in per_text.orderBy("_conflict_key").limit(examples).collect()
        ]
    finally:
        per_text.unpersist()
    return report


def _dedupe_partitions(df: DataFrame) -> int:
    """Partitions for the dedupe shuffle: about 32 MB of input each, a multiple of the cores.

    Not too few: a cached partition of millions of rows overflows the 1 GB heap of a default
    local driver (the job failed so at 5M rows in 3 partitions). A multiple of the cores: token
    counting after the shuffle is the costly part, and 3 tasks on 2 cores would leave one core
    idle for a third of it. Spark's size estimate is the files' size for a file source (Parquet
    compressed, so about a quarter of the strings in memory); frames without one (built in the
    driver, RDD-backed) get one partition per input split. A small input (at most
    ``SINGLE_PARTITION_MAX_BYTES``) gets one.
    """
    cores = max(1, df.sparkSession.sparkContext.defaultParallelism)
    splits = max(1, df.rdd.getNumPartitions())
    try:
        size: int | None = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception:  # no estimate (a Spark Connect session, an exotic source)
        size = None
    if size is not None and size <= SINGLE_PARTITION_MAX_BYTES:
        return 1
    wanted = splits
    if size is not None and size < 2**50:  # an unknown size is reported as a huge placeholder
        wanted = min(splits * MAX_PARTITIONS_PER_SPLIT, max(splits, -(-size // BYTES_PER_PARTITION)))
    return -(-max(wanted, cores) // cores) * cores


def prepare(
    df: DataFrame,
    params: PipelineParams,
    tokenizer_path: str,
    *,
    source: str | None = None,
    check_decoding: bool = False,
) -> PreparedData:
    """Apply the recipe to ``df``; the returned frames are backed by a persisted annotated frame.

    ``source`` names the source in error messages. ``check_decoding`` (for CSV and JSON files)
    fails on rows that were not decoded cleanly: bytes that are not UTF-8, JSON lines that do
    not parse; pass ``df`` straight from the reader so the offending files can be named.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    check_columns(df, params, source)
    text_col = find_column(df.columns, params.text_column)
    label_col = find_column(df.columns, params.label_column)
    quality_name = params.quality_column.strip()
    quality_col = find_column(df.columns, quality_name) if quality_name else None
    id_col = find_column(df.columns, params.id_column.strip()) if params.id_column.strip() else None
    ts_name = params.timestamp_column.strip()
    ts_col = find_column(df.columns, ts_name) if ts_name else None
    if quality_name and quality_col is None:
        log.warning(
            "quality column %r is not in the source (columns: %s): min_quality_score is skipped",
            quality_name,
            ", ".join(df.columns),
        )

    src_text = quoted_column(text_col).cast("string")
    src_label = quoted_column(label_col).cast("string")
    null_string = F.lit(None).cast("string")
    if id_col is None:
        src_id = null_string
    elif df.schema[id_col].dataType.typeName() == "binary":
        src_id = F.lower(F.hex(quoted_column(id_col)))  # a binary digest reads as its usual hex form
    else:
        src_id = quoted_column(id_col).cast("string")
    columns = [
        src_text.alias("_src_text"),
        src_label.alias("_src_label"),
        (quoted_column(quality_col).cast("string") if quality_col else null_string).alias("_src_quality"),
        (quoted_column(quality_col).try_cast("double") if quality_col else F.lit(None).cast("double")).alias(
            "_quality"
        ),
        src_id.alias("_src_id"),
    ]
    if ts_col:
        columns += [
            _timestamp_key(df, ts_col).alias("_ts"),
            quoted_column(ts_col).cast("string").alias("_src_ts"),
        ]
    if check_decoding:
        kind, example = decoding_problem(df, src_text, src_label)
        # input_file_name() only knows the file in the scan's own stage: this select is that stage.
        columns += [
            kind.alias("_bad_kind"),
            example.alias("_bad_example"),
            F.when(kind.isNotNull(), F.input_file_name()).alias("_bad_file"),
        ]
    source_rows = df.select(*columns)

    text = F.regexp_replace("_src_text", _TRIM_RE, "")
    label = F.regexp_replace("_src_label", _TRIM_RE, "")
    example_id = content_key(F.col("_src_text"))
    if id_col:
        given = F.regexp_replace("_src_id", _TRIM_RE, "")
        # A blank or missing id falls back to the content hash, so such rows still dedupe by text.
        example_id = F.coalesce(F.when(given != "", given), example_id)
    # Only what the dedupe needs crosses the shuffle: the trimmed text, the prompt and the completion
    # are derived after it, which keeps the shuffled and cached rows about one text wide, not four.
    staged = source_rows.select(
        "*",
        label.alias("label"),
        example_id.alias("example_id"),
        # With an id column the dedupe key is the id: label conflicts are still found by the text.
        *([content_key(F.col("_src_text")).alias("_text_key")] if id_col else []),
        F.coalesce(F.length(text), F.lit(0)).alias("_chars"),
        # Orders duplicates: the kept copy is the one with the smallest hash of its source values,
        # whatever order or partitioning Spark reads them in (equal hashes: identical copies).
        F.sha2(F.to_json(F.struct("_src_text", "_src_label", "_src_quality")), 256).alias("_row_hash"),
    )
    if ts_col:
        staged = staged.withColumn("_ts_unparsed", F.col("_src_ts").isNotNull() & F.col("_ts").isNull())

    min_q, min_c, max_c = params.min_quality_score, params.min_chars, params.max_chars
    early_reason = F.lit(None).cast("string")
    early_detail = F.lit(None).cast("string")
    if quality_col:
        low_quality = F.col("_quality").isNull() | (F.col("_quality") < F.lit(min_q))
        early_reason = F.when(low_quality, "min_quality_score")
        early_detail = F.when(
            F.col("_quality").isNull(),
            F.concat(
                F.lit(f"{quality_col} is missing or not a number: "),
                F.coalesce("_src_quality", F.lit("null")),
            ),
        ).when(low_quality, F.concat(F.lit(f"{quality_col} "), "_src_quality", F.lit(f" < {min_q:g}")))
    blank_label = F.col("label").isNull() | (F.col("label") == "")
    bad_length = (F.col("_chars") < min_c) | (F.col("_chars") > max_c)
    early_reason = F.coalesce(early_reason, F.when(blank_label, "null_label"), F.when(bad_length, "length"))
    early_detail = F.coalesce(
        early_detail,
        F.when(F.col("_src_label").isNull(), "label is null").when(blank_label, "label is blank"),
        F.when(
            bad_length,
            F.concat(
                F.lit("text has "), F.col("_chars").cast("string"), F.lit(f" chars, allowed {min_c}-{max_c}")
            ),
        ),
    )
    staged = staged.select("*", early_reason.alias("_reason"), early_detail.alias("_detail"))
    # A chat-template prompt lists the labels (sparktune.core.prompt_format): tokens are counted with the
    # labels of the rows that passed the checks so far, the rows are formatted with those of the kept
    # rows. Kept rows are among them, so a count can only be over, never under, when a label loses
    # every row to a later step.
    prompt_format = _PromptFormat(params.prompt_template, tokenizer_path, params.trust_remote_code)
    count_template = prompt_format.template(
        lambda: [r[0] for r in staged.filter(F.col("_reason").isNull()).select("label").distinct().collect()]
    )

    # Dedupe among the rows that survived the earlier steps only. The explicit repartition sizes
    # the shuffle by the input, not by spark.sql.shuffle.partitions: the result is cached, and
    # adaptive execution does not coalesce the partitions of a cached plan, so 200 mostly empty
    # partitions would be paid for by every count and write that follows.
    partitions = _dedupe_partitions(df)
    staged = staged.repartition(partitions, "example_id")
    order: list[Any] = ["_row_hash"]
    if ts_col:
        # The most recent copy wins; copies without a usable timestamp count as the oldest.
        order = [F.col("_ts").desc_nulls_last(), *order]
    keep_newest = params.label_conflicts == "keep_newest"
    by_content = Window.partitionBy("example_id", F.col("_reason").isNull()).orderBy(*order)
    kept_extra = [F.first("_src_ts").over(by_content).alias("_kept_ts")] if ts_col else []
    if id_col is None:
        # The dedupe key is the text: copies of it that disagree on the label are a conflict.
        kept_extra.append(_labels_differ(by_content).alias("_conflict"))
    staged = staged.select(
        "*",
        F.row_number().over(by_content).alias("_copy"),
        F.first("label").over(by_content).alias("_kept_label"),
        *kept_extra,
    )
    early_survivor = F.col("_reason").isNull()
    if id_col is None:
        conflicted = early_survivor & F.col("_conflict")
        if keep_newest:
            conflicted &= F.col("label") != F.col("_kept_label")
        staged = staged.withColumn("_conflict_kept", F.col("_kept_label"))
    else:
        conflicted = F.lit(False)
    duplicate = early_survivor & (F.col("_copy") > 1) & ~conflicted
    kept_ts_detail = (
        [F.concat(F.lit(f"; kept the copy with {ts_col} "), F.coalesce("_kept_ts", F.lit("null")))]
        if ts_col
        else []
    )
    dup_detail = F.concat(
        F.lit("duplicate of example_id "),
        F.substring("example_id", 1, 16),
        F.when(
            F.col("_kept_label") != F.col("label"),
            F.concat(F.lit(" with a different label (kept "), "_kept_label", F.lit(")")),
        ).otherwise(F.lit("")),
        *kept_ts_detail,
    )
    staged = staged.select(
        "*",
        F.coalesce("_reason", F.when(conflicted, "label_conflict"), F.when(duplicate, "dedupe")).alias(
            "_reason2"
        ),
        F.coalesce(
            "_detail",
            *(
                [F.when(conflicted, _conflict_detail(keep_newest, ts_col, "_kept_ts"))]
                if id_col is None
                else []
            ),
            F.when(duplicate, dup_detail),
        ).alias("_detail2"),
    )
    if id_col is not None:
        # Rows with different ids but the same text: a second window, by the text, over the rows
        # dedupe kept (a newer version of an id relabelling its row is an update, not a conflict).
        dedupe_survivor = F.col("_reason2").isNull()
        by_text = Window.partitionBy("_text_key", dedupe_survivor).orderBy(*order)
        staged = staged.select(
            "*",
            _labels_differ(by_text).alias("_conflict"),
            F.first("label").over(by_text).alias("_conflict_kept"),
            *([F.first("_src_ts").over(by_text).alias("_conflict_kept_ts")] if ts_col else []),
        )
        conflicted = dedupe_survivor & F.col("_conflict")
        if keep_newest:
            conflicted &= F.col("label") != F.col("_conflict_kept")
        staged = staged.withColumn(
            "_detail2",
            F.coalesce(
                "_detail2", F.when(conflicted, _conflict_detail(keep_newest, ts_col, "_conflict_kept_ts"))
            ),
        ).withColumn("_reason2", F.coalesce("_reason2", F.when(conflicted, "label_conflict")))

    # Tokens are counted after the dedupe, on its evenly sized partitions, for the surviving rows
    # only: rejected rows and duplicates get null and cost the tokenizer nothing.
    survivor = F.col("_reason2").isNull()
    staged = staged.select("*", F.when(survivor, text).alias("text"))
    prompt, completion = _format_columns(count_template, F.col("text"), F.col("label"))
    n_tokens = token_counter(tokenizer_path, params.trust_remote_code)(
        F.when(survivor, F.concat(prompt, completion))
    )
    staged = staged.select("*", n_tokens.alias("n_tokens"))

    too_long = survivor & (F.col("n_tokens") > params.max_length)
    staged = staged.select(
        "*",
        F.coalesce("_reason2", F.when(too_long, "max_length")).alias("reject_reason"),
        F.coalesce(
            "_detail2",
            F.when(
                too_long,
                F.concat(
                    F.col("n_tokens").cast("string"), F.lit(f" tokens > max_length {params.max_length}")
                ),
            ),
        ).alias("reject_detail"),
    )
    extra = ["_bad_kind", "_bad_example", "_bad_file"] if check_decoding else []
    if ts_col:
        extra.append("_ts_unparsed")
    rejected_row = F.col("reject_reason").isNotNull()
    in_conflict = F.col("reject_reason") == "label_conflict"
    annotated = staged.select(
        "example_id",
        "text",
        "label",
        "n_tokens",
        # The source values are kept for the quarantine only: kept rows have `text` instead.
        F.when(rejected_row, F.col("_src_text")).alias("_src_text"),
        "_src_label",
        "_src_quality",
        "_chars",
        "reject_reason",
        "reject_detail",
        # What the label conflicts report needs: the text's key and the label of the copy kept.
        F.when(in_conflict, F.col("_text_key" if id_col else "example_id")).alias("_conflict_key"),
        F.when(in_conflict, F.col("_conflict_kept")).alias("_conflict_kept"),
        base_split(split_bucket(params.split_seed, F.col("example_id"))).alias("_base_split"),
        split_bucket(params.split_seed, F.col("example_id")).alias("_bucket"),
        *extra,
    ).persist()

    kept = annotated.filter(F.col("reject_reason").isNull())
    # One aggregation gives every step's counts, the per-label split counts and the input checks.
    checks = []
    if check_decoding:
        checks += [
            F.collect_set("_bad_kind").alias("bad_kinds"),
            F.count("_bad_kind").alias("bad_rows"),
            F.collect_set("_bad_file").alias("bad_files"),
            F.min("_bad_example").alias("bad_example"),
        ]
    if ts_col:
        checks.append(
            F.count(F.when(F.col("_ts_unparsed"), 1)).alias("bad_ts"),
        )
    stats = (
        annotated.groupBy(
            "reject_reason",
            F.when(F.col("reject_reason").isNull(), F.col("label")).alias("label"),
            F.when(F.col("reject_reason").isNull(), F.col("_base_split")).alias("split"),
        )
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.min("_chars").alias("min_chars"),
            F.max("_chars").alias("max_chars"),
            *checks,
        )
        .collect()
    )
    if check_decoding and any(row["bad_rows"] for row in stats):
        annotated.unpersist()
        raise decoding_error(source, stats)
    if ts_col and (bad_ts := sum(row["bad_ts"] for row in stats)):
        log.warning(
            "%d row(s) have a %s value that is not a timestamp (expected ISO-8601 such as 2024-05-01 or "
            "2024-05-01T12:30:00): among duplicates they count as the oldest copy",
            bad_ts,
            ts_col,
        )
    rejected = {step: 0 for step in REJECTING_STEPS}
    per_label: dict[str, dict[str, int]] = {}
    for row in stats:
        if row["reject_reason"] is not None:
            rejected[row["reject_reason"]] += row["count"]
        else:
            per_label.setdefault(row["label"], dict.fromkeys(SPLITS, 0))[row["split"]] += row["count"]
    total = sum(r["count"] for r in stats)
    steps = step_counts(total, rejected, quality_used=quality_col is not None)
    findings = {}
    length_rows = [row for row in stats if row["reject_reason"] == "length"]
    if length_rows:
        shortest = min(row["min_chars"] for row in length_rows)
        longest = max(row["max_chars"] for row in length_rows)
        span = f"{shortest:,}" if shortest == longest else f"{shortest:,} to {longest:,}"
        findings["length"] = f"the rejected texts have {span} chars"

    conflicts = label_conflicts_report(annotated, rejected["label_conflict"], params.label_conflicts)
    if conflicts["texts"]:
        example = conflicts["examples"][0]
        log.warning(
            "%d text(s) carry different labels in the source (%d rows set aside, label_conflicts=%s), "
            "e.g. %r labelled %s; they are in the quarantine with reason label_conflict. Fix: correct "
            "them through record_corrections (a correction settles a text's label) or fix the source.",
            conflicts["texts"],
            conflicts["rows"],
            conflicts["policy"],
            example["text"][:80],
            " and ".join(example["labels"]),
        )

    to_test, to_validation = split_fixups(kept, per_label)
    split = F.col("_base_split")
    if to_test or to_validation:
        split = (
            F.when(F.col("example_id").isin(to_test), "test")
            .when(F.col("example_id").isin(to_validation), "validation")
            .otherwise(split)
        )
    prompt_template = prompt_format.template(lambda: list(per_label))
    if prompt_template != count_template:
        log.info(
            "the kept rows have fewer labels than were counted with; their prompts list %s", list(per_label)
        )
    prompt, completion = _format_columns(prompt_template, F.col("text"), F.col("label"))
    rows = kept.select(
        "example_id",
        "text",
        "label",
        prompt.alias("prompt"),
        completion.alias("completion"),
        "n_tokens",
        split.alias("split"),
    )
    quarantine = annotated.filter(F.col("reject_reason").isNotNull()).select(
        "example_id",
        F.col("_src_text").alias("text"),
        F.col("_src_label").alias("label"),
        F.col("_src_quality").alias("quality"),
        "reject_reason",
        "reject_detail",
    )
    return PreparedData(
        rows=rows,
        quarantine=quarantine,
        steps=steps,
        quality_used=quality_col is not None,
        findings=findings,
        label_conflicts=conflicts,
        prompt_template=prompt_template,
        partitions=partitions,
        _persisted=[annotated],
    )
