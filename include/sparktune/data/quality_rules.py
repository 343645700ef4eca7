"""The data-quality rules as data: every expectation the gate runs, with its batch, threshold and why.

:func:`raw_rules` hold for the source as read, :func:`quality_rules` for the prepared rows and the
per-label counts. Each rule is an ``error`` (blocks the run) or a ``warning`` (recorded, the run
continues): the names listed in ``params.quality_warning_rules`` are warnings. Being data, the rules
can be listed, keyed, tested and rendered before anything runs.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sparktune.core.params import InvalidParamsError, PipelineParams, default_params

if TYPE_CHECKING:
    from great_expectations.expectations.expectation import Expectation
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

RAW_INPUT = "raw_input"
ROWS = "rows"
LABEL_COUNTS = "label_counts"
SPLITS = ("train", "validation", "test")
ERROR = "error"
WARNING = "warning"
# Derived row-table column: how many splits the row's example_id occurs in (leakage when > 1).
ID_SPLITS_COLUMN = "example_id_splits"
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
    # The last three accept what preparation accepts (prepare_source._type_problem): CSV reads every
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
    # Built from unchecked defaults (model_construct), not validated: params validation may call this.
    return PipelineParams.model_construct(
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
    return tuple(name for name in PipelineParams.model_fields if name in used)


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
        # --- on the per-label counts table (see sparktune.data.quality._label_counts)
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
