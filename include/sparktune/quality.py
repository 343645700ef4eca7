"""The data-quality gate: Great Expectations 1.x on Spark, with HTML Data Docs for every run.

The rules are data (:func:`raw_rules`, :func:`quality_rules`), so they can be listed, tested and
rendered before anything runs. Three batches are validated, each by its own GX checkpoint so all
of them land in Data Docs:

* ``raw_input``: the source as read (required columns with usable types, null rates, row count);
* ``rows``: the prepared row table (nulls, uniqueness, lengths, token counts, splits, leakage);
* ``label_counts``: one row per label with its train/validation/test row counts, for the rules
  GX cannot state on the row table (enough rows per split and per label, labels seen in
  evaluation splits but never in train, class imbalance).

Each rule is an ``error`` (blocks the run) or a ``warning`` (recorded, the run continues): the
names listed in ``params.quality_warning_rules`` are warnings. Nothing here raises on failed
expectations: :func:`run_quality_gate` returns a :class:`QualityReport` and the caller (the
Airflow operator) decides, with :func:`format_failures` as the one error message. Raised are
only caller errors: unknown rule names in the params, or a prepared DataFrame that lacks the
columns the preparation step produces.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.params import PARAM_SPECS, InvalidParamsError, PipelineParams, default_params

if TYPE_CHECKING:
    from great_expectations import Checkpoint
    from great_expectations.core.batch_definition import BatchDefinition
    from great_expectations.core.expectation_validation_result import (
        ExpectationSuiteValidationResult,
        ExpectationValidationResult,
    )
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context import AbstractDataContext
    from great_expectations.expectations.expectation import Expectation
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

RAW_INPUT = "raw_input"
ROWS = "rows"
LABEL_COUNTS = "label_counts"
SPLITS = ("train", "validation", "test")
ERROR = "error"
WARNING = "warning"
PREPARED_SUITE = "prepared_training_data"
DATASOURCE_NAME = "sparktune_spark"
DATA_DOCS_SITE = "local_site"
# Latest validation results listed in the Data Docs index (three per pipeline run).
DATA_DOCS_RESULTS_LIMIT = 300
# Derived row-table column: how many splits the row's example_id occurs in (leakage when > 1).
ID_SPLITS_COLUMN = "example_id_splits"

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

# Index columns GX reports beside each unexpected value, so a failure names the offending rows.
_INDEX_COLUMNS = {ROWS: ["example_id", "split"], LABEL_COUNTS: ["label"]}
# Few examples per failure keep the stored results and the error message small.
_EXAMPLES_PER_FAILURE = 5
_MAX_VALUE_CHARS = 64
_GX_SEVERITY = {ERROR: "critical", WARNING: "warning"}


@dataclass(frozen=True)
class _RawColumn:
    role: str
    param: str
    # pyspark.sql.types class names; GX's type check is an isinstance test, so abstract
    # classes (IntegralType, NumericType) cover every width.
    types: tuple[str, ...]
    holds: str


# NullType: a JSON column with no value at all; the null-rate rules report that, not this one.
_STRING_TYPES = ("StringType", "CharType", "VarcharType", "NullType")
_TIME_TYPES = ("DateType", "TimestampType", "TimestampNTZType")
RAW_COLUMNS = (
    # A number as the text to classify is a mapping mistake, however well it casts.
    _RawColumn("text", "text_column", _STRING_TYPES, "text (a string column)"),
    _RawColumn(
        "label",
        "label_column",
        (*_STRING_TYPES, "IntegralType", "BooleanType"),
        "a string, integer or boolean",
    ),
    # The last three accept what preparation accepts (prepare._type_problem): CSV reads every
    # column as a string, and preparation parses numbers and times from it.
    _RawColumn(
        "quality", "quality_column", ("NumericType", *_STRING_TYPES), "numbers (or text holding numbers)"
    ),
    _RawColumn(
        "id",
        "id_column",
        (*_STRING_TYPES, "NumericType", "BooleanType", "BinaryType", *_TIME_TYPES),
        "a string, number or binary hash",
    ),
    _RawColumn(
        "timestamp",
        "timestamp_column",
        (*_TIME_TYPES, "NumericType", *_STRING_TYPES),
        "a timestamp, date, number (epoch) or ISO-8601 string",
    ),
)


@dataclass(frozen=True)
class QualityRule:
    """One expectation, as data: which batch it runs on, its GX type and kwargs, and why.

    ``param`` names the run param(s) that set its threshold (None: a fixed rule);
    ``severity`` is ``error`` (a failure blocks the run) or ``warning`` (recorded only).
    """

    name: str
    batch: str  # RAW_INPUT | ROWS | LABEL_COUNTS
    expectation_type: str
    kwargs: Mapping[str, Any] = field(hash=False)
    description: str
    param: str | None = None
    severity: str = ERROR

    def to_configuration(self) -> ExpectationConfiguration:
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        return ExpectationConfiguration(
            type=self.expectation_type,
            kwargs=dict(self.kwargs),
            description=self.description,
            severity=_GX_SEVERITY[self.severity],
            # The rule name travels with the result, so failures map back to their rule.
            meta={"rule": self.name, "batch": self.batch, "param": self.param, "severity": self.severity},
        )

    def to_expectation(self) -> Expectation:
        return self.to_configuration().to_domain_obj()


@dataclass(frozen=True)
class QualityIssue:
    """A failed rule: its report line and what controls it."""

    rule: str
    batch: str
    severity: str
    param: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the rules


def raw_rules(params: PipelineParams) -> list[QualityRule]:
    """Every rule the raw input must meet: columns present and usable, null rates, row count."""
    return _with_severity(_raw_rules(params), params)


def quality_rules(params: PipelineParams, labels: Sequence[str] | None = None) -> list[QualityRule]:
    """Every rule the prepared data must meet, derived from the run's params.

    ``labels``, when given, is the closed set of labels the model is meant to learn: any other
    label fails, and every listed label must have enough train rows even if it is absent.
    """
    return _with_severity(_prepared_rules(params, labels), params)


def rules_key(params: PipelineParams) -> str:
    """A 24-hex-digit key of every rule :func:`run_quality_gate` runs for ``params`` (no label set):
    thresholds, severities and the expectations themselves. Two runs whose keys match check the
    same data the same way, so a report on unchanged data holds for both."""
    import hashlib

    rules = [asdict(rule) for rule in raw_rules(params) + quality_rules(params)]
    return hashlib.sha256(json.dumps(rules, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _every_column_params() -> PipelineParams:
    """Defaults with every optional column named, so every rule there can be is built."""
    # Built from unchecked defaults, not parse_params: params validation may call this.
    return PipelineParams(
        **{**default_params(), "quality_column": "q", "id_column": "id", "timestamp_column": "ts"}
    )


@functools.cache
def rule_names() -> tuple[str, ...]:
    """Every rule name there is (raw and prepared, optional columns included)."""
    every_column = _every_column_params()
    rules = _raw_rules(every_column) + _prepared_rules(every_column, labels=("x",))
    return tuple(rule.name for rule in rules)


@functools.cache
def raw_rule_params() -> tuple[str, ...]:
    """The params a validation of a raw source alone reads, in trigger-form order: where the source
    is and how to read it, the columns and thresholds of :func:`raw_rules`, and which rules only warn.
    """
    used = {"source_uri", "source_format", "quality_warning_rules"}
    for rule in _raw_rules(_every_column_params()):
        used.update(name.strip() for name in (rule.param or "").split(",") if name.strip())
    return tuple(spec.name for spec in PARAM_SPECS if spec.name in used)


def warning_rules(params: PipelineParams) -> frozenset[str]:
    """The rule names in ``params.quality_warning_rules``; unknown names raise one error."""
    names = [name.strip() for name in params.quality_warning_rules.split(",") if name.strip()]
    unknown = [name for name in names if name not in rule_names()]
    if unknown:
        raise InvalidParamsError(
            [
                f"quality_warning_rules: unknown rule name(s) {', '.join(map(repr, unknown))}; "
                f"valid names: {', '.join(rule_names())}"
            ]
        )
    return frozenset(names)


def _with_severity(rules: list[QualityRule], params: PipelineParams) -> list[QualityRule]:
    warnings = warning_rules(params)
    return [replace(rule, severity=WARNING if rule.name in warnings else ERROR) for rule in rules]


def _raw_rules(params: PipelineParams) -> list[QualityRule]:
    rules = [
        QualityRule(
            "raw_rows_min",
            RAW_INPUT,
            "expect_table_row_count_to_be_between",
            {"min_value": params.min_rows},
            f"The raw input has at least {params.min_rows} rows (min_rows).",
            "min_rows",
        )
    ]
    for spec in RAW_COLUMNS:
        column = getattr(params, spec.param).strip()
        if column:  # text and label always name a column; the others are optional
            rules.append(
                QualityRule(
                    f"raw_{spec.role}_column",
                    RAW_INPUT,
                    "expect_column_values_to_be_in_type_list",
                    {"column": column, "type_list": list(spec.types)},
                    f"{spec.param} {column!r} exists and holds {spec.holds}.",
                    spec.param,
                )
            )
    mostly = round(1.0 - params.max_null_rate, 12)
    for role, param in (("text", "text_column"), ("label", "label_column")):
        column = getattr(params, param)
        rules.append(
            QualityRule(
                f"raw_{role}_null_rate",
                RAW_INPUT,
                "expect_column_values_to_not_be_null",
                {"column": column, "mostly": mostly},
                f"At most {params.max_null_rate:.0%} of the raw rows have a null {param} "
                f"({column!r}) (max_null_rate).",
                "max_null_rate",
            )
        )
    return rules


def _prepared_rules(params: PipelineParams, labels: Sequence[str] | None) -> list[QualityRule]:
    rules = [
        QualityRule(
            "row_count",
            ROWS,
            "expect_table_row_count_to_be_between",
            {"min_value": 1},
            "The prepared table has at least one row.",
        ),
        _not_null("example_id"),
        QualityRule(
            "example_id_unique",
            ROWS,
            "expect_column_values_to_be_unique",
            {"column": "example_id"},
            "example_id is unique (a duplicate means the dedupe step let a row through twice).",
        ),
        _not_null("text"),
        QualityRule(
            "text_length",
            ROWS,
            "expect_column_value_lengths_to_be_between",
            {"column": "text", "min_value": params.min_chars, "max_value": params.max_chars},
            f"text has between {params.min_chars} (min_chars) and {params.max_chars} (max_chars) characters.",
            "min_chars, max_chars",
        ),
        _not_null("label"),
    ]
    if labels is not None:
        rules.append(
            QualityRule(
                "label_known",
                ROWS,
                "expect_column_values_to_be_in_set",
                {"column": "label", "value_set": sorted(set(labels))},
                "label is one of the expected labels.",
            )
        )
    rules += [
        _not_null("prompt"),
        _not_null("completion"),
        _not_null("n_tokens"),
        QualityRule(
            "n_tokens_range",
            ROWS,
            "expect_column_values_to_be_between",
            {"column": "n_tokens", "min_value": 1, "max_value": params.max_length},
            f"n_tokens is between 1 and {params.max_length} (max_length).",
            "max_length",
        ),
        _not_null("split"),
        QualityRule(
            "split_known",
            ROWS,
            "expect_column_values_to_be_in_set",
            {"column": "split", "value_set": list(SPLITS)},
            f"split is one of {', '.join(SPLITS)}.",
        ),
        QualityRule(
            "split_leakage",
            ROWS,
            "expect_column_values_to_be_between",
            {"column": ID_SPLITS_COLUMN, "max_value": 1},
            "No example_id (content hash) is in two splits: a leaked row scores the model on data it "
            "trained on.",
        ),
        # --- on the per-label counts table (see _label_counts)
        QualityRule(
            "train_rows_min",
            LABEL_COUNTS,
            "expect_column_sum_to_be_between",
            {"column": "train_rows", "min_value": params.min_train_rows},
            f"The train split has at least {params.min_train_rows} rows (min_train_rows).",
            "min_train_rows",
        ),
    ]
    for split in ("validation", "test"):
        rules.append(
            QualityRule(
                f"{split}_rows_min",
                LABEL_COUNTS,
                "expect_column_sum_to_be_between",
                {"column": f"{split}_rows", "min_value": params.min_rows_per_split},
                f"The {split} split has at least {params.min_rows_per_split} rows (min_rows_per_split).",
                "min_rows_per_split",
            )
        )
    rules += [
        QualityRule(
            "label_train_rows_min",
            LABEL_COUNTS,
            "expect_column_values_to_be_between",
            {"column": "train_rows", "min_value": params.min_rows_per_label},
            f"Every label has at least {params.min_rows_per_label} train rows (min_rows_per_label).",
            "min_rows_per_label",
        ),
        QualityRule(
            "distinct_labels_min",
            LABEL_COUNTS,
            "expect_column_unique_value_count_to_be_between",
            # Labels only seeded from ``labels`` have no rows and do not count as present.
            {"column": "label", "min_value": 2, "row_condition": _greater_than_zero("total_rows")},
            "The data holds at least 2 distinct labels (a classifier needs two classes).",
        ),
        QualityRule(
            "eval_labels_in_train",
            LABEL_COUNTS,
            "expect_column_values_to_be_between",
            {"column": "train_rows", "min_value": 1, "row_condition": _greater_than_zero("eval_rows")},
            "Every label in validation or test also occurs in train (else it cannot be learnt).",
        ),
        QualityRule(
            "max_class_imbalance",
            LABEL_COUNTS,
            "expect_column_values_to_be_between",
            # train_imbalance: the label's train rows / the smallest train class (null without rows).
            {"column": "train_imbalance", "max_value": params.max_class_imbalance},
            f"The largest train class has at most {params.max_class_imbalance:g} times the rows of the "
            "smallest (max_class_imbalance).",
            "max_class_imbalance",
        ),
    ]
    return rules


def _not_null(column: str) -> QualityRule:
    return QualityRule(
        f"{column}_not_null",
        ROWS,
        "expect_column_values_to_not_be_null",
        {"column": column},
        f"{column} is never null.",
    )


def _greater_than_zero(column: str) -> dict[str, Any]:
    # The serialized form of GX's ``Column(column) > 0`` row condition: plain data, like the rest.
    return {"type": "comparison", "column": {"name": column}, "operator": ">", "parameter": 0}


# --- the report


@dataclass
class QualityReport:
    success: bool  # no failed error-severity rule; warnings do not count
    failures: list[str]  # one line per failed error rule
    evaluated: int
    statistics: dict[str, Any]
    data_docs_uri: str  # the prepared rows page (the raw page when only the raw input ran)
    # Data Docs page of each validated batch (RAW_INPUT, ROWS, LABEL_COUNTS) of this run.
    validation_pages: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # one line per failed warning rule
    issues: list[QualityIssue] = field(default_factory=list)
    # Severity of every evaluated rule, so a reader sees what would have blocked.
    rule_severities: dict[str, str] = field(default_factory=dict)
    # The Data Docs site folder (copy it, or the pages of this run, as artifacts).
    data_docs_dir: str | None = None
    summary_path: str | None = None  # the JSON summary, written by run_quality_gate

    @property
    def data_docs_index_uri(self) -> str | None:
        """The Data Docs site's front page (every suite and run), as a file URI."""
        return (Path(self.data_docs_dir).resolve() / "index.html").as_uri() if self.data_docs_dir else None

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> QualityReport:
        """The report :meth:`to_summary` described (a job's, read back in the Airflow task)."""
        return cls(
            success=bool(summary["success"]),
            failures=list(summary["failures"]),
            evaluated=int(summary["evaluated"]),
            statistics=copy.deepcopy(dict(summary.get("statistics") or {})),
            data_docs_uri=summary["data_docs_uri"],
            validation_pages=dict(summary.get("validation_pages") or {}),
            warnings=list(summary.get("warnings") or []),
            issues=[QualityIssue(**issue) for issue in summary.get("issues") or []],
            rule_severities=dict(summary.get("rules") or {}),
            data_docs_dir=summary.get("data_docs_dir"),
            summary_path=summary.get("summary_path"),
        )

    def to_summary(self) -> dict[str, Any]:
        """A small JSON-serializable summary for XCom, MLflow and the task log."""
        return {
            "success": self.success,
            "evaluated": self.evaluated,
            "failed": len(self.failures),
            "warned": len(self.warnings),
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "issues": [issue.to_dict() for issue in self.issues],
            "rules": dict(self.rule_severities),
            "statistics": copy.deepcopy(self.statistics),
            "data_docs_uri": self.data_docs_uri,
            "validation_pages": dict(self.validation_pages),
            "data_docs_dir": self.data_docs_dir,
            "data_docs_index_uri": self.data_docs_index_uri,
            "summary_path": self.summary_path,
        }


