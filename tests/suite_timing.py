"""Where the suite's time goes: a table of its groups' seconds closes every run.

A group is what one xdist worker takes whole (``tests/conftest.py``: a module, or modules that share
a session fixture). For each group: the worker that ran it, its tests, the seconds its fixtures took
to set up (a DAG run, a stack, a trained model), the seconds of the tests themselves (call and
teardown), and its wall span from its first setup to its last teardown. The same figures go to
``test-output/suite_timing.json`` for comparing two runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

OUTPUT = Path(__file__).resolve().parents[1] / "test-output" / "suite_timing.json"
SHOWN = 25  # rows of the table; the JSON has them all


@dataclass
class GroupTime:
    group: str
    worker: str = ""
    tests: int = 0
    setup_s: float = 0.0
    tests_s: float = 0.0
    first_start: float = field(default=float("inf"))
    last_stop: float = 0.0

    @property
    def wall_s(self) -> float:
        return max(0.0, self.last_stop - self.first_start)


class SuiteTiming:
    """A pytest plugin on the controlling process: it sees every worker's reports."""

    def __init__(self, group_of: Callable[[str], str]) -> None:
        self.group_of = group_of
        self.groups: dict[str, GroupTime] = {}
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        group = self.group_of(report.nodeid)
        row = self.groups.setdefault(group, GroupTime(group))
        node = getattr(report, "node", None)  # xdist's worker controller, on the controlling process
        if node is not None:
            worker = node.gateway.id
            row.worker = worker if row.worker in ("", worker) else f"{row.worker},{worker}"
        if report.when == "setup":
            row.tests += 1
            row.setup_s += report.duration
        else:
            row.tests_s += report.duration
        row.first_start = min(row.first_start, report.start)
        row.last_stop = max(row.last_stop, report.stop)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.groups:
            return
        wall = time.time() - self.started
        rows = sorted(self.groups.values(), key=lambda r: -r.wall_s)
        write = terminalreporter.write_line
        terminalreporter.section("time by test group (seconds)")
        write(f"{'group':<58}{'worker':>7}{'tests':>7}{'setup':>8}{'tests':>8}{'wall':>8}")
        for row in rows[:SHOWN]:
            name = row.group if len(row.group) <= 56 else "..." + row.group[-53:]
            write(
                f"{name:<58}{row.worker:>7}{row.tests:>7}{row.setup_s:>8.0f}{row.tests_s:>8.0f}{row.wall_s:>8.0f}"
            )
        rest = rows[SHOWN:]
        if rest:
            write(
                f"{f'{len(rest)} more groups':<58}{'':>7}{sum(r.tests for r in rest):>7}"
                f"{sum(r.setup_s for r in rest):>8.0f}{sum(r.tests_s for r in rest):>8.0f}{'':>8}"
            )
        busy: dict[str, float] = {}
        for row in rows:
            workers = row.worker.split(",") if row.worker else ["main"]
            for worker in workers:
                busy[worker] = busy.get(worker, 0.0) + (row.setup_s + row.tests_s) / len(workers)
        per_worker = ", ".join(f"{w} {s:.0f}" for w, s in sorted(busy.items()))
        write(f"pytest wall {wall:.0f} s; busy seconds per worker: {per_worker}")
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(
            json.dumps(
                {
                    "wall_s": round(wall, 1),
                    "busy_s": {w: round(s, 1) for w, s in busy.items()},
                    "groups": [{**asdict(r), "wall_s": round(r.wall_s, 1)} for r in rows],
                },
                indent=1,
            )
        )
