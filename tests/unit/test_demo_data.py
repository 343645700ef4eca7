from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from sparktune.model.builtin_corpus import SCHEMA, generate_support_tickets
from sparktune_dev import demo_data
from sparktune_dev.demo_data import write_demo_dataset


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))


def test_same_seed_same_bytes(tmp_path):
    a = write_demo_dataset(tmp_path / "a.jsonl", 1500, seed=11)
    b = write_demo_dataset(tmp_path / "b.jsonl", 1500, seed=11)
    c = write_demo_dataset(tmp_path / "c.jsonl", 1500, seed=12)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    pa_, pb = (
        write_demo_dataset(tmp_path / "a.parquet", 1500, 11),
        write_demo_dataset(tmp_path / "b.parquet", 1500, 11),
    )
    assert pa_.read_bytes() == pb.read_bytes()


def test_writers_read_back(tmp_path, monkeypatch):
    # several write chunks, so chunked writing is exercised too
    monkeypatch.setattr(demo_data, "_WRITE_CHUNK_ROWS", 700)
    expected = generate_support_tickets(2000, seed=7).to_pandas()

    parquet = write_demo_dataset(tmp_path / "t.parquet", 2000)
    pd.testing.assert_frame_equal(pq.read_table(parquet).to_pandas(), expected)

    jsonl = write_demo_dataset(tmp_path / "nested" / "t.jsonl", 2000)
    lines = jsonl.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2000
    assert json.loads(lines[0]).keys() == set(SCHEMA.names)
    from_json = pd.read_json(jsonl, lines=True, dtype={"created_date": str})
    pd.testing.assert_frame_equal(from_json, expected)

    csv = write_demo_dataset(tmp_path / "t.csv", 2000)
    from_csv = pd.read_csv(csv, keep_default_na=False, na_values={"intent_label": [""]})
    assert from_csv.message.tolist() == expected.message.tolist()  # newlines and quotes survive
    assert from_csv.intent_label.isna().sum() == expected.intent_label.isna().sum()
    assert list(tmp_path.glob(".*tmp*")) == []  # temp files renamed or removed


def test_format_errors(tmp_path):
    with pytest.raises(ValueError, match="suffix"):
        write_demo_dataset(tmp_path / "t.xlsx", 10)
    with pytest.raises(ValueError, match="Unknown format"):
        write_demo_dataset(tmp_path / "t.jsonl", 10, fmt="xml")
    assert write_demo_dataset(tmp_path / "t.data", 10, fmt="parquet").stat().st_size > 0
    assert not (tmp_path / "t.xlsx").exists()


def test_cli_writes_default_and_given_paths(tmp_path, capsys):
    assert demo_data.main(["--rows", "120", "--seed", "3"]) == 0
    default = tmp_path / "home" / "data" / "support_tickets.jsonl"
    assert len(default.read_text().splitlines()) == 120
    assert str(default) in capsys.readouterr().out

    assert demo_data.main(["--rows", "50", "--out", str(tmp_path / "x.parquet")]) == 0
    assert pq.read_table(tmp_path / "x.parquet").num_rows == 50
    assert "50 rows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        demo_data.main(["--rows", "5", "--out", str(tmp_path / "x.txt")])


# --- the helpdesk export: another shape -------------------------------------------------------


@pytest.fixture(scope="module")
def helpdesk_csv(tmp_path_factory):
    return demo_data.write_helpdesk_csv(tmp_path_factory.mktemp("helpdesk") / "tickets.csv")


def test_helpdesk_csv_is_a_windows_spreadsheet_export(helpdesk_csv):
    import csv
    import io

    raw = helpdesk_csv.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfticket_id,created_at,channel,priority,body,category\r\n")
    # every record ends in CRLF; the only bare LFs are inside quoted bodies
    text = raw.decode("utf-8-sig")
    records = list(csv.reader(io.StringIO(text, newline="")))
    assert len(records) == 1 + demo_data.HELPDESK_ROWS
    assert all(len(r) == len(demo_data.HELPDESK_COLUMNS) for r in records)
    assert text.count("\r\n") == len(records)
    bodies = [r[4] for r in records[1:]]
    assert sum("\n" in b for b in bodies) > 100 and all("\r" not in b for b in bodies)
    assert '",' in text and '""' in text  # quoted fields (newlines, commas) and doubled quotes
    assert any("," in b and "\n" in b for b in bodies)
    expected = demo_data.generate_helpdesk_tickets().to_pandas()
    assert bodies == expected.body.tolist()
    assert [r[5] for r in records[1:]] == expected.category.tolist()
    # pandas reads it as users would: the BOM is not part of the first column's name
    frame = pd.read_csv(helpdesk_csv, encoding="utf-8-sig", keep_default_na=False)
    assert list(frame.columns) == list(demo_data.HELPDESK_COLUMNS)
    assert frame.body.tolist() == expected.body.tolist()