def format_failures(report: QualityReport) -> str:
    """One message listing every problem found, with where to look next."""
    warnings = ""
    if report.warnings:
        warnings = f"{len(report.warnings)} warning(s), recorded, not blocking:\n" + "".join(
            f"- {line}\n" for line in report.warnings
        )
    if report.success:
        head = f"Data quality gate passed: {report.evaluated} expectations evaluated, no blocking failure"
        return (
            f"{head}.\n{warnings}See {report.data_docs_uri}"
            if warnings
            else f"{head}; see {report.data_docs_uri}"
        )
    lines = "".join(f"- {failure}\n" for failure in report.failures)
    return (
        f"Data quality gate failed: {len(report.failures)} of {report.evaluated} expectations not met.\n"
        f"{lines}{warnings}"
        "Fix the source data or the param named on each line and rerun (a rule listed in "
        f"quality_warning_rules only warns). See Data Docs at {report.data_docs_uri} for the failing rows."
    )


class PreparedDataSchemaError(ValueError):
    """The DataFrame is not the output of the preparation step: a caller error, not bad data."""


@dataclass
class _Outcome:
    """What one suite (raw, or prepared) found."""

    issues: list[QualityIssue]
    evaluated: int
    statistics: dict[str, Any]
    pages: dict[str, str]
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
    (:func:`sparktune.prepare.load_source`) and validated under the suite ``raw_suite_name``
    (its own name keeps a report's runs apart from the pipeline's in Data Docs); ``raw_df``, the
    source as a caller in the same Spark application read it already, saves a second read. Data Docs are
    updated under ``gx_root``; the summary is written to
    ``gx/uncommitted/quality_summaries/<run>/<time>.json`` beside GX's own results.
    """
    from sparktune.prepare import load_source

    warning_rules(params)  # a typo in the params fails here, before any Spark or GX work
    if raw_df is None:
        raw_df = load_source(spark, source_uri, params.source_format)
    prepared_df = None
    if prepared_uri is not None:
        prepared_df = spark.read.parquet(prepared_uri)
        _check_schema(prepared_df)
    started = time.perf_counter()
    context = _context(Path(gx_root))
    identifier = _identifier(run_id)
    raw = _validate_raw(context, raw_df, params, identifier, raw_suite_name)
    outcomes = [raw]
    statistics: dict[str, Any] = {RAW_INPUT: raw.statistics}
    if prepared_df is not None:
        prepared = _validate_prepared(context, prepared_df, params, identifier, PREPARED_SUITE, labels)
        outcomes.append(prepared)
        statistics["prepared"] = prepared.statistics
    report = _report(context, outcomes, primary=RAW_INPUT if prepared_df is None else ROWS)
    report.statistics = {
        **statistics,
        "evaluated_expectations": report.evaluated,
        "failed_expectations": len(report.failures),
        "warned_expectations": len(report.warnings),
        "validation_seconds": round(time.perf_counter() - started, 3),
    }
    summary_dir = Path(context.root_directory) / "uncommitted" / "quality_summaries" / _run_folder(identifier)
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
    context = _context(Path(gx_root))
    outcome = _validate_raw(context, df, params, _identifier(run_id), suite_name)
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
    context = _context(Path(gx_root))
    outcome = _validate_prepared(context, df, params, _identifier(run_id), suite_name, labels)
    outcome.statistics["validation_seconds"] = round(time.perf_counter() - started, 3)
    report = _report(context, [outcome], primary=ROWS)
    log.info("Data quality: %s", format_failures(report))
    return report


def _identifier(run_id: str | None) -> RunIdentifier:
    from great_expectations.core.run_identifier import RunIdentifier

    return RunIdentifier(run_name=_safe_name(run_id) if run_id else None, run_time=datetime.now(UTC))


def _run_folder(identifier: RunIdentifier) -> str:
    return identifier.run_name or "__none__"


def _report(context: AbstractDataContext, outcomes: list[_Outcome], *, primary: str) -> QualityReport:
    issues = [issue for outcome in outcomes for issue in outcome.issues]
    pages = {batch: url for outcome in outcomes for batch, url in outcome.pages.items()}
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
        data_docs_dir=str(_data_docs_dir(context)),
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
                    _issue(
                        rule,
                        f"[{rule.name}] {rule.description} Failed on {RAW_INPUT}: column {column!r} is "
                        f"missing; the input has columns: {shown or 'none'}. {_param_hint(rule)}",
                    )
                )
            continue  # every other rule on a missing column is not evaluated
        gx_rules.append(replace(rule, kwargs={**rule.kwargs, "column": actual}) if column else rule)

    used = list(dict.fromkeys(r.kwargs["column"] for r in gx_rules if "column" in r.kwargs))
    # Only the checked columns are cached: the source may be wide. Without any, only the row
    # count runs: one job, nothing worth caching.
    frame = df.select(*(_quote(c) for c in used)).cache() if used else df
    try:
        key, result = _run_batch(context, suite_name, RAW_INPUT, gx_rules, frame, identifier)
    finally:
        if used:
            frame.unpersist()
    by_name = {rule.name: rule for rule in gx_rules}
    issues += [_issue(by_name[_rule_name(r)], _describe(r, by_name)) for r in result.results if not r.success]

    null_rates: dict[str, float | None] = {}
    rows = None
    for r in result.results:
        outcome = r.result or {}
        name = _rule_name(r)
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
        pages={RAW_INPUT: _page_url(context, key)},
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
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rules = quality_rules(params, labels)
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
        counts_df, split_counts, n_labels, imbalance = _label_counts(frame, labels)
        results = {
            batch: _run_batch(
                context,
                suite_name if batch == ROWS else f"{suite_name}_{batch}",
                batch,
                [r for r in rules if r.batch == batch],
                batch_frame,
                identifier,
            )
            for batch, batch_frame in ((ROWS, frame), (LABEL_COUNTS, counts_df))
        }
        leaked_ids = 0
        if any(_rule_name(r) == "split_leakage" and not r.success for r in results[ROWS][1].results):
            leaked_ids = frame.where(F.col(ID_SPLITS_COLUMN) > 1).select("example_id").distinct().count()
    finally:
        frame.unpersist()

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
            _issue(by_name[_rule_name(r)], _describe(r, by_name, extra))
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
        pages={batch: _page_url(context, key) for batch, (key, _) in results.items()},
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


def _label_counts(
    df: DataFrame, labels: Sequence[str] | None
) -> tuple[DataFrame, dict[str, int], int, tuple[tuple[str, int], tuple[str, int], float] | None]:
    """Per-label split counts as a small local DataFrame, plus per-split totals for statistics
    and the train class imbalance ((largest label, rows), (smallest label, rows), ratio).

    One Spark aggregation; the result (labels x splits) is collected and rebuilt locally so the
    GX metric jobs on it cost nothing against the source plan.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    grouped = df.groupBy("label", "split").agg(F.count(F.lit(1)).alias("n")).collect()
    split_counts: dict[str, int] = {}
    per_label: dict[str, dict[str, int]] = {label: {} for label in labels or ()}
    for row in grouped:
        split = row["split"] if row["split"] in SPLITS else "other"
        split_counts[split] = split_counts.get(split, 0) + row["n"]
        # Null labels and unknown splits are row-level failures already; keep them out here.
        if row["label"] is not None and row["split"] in SPLITS:
            per_label.setdefault(row["label"], {})[row["split"]] = row["n"]
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
    schema = StructType(
        [StructField("label", StringType(), False)]
        + [
            StructField(name, LongType(), False)
            for name in ("train_rows", "validation_rows", "test_rows", "eval_rows", "total_rows")
        ]
        + [StructField("train_imbalance", DoubleType(), True)]
    )
    n_labels = sum(1 for r in records if r[5] > 0)
    return df.sparkSession.createDataFrame(records, schema), split_counts, n_labels, imbalance


