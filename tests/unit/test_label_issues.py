"""The label-issue finder: wrong labels planted on purpose rank first; labels too small for the folds
lower the folds or are left out; a single label or no usable row is refused with the fix; a source
read with Spark keeps one row per text, leaves out blank and corrected ones and samples above its cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sparktune.serve.label_issues import LabelIssueError, rank_label_issues, source_label_issues

try:
    from tests.unit import planted_labels
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import planted_labels


def _columns(rows: list[dict[str, str]]) -> tuple[list[str], list[str], list[str]]:
    return [r["text"] for r in rows], [r["label"] for r in rows], [r["id"] for r in rows]


def test_planted_wrong_labels_rank_first_with_their_true_label_suggested():
    rows = planted_labels.keyword_rows(600)
    truth = planted_labels.flip(rows, 0.03)  # 18 rows, each given another label
    found = rank_label_issues(*_columns(rows))
    assert (found.rows, found.folds, found.labels, found.left_out) == (600, 5, 4, {})

    top = found.issues[: 2 * len(truth)]
    hits = [issue for issue in top if issue.id in truth]
    assert len(hits) / len(truth) >= 0.8  # recall of the planted flips in the first 2 x flips rows
    assert len(hits) / len(top) >= 0.8  # and what is flagged is mostly them
    assert all(issue.suggested_label == truth[issue.id] for issue in hits)
    by_id = {r["id"]: r for r in rows}
    for issue in hits:
        assert issue.given_label == by_id[issue.id]["label"] and issue.text == by_id[issue.id]["text"]
        assert 0.0 <= issue.label_quality < issue.suggested_probability <= 1.0
    # Lowest quality first, ties by id: the same rows rank the same way every time.
    assert [(i.label_quality, i.id) for i in found.issues] == sorted(
        (i.label_quality, i.id) for i in found.issues
    )
    assert rank_label_issues(*_columns(rows)).issues == found.issues


def test_a_label_smaller_than_the_folds_lowers_them_and_one_smaller_still_is_left_out(caplog):
    rows = planted_labels.keyword_rows(80)  # 20 rows of each label
    small = [r for r in rows if r["label"] == "cancel"]
    four = [r for r in rows if r["label"] != "cancel"] + small[:4]
    found = rank_label_issues(*_columns(four))
    assert (found.folds, found.left_out, found.rows) == (4, {}, 64)

    two = [r for r in rows if r["label"] != "cancel"] + small[:2]
    found = rank_label_issues(*_columns(two))
    assert (found.folds, found.left_out, found.rows, found.labels) == (3, {"cancel": 2}, 60, 3)
    assert "fewer than 3 rows are left out" in caplog.text and "'cancel' (2)" in caplog.text


def test_one_label_no_usable_row_or_blank_texts_are_refused_or_left_out_with_the_fix():
    rows = planted_labels.keyword_rows(40)
    with pytest.raises(LabelIssueError, match="every row has the label 'billing' \\(10 rows\\)") as caught:
        rank_label_issues(*_columns([r for r in rows if r["label"] == "billing"]), source="t.csv")
    message = str(caught.value)
    assert message.startswith("Cannot look for label issues in t.csv")
    assert "Fix: point the source and its label_column" in message and "label_issues to 0" in message

    # Only one label has enough rows once the small ones are left out.
    one = [r for r in rows if r["label"] == "billing"] + [r for r in rows if r["label"] == "login"][:2]
    with pytest.raises(LabelIssueError, match=r"only one label has at least 3 rows"):
        rank_label_issues(*_columns(one))

    with pytest.raises(LabelIssueError, match=r"no row has both a text and a label \(2 rows without\)"):
        rank_label_issues(["  ", None], ["a", "b"], ["1", "2"])

    # Blank texts and labels are left out, the rest judged.
    texts, labels, ids = _columns(rows)
    found = rank_label_issues(
        [*texts, " \n", None, "a text"], [*labels, "billing", "login", " "], [*ids, "x", "y", "z"]
    )
    assert (found.rows, found.blank) == (40, 3)


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.spark
def test_a_spark_source_keeps_one_row_per_text_without_blank_or_corrected_ones_and_samples_above_its_cap(
    spark, tmp_path
):
    rows = planted_labels.keyword_rows(200)
    truth = planted_labels.flip(rows, 0.03)
    source = [{"body": r["text"], "topic": r["label"], "ticket": r["id"]} for r in rows]
    source += [
        {"body": "  " + rows[0]["text"].upper(), "topic": rows[0]["label"], "ticket": "copy"},  # one text
        {"body": " \t", "topic": "billing", "ticket": "blank"},
        {"body": "no label at all", "topic": None, "ticket": "nolabel"},
        {"body": rows[1]["text"], "topic": rows[1]["label"], "ticket": " "},  # blank id: the content key
    ]
    uri = _jsonl(tmp_path / "source.jsonl", source)
    corrected = sorted(truth)[0]
    text_of = {r["id"]: r["text"] for r in rows}
    from pyspark.sql import functions as F
    from sparktune.data.prepare import content_key

    exclude = spark.createDataFrame([(text_of[corrected],)], "text string").select(
        content_key(F.col("text")).alias("_key")
    )
    found = source_label_issues(
        spark,
        source_uri=uri,
        text_column="BODY",  # matched as Spark matches columns
        label_column="topic",
        id_column="ticket",
        exclude_keys=exclude,
    )
    # 200 distinct texts (one copy of rows[0] and of rows[1] kept), 1 corrected left out; 2 blank.
    assert (found.source_rows, found.corrected, found.rows, found.sampled) == (200, 1, 199, False)
    assert (found.blank, found.duplicates) == (2, 2)
    ids = {issue.id for issue in found.issues}
    assert corrected not in ids and ids & set(truth)
    assert all(len(issue.key) == 64 for issue in found.issues)

    capped = source_label_issues(
        spark, source_uri=uri, text_column="body", label_column="topic", id_column="ticket", max_rows=120
    )
    assert (capped.rows, capped.sampled, capped.source_rows) == (120, True, 200)

    with pytest.raises(
        LabelIssueError, match=r"no column for label_column='intent_label'.*label_issues to 0"
    ):
        source_label_issues(spark, source_uri=uri, text_column="body", label_column="intent_label")
