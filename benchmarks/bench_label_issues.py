"""Benchmark: the wrong labels planted in a helpdesk export that the label-issue finder ranks first.

    make bench-label-issues                                   # 4,000 rows
    BENCH_LABEL_ISSUES_ROWS=20000 make bench-label-issues     # another size

The data: the helpdesk export of ``sparktune_dev.demo_data`` (what ``--tickets-csv`` writes: 12
categories 10x apart in size, texts of a few hundred characters, exact and near-duplicates, and 3%
of rows the generator itself mislabels) of ``BENCH_LABEL_ISSUES_ROWS`` rows (default 4,000), with
3% more labels flipped on purpose (seeded, each to another category, among the rows whose text
occurs once, so dedupe keeps every flipped row), written as the tool exports it (CSV, BOM, CRLF).

The finder: ``sparktune.serve.label_issues.source_label_issues``, the function the review queue
calls, on a ``local[2]`` Spark session (``text_column=body``, ``label_column=category``,
``id_column=ticket_id``): Spark reads and dedupes the export, the driver cross-validates TF-IDF +
logistic regression (5 stratified folds) and cleanlab flags and ranks the label issues.

Reported: recall (flipped rows among the first 2 x flipped rows of the ranking, over the flipped
rows), precision (flipped rows among those first rows, over how many there are: fewer when the
finder flags fewer), how many issues it flagged, and the seconds of the call (a fresh Spark
session's first job included, as in a review_queue task; the session's start is not). Precision
cannot reach 1: the generator's own mislabelled rows are issues too and take their share of the
first rows, about half of them at 3% + 3%.

Target: recall >= 0.80.

Prints a table and writes ``SPARKTUNE_HOME/bench/label_issues.json``; exits 1 when the run fails
or the target is missed. Not a test.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import finish, target  # noqa: E402
from bench_quality import settings_home, start_spark  # noqa: E402

DEFAULT_ROWS = 4000
FLIP_SHARE = 0.03
DATA_SEED = 7
FLIP_SEED = 11
MIN_RECALL = 0.80


def flipped_export(path: Path, rows: int) -> tuple[dict[str, str], int]:
    """The helpdesk export of ``rows`` rows with :data:`FLIP_SHARE` of its labels flipped, written to
    ``path`` as the tool writes it: ({ticket_id: the label it had}, rows written)."""
    import numpy as np
    from sparktune_dev import demo_data

    table = demo_data.generate_helpdesk_tickets(rows, seed=DATA_SEED)
    columns = {name: table.column(name).to_pylist() for name in demo_data.HELPDESK_COLUMNS}
    texts, labels = columns[demo_data.HELPDESK_TEXT_COLUMN], columns[demo_data.HELPDESK_LABEL_COLUMN]
    # Only texts that occur once: dedupe keeps one copy of a repeated text, maybe not the flipped one.
    copies = Counter(" ".join(t.split()).lower() for t in texts)
    once = [i for i, t in enumerate(texts) if copies[" ".join(t.split()).lower()] == 1]
    rng = np.random.default_rng(FLIP_SEED)
    categories = demo_data.HELPDESK_CATEGORIES
    truth = {}
    for i in sorted(rng.choice(once, size=round(FLIP_SHARE * rows), replace=False).tolist()):
        truth[columns["ticket_id"][i]] = labels[i]
        labels[i] = categories[
            (categories.index(labels[i]) + int(rng.integers(1, len(categories)))) % len(categories)
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8-sig", newline="") as f:  # as demo_data.write_helpdesk_csv writes
        writer = csv.writer(f, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(demo_data.HELPDESK_COLUMNS)
        writer.writerows(zip(*(columns[c] for c in demo_data.HELPDESK_COLUMNS), strict=True))
    return truth, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_label_issues", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows",
        type=int,
        default=int(os.environ.get("BENCH_LABEL_ISSUES_ROWS") or DEFAULT_ROWS),
        help=f"rows of the export (default: BENCH_LABEL_ISSUES_ROWS or {DEFAULT_ROWS})",
    )
    parser.add_argument(
        "--out", default=None, help="JSON path (default SPARKTUNE_HOME/bench/label_issues.json)"
    )
    args = parser.parse_args(argv)
    if args.rows < 400:
        parser.error("--rows must be at least 400 (12 flipped rows)")

    from sparktune.serve.label_issues import source_label_issues
    from sparktune_dev import demo_data

    home = settings_home()
    out = Path(args.out) if args.out else home / "bench" / "label_issues.json"
    source = home / "bench" / "label_issues" / "helpdesk_export.csv"
    truth, rows = flipped_export(source, args.rows)
    print(f"{rows:,} helpdesk rows, {len(truth)} labels flipped on purpose -> {source}", flush=True)

    started = time.perf_counter()
    spark = start_spark("sparktune-bench-label-issues")
    spark_seconds = time.perf_counter() - started
    try:
        started = time.perf_counter()
        found = source_label_issues(
            spark,
            source_uri=str(source),
            source_format="csv",
            text_column=demo_data.HELPDESK_TEXT_COLUMN,
            label_column=demo_data.HELPDESK_LABEL_COLUMN,
            id_column="ticket_id",
        )
        seconds = time.perf_counter() - started
    finally:
        spark.stop()

    first = found.issues[: 2 * len(truth)]
    hits = [issue for issue in first if issue.id in truth]
    recall = len(hits) / len(truth)
    precision = len(hits) / len(first) if first else 0.0
    suggested = sum(issue.suggested_label == truth[issue.id] for issue in hits)
    result = {
        "rows": rows,
        "rows_judged": found.rows,
        "labels": found.labels,
        "folds": found.folds,
        "flipped": len(truth),
        "issues_flagged": len(found.issues),
        "first_rows": len(first),
        "flipped_in_first_rows": len(hits),
        "recall": round(recall, 4),
        "precision": round(precision, 4),
        "true_label_suggested": suggested,
        "seconds": round(seconds, 2),
        "spark_start_seconds": round(spark_seconds, 2),
    }
    header = (
        f"{'rows':>7} {'judged':>7} {'flipped':>7} {'flagged':>7} {'first rows':>10} "
        f"{'recall':>7} {'precision':>9} {'true label suggested':>20} {'seconds':>8}"
    )
    print()
    print(header)
    print("-" * len(header))
    print(
        f"{rows:>7,} {found.rows:>7,} {len(truth):>7} {len(found.issues):>7} {len(first):>10} "
        f"{recall:>7.3f} {precision:>9.3f} {f'{suggested} of {len(hits)}':>20} {seconds:>8.1f}"
    )
    targets = [
        target(
            f"recall of the flipped rows in the first {2 * len(truth)} of the ranking",
            recall,
            at_least=MIN_RECALL,
            note=f"precision {precision:.3f}, {seconds:.1f} s",
        )
    ]
    report = {
        "benchmark": "label_issues",
        "method": (
            "helpdesk export (sparktune_dev.demo_data, seed 7) with 3% of its labels flipped on purpose "
            "(seed 11, rows of a text that occurs once); sparktune.serve.label_issues.source_label_issues "
            "on local[2] (Spark reads and dedupes, 5-fold cross-validated TF-IDF + logistic regression, "
            "cleanlab's find_label_issues ranked by self-confidence); recall and precision of the flipped "
            "rows in the first 2 x flipped rows of the ranking; seconds of that call"
        ),
        "result": result,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
    return finish(out, report, targets)


if __name__ == "__main__":
    sys.exit(main())
