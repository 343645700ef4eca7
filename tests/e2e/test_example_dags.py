"""The DAGs composed from the pipeline's operators, through `airflow dags test` on embedded defaults.

- `example_spark_to_dataset` (the README's "Use the operators in your own DAG"): a quality check,
  then a Hugging Face dataset on disk;
- `data_quality_report`: the raw-input rules over a table, Data Docs as the output; red on bad
  data with every failed rule named. Green on good data is the example DAG's `check_source` (the
  same operator and rules), so the report runs once, on bad data.

Small generated data (400 rows) keeps each run to Spark and GX start-up costs. fail_on_error=False
(record, do not fail) is the operator's decision alone: tests/operators/test_quality_gate_operator.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from tests.e2e.dag_runs import output_tail, run_dag
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    from dag_runs import output_tail, run_dag

pytestmark = pytest.mark.e2e

ROWS = 400
REPORT_SUITE = "data_quality_report"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A SPARKTUNE_HOME whose demo source (what an empty source_uri means) holds ROWS generated rows."""
    home = tmp_path_factory.mktemp("reuse-home")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sparktune_dev.demo_data",
            "--rows",
            str(ROWS),
            "--out",
            str(_demo_source(home)),
        ],
        check=True,
    )
    return home


def _demo_source(home: Path) -> Path:
    return home / "data" / "support_tickets.jsonl"


def _summaries(home: Path) -> set[Path]:
    return set((home / "gx" / "gx" / "uncommitted" / "quality_summaries").rglob("*.json"))


def _report_run(home: Path, conf: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """One data_quality_report run and the JSON summary it wrote."""
    before = _summaries(home)
    result = run_dag(home, "data_quality_report", conf)
    new = _summaries(home) - before
    assert len(new) == 1, f"expected one new quality summary, got {new}\n{output_tail(result)}"
    return result, json.loads(new.pop().read_text())


def _site(home: Path) -> Path:
    return home / "gx" / "gx" / "uncommitted" / "data_docs" / "local_site"


def test_example_dag_checks_the_source_and_writes_a_loadable_dataset(home):
    import datasets

    result = run_dag(home, "example_spark_to_dataset", {})
    assert result.returncode == 0, output_tail(result)

    [marker] = (home / "lake" / "datasets").glob("*/_SPARKTUNE_COMPLETE.json")
    dataset = datasets.load_from_disk(str(marker.parent))
    assert list(dataset) == ["train"]  # no split column: every row in train
    assert dataset["train"].num_rows == ROWS
    labels = dataset["train"].features["intent_label"]
    assert isinstance(labels, datasets.ClassLabel) and len(labels.names) == 10
    assert {"message", "intent_label", "quality_score"} <= set(dataset["train"].column_names)
    # The check ran first and left its Data Docs (the raw suite of the pipeline's rules).
    index = (_site(home) / "index.html").read_text()
    assert "raw_input" in index


@pytest.fixture(scope="module")
def bad_source(home) -> Path:
    """80 of the demo rows (below min_rows 100), 40% of them without a label (above max_null_rate 0.2)."""
    rows = [json.loads(line) for line in _demo_source(home).read_text().splitlines()[:80]]
    for i, row in enumerate(rows):
        if i % 5 < 2:
            row["intent_label"] = None
    path = home / "data" / "bad_tickets.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_report_on_bad_data_fails_naming_every_failed_rule(home, bad_source):
    result, summary = _report_run(home, {"source_uri": str(bad_source)})
    assert result.returncode != 0, "the nightly report must be red on bad data"
    output = result.stdout + result.stderr
    assert "Data quality gate failed: 2 of" in output
    assert "[raw_rows_min]" in output and "observed 80" in output
    assert "[raw_label_null_rate]" in output and "(40.0%, allowed 20.0%)" in output
    # Failed at once: a bad-data failure is not retried.
    assert "AirflowFailException" in output
    assert {issue["rule"] for issue in summary["issues"]} == {"raw_rows_min", "raw_label_null_rate"}
    assert summary["statistics"]["raw_input"]["rows"] == 80
    assert "prepared" not in summary["statistics"]  # no preparation, no training
    # The report is the Data Docs page of the failing run, under the DAG's own suite.
    page = Path(summary["data_docs_uri"].removeprefix("file://"))
    assert page.is_file(), "the failing run's Data Docs page must exist: it is the report"
    assert f"/validations/{REPORT_SUITE}/" in str(page)
    assert REPORT_SUITE in (_site(home) / "index.html").read_text()
    # The task log says where the Data Docs are.
    assert f"Data Docs (every suite and run): {(_site(home) / 'index.html').as_uri()}" in result.stdout
