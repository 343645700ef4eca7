"""What the drift monitor's tests compare: a champion's training split (the generator's helpdesk
tickets, published as the pipeline publishes a dataset) with its test-split scores, and traffic
written into the feedback table as batch inference leaves it."""

from __future__ import annotations

import csv
import json
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np

MODEL = "support-intent"
WHEN = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
PARAPHRASES = Path(__file__).parents[1] / "benchmarks" / "data" / "helpdesk_paraphrases.csv"


def helpdesk_tickets(n_rows: int, seed: int) -> list[dict]:
    from sparktune_dev.demo_data import generate_helpdesk_tickets

    return generate_helpdesk_tickets(max(n_rows, 12), seed=seed).to_pylist()[:n_rows]


def publish_champion(root: Path, rows: int = 1200) -> dict:
    """The training split under ``root/dataset`` and the test-split scores ``root/predictions.csv``."""
    import datasets
    from sparktune.data.published_dataset import MARKER

    tickets = helpdesk_tickets(rows, seed=7)
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
    (dataset_uri / MARKER).write_text(json.dumps({"rows": {"train": rows}}))
    predictions = root / "predictions.csv"
    with open(predictions, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["example_id", "label", "prediction", "score"])
        for i, score in enumerate(np.random.default_rng(0).beta(20, 1, 300)):
            writer.writerow([i, names[i % len(names)], names[i % len(names)], repr(float(score))])
    return {"dataset_uri": str(dataset_uri), "predictions": str(predictions), "labels": names}


def score_into_feedback(
    spark, feedback: str, texts: list[str], predictions: list[str], scores: list[float], when: datetime = WHEN
) -> None:
    """The texts as batch inference leaves them in the feedback table, scored by the champion."""
    from sparktune.serve.feedback import write_review_rows

    rows = [
        (f"t{i}", p, float(s), MODEL, "3", "champion", "fp", when)
        for i, (p, s) in enumerate(zip(predictions, scores, strict=True))
    ]
    scored = spark.createDataFrame(
        rows,
        "id string, prediction string, score double, model_name string, model_version string, "
        "model_alias string, data_fingerprint string, scored_at timestamp",
    )
    source = spark.createDataFrame([(f"t{i}", t) for i, t in enumerate(texts)], "id string, text string")
    write_review_rows(spark, scored, source, feedback, date(when.year, when.month, when.day))


def unshifted_traffic(spark, feedback: str, rows: int = 300) -> None:
    """New tickets from the same source, labelled as the training data is, confident as on the test split."""
    incoming = helpdesk_tickets(rows, seed=11)
    scores = list(np.random.default_rng(1).beta(20, 1, len(incoming)))
    score_into_feedback(
        spark, feedback, [t["body"] for t in incoming], [t["category"] for t in incoming], scores
    )


def shifted_traffic(spark, feedback: str, labels: list[str]) -> list[str]:
    """Texts in other words (the hand-written paraphrases), nearly all predicted as one label, with
    far less confidence; the texts."""
    with open(PARAPHRASES, encoding="utf-8") as f:
        texts = [row["body"] for row in csv.DictReader(f)]
    predictions = [labels[0] if i % 10 else labels[1] for i in range(len(texts))]
    scores = list(np.random.default_rng(2).uniform(0.2, 0.6, len(texts)))
    score_into_feedback(spark, feedback, texts, predictions, scores)
    return texts