# --- Great Expectations plumbing


def _context(gx_root: Path) -> AbstractDataContext:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    gx_root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=gx_root)
    bars = context.variables.progress_bars
    # Read back from the YAML file it is a dict, freshly set a ProgressBarsConfig.
    if bars is not None and not isinstance(bars, Mapping):
        bars = {"globally": bars.globally, "metric_calculations": bars.metric_calculations}
    # tqdm bars fill Airflow task logs with carriage-return noise; switch them off once.
    if bars is None or bars.get("globally", True) or bars.get("metric_calculations", True):
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        context.variables.save()
    # Unlimited, every Data Docs update re-reads every validation result ever stored: a run
    # would get slower each day. Keep the index (and section rebuilds) to the latest results.
    sites = copy.deepcopy(context.variables.data_docs_sites or {})
    index_builder = sites.get(DATA_DOCS_SITE, {}).get("site_index_builder")
    if index_builder is not None and index_builder.get("validation_results_limit") != DATA_DOCS_RESULTS_LIMIT:
        index_builder["validation_results_limit"] = DATA_DOCS_RESULTS_LIMIT
        context.variables.data_docs_sites = sites
        context.variables.save()
    return context


def _data_docs_dir(context: AbstractDataContext) -> Path:
    site = (context.variables.data_docs_sites or {}).get(DATA_DOCS_SITE, {})
    base = site.get("store_backend", {}).get("base_directory", f"uncommitted/data_docs/{DATA_DOCS_SITE}/")
    return Path(context.root_directory) / base