def test_helpdesk_classes_imbalanced_and_long_texts():
    table = demo_data.generate_helpdesk_tickets()
    frame = table.to_pandas()
    assert table.column_names == list(demo_data.HELPDESK_COLUMNS)
    assert "message" not in frame and "intent_label" not in frame
    counts = frame.category.value_counts()
    assert counts.to_dict() == demo_data.helpdesk_category_counts()
    assert len(counts) == 12 and counts.sum() == 2500
    assert counts.min() >= 40 and 8 <= counts.max() / counts.min() <= 12
    lengths = frame.body.str.len()
    assert 200 < lengths.median() < 400 and lengths.min() >= 60
    assert frame.ticket_id.is_unique


def test_helpdesk_duplicates_and_near_duplicates():
    frame = demo_data.generate_helpdesk_tickets().to_pandas()
    exact = frame.body.duplicated()
    assert 0.03 < exact.mean() < 0.08
    # a copy keeps its category
    assert frame.groupby("body").category.nunique().eq(1).all()
    # near-duplicates: different bytes, the same words once case and punctuation are ignored
    loose = frame.body.str.lower().str.replace(r"[^a-z0-9 ]+", " ", regex=True).str.split().str.join(" ")
    near = loose.duplicated() & ~exact
    assert near.mean() > 0.02  # not all of them: a changed word or an added line is not caught here


def test_helpdesk_is_deterministic_by_seed(tmp_path, helpdesk_csv):
    again = demo_data.write_helpdesk_csv(tmp_path / "again.csv")
    assert again.read_bytes() == helpdesk_csv.read_bytes()
    other = demo_data.write_helpdesk_csv(tmp_path / "other.csv", seed=8)
    assert other.read_bytes() != helpdesk_csv.read_bytes()
    assert list(tmp_path.glob(".*tmp*")) == []
    with pytest.raises(ValueError, match="at least 12"):
        demo_data.generate_helpdesk_tickets(5)


def test_helpdesk_labels_learnable_but_not_by_one_keyword():
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer
    from sparktune.release.baseline import fit_predict

    frame = demo_data.generate_helpdesk_tickets().to_pandas().drop_duplicates("body")
    train = frame.iloc[::5]  # a small train set keeps the fit fast
    test = frame.drop(train.index)
    predicted = fit_predict(train.body.tolist(), train.category.tolist(), test.body.tolist())
    accuracy = (np.array(predicted) == test.category.to_numpy()).mean()
    assert 0.8 < accuracy < 0.99  # learnable, not perfect (mislabelled rows, shared words)
    # no word is in most tickets of one category and (nearly) none of the others'
    words = CountVectorizer(binary=True).fit(frame.body)
    present = words.transform(frame.body)
    categories = frame.category.to_numpy()
    share = np.vstack(
        [np.asarray(present[categories == c].mean(axis=0)).ravel() for c in demo_data.HELPDESK_CATEGORIES]
    )
    for i, category in enumerate(demo_data.HELPDESK_CATEGORIES):
        others = np.delete(share, i, axis=0).max(axis=0)
        giveaway = (share[i] > 0.6) & (others < 0.05)
        assert not giveaway.any(), (category, words.get_feature_names_out()[giveaway])


def test_cli_writes_the_helpdesk_csv(tmp_path, capsys):
    out = tmp_path / "exports" / "tickets.csv"
    assert demo_data.main(["--tickets-csv", str(out), "--rows", "300", "--seed", "2"]) == 0
    assert out.read_bytes() == demo_data.write_helpdesk_csv(tmp_path / "same.csv", 300, seed=2).read_bytes()
    assert "300 rows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        demo_data.main(["--tickets-csv", str(out), "--out", str(tmp_path / "x.csv")])
