"""Label issues: training rows whose given label is probably wrong.

The champion's doubt (the review queue's scored rows) cannot find them: a model learns around the
wrong labels it was trained on. So every labelled row of the training source is scored by a model
that never saw it: out-of-sample probabilities from cross-validated TF-IDF + logistic regression
(the project's baseline, :func:`sparktune.release.baseline.baseline_model`; stratified folds,
seeded), and cleanlab's confident learning decides which given labels those probabilities
contradict (:func:`cleanlab.filter.find_label_issues`) and how much
(:func:`cleanlab.rank.get_label_quality_scores`, self-confidence: the out-of-sample probability of
the given label). Each issue carries the row's id, text, given label, the suggested label (the
most probable label out of sample) and its probability, and the label quality score; issues are
ranked lowest quality first, ties by id, so the same rows always rank the same way.

:func:`rank_label_issues` works on plain lists; :func:`source_label_issues` reads a source with
Spark the way the pipeline does (:func:`~sparktune.data.prepare_source.load_source`, the text,
label and id columns of :class:`~sparktune.core.params.DataSource`), keeps one row per text by
:func:`~sparktune.data.prepare.content_key` (the key dedupe, feedback merging and the review queue
use), leaves out the texts it is told to (the corrected ones) and collects at most ``max_rows``
rows to the driver, where the models are fit.

Left out, and logged: rows without text or label; the rows of a label with fewer rows than the
smallest fold count (:data:`MIN_FOLDS`), which cannot be judged out of sample. A label with fewer
rows than the folds asked for lowers the folds to its count first, down to :data:`MIN_FOLDS`.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sparktune.serve.feedback import FeedbackError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Where a review queue row comes from (beside feedback.BATCH_ORIGIN and SERVING_ORIGIN).
LABEL_ISSUE_ORIGIN = "label_issue"
DEFAULT_FOLDS = 5
# Fewer folds than this and each model sees too little of the data for its probabilities to mean much.
MIN_FOLDS = 3
DEFAULT_MAX_ROWS = 200_000
DEFAULT_SEED = 0
# content_key of a text that is empty once trimmed: a blank text, whatever whitespace it holds.
_BLANK_KEY = hashlib.sha256(b"").hexdigest()


class LabelIssueError(FeedbackError):
    """Rows the label-issue finder cannot judge; the message says how to fix it."""


@dataclass(frozen=True)
class LabelIssue:
    """One training row whose given label the out-of-sample probabilities contradict."""

    id: str
    text: str
    given_label: str
    suggested_label: str  # the most probable label out of sample
    suggested_probability: float  # its out-of-sample probability
    label_quality: float  # cleanlab's label quality score of the given label (0: surely wrong)
    key: str = ""  # content_key of the text ("" when the rows did not come from Spark)


@dataclass(frozen=True)
class LabelIssues:
    """The ranked issues and what was judged to find them."""

    issues: list[LabelIssue]
    rows: int  # rows judged (cross-validated)
    folds: int
    labels: int  # labels judged
    left_out: dict[str, int] = field(default_factory=dict)  # label -> rows left out (too few rows)
    blank: int = 0  # rows without text or label, left out
    # From a source (source_label_issues) only:
    duplicates: int = 0  # more copies of a text already judged, left out
    source_rows: int = 0  # distinct labelled texts of the source, corrected ones included
    corrected: int = 0  # of those, texts already corrected, left out
    sampled: bool = False  # more than max_rows distinct texts: a sample by content_key was judged

    def to_summary(self) -> dict[str, Any]:
        summary = asdict(self)
        summary["issues"] = len(self.issues)
        return summary


def _blank(value: str | None) -> bool:
    return value is None or not str(value).strip()


def rank_label_issues(
    texts: Sequence[str | None],
    labels: Sequence[str | None],
    ids: Sequence[str],
    *,
    keys: Sequence[str] | None = None,
    folds: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
    source: str = "the rows",
) -> LabelIssues:
    """The rows whose given label is probably wrong, lowest label quality first (ties by id).

    ``ids`` should be unique (they settle ties). ``keys`` (optional) are carried into the issues.
    ``source`` names the rows in error messages. Raises :class:`LabelIssueError` when fewer than
    two labels have enough rows to be judged.
    """
    import numpy as np
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sparktune.release.baseline import baseline_model
    from threadpoolctl import threadpool_limits

    if not len(texts) == len(labels) == len(ids) or (keys is not None and len(keys) != len(ids)):
        raise ValueError(f"{len(texts)} texts, {len(labels)} labels and {len(ids)} ids: need as many of each")
    if folds < MIN_FOLDS:
        raise LabelIssueError(f"folds is {folds}. Fix: at least {MIN_FOLDS}.")
    usable = [i for i in range(len(ids)) if not (_blank(texts[i]) or _blank(labels[i]))]
    blank = len(ids) - len(usable)
    if blank:
        log.info("Label issues: %d rows of %s without text or label left out", blank, source)
    given = [str(labels[i]).strip() for i in usable]
    counts = Counter(given)
    if len(counts) < 2:
        raise LabelIssueError(_one_label(source, counts, blank))
    # Stratified folds need every label in every fold: fewer folds for a small label, down to
    # MIN_FOLDS; a label smaller still cannot be judged out of sample and is left out.
    used_folds = max(MIN_FOLDS, min(folds, min(counts.values())))
    left_out = {label: n for label, n in sorted(counts.items()) if n < used_folds}
    if used_folds < folds:
        log.warning(
            "Label issues: %d folds instead of %d, the smallest label of %s has %d rows",
            used_folds,
            folds,
            source,
            min(counts.values()),
        )
    if left_out:
        log.warning(
            "Label issues: the rows of labels with fewer than %d rows are left out, too few to judge "
            "out of sample: %s",
            used_folds,
            ", ".join(f"{label!r} ({n})" for label, n in left_out.items()),
        )
    judged = [(i, label) for i, label in zip(usable, given, strict=True) if label not in left_out]
    classes = sorted({label for _, label in judged})
    if len(classes) < 2:
        raise LabelIssueError(_one_label(source, counts, blank, min_rows=used_folds))
    index = {label: k for k, label in enumerate(classes)}
    rows = [i for i, _ in judged]
    y = np.array([index[label] for _, label in judged])
    try:
        # One BLAS thread: L-BFGS's many small vector products pay OpenBLAS's thread start-up each
        # time; on 2 busy cores the folds of 4,000 helpdesk rows took 10 times as long with 2.
        with threadpool_limits(limits=1, user_api="blas"):
            probabilities = cross_val_predict(
                baseline_model(seed),
                [str(texts[i]) for i in rows],
                y,
                cv=StratifiedKFold(n_splits=used_folds, shuffle=True, random_state=seed),
                method="predict_proba",
            )
    except ValueError as exc:
        if "empty vocabulary" not in str(exc):
            raise
        raise LabelIssueError(
            f"Cannot look for label issues in {source}: the texts of a fold hold no word of two "
            "letters or more (TF-IDF found no vocabulary). Fix: point text_column at the column "
            "with the texts."
        ) from exc
    quality = get_label_quality_scores(y, probabilities, method="self_confidence")
    # One process: the finder's own pool would start workers inside a task or a Spark driver.
    flagged = find_label_issues(y, probabilities, return_indices_ranked_by="self_confidence", n_jobs=1)
    suggested = probabilities.argmax(axis=1)
    issues = [
        LabelIssue(
            id=str(ids[rows[k]]),
            text=str(texts[rows[k]]),
            given_label=classes[y[k]],
            suggested_label=classes[suggested[k]],
            suggested_probability=float(probabilities[k, suggested[k]]),
            label_quality=float(quality[k]),
            key=str(keys[rows[k]]) if keys is not None else "",
        )
        for k in flagged.tolist()
    ]
    issues.sort(key=lambda issue: (issue.label_quality, issue.id))
    log.info(
        "Label issues: %d of %d rows of %s (%d labels, %d folds)",
        len(issues),
        len(rows),
        source,
        len(classes),
        used_folds,
    )
    return LabelIssues(
        issues=issues,
        rows=len(rows),
        folds=used_folds,
        labels=len(classes),
        left_out=left_out,
        blank=blank,
    )


def _one_label(source: str, counts: Counter[str], blank: int, min_rows: int = 1) -> str:
    if not counts:
        found = f"no row has both a text and a label ({blank} rows without)"
    elif min_rows > 1:
        found = f"only one label has at least {min_rows} rows ({dict(counts.most_common())})"
    else:
        ((label, n),) = counts.items()
        found = f"every row has the label {label!r} ({n} rows)"
    return (
        f"Cannot look for label issues in {source}: {found}, and a wrong label shows only against "
        "other labels. Fix: point the source and its label_column at the training data (at least "
        f"two labels of {max(min_rows, MIN_FOLDS)} rows or more), or set label_issues to 0 to leave "
        "label issues out."
    )


def source_label_issues(
    spark: SparkSession,
    *,
    source_uri: str,
    source_format: str = "auto",
    text_column: str,
    label_column: str,
    id_column: str = "",
    exclude_keys: DataFrame | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
    folds: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
) -> LabelIssues:
    """The label issues of a training source (read as the pipeline reads it), one row per text.

    ``exclude_keys`` (a frame with a ``_key`` column of content keys) names texts to leave out:
    the corrected ones. An issue's id is the row's ``id_column`` value, or the content key when the
    source has no id column (prepare_data's example_id either way). More than ``max_rows`` distinct
    texts: the ``max_rows`` of smallest content key are judged, a sample that is the same on every
    run, and the result says so (``sampled``).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key
    from sparktune.data.prepare_source import find_column, load_source, quoted_column

    if max_rows < 1:
        raise LabelIssueError(f"max_rows is {max_rows}. Fix: at least 1 row.")
    raw = load_source(spark, source_uri, source_format)
    wanted = {"text_column": text_column, "label_column": label_column}
    if id_column.strip():
        wanted["id_column"] = id_column.strip()
    found = {name: find_column(raw.columns, value) for name, value in wanted.items()}
    missing = [f"{name}={wanted[name]!r}" for name, column in found.items() if column is None]
    if missing:
        raise LabelIssueError(
            f"Cannot look for label issues in {source_uri}: it has no column for {', '.join(missing)} "
            f"(it has {raw.columns}). Fix: set the label-issue source's columns to those of the "
            "training source (as in llm_finetune's run), or set label_issues to 0."
        )
    key = content_key(quoted_column(found["text_column"]).cast("string"))
    label = F.trim(quoted_column(found["label_column"]).cast("string"))
    if found.get("id_column"):
        given_id = F.trim(quoted_column(found["id_column"]).cast("string"))
        row_id = F.coalesce(F.when(given_id != "", given_id), key)  # as prepare_data's example_id
    else:
        row_id = key
    staged = raw.select(
        key.alias("_key"),
        quoted_column(found["text_column"]).cast("string").alias("text"),
        label.alias("label"),
        row_id.alias("id"),
    )
    usable = (F.col("_key").isNotNull() & (F.col("_key") != _BLANK_KEY)) & F.coalesce(
        F.col("label") != "", F.lit(False)
    )
    # One copy per text, as prepare_data keeps one without a timestamp column: the smallest hash of
    # its values, whatever order Spark reads the rows in.
    copy = Window.partitionBy("_key").orderBy(F.sha2(F.to_json(F.struct("text", "label", "id")), 256))
    texts = (
        staged.where(usable)
        .repartition(max(1, raw.rdd.getNumPartitions()), "_key")
        .withColumn("_n", F.row_number().over(copy))
        .where("_n = 1")
        .drop("_n")
    )
    if exclude_keys is None:
        texts = texts.withColumn("_corrected", F.lit(False))
    else:
        corrected = exclude_keys.select("_key").distinct().withColumn("_corrected", F.lit(True))
        texts = texts.join(F.broadcast(corrected), "_key", "left").withColumn(
            "_corrected", F.coalesce("_corrected", F.lit(False))
        )
    texts = texts.persist()
    try:
        read = staged.agg(F.count("*").alias("n"), F.sum(usable.cast("int")).alias("usable")).first()
        total, labelled = int(read["n"]), int(read["usable"] or 0)
        counts = texts.agg(F.count("*").alias("n"), F.sum(F.col("_corrected").cast("int")).alias("c")).first()
        distinct, corrected_count = int(counts["n"]), int(counts["c"] or 0)
        kept = texts.where(~F.col("_corrected"))
        candidates = distinct - corrected_count
        sampled = candidates > max_rows
        if sampled:
            log.warning(
                "Label issues: %d distinct texts in %s, more than max_rows=%d: the %d of smallest "
                "content key are judged (the same sample every run)",
                candidates,
                source_uri,
                max_rows,
                max_rows,
            )
            kept = kept.orderBy("_key").limit(max_rows)
        collected = kept.select("_key", "id", "text", "label").orderBy("_key").toArrow()
    finally:
        texts.unpersist()
    log.info(
        "Label issues: %s holds %d rows, %d distinct labelled texts; left out: %d rows without text "
        "or label, %d more copies of a text, %d texts already corrected",
        source_uri,
        total,
        distinct,
        total - labelled,
        labelled - distinct,
        corrected_count,
    )
    columns = collected.to_pydict()
    result = rank_label_issues(
        columns["text"],
        columns["label"],
        columns["id"],
        keys=columns["_key"],
        folds=folds,
        seed=seed,
        source=source_uri,
    )
    return LabelIssues(
        issues=result.issues,
        rows=result.rows,
        folds=result.folds,
        labels=result.labels,
        left_out=result.left_out,
        blank=total - labelled,
        duplicates=labelled - distinct,
        source_rows=distinct,
        corrected=corrected_count,
        sampled=sampled,
    )