def _batch_definition(context: AbstractDataContext, asset_name: str) -> BatchDefinition:
    # Get-or-add each level: add_or_update on the data source would drop its assets and give
    # the batch definitions new ids, making the stored validation definitions stale.
    try:
        source = context.data_sources.get(DATASOURCE_NAME)
    except KeyError:
        # persist=False: this module caches and unpersists the DataFrames itself.
        source = context.data_sources.add_spark(DATASOURCE_NAME, persist=False)
    try:
        asset = source.get_asset(asset_name)
    except LookupError:
        asset = source.add_dataframe_asset(asset_name)
    try:
        return asset.get_batch_definition("whole_dataframe")
    except KeyError:
        return asset.add_batch_definition_whole_dataframe("whole_dataframe")


def _run_batch(
    context: AbstractDataContext,
    name: str,
    batch: str,
    rules: list[QualityRule],
    frame: DataFrame,
    identifier: RunIdentifier,
) -> tuple[Any, ExpectationSuiteValidationResult]:
    """Validate one batch; when the row table fails, validate it again with the offending rows named.

    Naming the offending rows (SUMMARY with index columns) costs extra Spark jobs per
    expectation even when it passes, so the common, passing run on the row table asks for
    observed values only (BASIC). The detailed rerun keeps the run id, so its result replaces
    the first one in the store and in Data Docs. The label counts table is tiny: it gets
    details at once. The raw input has no row key to name.
    """
    checkpoint = _checkpoint(
        context, name, f"{name}_checkpoint", batch, rules, detailed=batch == LABEL_COUNTS
    )
    key, result = _run(checkpoint, frame, identifier)
    if not result.success and batch == ROWS:
        checkpoint = _checkpoint(context, name, f"{name}_detailed_checkpoint", batch, rules, detailed=True)
        key, result = _run(checkpoint, frame, identifier)
    return key, result


