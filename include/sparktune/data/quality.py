"""The data-quality gate: Great Expectations 1.x on Spark, with HTML Data Docs for every run.

Small batches are validated by pandas in the driver instead, with the same expectations: the
per-label counts always, the prepared rows up to :data:`LOCAL_VALIDATION_MAX_ROWS`. On Spark every
expectation runs a few small jobs of its own, which on a few thousand rows is most of the gate's time.

The rules are data (:mod:`sparktune.data.quality_rules`), so they can be listed, tested and
rendered before anything runs. Three batches are validated, each by its own GX checkpoint so all
of them land in Data Docs (:mod:`sparktune.data.quality_gx`):

* ``raw_input``: the source as read (required columns with usable types, null rates, row count);
* ``rows``: the prepared row table (nulls, uniqueness, lengths, token counts, splits, leakage);
* ``label_counts``: one row per label with its train/validation/test row counts, for the rules
  GX cannot state on the row table (enough rows per split and per label, labels seen in
  evaluation splits but never in train, class imbalance).

Each rule is an ``error`` (blocks the run) or a ``warning`` (recorded, the run continues): the
names listed in ``params.quality_warning_rules`` are warnings. Nothing here raises on failed
expectations: :func:`run_quality_gate` returns a :class:`~sparktune.data.quality_report.QualityReport`
and the caller (the Airflow operator) decides, with
:func:`~sparktune.data.quality_report.format_failures` as the one error message. Raised are only
caller errors: unknown rule names in the params, or a prepared DataFrame that lacks the columns the
preparation step produces.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PipelineParams
from sparktune.data.data_version import read_version
from sparktune.data.quality_gx import (
    data_docs_dir,
    gx_context,
    page_url,
    run_batch,
    run_folder,
    run_identifier,
    update_data_docs,
)
from sparktune.data.quality_report import (
    QualityIssue,
    QualityReport,
    describe_result,
    format_failures,
    param_hint,
    rule_issue,
    rule_name_of,
)
from sparktune.data.quality_rules import (
    ERROR,
    ID_SPLITS_COLUMN,
    LABEL_COUNTS,
    RAW_INPUT,
    ROWS,
    SPLITS,
    WARNING,
    QualityRule,
    quality_rules,
    raw_rules,
    warning_rules,
)

if TYPE_CHECKING:
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context import AbstractDataContext
    from pandas import DataFrame as PandasFrame
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

PREPARED_SUITE = "prepared_training_data"
# Column -> Spark simpleString type family the preparation step produces.
REQUIRED_COLUMNS: dict[str, str] = {
    "example_id": "string",
    "text": "string",
    "label": "string",
    "prompt": "string",
    "completion": "string",
    "n_tokens": "integer",
    "split": "string",
}
_INTEGER_TYPES = {"tinyint", "smallint", "int", "bigint"}
# Prepared tables of at most this many rows are validated in the driver by pandas, not by Spark
# jobs. Each row holds its text twice (text, prompt): a few MB for short messages, about 80 MB at
# the default max_chars (2,048).
LOCAL_VALIDATION_MAX_ROWS = 20_000
# The per-label counts table (_label_counts): train_imbalance is NaN for a label without train rows.
_LABEL_COUNT_TYPES = {
    "label": "object",
    "train_rows": "int64",
    "validation_rows": "int64",
    "test_rows": "int64",
    "eval_rows": "int64",
    "total_rows": "int64",
    "train_imbalance": "float64",
}


class PreparedDataSchemaError(ValueError):
    """The DataFrame is not the output of the preparation step: a caller error, not bad data."""


@dataclass
class _Outcome:
    """What one suite (raw, or prepared) found."""

    issues: list[QualityIssue]
    evaluated: int
    statistics: dict[str, Any]
    results: dict[str, Any]  # batch -> GX's key of its validation result (its Data Docs page)
    severities: dict[str, str]


# --- entry points


def run_quality_gate(
    spark: SparkSession,
    params: PipelineParams,
    *,
    source_uri: str,
    gx_root: Path,
    prepared_uri: str | None = None,
    run_id: str | None = None,
    labels: Sequence[str] | None = None,
    raw_suite_name: str = RAW_INPUT,
    raw_df: DataFrame | None = None,
) -> QualityReport:
    """Validate the raw source and, when ``prepared_uri`` is given, the prepared Parquet; one
    combined report, one JSON summary.

    Without ``prepared_uri`` only the raw input rules run (:func:`raw_rules`): a report over any
    table, no preparation needed. The raw input is read as preparation reads it
    (:func:`sparktune.data.prepare_source.load_source`) and validated under the suite ``raw_suite_name``
    (its own name keeps a report's runs apart from the pipeline's in Data Docs); ``raw_df``, the
    source as a caller in the same Spark application read it already, saves a second read. Data Docs are
    updated under ``gx_root``; the summary is written to
    ``gx/uncommitted/quality_summaries/<run>/<time>.json`` beside GX's own results.
    """
    from sparktune.data.prepare_source import load_source

    warning_rules(params)  # a typo in the params fails here, before any Spark or GX work
    if raw_df is None:
        raw_df = load_source(spark, source_uri, params.source_format)
    prepared_df = None
    if prepared_uri is not None:
        prepared_df = spark.read.parquet(prepared_uri)
        _check_schema(prepared_df)
    started = time.perf_counter()
    context = gx_context(Path(gx_root))
    identifier = run_identifier(run_id)
    raw = _validate_raw(context, raw_df, params, identifier, raw_suite_name)
    outcomes = [raw]
    statistics: dict[str, Any] = {RAW_INPUT: raw.statistics}
    if prepared_df is not None:
        prepared = _validate_prepared(context, prepared_df, params, identifier, PREPARED_SUITE, labels)
        outcomes.append(prepared)
        statistics["prepared"] = prepared.statistics
    report = _report(context, outcomes, primary=RAW_INPUT if prepared_df is None else ROWS)
    version = read_version(spark, source_uri)
    if version is not None:
        # The gate validated a data version the feedback loop wrote: say what corrections changed.
        statistics["feedback"] = {
            key: version.get(key) for key in ("corrections", "labels_changed", "added_rows", "overrides_uri")
        }
    report.statistics = {
        **statistics,
        "evaluated_expectations": report.evaluated,
        "failed_expectations": len(report.failures),
        "warned_expectations": len(report.warnings),
        "validation_seconds": round(time.perf_counter() - started, 3),
    }
    summary_dir = Path(context.root_directory) / "uncommitted" / "quality_summaries" / run_folder(identifier)
    summary_path = summary_dir / f"{identifier.run_time.strftime('%Y%m%dT%H%M%S.%fZ')}.json"
    report.summary_path = str(summary_path)
    summary_dir.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(report.to_summary(), indent=2, default=str))
    log.info("Data quality: %s", format_failures(report))
    return report


def validate_raw(
    df: DataFrame,
    params: PipelineParams,
    *,
    gx_root: Path,
    suite_name: str = RAW_INPUT,
    run_id: str | None = None,
) -> QualityReport:
    """Validate the raw source DataFrame (before preparation) and update Data Docs."""
    warning_rules(params)
    started = time.perf_counter()
    context = gx_context(Path(gx_root))
    outcome = _validate_raw(context, df, params, run_identifier(run_id), suite_name)
    outcome.statistics["validation_seconds"] = round(time.perf_counter() - started, 3)
    report = _report(context, [outcome], primary=RAW_INPUT)
    log.info("Data quality (raw input): %s", format_failures(report))
    return report


def validate_prepared(
    df: DataFrame,
    params: PipelineParams,
    *,
    gx_root: Path,
    suite_name: str = PREPARED_SUITE,
    run_id: str | None = None,
    labels: Sequence[str] | None = None,
) -> QualityReport:
    """Validate prepared rows with Great Expectations and update Data Docs under ``gx_root``.

    Reruns in the same ``gx_root`` reuse (and update) the data source, assets, suites,
    validation definitions and checkpoints. Failed expectations are returned, not raised.
    """
    _check_schema(df)
    warning_rules(params)
    started = time.perf_counter()
    context = gx_context(Path(gx_root))
    outcome = _validate_prepared(context, df, params, run_identifier(run_id), suite_name, labels)
    outcome.statistics["validation_seconds"] = round(time.perf_counter() - started, 3)
    report = _report(context, [outcome], primary=ROWS)
    log.info("Data quality: %s", format_failures(report))
    return report


def _report(context: AbstractDataContext, outcomes: list[_Outcome], *, primary: str) -> QualityReport:
    """The gate's report, after one Data Docs build for every batch it validated."""
    results = {batch: key for outcome in outcomes for batch, key in outcome.results.items()}
    update_data_docs(context, list(results.values()))
    pages = {batch: page_url(context, key) for batch, key in results.items()}
    issues = [issue for outcome in outcomes for issue in outcome.issues]
    evaluated = sum(outcome.evaluated for outcome in outcomes)
    failures = [issue.message for issue in issues if issue.severity == ERROR]
    warnings = [issue.message for issue in issues if issue.severity == WARNING]
    statistics = dict(outcomes[0].statistics) if len(outcomes) == 1 else {}
    statistics.update(
        evaluated_expectations=evaluated, failed_expectations=len(failures), warned_expectations=len(warnings)
    )
    return QualityReport(
        success=not failures,
        failures=failures,
        evaluated=evaluated,
        statistics=statistics,
        data_docs_uri=pages.get(primary) or next(iter(pages.values()), ""),
        validation_pages=pages,
        warnings=warnings,
        issues=issues,
        rule_severities={k: v for outcome in outcomes for k, v in outcome.severities.items()},
        data_docs_dir=str(data_docs_dir(context)),
    )


