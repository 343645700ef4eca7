"""What ReviewQueueOperator hands its Spark callable: one folder per run under the queues' root, the
size as a number, the defaults of the lake, the training source of the label issues resolved as the
pipeline resolves it; a size that is no row count, or a missing source, fails before Spark starts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow import ReviewQueueOperator


@pytest.fixture
def started(tmp_path, monkeypatch):
    """The op_kwargs each execute would start Spark with (Spark itself is replaced)."""
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPARKTUNE_FEEDBACK_URI", raising=False)
    monkeypatch.delenv("SPARKTUNE_SERVING_CAPTURES_URI", raising=False)
    monkeypatch.delenv("SPARKTUNE_LAKE_URI", raising=False)
    demo = tmp_path / "home" / "data" / "support_tickets.jsonl"  # the pipeline's default source
    demo.parent.mkdir(parents=True)
    demo.write_text("{}\n")
    seen: list[dict] = []
    monkeypatch.setattr(PySparkOperator, "execute", lambda op, context: seen.append(dict(op.op_kwargs)))
    return seen


def _context(run_id: str = "manual__2026-11-23T10:00:00+00:00") -> dict:
    return {"ti": SimpleNamespace(dag_id="review_queue", run_id=run_id, task_id="build_queue", try_number=1)}


def test_each_run_writes_its_own_folder_under_the_feedback_tables_queues(tmp_path, started):
    ReviewQueueOperator(task_id="build_queue", model_name=" intent ", size="25").execute(_context())
    lake = tmp_path / "home" / "lake"
    assert started[-1] == {
        "feedback_uri": str(lake / "feedback"),
        "captures_uri": str(lake / "serving_captures"),
        "model_name": "intent",
        "size": 25,
        "output_uri": str(lake / "feedback" / "review_queue" / "manual__2026-11-23T10_00_00_00_00"),
        # 50 label issues of the pipeline's default source (the demo data) lead the queue.
        "label_issues": 50,
        "label_issue_source": {
            "source_uri": str(tmp_path / "home" / "data" / "support_tickets.jsonl"),
            "source_format": "auto",
            "text_column": "message",
            "label_column": "intent_label",
            "id_column": "",
            "max_rows": 200_000,
        },
    }
    # A folder of the user's: relative paths resolved, the run's folder inside; no name: every model.
    ReviewQueueOperator(task_id="build_queue", model_name=None, size=5, output_uri="queues/").execute(
        _context("manual__1")
    )
    assert started[-1]["output_uri"].endswith("/queues/manual__1") and started[-1]["output_uri"].startswith(
        "/"
    )
    assert started[-1]["model_name"] == ""


@pytest.mark.parametrize("size", [0, "-3", "many", None])
def test_a_size_that_is_no_row_count_fails_without_retries(started, size):
    with pytest.raises(AirflowFailException, match="at least 1"):
        ReviewQueueOperator(task_id="build_queue", size=size).execute(_context())
    assert started == []


def test_the_label_issue_source_is_the_one_given_and_label_issues_0_reads_none(tmp_path, started):
    source = {"source_uri": "exports/tickets.csv", "text_column": "body", "label_column": "category"}
    ReviewQueueOperator(
        task_id="build_queue", label_issues="10", source=source, label_issue_max_rows="5000"
    ).execute(_context())
    given = started[-1]["label_issue_source"]
    assert started[-1]["label_issues"] == 10 and given["max_rows"] == 5000
    assert given["source_uri"].endswith("/exports/tickets.csv") and given["source_uri"].startswith("/")
    assert (given["text_column"], given["label_column"]) == ("body", "category")

    (tmp_path / "home" / "data" / "support_tickets.jsonl").unlink()
    ReviewQueueOperator(task_id="build_queue", label_issues=0).execute(_context())
    assert (started[-1]["label_issues"], started[-1]["label_issue_source"]) == (0, None)


def test_a_missing_default_source_or_a_bad_label_issue_count_fails_without_retries(tmp_path, started):
    (tmp_path / "home" / "data" / "support_tickets.jsonl").unlink()
    with pytest.raises(AirflowFailException, match="demo data .* does not exist.*set label_issues to 0"):
        ReviewQueueOperator(task_id="build_queue").execute(_context())
    with pytest.raises(AirflowFailException, match="label_issues is '-1'. Fix: .* at least 0"):
        ReviewQueueOperator(task_id="build_queue", label_issues="-1").execute(_context())
    assert started == []
