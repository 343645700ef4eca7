"""The review queue on a real local Spark: the training rows whose label is likely wrong, then the
scored texts the model doubts most, one row per text, without the corrected ones, as one CSV and
one Parquet file; a filled queue recorded back, its label issues relabelling the source."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from sparktune.serve.capture import CaptureWriter
from sparktune.serve.feedback import FeedbackError, merge_feedback, record_corrections, write_review_rows
from sparktune.serve.review_queue import (
    CSV_NAME,
    PARQUET_NAME,
    QUEUE_COLUMNS,
    LabelIssueSource,
    build_review_queue,
)

try:
    from tests.unit import planted_labels
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import planted_labels

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


def _copy(tables: dict[str, Path], tmp_path: Path) -> dict[str, str]:
    """The tables, written by Spark once per module, copied for one test: a test that records
    corrections changes only its own copy."""
    for name, folder in tables.items():
        shutil.copytree(folder, tmp_path / name)
    return {name: str(tmp_path / name) for name in tables}


@pytest.fixture(scope="module")
def _tables_once(spark, tmp_path_factory) -> dict[str, Path]:
    """Scored rows of model m (and one of another model) from both origins, one text corrected."""
    tmp_path = tmp_path_factory.mktemp("review-tables")
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
    return {"feedback": Path(feedback), "serving_captures": Path(captures)}


@pytest.fixture
def tables(tmp_path, _tables_once):
    copied = _copy(_tables_once, tmp_path)
    return copied["feedback"], copied["serving_captures"]


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
            "given_label": "",
            "label_quality": "",
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


# --- label issues: the training rows whose label is likely wrong lead the queue -------------------


@pytest.fixture(scope="module")
def training_source(tmp_path_factory):
    """A training source with wrong labels planted: (rows, {id: true label}, where it is)."""
    rows = planted_labels.keyword_rows(300, seed=1)
    truth = planted_labels.flip(rows, 0.05, seed=1)  # 15 rows given another label
    path = tmp_path_factory.mktemp("training") / "training.jsonl"
    path.write_text(
        "".join(
            json.dumps({"message": r["text"], "intent_label": r["label"], "ticket": r["id"]}) + "\n"
            for r in rows
        )
    )
    source = LabelIssueSource(str(path), "json", "message", "intent_label", "ticket")
    return SimpleNamespace(rows=rows, truth=truth, source=source, uri=str(path))


@pytest.fixture(scope="module")
def _training_once(spark, tmp_path_factory, training_source):
    """The training source; the champion scored every wrongly labelled text (sure of the label it
    learned) and three others (unsure); one wrongly labelled text is corrected."""
    tmp_path = tmp_path_factory.mktemp("review-training")
    rows, truth = training_source.rows, training_source.truth
    flipped = [r for r in rows if r["id"] in truth]
    others = [r for r in rows if r["id"] not in truth][:3]
    feedback = str(tmp_path / "feedback")
    scored = [(f"s{i}", r["text"], r["label"], 0.95, "m") for i, r in enumerate(flipped)]
    scored += [(f"o{i}", r["text"], r["label"], 0.3 + i / 10, "m") for i, r in enumerate(others)]
    _scored(spark, feedback, scored)
    corrected = flipped[0]
    record_corrections(
        spark,
        _write_csv(tmp_path / "earlier.csv", [{"id": "s0", "label": truth[corrected["id"]]}]),
        feedback,
        "earlier",
        corrected_at=WHEN,
    )
    return SimpleNamespace(**vars(training_source), corrected=corrected, feedback=Path(feedback))


@pytest.fixture
def training(tmp_path, _training_once):
    feedback = _copy({"feedback": _training_once.feedback}, tmp_path)["feedback"]
    return SimpleNamespace(**{**vars(_training_once), "feedback": feedback})


def _key(text: str) -> str:
    return " ".join(text.split()).lower()


def _queue(spark, tmp_path, training, *, size: int):
    """The queue of model m's scored rows, led by 6 label issues of the training source."""
    return build_review_queue(
        spark,
        feedback_uri=training.feedback,
        captures_uri=None,
        model_name="m",
        size=size,
        output_uri=str(tmp_path / "queue"),
        label_issue_source=training.source,
        label_issues=6,
    )


