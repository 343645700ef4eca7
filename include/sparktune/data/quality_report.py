"""What the data-quality gate reports: the failed rules as issues, one line each naming the rule, what
was observed, example rows and the param to change, gathered in a :class:`QualityReport`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.data.quality_rules import LABEL_COUNTS, QualityRule

if TYPE_CHECKING:
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult

# Few examples per failure keep the stored results and the error message small.
EXAMPLES_PER_FAILURE = 5
_MAX_VALUE_CHARS = 64


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


def rule_name_of(result: ExpectationValidationResult) -> str:
    """The name of the rule a GX result is for (its expectation carries it in ``meta``)."""
    return str(result.expectation_config.meta.get("rule", ""))


def rule_issue(rule: QualityRule, message: str) -> QualityIssue:
    """The issue ``rule`` failing with the report line ``message``."""
    return QualityIssue(rule.name, rule.batch, rule.severity, rule.param, message)


def param_hint(rule: QualityRule | None) -> str:
    """The param(s) that set ``rule``'s threshold, in parentheses, for the end of a report line."""
    if rule is None or not rule.param:
        return "(fixed rule; param quality_warning_rules can make it a warning)"
    return f"(param{'s' if ',' in rule.param else ''} {rule.param})"


def describe_result(
    result: ExpectationValidationResult,
    rules_by_name: Mapping[str, QualityRule],
    extra: Mapping[str, str] | None = None,
) -> str:
    """The report line of a failed GX result: the rule, what was expected and observed, examples of
    the offending rows, ``extra`` (what the caller measured besides) and the param to change."""
    config = result.expectation_config
    rule = rules_by_name.get(config.meta.get("rule", ""))
    expected = rule.description if rule else (config.description or config.type)
    name = rule.name if rule else config.type
    where = f"{rule.batch} " if rule else ""
    column = config.kwargs.get("column")
    where += f"column {column!r}" if column else "table"
    hint = param_hint(rule)
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
            ", ".join(f"{key}={_short(value)}" for key, value in _index_first(dict(item), column))
            if isinstance(item, Mapping)
            else _short(item)
            for item in indexed[:EXAMPLES_PER_FAILURE]
        ]
        return "; ".join(f"({s})" for s in shown)
    values = [v for v in outcome.get("partial_unexpected_list") or [] if v is not None]
    return ", ".join(f"{column}={_short(v)}" for v in values[:EXAMPLES_PER_FAILURE])


def _index_first(item: dict[str, Any], column: str | None) -> list[tuple[str, Any]]:
    """A row's index columns, then the checked column: the order Spark's results have, which
    pandas' put the other way round."""
    return sorted(item.items(), key=lambda pair: pair[0] == column)


def _short(value: Any) -> str:
    if type(value).__module__ == "numpy":  # pandas' results hold numpy scalars: 9.0, not np.float64(9.0)
        value = value.item()
    text = repr(value)
    if len(text) > _MAX_VALUE_CHARS + 2:
        return f"{text[:_MAX_VALUE_CHARS]}... ({len(str(value))} chars)"
    return text