def _run(
    checkpoint: Checkpoint, frame: DataFrame, identifier: RunIdentifier
) -> tuple[Any, ExpectationSuiteValidationResult]:
    outcome = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=identifier)
    ((key, result),) = outcome.run_results.items()
    return key, result


def _checkpoint(
    context: AbstractDataContext,
    name: str,
    checkpoint_name: str,
    batch: str,
    rules: list[QualityRule],
    *,
    detailed: bool,
) -> Checkpoint:
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=name, expectations=[rule.to_expectation() for rule in rules])
    definition = gx.ValidationDefinition(name=name, data=_batch_definition(context, name), suite=suite)
    # BASIC still shows observed values in Data Docs; BOOLEAN_ONLY would save about a Spark job
    # per expectation but leaves the passing run's page reading "unknown % not null".
    result_format: dict[str, Any] = {
        "result_format": "BASIC",
        "partial_unexpected_count": _EXAMPLES_PER_FAILURE,
    }
    if detailed:
        result_format = {
            "result_format": "SUMMARY",
            "partial_unexpected_count": _EXAMPLES_PER_FAILURE,
            "unexpected_index_column_names": _INDEX_COLUMNS[batch],
        }
    checkpoint = gx.Checkpoint(
        name=checkpoint_name,
        validation_definitions=[definition],
        actions=[gx.checkpoint.UpdateDataDocsAction(name="update_data_docs", site_names=[DATA_DOCS_SITE])],
        result_format=result_format,
    )
    # Cascades: stores (or overwrites) the suite and validation definition by name too.
    return context.checkpoints.add_or_update(checkpoint)


