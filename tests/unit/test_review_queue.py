"""The review queue on a real local Spark: the scored texts the model doubts most, one row per text,
without the corrected ones, as one CSV and one Parquet file; a filled queue recorded back."""

from __future__ import annotations

import csv
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sparktune.serve.capture import CaptureWriter
from sparktune.serve.feedback import FeedbackError, record_corrections, write_review_rows
from sparktune.serve.review_queue import CSV_NAME, PARQUET_NAME, QUEUE_COLUMNS, build_review_queue

pytestmark = pytest.mark.spark

WHEN = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
LABELS = ["shipping", "billing", "login", "cancel"]
# A text a spreadsheet must keep whole: a comma, doubled quotes and a newline inside one field.
AWKWARD = 'I was charged twice, "twice"!\nPlease help'


def _scored(spark, feedback: str, rows: list[tuple[str, str, str, float, str]]) -> None:
    """Review rows as batch inference leaves them: (id, text, prediction, score, model_name)."""
    predictions = spark.createDataFrame(
        [(i, p, s, m, "3", "champion", "fp", WHEN) for i, _, p, s, m in rows],
        "id string, prediction string, score double, model_name string, model_version string, "
        "model_alias string, data_fingerprint string, scored_at timestamp",
    )
    texts = spark.createDataFrame([(i, t) for i, t, *_ in rows], "id string, text string")
    write_review_rows(spark, predictions, texts, feedback, date(2026, 11, 20))


def _captured(captures: str, texts: list[str], predictions: list[str], scores: list[float]) -> None:
    writer = CaptureWriter(captures)
    writer.add("req-1", texts, predictions, scores, "m", "4", 12.0, WHEN + timedelta(hours=1))
    writer.flush()


def _read_csv(path: str) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