# --- raw input


def _find_column(columns: Sequence[str], name: str) -> str | None:
    # Spark resolves column names case-insensitively by default, as preparation does.
    if name in columns:
        return name
    matches = [c for c in columns if c.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _validate_raw(
    context: AbstractDataContext,
    df: DataFrame,
    params: PipelineParams,
    identifier: RunIdentifier,
    suite_name: str,
) -> _Outcome:
    """Missing columns are found here, not by GX: an expectation on a missing column only
    reports an exception, and the rules on it would each repeat the same problem."""
    rules = raw_rules(params)
    columns = df.columns
    issues: list[QualityIssue] = []
    gx_rules: list[QualityRule] = []
    missing: set[str] = set()
    for rule in rules:
        column = rule.kwargs.get("column")
        actual = _find_column(columns, column) if column else None
        if column and actual is None:
            if rule.name == "raw_quality_column":
                # The recipe skips the quality filter when the source has no quality column
                # (the prepare summary marks the step skipped): absent is fine, mistyped is not.
                continue
            if column not in missing and rule.expectation_type == "expect_column_values_to_be_in_type_list":
                missing.add(column)
                shown = ", ".join(columns[:20]) + (
                    f" and {len(columns) - 20} more" if len(columns) > 20 else ""
                )
                issues.append(
                    rule_issue(
                        rule,
                        f"[{rule.name}] {rule.description} Failed on {RAW_INPUT}: column {column!r} is "
                        f"missing; the input has columns: {shown or 'none'}. {param_hint(rule)}",
                    )
                )
            continue  # every other rule on a missing column is not evaluated
        gx_rules.append(replace(rule, kwargs={**rule.kwargs, "column": actual}) if column else rule)

    used = list(dict.fromkeys(r.kwargs["column"] for r in gx_rules if "column" in r.kwargs))
    # Only the checked columns are cached: the source may be wide. Without any, only the row
    # count runs: one job, nothing worth caching.
    frame = df.select(*(_quote(c) for c in used)).cache() if used else df
    try:
        key, result = run_batch(context, suite_name, RAW_INPUT, gx_rules, frame, identifier)
    finally:
        if used:
            frame.unpersist()
    by_name = {rule.name: rule for rule in gx_rules}
    issues += [
        rule_issue(by_name[rule_name_of(r)], describe_result(r, by_name))
        for r in result.results
        if not r.success
    ]

    null_rates: dict[str, float | None] = {}
    rows = None
    for r in result.results:
        outcome = r.result or {}
        name = rule_name_of(r)
        if name == "raw_rows_min":
            rows = outcome.get("observed_value")
        elif name.endswith("_null_rate") and outcome.get("unexpected_percent") is not None:
            null_rates[by_name[name].kwargs["column"]] = round(outcome["unexpected_percent"] / 100, 6)
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    statistics = {
        "rows": rows,
        "null_rates": null_rates,
        "column_types": {c: types[c] for c in used},
        "missing_columns": sorted(missing),
        "evaluated_expectations": len(result.results) + len(missing),
    }
    return _Outcome(
        issues=issues,
        evaluated=len(result.results) + len(missing),
        statistics=statistics,
        results={RAW_INPUT: key},
        severities={issue.rule: issue.severity for issue in issues} | {r.name: r.severity for r in gx_rules},
    )


# --- prepared data


def _validate_prepared(
    context: AbstractDataContext,
    df: DataFrame,
    params: PipelineParams,
    identifier: RunIdentifier,
    suite_name: str,
    labels: Sequence[str] | None,
) -> _Outcome:
    rules = quality_rules(params, labels)

    def validate(rows_frame: DataFrame | PandasFrame, counts_frame: PandasFrame) -> dict[str, Any]:
        return {
            batch: run_batch(
                context,
                suite_name if batch == ROWS else f"{suite_name}_{batch}",
                batch,
                [r for r in rules if r.batch == batch],
                batch_frame,
                identifier,
            )
            for batch, batch_frame in ((ROWS, rows_frame), (LABEL_COUNTS, counts_frame))
        }

    def leaked(results: dict[str, Any]) -> bool:
        return any(rule_name_of(r) == "split_leakage" and not r.success for r in results[ROWS][1].results)

    if df.count() <= LOCAL_VALIDATION_MAX_ROWS:
        # GX on Spark runs a few small jobs per expectation (33 for 2,000 rows), the leakage column
        # a window, the label counts an aggregation: here two Spark jobs read the rows, no shuffle.
        rows, splits_per_id = _with_id_splits(df.toArrow().to_pandas(integer_object_nulls=True))
        grouped = rows.groupby(["label", "split"], dropna=False).size()
        counts_df, split_counts, n_labels, imbalance = _label_counts(
            [(_value(label), _value(split), int(n)) for (label, split), n in grouped.items()], labels
        )
        results = validate(rows, counts_df)
        leaked_ids = int(rows.loc[splits_per_id > 1, "example_id"].nunique()) if leaked(results) else 0
    else:
        results, counts_df, split_counts, n_labels, imbalance, leaked_ids = _validate_on_spark(
            df, labels, validate, leaked
        )

    extra = {"split_leakage": f"{leaked_ids} example_id(s) in more than one split"}
    if imbalance:
        largest, smallest, ratio = imbalance
        extra["max_class_imbalance"] = (
            f"largest {largest[0]!r} {largest[1]} / smallest {smallest[0]!r} {smallest[1]} train rows "
            f"= {ratio:.4g}"
        )
    by_name = {rule.name: rule for rule in rules}
    issues: list[QualityIssue] = []
    evaluated = 0
    for _, result in results.values():
        evaluated += int(result.statistics["evaluated_expectations"])
        issues += [
            rule_issue(by_name[rule_name_of(r)], describe_result(r, by_name, extra))
            for r in result.results
            if not r.success
        ]
    statistics = {
        "rows": sum(split_counts.values()),
        "rows_per_split": split_counts,
        "labels": n_labels,
        "class_imbalance": round(imbalance[2], 6) if imbalance else None,
        "leaked_ids": leaked_ids,
        "evaluated_expectations": evaluated,
    }
    return _Outcome(
        issues=issues,
        evaluated=evaluated,
        statistics=statistics,
        results={batch: key for batch, (key, _) in results.items()},
        severities={rule.name: rule.severity for rule in rules},
    )


def _check_schema(df: DataFrame) -> None:
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    problems = []
    for column, family in REQUIRED_COLUMNS.items():
        actual = types.get(column)
        if actual is None:
            problems.append(f"missing column {column!r} ({family})")
        elif family == "integer" and actual not in _INTEGER_TYPES:
            problems.append(f"column {column!r} is {actual}, expected an integer type")
        elif family == "string" and actual != "string":
            problems.append(f"column {column!r} is {actual}, expected string")
    if problems:
        raise PreparedDataSchemaError(
            "The DataFrame to validate is not prepared training data: "
            + "; ".join(problems)
            + f". Pass the output of the preparation step (columns: {', '.join(REQUIRED_COLUMNS)}); "
            f"got columns: {', '.join(types) or 'none'}."
        )


def _validate_on_spark(
    df: DataFrame,
    labels: Sequence[str] | None,
    validate: Callable[[DataFrame, PandasFrame], dict[str, Any]],
    leaked: Callable[[dict[str, Any]], bool],
) -> tuple[dict[str, Any], PandasFrame, dict[str, int], int, Any, int]:
    """The prepared rows validated on Spark (more than LOCAL_VALIDATION_MAX_ROWS of them)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # The leakage rule needs each row's count of splits its id occurs in: one window, computed
    # once into the cache. GX runs one Spark job per metric bundle: the cache spares them all
    # from recomputing the plan.
    splits_of_id = F.size(F.collect_set("split").over(Window.partitionBy("example_id")))
    # The window shuffles into spark.sql.shuffle.partitions (200 by default) partitions, and adaptive
    # execution does not coalesce a cached plan (prepare's dedupe met the same): every GX job then
    # ran 200 mostly empty tasks, 4,800 tasks for 2,000 prepared rows and about half of
    # validate_data's CPU. Back to as many partitions as the prepared data has (it grows with size).
    frame = (
        df.withColumn(ID_SPLITS_COLUMN, F.when(F.col("example_id").isNotNull(), splits_of_id).cast("int"))
        .coalesce(max(1, df.rdd.getNumPartitions()))
        .cache()
    )
    try:
        grouped = frame.groupBy("label", "split").agg(F.count(F.lit(1)).alias("n")).collect()
        counts_df, split_counts, n_labels, imbalance = _label_counts(
            [(row["label"], row["split"], row["n"]) for row in grouped], labels
        )
        results = validate(frame, counts_df)
        leaked_ids = 0
        if leaked(results):
            leaked_ids = frame.where(F.col(ID_SPLITS_COLUMN) > 1).select("example_id").distinct().count()
    finally:
        frame.unpersist()
    return results, counts_df, split_counts, n_labels, imbalance, leaked_ids


def _value(key: Any) -> Any:
    """A pandas group key as Spark gives it: None for a missing value."""
    import pandas as pd

    return None if pd.isna(key) else key


def _with_id_splits(rows: PandasFrame) -> tuple[PandasFrame, Any]:
    """``rows`` with the leakage column (how many splits each row's example_id occurs in; None
    without an id), as the Spark path's window computes it, and those counts as floats (NaN: none)."""
    import pandas as pd

    splits_per_id = rows.groupby("example_id")["split"].transform("nunique")
    if splits_per_id.isna().any():
        # Object, not float: 2, not 2.0, in the report's examples (as integers with nulls arrive).
        values = [None if pd.isna(count) else int(count) for count in splits_per_id]
        rows[ID_SPLITS_COLUMN] = pd.Series(values, index=rows.index, dtype=object)
    else:
        rows[ID_SPLITS_COLUMN] = splits_per_id.astype("int64")
    return rows, splits_per_id


def _label_counts(
    grouped: Sequence[tuple[str | None, str | None, int]], labels: Sequence[str] | None
) -> tuple[PandasFrame, dict[str, int], int, tuple[tuple[str, int], tuple[str, int], float] | None]:
    """Per-label split counts as a small pandas DataFrame, plus per-split totals for statistics
    and the train class imbalance ((largest label, rows), (smallest label, rows), ratio), from the
    rows' (label, split, count) groups.

    The table (labels x splits) is validated in the driver: GX on a Spark frame of a few rows
    still ran a few small Spark jobs per expectation.
    """
    import pandas as pd

    split_counts: dict[str, int] = {}
    per_label: dict[str, dict[str, int]] = {label: {} for label in labels or ()}
    for label, row_split, n in grouped:
        split = row_split if row_split in SPLITS else "other"
        split_counts[split] = split_counts.get(split, 0) + n
        # Null labels and unknown splits are row-level failures already; keep them out here.
        if label is not None and row_split in SPLITS:
            per_label.setdefault(label, {})[row_split] = n
    train = {label: counts.get("train", 0) for label, counts in per_label.items()}
    trained = sorted((n, label) for label, n in train.items() if n > 0)
    imbalance = None
    smallest = trained[0][0] if trained else 0
    if trained:
        (low, low_label), (high, high_label) = trained[0], trained[-1]
        imbalance = ((high_label, high), (low_label, low), high / low)
    records = []
    for label, counts in sorted(per_label.items()):
        n_train, validation, test = (counts.get(s, 0) for s in SPLITS)
        ratio = n_train / smallest if n_train > 0 else None
        records.append(
            (label, n_train, validation, test, validation + test, n_train + validation + test, ratio)
        )
    counts_df = pd.DataFrame.from_records(records, columns=list(_LABEL_COUNT_TYPES)).astype(
        _LABEL_COUNT_TYPES
    )
    n_labels = sum(1 for r in records if r[5] > 0)
    return counts_df, split_counts, n_labels, imbalance