def _page_url(context: AbstractDataContext, key: Any) -> str:
    urls = context.get_docs_sites_urls(resource_identifier=key, site_name=DATA_DOCS_SITE)
    if urls and urls[0].get("site_url"):
        return str(urls[0]["site_url"])
    index = context.get_docs_sites_urls(site_name=DATA_DOCS_SITE, only_if_exists=False)
    return str(index[0]["site_url"])


# --- report lines


def _rule_name(result: ExpectationValidationResult) -> str:
    return str(result.expectation_config.meta.get("rule", ""))


def _issue(rule: QualityRule, message: str) -> QualityIssue:
    return QualityIssue(rule.name, rule.batch, rule.severity, rule.param, message)


def _param_hint(rule: QualityRule | None) -> str:
    if rule is None or not rule.param:
        return "(fixed rule; param quality_warning_rules can make it a warning)"
    return f"(param{'s' if ',' in rule.param else ''} {rule.param})"


def _describe(
    result: ExpectationValidationResult,
    rules_by_name: Mapping[str, QualityRule],
    extra: Mapping[str, str] | None = None,
) -> str:
    config = result.expectation_config
    rule = rules_by_name.get(config.meta.get("rule", ""))
    expected = rule.description if rule else (config.description or config.type)
    name = rule.name if rule else config.type
    where = f"{rule.batch} " if rule else ""
    column = config.kwargs.get("column")
    where += f"column {column!r}" if column else "table"
    hint = _param_hint(rule)
    if result.exception_info and result.exception_info.get("raised_exception"):
        error = result.exception_info.get("exception_message")
        return f"[{name}] {expected} Could not be evaluated on {where}: {error} {hint}"
    outcome = result.result or {}
    if "unexpected_count" in outcome:
        unit = "labels" if rule and rule.batch == LABEL_COUNTS else "rows"
        observed = f"{outcome['unexpected_count']} of {outcome.get('element_count', '?')} {unit} unexpected"
        mostly = config.kwargs.get("mostly")
        if mostly is not None and outcome.get("unexpected_percent") is not None:
            observed += f" ({outcome['unexpected_percent']:.1f}%, allowed {(1 - mostly) * 100:.1f}%)"
        examples = _examples(outcome, column)
        if examples:
            observed += f", e.g. {examples}"
    elif outcome.get("observed_value") is None:
        observed = "nothing to measure (no rows)"
    else:
        value = outcome["observed_value"]
        # GX sums come back as floats: 18 rows, not 18.0 rows.
        observed = (
            f"observed {_short(int(value) if isinstance(value, float) and value.is_integer() else value)}"
        )
        if config.type == "expect_column_values_to_be_in_type_list":
            observed += f", allowed {', '.join(config.kwargs.get('type_list') or [])}"
    if extra and rule and extra.get(rule.name):
        observed += f"; {extra[rule.name]}"
    return f"[{name}] {expected} Failed on {where}: {observed}. {hint}"


def _examples(outcome: Mapping[str, Any], column: str | None) -> str:
    indexed = outcome.get("partial_unexpected_index_list") or []
    if indexed:
        shown = [
            ", ".join(f"{key}={_short(value)}" for key, value in dict(item).items())
            if isinstance(item, Mapping)
            else _short(item)
            for item in indexed[:_EXAMPLES_PER_FAILURE]
        ]
        return "; ".join(f"({s})" for s in shown)
    values = [v for v in outcome.get("partial_unexpected_list") or [] if v is not None]
    return ", ".join(f"{column}={_short(v)}" for v in values[:_EXAMPLES_PER_FAILURE])


def _short(value: Any) -> str:
    text = repr(value)
    if len(text) > _MAX_VALUE_CHARS + 2:
        return f"{text[:_MAX_VALUE_CHARS]}... ({len(str(value))} chars)"
    return text


def _safe_name(run_id: str) -> str:
    # Airflow run ids carry ':' and '+', which end up in file paths and file:// URIs.
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)