def _write_csv(path: Path, rows: list[dict[str, str]]) -> str:
    # As a spreadsheet saves "CSV UTF-8": with the byte order mark, every column kept.
    with open(path, "w", encoding="utf-8-sig", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


@pytest.fixture
def tables(spark, tmp_path):
    """Scored rows of model m (and one of another model) from both origins, one text corrected."""
    feedback, captures = str(tmp_path / "feedback"), str(tmp_path / "serving_captures")
    _scored(
        spark,
        feedback,
        [
            ("a", "Where is my parcel?", "shipping", 0.9, "m"),
            ("b", AWKWARD, "shipping", 0.35, "m"),
            ("c", "Reset my password", "login", 0.6, "m"),
            ("d", "Cancel my subscription", "billing", 0.2, "m"),  # corrected below: left out
            ("e", "Café order never arrived", "shipping", 0.5, "m"),
            ("g", "Where is the invoice", "billing", 0.5, "m"),  # ties with e: the id decides
            ("o", "another model's doubt", "billing", 0.01, "other"),
        ],
    )
    # The server answered "a" again an hour later, spelled differently: its latest scoring counts.
    _captured(captures, ["  where IS my   parcel? ", "cannot log in"], ["billing", "login"], [0.4, 0.45])
    record_corrections(
        spark,
        _write_csv(tmp_path / "earlier.csv", [{"id": "d", "label": "cancel"}]),
        feedback,
        "earlier",
        corrected_at=WHEN,
    )
    return feedback, captures


def test_the_queue_holds_the_least_confident_distinct_uncorrected_texts_in_one_csv_and_one_parquet(
    spark, tmp_path, tables
):
    feedback, captures = tables
    out = tmp_path / "queue"
    result = build_review_queue(
        spark, feedback_uri=feedback, captures_uri=captures, model_name="m", size=4, output_uri=str(out)
    )
    assert (result.csv_uri, result.parquet_uri) == (str(out / CSV_NAME), str(out / PARQUET_NAME))
    # a (twice), b, c, d, e, g and the served "cannot log in": 7 texts, d already corrected.
    assert (result.rows, result.candidates, result.already_corrected) == (4, 7, 1)
    # One file each, nothing else (no part files, no temporary files left behind).
    assert sorted(p.name for p in out.iterdir()) == [CSV_NAME, PARQUET_NAME]

    parquet = pq.read_table(result.parquet_uri)
    assert tuple(parquet.column_names) == QUEUE_COLUMNS
    rows = parquet.to_pylist()
    # Lowest score first; "a" by its latest scoring (the served one); e before g on a tie; size kept.
    assert [(r["id"], r["score"]) for r in rows] == [
        ("b", 0.35),
        ("req-1:0", 0.4),
        ("req-1:1", 0.45),
        ("e", 0.5),
    ]
    assert [r["origin"] for r in rows] == ["batch", "serving", "serving", "batch"]
    assert rows[1]["text"] == "  where IS my   parcel? " and rows[1]["model_version"] == "4"
    assert rows[0]["text"] == AWKWARD and rows[0]["scored_at"] == WHEN
    assert all(r["label"] is None for r in rows)

    # The CSV holds the same rows, the awkward text intact, an empty label column to fill in.
    written = _read_csv(result.csv_uri)
    assert list(written[0]) == list(QUEUE_COLUMNS)
    for in_csv, in_parquet in zip(written, rows, strict=True):
        assert in_csv == {
            **{c: str(in_parquet[c]) for c in ("id", "text", "prediction", "model_version", "origin")},
            "score": repr(in_parquet["score"]),
            "scored_at": in_parquet["scored_at"].isoformat(),
            "label": "",
        }

    # Every model when no name is given: the other model's row is the most doubtful of all.
    everyone = build_review_queue(
        spark, feedback_uri=feedback, captures_uri=captures, model_name="", size=2, output_uri=str(out)
    )
    assert [r["id"] for r in _read_csv(everyone.csv_uri)] == ["o", "b"] and everyone.candidates == 8


def test_nothing_scored_or_an_unknown_model_is_refused_with_the_fix(spark, tmp_path, tables):
    with pytest.raises(FeedbackError, match="Nothing to review") as caught:
        build_review_queue(
            spark,
            feedback_uri=str(tmp_path / "empty"),
            captures_uri=str(tmp_path / "none"),
            model_name="m",
            size=10,
            output_uri=str(tmp_path / "q"),
        )
    assert "make score" in str(caught.value) and "make serve" in str(caught.value)
    feedback, captures = tables
    with pytest.raises(FeedbackError, match=r"No scored row of model 'intent'.*\['m', 'other'\]"):
        build_review_queue(
            spark,
            feedback_uri=feedback,
            captures_uri=captures,
            model_name="intent",
            size=10,
            output_uri=str(tmp_path / "q"),
        )
    assert not (tmp_path / "q").exists()


def test_a_filled_queue_is_recorded_with_blank_rows_skipped_and_unknown_labels_listed(
    spark, tmp_path, tables
):
    feedback, captures = tables
    queue = build_review_queue(
        spark,
        feedback_uri=feedback,
        captures_uri=captures,
        model_name="m",
        size=5,
        output_uri=str(tmp_path / "queue"),
    )
    rows = _read_csv(queue.csv_uri)
    assert [r["id"] for r in rows] == ["b", "req-1:0", "req-1:1", "e", "g"]

    # Untouched, nothing was reviewed: an error that says to fill in the labels.
    with pytest.raises(FeedbackError, match="no row has a label.*fill in the 'label' column"):
        record_corrections(spark, queue.csv_uri, feedback, "q0", known_labels=LABELS, corrected_at=WHEN)

    # The reviewer labels three rows (one misspelt) and leaves two blank.
    filled = {"b": "billing", "req-1:0": "shipping", "req-1:1": "logn"}
    for row in rows:
        row["label"] = filled.get(row["id"], "")
    path = tmp_path / "filled.csv"
    with pytest.raises(FeedbackError) as caught:
        record_corrections(
            spark,
            _write_csv(path, rows),
            feedback,
            "q1",
            known_labels=LABELS,
            corrected_at=WHEN,
            captures_uri=captures,
        )
    message = str(caught.value)
    assert "1 rows have a label the model does not know" in message
    assert "'req-1:1': 'logn'" in message and f"known: {sorted(LABELS)}" in message
    assert "'b'" not in message  # only the refused rows are listed

    rows[2]["label"] = "login"
    result = record_corrections(
        spark,
        _write_csv(path, rows),
        feedback,
        "q1",
        known_labels=LABELS,
        corrected_at=WHEN,
        captures_uri=captures,
    )
    assert (result.rows, result.not_reviewed) == (3, 2)
    assert result.labels == {"billing": 1, "shipping": 1, "login": 1}
    batch = {r["id"]: r for r in spark.read.parquet(result.batch_uri).collect()}
    assert batch["b"]["text"] == AWKWARD and batch["b"]["prediction"] == "shipping"
    assert batch["req-1:0"]["label"] == "shipping"

    # The next queue leaves the reviewed texts out; the blank ones come back.
    again = build_review_queue(
        spark,
        feedback_uri=feedback,
        captures_uri=captures,
        model_name="m",
        size=5,
        output_uri=str(tmp_path / "queue"),
    )
    assert [r["id"] for r in _read_csv(again.csv_uri)] == ["e", "g", "c"]
    assert again.already_corrected == 4
