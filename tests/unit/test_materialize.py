from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktune.materialize import MARKER, materialize_dataset

LABELS = ["billing", "shipping", "login"]


def _prepared(root, rows_per_split=(40, 5, 5)):
    for split, n in zip(("train", "validation", "test"), rows_per_split, strict=True):
        folder = root / f"split={split}"
        folder.mkdir(parents=True)
        for part in range(2):  # two Spark-style part files per split
            ids = [f"{split}-{part}-{i:03d}" for i in range(n)]
            table = pa.table(
                {
                    "example_id": ids,
                    "text": [f"text {i}" for i in ids],
                    "label": [LABELS[i % 3] for i in range(n)],
                    "prompt": [f"[INST] {i} [/INST]" for i in ids],
                    "completion": [f" {LABELS[i % 3]}" for i in range(n)],
                    "n_tokens": list(range(n)),
                }
            )
            pq.write_table(table, folder / f"part-{part:05d}.parquet")
    return root


def test_builds_a_memory_mapped_dataset_dict_with_class_labels(tmp_path):
    prepared = _prepared(tmp_path / "prepared")
    result = materialize_dataset(str(prepared), tmp_path / "datasets", "fp1", LABELS)
    assert not result.reused
    assert result.rows == {"train": 80, "validation": 10, "test": 10}
    loaded = datasets.load_from_disk(result.dataset_uri)
    assert set(loaded) == {"train", "validation", "test"}
    assert loaded["train"].features["label"] == datasets.ClassLabel(names=sorted(LABELS))
    assert loaded["train"]["example_id"] == sorted(loaded["train"]["example_id"])
    assert all(len(f) > 0 for f in loaded["train"].cache_files)  # memory-mapped from disk
    row = loaded["test"][0]
    assert loaded["test"].features["label"].int2str(row["label"]) == row["completion"].strip()


def test_same_fingerprint_is_reused_without_rebuilding(tmp_path):
    prepared = _prepared(tmp_path / "prepared")
    first = materialize_dataset(str(prepared), tmp_path / "datasets", "fp1", LABELS)
    marker_mtime = (tmp_path / "datasets" / "fp1" / MARKER).stat().st_mtime_ns
    again = materialize_dataset(str(prepared), tmp_path / "datasets", "fp1", LABELS)
    assert again.reused and again.dataset_uri == first.dataset_uri and again.rows == first.rows
    assert (tmp_path / "datasets" / "fp1" / MARKER).stat().st_mtime_ns == marker_mtime


def test_unfinished_folder_is_never_trusted(tmp_path):
    prepared = _prepared(tmp_path / "prepared")
    half_written = tmp_path / "datasets" / "fp1"
    (half_written / "train").mkdir(parents=True)
    (half_written / "train" / "data-00000-of-00001.arrow").write_bytes(b"truncated")
    result = materialize_dataset(str(prepared), tmp_path / "datasets", "fp1", LABELS)
    assert not result.reused
    assert json.loads((half_written / MARKER).read_text())["rows"]["train"] == 80
    assert len(datasets.load_from_disk(str(half_written))["train"]) == 80
    assert not [p for p in (tmp_path / "datasets").iterdir() if p.name.startswith("_tmp")]


def test_missing_split_is_a_clear_error(tmp_path):
    prepared = _prepared(tmp_path / "prepared")
    (prepared / "split=test").rename(prepared / "elsewhere")
    with pytest.raises(FileNotFoundError, match=r"no split folder\(s\) \['test'\]"):
        materialize_dataset(str(prepared), tmp_path / "datasets", "fp1", LABELS)
