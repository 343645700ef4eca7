"""What a preparation run reports: rows in and out of every step, the summary of the published data,
and the warnings and hints for steps that rejected most rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sparktune.data.prepare_errors import NoRowsLeftError
from sparktune.data.prepare_split import SPLITS

if TYPE_CHECKING:
    from sparktune.core.params import PipelineParams

STEPS = (
    "read",
    "min_quality_score",
    "null_label",
    "length",
    "dedupe",
    "label_conflict",
    "format",
    "max_length",
    "split",
)
# Steps that can reject rows, in the order they are applied (a row is charged to the first one).
REJECTING_STEPS = ("min_quality_score", "null_label", "length", "dedupe", "label_conflict", "max_length")
# A step that drops at least this share of the rows reaching it is called out in the summary.
WARN_DROP_SHARE = 0.5


@dataclass(frozen=True)
class StepCount:
    step: str
    rows_in: int
    rows_out: int
    skipped: bool = False

    @property
    def dropped(self) -> int:
        return self.rows_in - self.rows_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_counts(total: int, rejected: dict[str, int], quality_used: bool) -> list[StepCount]:
    """Every step's rows in and out, from the rows ``rejected`` per step out of ``total`` read."""
    steps = []
    remaining = total
    for step in STEPS:
        dropped = rejected.get(step, 0)
        steps.append(
            StepCount(
                step, remaining, remaining - dropped, skipped=step == "min_quality_score" and not quality_used
            )
        )
        remaining -= dropped
    return steps


def _step_hint(step: str, params: PipelineParams, finding: str | None = None) -> str:
    """What usually makes ``step`` reject most rows (with what it saw, if known) and what to check."""
    id_column = params.id_column.strip()
    key = f"id_column {id_column!r}" if id_column else "normalized text (a content hash)"
    hints = {
        "min_quality_score": (
            f"quality_column {params.quality_column!r} is below min_quality_score "
            f"({params.min_quality_score:g}) or not a number: check quality_column and min_quality_score"
        ),
        "null_label": f"label_column {params.label_column!r} is null or blank: check label_column",
        "length": (
            f"text_column {params.text_column!r} is shorter than min_chars ({params.min_chars}) or longer "
            f"than max_chars ({params.max_chars}) after trimming: check text_column and the thresholds"
        ),
        "dedupe": (
            f"rows repeat another row's {key}: check that the source was not appended to itself"
            + (f" and that {id_column!r} is unique per example" if id_column else "")
        ),
        "label_conflict": (
            "the same normalized text carries different labels in the source (label_conflicts="
            f"{params.label_conflicts}): correct those texts (record_corrections) or fix the source"
        ),
        "max_length": (
            f"prompt + label exceed max_length ({params.max_length}) tokens: raise max_length or shorten "
            "prompt_template or the texts (max_chars)"
        ),
    }
    hint = hints.get(step, "")
    if finding and ": " in hint:
        cause, fix = hint.split(": ", 1)
        hint = f"{cause} ({finding}): {fix}"
    return hint


def step_warnings(steps: list[StepCount], params: PipelineParams) -> list[str]:
    """A sentence for every step that rejected at least half of the rows reaching it."""
    warnings = []
    for s in steps:
        if s.step in REJECTING_STEPS and s.rows_in and s.dropped / s.rows_in >= WARN_DROP_SHARE:
            warnings.append(
                f"{s.step} dropped {s.dropped:,} of {s.rows_in:,} rows ({s.dropped / s.rows_in:.0%}): "
                f"{_step_hint(s.step, params)}"
            )
    return warnings


def summarize(steps: list[StepCount], split_label_counts: list[tuple[str, str, int]]) -> dict[str, Any]:
    split_counts = dict.fromkeys(SPLITS, 0)
    rows_per_label: dict[str, int] = {}
    for label, split, count in split_label_counts:
        split_counts[split] = split_counts.get(split, 0) + count
        rows_per_label[label] = rows_per_label.get(label, 0) + count
    return {
        "rows_in": steps[0].rows_in,
        "rows_out": steps[-1].rows_out,
        "steps": [s.to_dict() for s in steps],
        "split_counts": split_counts,
        "labels": sorted(rows_per_label),
        "rows_per_label": dict(sorted(rows_per_label.items())),
    }


def format_steps(steps: list[StepCount]) -> list[str]:
    """One line per step for the task log."""
    lines = [f"{'step':<18} {'rows_in':>12} {'rows_out':>12} {'dropped':>10}"]
    for s in steps:
        note = "  (skipped)" if s.skipped else ""
        lines.append(f"{s.step:<18} {s.rows_in:>12,} {s.rows_out:>12,} {s.dropped:>10,}{note}")
    return lines


def no_rows_left_error(
    source_uri: str,
    steps: list[StepCount],
    findings: dict[str, str],
    params: PipelineParams,
    quarantine_uri: str,
) -> NoRowsLeftError:
    """The error of a run whose every row was rejected: the step that rejected most, why it usually
    does (with ``findings``, what it saw), every step's counts and where the rejected rows are."""
    worst = max((s for s in steps if s.step in REJECTING_STEPS), key=lambda s: s.dropped)
    return NoRowsLeftError(
        f"No rows left after preparing {source_uri!r}: all {steps[0].rows_in:,} row(s) were rejected; "
        f"{worst.step} rejected {worst.dropped:,} of the {worst.rows_in:,} row(s) reaching it, because "
        f"{_step_hint(worst.step, params, findings.get(worst.step))}.\n"
        + "\n".join(format_steps(steps))
        + f"\nEvery rejected row, with its reason, is in {quarantine_uri}. Fix: check the column mapping "
        "(text_column, label_column, quality_column) and the thresholds (min_quality_score, min_chars, "
        "max_chars, max_length)."
    )
