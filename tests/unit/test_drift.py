"""The drift monitor on a real local Spark and Evidently: traffic like the training data reports no
drift, traffic in other words with another label mix and lower confidence reports drift and queues
its texts for review, and a window with too few texts says so instead of comparing."""

from __future__ import annotations

import csv
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import datasets
import numpy as np
import pytest
from sparktune.data.published_dataset import MARKER
from sparktune.serve.drift import DRIFT_ORIGIN, LATEST_SUMMARY_NAME, DriftThresholds, monitor_champion
from sparktune.serve.feedback import write_review_rows
from sparktune_dev.demo_data import generate_helpdesk_tickets

pytestmark = pytest.mark.spark

MODEL = "support-intent"
WHEN = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
PARAPHRASES = Path(__file__).parents[2] / "benchmarks" / "data" / "helpdesk_paraphrases.csv"


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    """The champion's training split (the generator's helpdesk tickets, published as the pipeline
    publishes a dataset) and its scores on its test split, as its evaluation logs them."""
    root = tmp_path_factory.mktemp("champion")
    tickets = generate_helpdesk_tickets(1200, seed=7).to_pylist()
    names = sorted({t["category"] for t in tickets})
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)}
    )
    train = datasets.Dataset.from_dict(
        {"text": [t["body"] for t in tickets], "label": [names.index(t["category"]) for t in tickets]},
        features=features,
    )
    dataset_uri = root / "dataset"
    datasets.DatasetDict({"train": train}).save_to_disk(str(dataset_uri))
    (dataset_uri / MARKER).write_text(json.dumps({"rows": {"train": 1200}}))
    rng = np.random.default_rng(0)
    predictions = root / "predictions.csv"
    with open(predictions, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["example_id", "label", "prediction", "score"])
        for i, score in enumerate(rng.beta(20, 1, 300)):
            writer.writerow([i, names[i % len(names)], names[i % len(names)], repr(float(score))])
    return {"dataset_uri": str(dataset_uri), "predictions": str(predictions), "labels": names}


def _score(spark, feedback: str, texts: list[str], predictions: list[str], scores: list[float]) -> None:
    """The texts as batch inference leaves them in the feedback table, scored by the champion."""
    rows = [
        (f"t{i}", p, float(s), MODEL, "3", "champion", "fp", WHEN)
        for i, (p, s) in enumerate(zip(predictions, scores, strict=True))
    ]
    scored = spark.createDataFrame(
        rows,
        "id string, prediction string, score double, model_name string, model_version string, "
        "model_alias string, data_fingerprint string, scored_at timestamp",
    )
    source = spark.createDataFrame([(f"t{i}", t) for i, t in enumerate(texts)], "id string, text string")
    write_review_rows(spark, scored, source, feedback, date(2026, 11, 20))


def _monitor(spark, champion, tmp_path, **overrides):
    out = tmp_path / "monitoring" / MODEL / "run"
    kwargs = dict(
        model_name=MODEL,
        model_version="3",
        dataset_uri=champion["dataset_uri"],
        champion_predictions_csv=champion["predictions"],
        feedback_uri=str(tmp_path / "feedback"),
        captures_uri=None,
        start=WHEN - timedelta(hours=24),
        end=WHEN + timedelta(hours=1),
        output_uri=str(out),
        latest_uri=str(tmp_path / "monitoring" / MODEL / LATEST_SUMMARY_NAME),
        min_texts=100,
    )
    kwargs.update(overrides)
    return monitor_champion(spark, **kwargs)


def test_traffic_like_the_training_data_reports_no_drift(spark, champion, tmp_path):
    incoming = generate_helpdesk_tickets(300, seed=11).to_pylist()
    rng = np.random.default_rng(1)
    _score(
        spark,
        str(tmp_path / "feedback"),
        [t["body"] for t in incoming],
        [t["category"] for t in incoming],
        list(rng.beta(20, 1, len(incoming))),
    )
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
    with open(PARAPHRASES, encoding="utf-8") as f:
        paraphrases = [row["body"] for row in csv.DictReader(f)]
    # Texts in other words, nearly all predicted as one label, with far less confidence.
    labels = champion["labels"]
    predictions = [labels[0] if i % 10 else labels[1] for i in range(len(paraphrases))]
    scores = list(np.random.default_rng(2).uniform(0.2, 0.6, len(paraphrases)))
    _score(spark, str(tmp_path / "feedback"), paraphrases, predictions, scores)
    result = _monitor(spark, champion, tmp_path, review_size=20)
    assert result.status == "drift", result.message
    assert {c.name for c in result.drifted_checks} == {"texts", "label_mix", "scores"}, result.checks
    assert result.message.startswith(f"Drift in {len(paraphrases)} texts scored by {MODEL}")
    with open(result.review_csv_uri, encoding="utf-8-sig", newline="") as f:
        queued = list(csv.DictReader(f))
    assert len(queued) == result.drifted_texts == 20
    assert {row["origin"] for row in queued} == {DRIFT_ORIGIN}
    assert {row["text"] for row in queued} <= set(paraphrases)
    assert all(row["label"] == "" for row in queued)


def test_too_little_traffic_says_how_much_there_is_and_how_much_is_needed(spark, champion, tmp_path):
    incoming = generate_helpdesk_tickets(12, seed=11).to_pylist()[:5]
    _score(spark, str(tmp_path / "feedback"), [t["body"] for t in incoming], ["x"] * 5, [0.9] * 5)
    result = _monitor(spark, champion, tmp_path)
    assert result.status == "too_little_traffic"
    assert result.message.startswith(f"5 texts scored by {MODEL} since 2026-11-19T09:30:00+00:00; need 100")
    assert result.checks == [] and result.report_uri is None
    assert json.loads(Path(result.summary_uri).read_text())["status"] == "too_little_traffic"


def test_texts_outside_the_window_or_of_another_model_are_not_compared(spark, champion, tmp_path):
    incoming = generate_helpdesk_tickets(150, seed=11).to_pylist()
    _score(spark, str(tmp_path / "feedback"), [t["body"] for t in incoming], ["x"] * 150, [0.9] * 150)
    later = _monitor(spark, champion, tmp_path, start=WHEN + timedelta(minutes=1))
    assert later.status == "too_little_traffic" and later.texts == 0
    other = _monitor(spark, champion, tmp_path, model_name="another-model")
    assert other.status == "too_little_traffic" and other.texts == 0


def test_thresholds_decide_what_counts_as_drift(spark, champion, tmp_path):
    incoming = generate_helpdesk_tickets(300, seed=11).to_pylist()
    _score(
        spark,
        str(tmp_path / "feedback"),
        [t["body"] for t in incoming],
        [t["category"] for t in incoming],
        list(np.random.default_rng(1).beta(20, 1, len(incoming))),
    )
    # A label-mix threshold of 0 makes any difference in the mix drift; the others stay off.
    strict = _monitor(
        spark, champion, tmp_path, thresholds=DriftThresholds(text=0.99, label_mix=0.0, score=10.0)
    )
    assert [c.name for c in strict.drifted_checks] == ["label_mix"]
