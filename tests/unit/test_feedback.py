"""The feedback table on a real local Spark: review rows, recorded corrections, and the merge into a
new training data version (deduplicated against every split of the source)."""

from __future__ import annotations

import csv
import hashlib
import json
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from sparktune.data.data_version import read_version
from sparktune.serve.feedback import (
    CORRECTIONS_DIR,
    FeedbackError,
    corrections_present,
    merge_feedback,
    record_corrections,
    write_review_rows,
)

WHEN = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _scored(spark, feedback: str, day: date, rows: list[tuple[str, str, str]]) -> None:
    """Review rows as batch inference leaves them: (id, text, prediction)."""
    predictions = spark.createDataFrame(
        [(i, p, 0.9, "m", "3", "champion", "fp", WHEN) for i, _, p in rows],
        "id string, prediction string, score double, model_name string, model_version string, "
        "model_alias string, data_fingerprint string, scored_at timestamp",
    )
    texts = spark.createDataFrame([(i, t) for i, t, _ in rows], "id string, text string")
    write_review_rows(spark, predictions, texts, feedback, day)


def test_review_rows_carry_the_text_and_a_rerun_replaces_its_day(spark, tmp_path):
    feedback = str(tmp_path / "feedback")
    rows = [("a", "where is my parcel", "shipping"), ("b", "refund me please", "refund")]
    _scored(spark, feedback, date(2026, 11, 20), rows)
    _scored(spark, feedback, date(2026, 11, 20), rows)  # the same run again
    _scored(spark, feedback, date(2026, 11, 21), rows[:1])  # another day stays beside it
    written = spark.read.parquet(f"{feedback}/predictions")
    assert written.count() == 3
    day = {r["id"]: r["text"] for r in written.where("date = '2026-11-20'").collect()}
    assert day == {"a": "where is my parcel", "b": "refund me please"}


def test_corrections_take_the_scored_text_and_the_latest_label_per_id(spark, tmp_path):
    feedback = str(tmp_path / "feedback")
    _scored(spark, feedback, date(2026, 11, 20), [("a", "where is my parcel", "refund")])
    corrections = _jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "a", "label": "billing", "corrected_at": "2026-11-20T10:00:00"},
            {"id": "a", "label": "shipping", "corrected_at": "2026-11-20T11:00:00"},
            {"id": "z", "label": "refund", "text": "I want my money back"},
        ],
    )
    result = record_corrections(
        spark,
        corrections,
        feedback,
        "record_corrections__run1",
        known_labels=["shipping", "refund", "billing"],
        corrected_at=WHEN,
    )
    assert result.rows == 2 and result.labels == {"shipping": 1, "refund": 1}
    batch = {r["id"]: r for r in spark.read.parquet(result.batch_uri).collect()}
    assert batch["a"]["text"] == "where is my parcel" and batch["a"]["label"] == "shipping"
    assert batch["a"]["prediction"] == "refund" and batch["a"]["model_version"] == "3"
    assert batch["z"]["text"] == "I want my money back"
    # The same run again replaces its batch instead of adding one.
    record_corrections(spark, corrections, feedback, "record_corrections__run1", corrected_at=WHEN)
    assert spark.read.parquet(f"{feedback}/{CORRECTIONS_DIR}").count() == 2


def test_a_served_answer_captured_by_the_server_can_be_corrected_by_its_id(spark, tmp_path):
    """The serving endpoint's capture table is a source of scored rows: a reviewer corrects an
    answer by ``<request_id>:<row>`` and the text comes from the capture."""
    from sparktune.serve.capture import CaptureWriter
    from sparktune.serve.feedback import captured_row_id

    feedback, captures = str(tmp_path / "feedback"), str(tmp_path / "serving_captures")
    _scored(spark, feedback, date(2026, 11, 20), [("a", "where is my parcel", "refund")])
    writer = CaptureWriter(captures)
    writer.add(
        "req-1", ["charged twice", "cannot log in"], ["shipping", "login"], [0.6, 0.9], "m", "4", 12.0, WHEN
    )
    writer.flush()
    corrections = _jsonl(
        tmp_path / "c.jsonl",
        [{"id": captured_row_id("req-1", 0), "label": "billing"}, {"id": "a", "label": "shipping"}],
    )
    result = record_corrections(spark, corrections, feedback, "b1", corrected_at=WHEN, captures_uri=captures)
    assert result.rows == 2
    rows = {r["id"]: r.asDict() for r in spark.read.parquet(result.batch_uri).collect()}
    assert rows["req-1:0"]["text"] == "charged twice" and rows["req-1:0"]["label"] == "billing"
    assert rows["req-1:0"]["prediction"] == "shipping" and rows["req-1:0"]["model_version"] == "4"
    assert rows["a"]["text"] == "where is my parcel"
    # Without the capture table the served id is unknown, and the message names both places looked in.
    with pytest.raises(FeedbackError, match="never scored") as err:
        record_corrections(
            spark, corrections, feedback, "b2", corrected_at=WHEN, captures_uri=str(tmp_path / "none")
        )
    assert "req-1:0" in str(err.value) and "answered by the server" in str(err.value)


