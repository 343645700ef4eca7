"""The drift monitor on a real local Spark and Evidently: traffic like the training data reports no
drift, traffic in other words with another label mix and lower confidence reports drift and queues
its texts for review, and a window with too few texts says so instead of comparing."""

from __future__ import annotations

import csv
import json
from datetime import timedelta
from pathlib import Path

import pytest
from sparktune.serve.drift import DRIFT_ORIGIN, LATEST_SUMMARY_NAME, DriftThresholds, monitor_champion

try:
    from tests import drift_data
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    import drift_data

pytestmark = pytest.mark.spark

MODEL, WHEN = drift_data.MODEL, drift_data.WHEN


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    return drift_data.publish_champion(tmp_path_factory.mktemp("champion"))


def _monitor(spark, champion, tmp_path, **overrides):
    kwargs = dict(
        model_name=MODEL,
        model_version="3",
        dataset_uri=champion["dataset_uri"],
        champion_predictions_csv=champion["predictions"],
        feedback_uri=str(tmp_path / "feedback"),
        captures_uri=None,
        start=WHEN - timedelta(hours=24),
        end=WHEN + timedelta(hours=1),
        output_uri=str(tmp_path / "monitoring" / MODEL / "run"),
        latest_uri=str(tmp_path / "monitoring" / MODEL / LATEST_SUMMARY_NAME),
        min_texts=100,
    )
    kwargs.update(overrides)
    return monitor_champion(spark, **kwargs)


def test_traffic_like_the_training_data_reports_no_drift(spark, champion, tmp_path):
    drift_data.unshifted_traffic(spark, str(tmp_path / "feedback"))
    result = _monitor(spark, champion, tmp_path)
    assert result.status == "no_drift", result.message
    assert result.texts == 300
    assert [c.name for c in result.checks] == ["texts", "label_mix", "scores"]
    assert all(c.value is not None and not c.drifted for c in result.checks), result.checks
    assert result.review_csv_uri is None
    report = Path(result.report_uri).read_text()
    assert "Absolute text content drift" in report and "Jensen-Shannon distance" in report
    summary = json.loads(Path(result.summary_uri).read_text())
    assert summary["status"] == "no_drift" and summary["report_uri"] == result.report_uri
    latest = json.loads((tmp_path / "monitoring" / MODEL / LATEST_SUMMARY_NAME).read_text())
    assert latest == summary


def test_shifted_traffic_reports_drift_and_queues_the_drifted_texts(spark, champion, tmp_path):
    texts = drift_data.shifted_traffic(spark, str(tmp_path / "feedback"), champion["labels"])
    result = _monitor(spark, champion, tmp_path, review_size=20)
    assert result.status == "drift", result.message
    assert {c.name for c in result.drifted_checks} == {"texts", "label_mix", "scores"}, result.checks
    assert result.message.startswith(f"Drift in {len(texts)} texts scored by {MODEL}")
    with open(result.review_csv_uri, encoding="utf-8-sig", newline="") as f:
        queued = list(csv.DictReader(f))
    assert len(queued) == result.drifted_texts == 20
    assert {row["origin"] for row in queued} == {DRIFT_ORIGIN}
    assert {row["text"] for row in queued} <= set(texts)
    assert all(row["label"] == "" for row in queued)


def test_too_little_traffic_says_how_much_there_is_and_how_much_is_needed(spark, champion, tmp_path):
    incoming = drift_data.helpdesk_tickets(5, seed=11)
    drift_data.score_into_feedback(
        spark, str(tmp_path / "feedback"), [t["body"] for t in incoming], ["x"] * 5, [0.9] * 5
    )
    result = _monitor(spark, champion, tmp_path)
    assert result.status == "too_little_traffic"
    assert result.message.startswith(f"5 texts scored by {MODEL} since 2026-11-19T09:30:00+00:00; need 100")
    assert result.checks == [] and result.report_uri is None
    assert json.loads(Path(result.summary_uri).read_text())["status"] == "too_little_traffic"


def test_texts_outside_the_window_or_of_another_model_are_not_compared(spark, champion, tmp_path):
    drift_data.unshifted_traffic(spark, str(tmp_path / "feedback"), rows=150)
    later = _monitor(spark, champion, tmp_path, start=WHEN + timedelta(minutes=1))
    assert later.status == "too_little_traffic" and later.texts == 0
    other = _monitor(spark, champion, tmp_path, model_name="another-model")
    assert other.status == "too_little_traffic" and other.texts == 0


def test_thresholds_decide_what_counts_as_drift(spark, champion, tmp_path):
    drift_data.unshifted_traffic(spark, str(tmp_path / "feedback"))
    # A label-mix threshold of 0 makes any difference in the mix drift; the others stay off.
    strict = _monitor(
        spark, champion, tmp_path, thresholds=DriftThresholds(text=0.99, label_mix=0.0, score=0.0)
    )
    assert [c.name for c in strict.drifted_checks] == ["label_mix"]


def test_a_report_is_read_back_only_from_the_models_own_folders(spark, champion, tmp_path):
    from sparktune.serve.drift import latest_summary, read_report

    drift_data.unshifted_traffic(spark, str(tmp_path / "feedback"), rows=150)
    result = _monitor(spark, champion, tmp_path)
    root = str(tmp_path / "monitoring")
    assert latest_summary(root, MODEL)["report_uri"] == result.report_uri
    assert read_report(root, MODEL) == read_report(root, MODEL, "run") == Path(result.report_uri).read_text()
    for outside in ("..", ".", "run/../run", "../support-intent/run"):
        assert read_report(root, MODEL, outside) is None
    assert read_report(root, "never-monitored") is None and latest_summary(root, "never-monitored") is None


def test_a_streaming_champion_is_compared_with_its_prepared_parquet(spark, champion, tmp_path):
    """dataset_mode=streaming trains on the prepared Parquet (split=train/ under it), not a dataset."""
    import datasets

    train = datasets.load_from_disk(champion["dataset_uri"])["train"]
    names = train.features["label"].names
    prepared = tmp_path / "prepared"
    spark.createDataFrame(
        [(t, names[i], "train") for t, i in zip(train["text"], train["label"], strict=True)],
        "text string, label string, split string",
    ).write.partitionBy("split").parquet(str(prepared))
    drift_data.unshifted_traffic(spark, str(tmp_path / "feedback"))
    result = _monitor(spark, champion, tmp_path, dataset_uri=str(prepared))
    assert result.status == "no_drift", result.message
    assert result.reference_rows == train.num_rows


def test_a_training_split_that_is_gone_says_how_to_fix_it(tmp_path):
    from sparktune.serve.drift import DriftError, reference_frame

    with pytest.raises(DriftError, match="cannot be read from .*run llm_finetune again"):
        reference_frame(str(tmp_path / "deleted"), champion_predictions_csv=None, max_rows=10)