def test_label_issues_come_first_then_the_least_confident_scored_rows_each_text_once(
    spark, tmp_path, training
):
    result = _queue(spark, tmp_path, training, size=20)
    # 14 wrong labels left to find (one is corrected); 6 asked for.
    assert (result.label_issues, result.label_issue_source_rows, result.label_issue_sampled) == (
        6,
        300,
        False,
    )
    assert result.label_issues_found >= 6
    rows = pq.read_table(result.parquet_uri).to_pylist()
    issues, scored = rows[:6], rows[6:]
    assert [r["origin"] for r in issues] == ["label_issue"] * 6
    assert {r["origin"] for r in scored} == {"batch"}
    # The planted ones, likeliest wrong first, the true label suggested with its probability.
    assert all(r["id"] in training.truth for r in issues)
    assert [r["label_quality"] for r in issues] == sorted(r["label_quality"] for r in issues)
    by_id = {r["id"]: r for r in training.rows}
    for r in issues:
        assert (r["given_label"], r["text"]) == (by_id[r["id"]]["label"], by_id[r["id"]]["text"])
        assert r["prediction"] == training.truth[r["id"]] != r["given_label"]
        assert 0 <= r["label_quality"] < 0.5 < r["score"] <= 1
        assert r["model_version"] is None and r["scored_at"] is None and r["label"] is None
    # Then the scored rows as before, without the label-issue columns; the unsure ones first.
    assert [r["score"] for r in scored[:3]] == [0.3, 0.4, 0.5]
    assert all(r["given_label"] is None and r["label_quality"] is None for r in scored)
    # A text once: a scored text that leads as a label issue is not queued again; the corrected
    # text is in neither part.
    texts = [_key(r["text"]) for r in rows]
    assert len(texts) == len(set(texts)) == 6 + 3 + 14 - 6
    assert _key(training.corrected["text"]) not in texts
    assert result.candidates == 14 + 3 - 6 + 1 and result.already_corrected == 1

    written = _read_csv(result.csv_uri)
    assert list(written[0]) == list(QUEUE_COLUMNS)
    assert written[0]["given_label"] == issues[0]["given_label"]
    assert float(written[0]["label_quality"]) == issues[0]["label_quality"]
    assert written[6]["given_label"] == written[6]["label_quality"] == written[6]["label"] == ""


def test_filled_label_issues_are_recorded_and_relabel_their_source_rows_when_merged(
    spark, tmp_path, training
):
    queue = _queue(spark, tmp_path, training, size=5)
    rows = _read_csv(queue.csv_uri)
    # The reviewer accepts the suggested label of each label issue and leaves the scored rows blank.
    for row in rows:
        row["label"] = row["prediction"] if row["origin"] == "label_issue" else ""
    fixed = {row["text"]: row["label"] for row in rows if row["label"]}
    assert len(fixed) == 6
    recorded = record_corrections(
        spark,
        _write_csv(tmp_path / "filled.csv", rows),
        training.feedback,
        "q1",
        known_labels=list(planted_labels.LABELS),
        corrected_at=WHEN,
    )
    assert (recorded.rows, recorded.not_reviewed) == (6, 5)

    merged = merge_feedback(
        spark,
        spark.read.json(training.uri),
        source_uri=training.uri,
        source_format="json",
        feedback_uri=training.feedback,
        versions_root=str(tmp_path / "sources"),
        text_column="message",
        label_column="intent_label",
        id_column="ticket",
    )
    # The six accepted suggestions and the earlier correction, each relabelling its one source row.
    assert (merged.corrections, merged.added_rows, merged.labels_changed) == (7, 0, 7)
    labels = {r["message"]: r["intent_label"] for r in spark.read.parquet(merged.source_uri).collect()}
    assert len(labels) == 300
    assert all(labels[text] == label for text, label in fixed.items())
    by_text = {r["text"]: r["id"] for r in training.rows}
    assert all(labels[text] == training.truth[by_text[text]] for text in fixed)


def test_a_queue_of_label_issues_alone_when_nothing_is_scored(spark, tmp_path, training_source):
    empty = str(tmp_path / "no-feedback")
    result = build_review_queue(
        spark,
        feedback_uri=empty,
        captures_uri=str(tmp_path / "no-captures"),
        model_name="m",
        size=10,
        output_uri=str(tmp_path / "queue"),
        label_issue_source=training_source.source,
        label_issues=3,
    )
    assert (result.rows, result.label_issues, result.candidates) == (3, 3, 0)
    assert {r["origin"] for r in _read_csv(result.csv_uri)} == {"label_issue"}
    # label_issues=0 does not read the source (it may be missing): nothing scored is still refused.
    with pytest.raises(FeedbackError, match="Nothing to review"):
        build_review_queue(
            spark,
            feedback_uri=empty,
            captures_uri=None,
            model_name="m",
            size=10,
            output_uri=str(tmp_path / "queue"),
            label_issue_source=LabelIssueSource(str(tmp_path / "missing.jsonl")),
            label_issues=0,
        )


def test_a_label_issue_whose_id_a_scored_row_of_another_text_uses_is_queued_by_its_content_key(spark):
    from sparktune.serve.label_issues import LabelIssue
    from sparktune.serve.review_queue import _unclaimed_ids

    def issue(id_: str, text: str) -> LabelIssue:
        key = hashlib.sha256(_key(text).encode()).hexdigest()
        return LabelIssue(id_, text, "billing", "shipping", 0.9, 0.05, key)

    issues = [issue("t1", "where is my parcel"), issue("t2", "my parcel is late")]
    scored = spark.createDataFrame(
        [("t1", "reset my password"), ("t2", "  My parcel is LATE ")], "id string, text string"
    )
    kept = _unclaimed_ids(spark, issues, scored)
    # t1 names another text among the scored rows: a correction by that id would land on it.
    assert [i.id for i in kept] == [issues[0].key, "t2"]