def test_bad_corrections_are_refused_with_every_problem(spark, tmp_path):
    feedback = str(tmp_path / "feedback")
    _scored(spark, feedback, date(2026, 11, 20), [("a", "where is my parcel", "refund")])
    bad = _jsonl(
        tmp_path / "bad.jsonl",
        [
            {"id": "a", "label": "teleportation"},
            {"id": "never-scored", "label": "refund"},
            {"id": " ", "label": "refund"},
            {"id": "b", "label": " "},  # not reviewed: skipped, never an error
        ],
    )
    with pytest.raises(FeedbackError) as caught:
        record_corrections(spark, bad, feedback, "b1", known_labels=["shipping", "refund"], corrected_at=WHEN)
    message = str(caught.value)
    assert "1 rows have a label the model does not know (known: ['refund', 'shipping'])" in message
    assert "'a': 'teleportation'" in message
    assert "never-scored" in message and "add a 'text' column" in message
    assert "1 rows have a label but a blank id" in message
    assert "'b'" not in message
    assert not (Path(feedback) / CORRECTIONS_DIR).exists()

    no_label = _jsonl(tmp_path / "nolabel.jsonl", [{"id": "a", "intent": "refund"}])
    with pytest.raises(FeedbackError, match="no column 'label'"):
        record_corrections(spark, no_label, feedback, "b2", corrected_at=WHEN)


SOURCE = [
    {"message": "Where is my parcel?", "intent_label": "shipping", "quality_score": 0.9, "channel": "web"},
    {"message": "Refund me please", "intent_label": "refund", "quality_score": 0.95, "channel": "mail"},
]


def _merge(spark, tmp_path, source_path: str):
    source = spark.read.json(source_path)
    return merge_feedback(
        spark,
        source,
        source_uri=source_path,
        source_format="json",
        feedback_uri=str(tmp_path / "feedback"),
        versions_root=str(tmp_path / "sources"),
        text_column="message",
        label_column="intent_label",
        quality_column="quality_score",
    )


def test_merge_relabels_texts_the_source_holds_and_adds_the_others_as_a_new_version(spark, tmp_path):
    source_path = _jsonl(tmp_path / "source.jsonl", SOURCE)
    assert _merge(spark, tmp_path, source_path).source_uri == source_path  # no feedback yet: unchanged
    corrections = _jsonl(
        tmp_path / "c.jsonl",
        [
            # Already in the source (whatever its split, test included) with another label: relabelled.
            {"id": "x1", "label": "billing", "text": "  where IS my   parcel?", "corrected_by": "ana"},
            {
                "id": "x2",
                "label": "billing",
                "text": "I was charged twice",
                "corrected_at": "2026-11-20T08:00:00",
            },
            {
                "id": "x3",
                "label": "refund",
                "text": "i was charged  twice",
                "corrected_at": "2026-11-20T09:00:00",
            },
        ],
    )
    assert not corrections_present(str(tmp_path / "feedback"))  # the operator then starts no Spark
    record_corrections(spark, corrections, str(tmp_path / "feedback"), "b1", corrected_at=WHEN)
    assert corrections_present(str(tmp_path / "feedback"))

    merged = _merge(spark, tmp_path, source_path)
    assert (merged.corrections, merged.already_in_source, merged.added_rows) == (2, 1, 1)
    assert merged.labels_changed == 1
    assert merged.source_format == "parquet" and merged.source_uri.startswith(str(tmp_path / "sources"))
    rows = {r["message"]: r for r in spark.read.parquet(merged.source_uri).collect()}
    assert len(rows) == 3
    # The source's row keeps its text (hence its example_id and split) and takes the corrected label.
    parcel = rows["Where is my parcel?"]
    assert (
        parcel["intent_label"] == "billing" and parcel["quality_score"] == 1.0 and parcel["channel"] == "web"
    )
    assert rows["Refund me please"]["intent_label"] == "refund"  # not corrected: as it was
    [added] = [r for text, r in rows.items() if text not in {s["message"] for s in SOURCE}]
    # The latest correction of one text wins; a person checked it, so its quality is 1.0.
    assert added["intent_label"] == "refund" and added["quality_score"] == 1.0 and added["channel"] is None
    # The version lists the relabelled rows, and says what it holds.
    with open(merged.overrides_uri, newline="") as listed:
        [override] = list(csv.DictReader(listed))
    assert override == {
        "text_key": hashlib.sha256(b"where is my parcel?").hexdigest(),
        "text": "  where IS my   parcel?",
        "old_label": "shipping",
        "new_label": "billing",
        "corrected_by": "ana",
        "corrected_at": WHEN.replace(tzinfo=None).isoformat(),
        "rows": "1",
    }
    record = read_version(spark, merged.source_uri)
    assert (record["labels_changed"], record["added_rows"], record["overrides_uri"]) == (
        1,
        1,
        merged.overrides_uri,
    )
    assert read_version(spark, source_path) is None
    # Same source, same corrections: the same version, reused, so the data fingerprint stays.
    again = _merge(spark, tmp_path, source_path)
    assert again.source_uri == merged.source_uri and again.version == merged.version
    # The source rewritten: a new version, never the stale one.
    _jsonl(tmp_path / "source.jsonl", [*SOURCE, {"message": "A third text", "intent_label": "refund"}])
    assert _merge(spark, tmp_path, source_path).version != merged.version


