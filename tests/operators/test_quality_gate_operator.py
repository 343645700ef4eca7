"""SparkQualityGateOperator's decisions: raw-only runs, and whether failed rules fail the task.

The GX work itself is tested in tests/unit/test_quality.py and end to end in tests/e2e; here the
domain entry point is replaced by a recorder so the operator's choices run in milliseconds.
"""

from __future__ import annotations

import pytest
import sparktune.data.quality
from airflow.sdk.exceptions import AirflowFailException
from sparktune.core.params import parse_params
from sparktune.data.quality_report import QualityIssue, QualityReport
from sparktune.data.quality_rules import ERROR, RAW_INPUT
from sparktune_airflow import SparkQualityGateOperator
from sparktune_airflow.data.quality import _quality_gate

FAILED_LINE = "[raw_label_null_rate] At most 20% of the raw rows have a null label_column. Failed ..."


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """Every call the operator makes to run_quality_gate; each returns a report with one failed rule."""
    seen: list[dict] = []

    def fake_run_quality_gate(spark, params, **kwargs):
        seen.append({"params": params, **kwargs})
        issue = QualityIssue("raw_label_null_rate", RAW_INPUT, ERROR, "max_null_rate", FAILED_LINE)
        return QualityReport(
            success=False,
            failures=[FAILED_LINE],
            evaluated=6,
            statistics={},
            data_docs_uri="file:///docs/raw.html",
            validation_pages={RAW_INPUT: "file:///docs/raw.html"},
            issues=[issue],
            data_docs_dir=str(tmp_path / "site"),
        )

    monkeypatch.setattr(sparktune.data.quality, "run_quality_gate", fake_run_quality_gate)
    return seen


def _gate(tmp_path, **kwargs):
    defaults = {
        "prepared_uri": None,
        "source_uri": str(tmp_path / "reviews.jsonl"),
        "typed_params": parse_params({"label_column": "stars", "max_null_rate": 0.2}),
        "gx_root": str(tmp_path / "gx"),
        "run_id": "scheduled__2026-01-01T00:00:00+00:00",
    }
    return _quality_gate(**{**defaults, **kwargs})


def test_failed_rules_fail_the_task_by_default_naming_each_rule(calls, tmp_path):
    with pytest.raises(AirflowFailException) as error:
        _gate(tmp_path)
    assert "Data quality gate failed: 1 of 6 expectations not met" in str(error.value)
    assert FAILED_LINE in str(error.value)
    # No prepared data: a raw-only run, under the pipeline's raw suite unless told otherwise.
    (call,) = calls
    assert call["prepared_uri"] is None and call["raw_suite_name"] == RAW_INPUT
    assert call["source_uri"] == str(tmp_path / "reviews.jsonl")
    assert call["params"].label_column == "stars"


@pytest.mark.parametrize("flag", [False, "False", " false "])
def test_report_mode_returns_the_failures_instead_of_failing(calls, tmp_path, flag):
    summary = _gate(tmp_path, fail_on_error=flag, raw_suite_name="reviews_report")
    assert summary["success"] is False and summary["failed"] == 1
    assert [issue["rule"] for issue in summary["issues"]] == ["raw_label_null_rate"]
    assert summary["source_uri"] == str(tmp_path / "reviews.jsonl")
    assert summary["data_docs_index_uri"] == (tmp_path / "site" / "index.html").as_uri()
    assert calls[0]["raw_suite_name"] == "reviews_report"


def test_a_flag_that_is_not_a_boolean_fails_before_any_validation(calls, tmp_path):
    with pytest.raises(AirflowFailException, match="fail_on_error must be true or false, got 'yes'"):
        _gate(tmp_path, fail_on_error="yes")
    assert calls == []


def test_operator_needs_no_prepared_data_and_templates_its_inputs(tmp_path):
    task = SparkQualityGateOperator(
        task_id="check",
        source_uri="{{ params.source_uri }}",
        gx_root=str(tmp_path / "gx"),
        fail_on_error="{{ params.fail_on_error }}",
        raw_suite_name="reviews_report",
    )
    assert task.prepared_uri is None
    assert task.op_kwargs["fail_on_error"] == "{{ params.fail_on_error }}"
    assert task.op_kwargs["raw_suite_name"] == "reviews_report"
    assert {"op_kwargs", "source_uri", "prepared_uri"} <= set(task.template_fields)


def _job_report(tmp_path) -> dict:
    """What a prepare job that ran the gate returns under ``quality``: one failed error rule."""
    issue = QualityIssue("raw_label_null_rate", RAW_INPUT, ERROR, "max_null_rate", FAILED_LINE)
    report = QualityReport(
        success=False,
        failures=[FAILED_LINE],
        evaluated=26,
        statistics={"raw_input": {"rows": 500}},
        data_docs_uri="file:///docs/rows.html",
        issues=[issue],
        rule_severities={"raw_label_null_rate": ERROR},
        data_docs_dir=str(tmp_path / "site"),
    )
    return {**report.to_summary(), "source_uri": str(tmp_path / "reviews.jsonl")}


@pytest.mark.parametrize("fail_on_error", [True, False])
def test_a_report_from_the_prepare_job_is_decided_on_without_a_second_validation(
    calls, tmp_path, fail_on_error, monkeypatch
):
    from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator

    monkeypatch.setattr(PySparkOperator, "execute_callable", lambda self: pytest.fail("a Spark session"))
    report = _job_report(tmp_path)
    task = SparkQualityGateOperator(
        task_id="validate_data",
        source_uri=str(tmp_path / "reviews.jsonl"),
        gx_root=str(tmp_path / "gx"),
        fail_on_error=fail_on_error,
        quality_summary=report,
        source={"label_column": "stars"},
    )
    context = {"params": {"label_column": "stars"}, "run_id": "manual__1"}
    if fail_on_error:
        with pytest.raises(AirflowFailException) as error:
            task.execute(context)
        assert "Data quality gate failed: 1 of 26 expectations not met" in str(error.value)
        assert FAILED_LINE in str(error.value)
    else:
        summary = task.execute(context)
        # The report as the job wrote it, so XCom, links and MLflow see what a validation here gives.
        assert summary == report
    assert calls == []  # no validation of its own


def test_a_quality_summary_that_is_not_a_report_fails_with_what_to_pass(calls, tmp_path):
    task = SparkQualityGateOperator(
        task_id="validate_data", source_uri=str(tmp_path / "reviews.jsonl"), quality_summary={"rows": 3}
    )
    with pytest.raises(AirflowFailException, match="quality_summary is not a quality report .*KeyError"):
        task.execute({"params": {}, "run_id": "manual__1"})
    assert calls == []


def test_a_report_rendered_as_text_is_read_back_and_none_validates_here(calls, tmp_path, monkeypatch):
    """A DAG that does not render native objects passes the report as its repr, and None as "None"."""
    from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator

    sessions: list[str] = []
    monkeypatch.setattr(PySparkOperator, "execute_callable", lambda self: sessions.append(self.task_id))
    report = _job_report(tmp_path)
    context = {"params": {"label_column": "stars"}, "run_id": "manual__1"}

    def task(rendered: str) -> SparkQualityGateOperator:
        return SparkQualityGateOperator(
            task_id="validate_data",
            source_uri=str(tmp_path / "reviews.jsonl"),
            fail_on_error=False,
            quality_summary=rendered,
            source={"label_column": "stars"},
        )

    assert task(repr(report)).execute(context) == report and sessions == []
    task("None").execute(context)
    assert sessions == ["validate_data"]  # no report: the gate runs in a session of its own