def test_corrections_and_a_merged_version_are_as_many_files_as_their_input_not_one_per_shuffle_partition(
    spark, tmp_path
):
    # The jobs run with Spark's default of 200 shuffle partitions (the session fixture has 4), and
    # adaptive execution does not coalesce a persisted plan: the corrections batch was 200 tasks per
    # stage, and the data version the next run prepares from was the source plus 200 files. Any count
    # above the input's one file shows it: 16 here (200 tasks a stage cost 8 s more CPU on local[1]).
    spark.conf.set("spark.sql.shuffle.partitions", "16")
    try:
        source_path = _jsonl(tmp_path / "source.jsonl", SOURCE)
        corrections = _jsonl(
            tmp_path / "c.jsonl",
            [{"id": f"x{i}", "label": "refund", "text": f"new text number {i}"} for i in range(30)],
        )
        batch = record_corrections(spark, corrections, str(tmp_path / "feedback"), "b1", corrected_at=WHEN)
        merged = _merge(spark, tmp_path, source_path)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "4")
    assert batch.rows == 30 and merged.added_rows == 30
    assert len(list(Path(batch.batch_uri).glob("*.parquet"))) == 1  # one input file, one partition
    assert len(list(Path(merged.source_uri).glob("*.parquet"))) <= 2  # the source's file + the corrections'


def test_merge_with_corrections_that_agree_with_the_source_keeps_the_source(spark, tmp_path):
    source_path = _jsonl(tmp_path / "source.jsonl", SOURCE)
    known = _jsonl(tmp_path / "c.jsonl", [{"id": "x1", "label": "refund", "text": "Refund me please"}])
    record_corrections(spark, known, str(tmp_path / "feedback"), "b1", corrected_at=WHEN)
    result = _merge(spark, tmp_path, source_path)
    assert result.source_uri == source_path and result.added_rows == 0 and result.already_in_source == 1
    assert result.labels_changed == 0


def test_a_correction_settles_a_label_conflict_and_the_text_keeps_its_split(spark, tmp_path, tokenizer_path):
    from sparktune.core.params import parse_params
    from sparktune.data.prepare import prepare

    conflicting = [
        *SOURCE,
        {"message": "where is my parcel?  ", "intent_label": "billing", "quality_score": 0.9},
    ]
    source_path = _jsonl(tmp_path / "source.jsonl", conflicting)
    params = parse_params({"label_conflicts": "quarantine", "min_chars": 5})
    before = prepare(spark.read.json(source_path), params, tokenizer_path)
    assert before.label_conflicts["texts"] == 1 and before.rows.count() == 1
    splits_before = {r["example_id"]: r["split"] for r in before.rows.collect()}
    before.unpersist()

    fix = _jsonl(tmp_path / "c.jsonl", [{"id": "x1", "label": "shipping", "text": "Where is my parcel?"}])
    record_corrections(spark, fix, str(tmp_path / "feedback"), "b1", corrected_at=WHEN)
    merged = _merge(spark, tmp_path, source_path)
    assert (merged.labels_changed, merged.added_rows) == (1, 0)  # only the copy labelled otherwise
    after = prepare(spark.read.parquet(merged.source_uri), params, tokenizer_path)
    rows = {r["example_id"]: r for r in after.rows.collect()}
    assert after.label_conflicts["texts"] == 0
    # Both copies now agree: the text is trained on, under the content key it always had.
    assert rows[hashlib.sha256(b"where is my parcel?").hexdigest()]["label"] == "shipping"
    [(refund_id, refund_split)] = splits_before.items()
    assert rows[refund_id]["split"] == refund_split  # what was not corrected stays where it was
    after.unpersist()


def test_merge_matches_columns_as_spark_does_and_leaves_a_missing_one_to_prepare_data(spark, tmp_path):
    source_path = _jsonl(tmp_path / "source.jsonl", SOURCE)
    new = _jsonl(tmp_path / "c.jsonl", [{"id": "x1", "label": "billing", "text": "Charged twice"}])
    record_corrections(spark, new, str(tmp_path / "feedback"), "b1", corrected_at=WHEN)

    def merge(text_column: str, label_column: str):
        return merge_feedback(
            spark,
            spark.read.json(source_path),
            source_uri=source_path,
            source_format="json",
            feedback_uri=str(tmp_path / "feedback"),
            versions_root=str(tmp_path / "sources"),
            text_column=text_column,
            label_column=label_column,
        )

    assert merge("MESSAGE", "Intent_Label").added_rows == 1
    # prepare_data names the missing column and the ones there are; the merge does not pre-empt it.
    missing = merge("message", "category")
    assert missing.source_uri == source_path and missing.added_rows == 0
