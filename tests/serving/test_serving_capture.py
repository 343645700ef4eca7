"""The capture writer on its own: batched background writes, dated partitions, atomic files, retries."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sparktune.serve import capture as capture_module
from sparktune.serve.capture import COLUMNS, CaptureWriter

DAY1 = datetime(2025, 3, 1, 23, 59, 59, 999000, tzinfo=UTC)
DAY2 = datetime(2025, 3, 2, 0, 0, 0, 1000, tzinfo=UTC)


def _add(writer: CaptureWriter, request_id: str, n: int = 1, at: datetime = DAY1) -> None:
    texts = [f"{request_id} text {i}" for i in range(n)]
    writer.add(request_id, texts, ["billing_refund"] * n, [0.75] * n, "support-intent", "3", 12.5, at)


def _parts(root: Path) -> list[Path]:
    return sorted(root.glob("date=*/part-*.parquet"))


def _wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_rows_are_written_when_flush_rows_are_buffered_not_before(tmp_path):
    writer = CaptureWriter(str(tmp_path / "cap"), flush_rows=4, flush_seconds=60)
    writer.start()
    try:
        _add(writer, "r1", 3)
        time.sleep(0.2)
        assert not _parts(tmp_path / "cap") and writer.stats.rows_pending == 3
        _add(writer, "r2", 1)
        _wait_for(lambda: writer.stats.rows_written == 4)
        assert len(_parts(tmp_path / "cap")) == 1 and writer.stats.rows_pending == 0
    finally:
        writer.close()


def test_rows_are_written_every_flush_seconds_and_on_close(tmp_path):
    timed = CaptureWriter(str(tmp_path / "timed"), flush_rows=1000, flush_seconds=0.1)
    timed.start()
    try:
        _add(timed, "timed")
        _wait_for(lambda: timed.stats.rows_written == 1)
    finally:
        timed.close()
    closing = CaptureWriter(str(tmp_path / "closing"), flush_rows=1000, flush_seconds=60)
    closing.start()
    _add(closing, "closing")
    time.sleep(0.1)
    assert not _parts(tmp_path / "closing")
    closing.close()
    assert closing.stats.rows_written == 1 and len(_parts(tmp_path / "closing")) == 1


def test_each_utc_date_is_its_own_partition_with_the_capture_columns(tmp_path):
    root = tmp_path / "cap"
    writer = CaptureWriter(str(root))
    _add(writer, "late", 2, DAY1)
    _add(writer, "early", 1, DAY2)
    paths = writer.flush()
    assert [Path(p).parent.name for p in paths] == ["date=2025-03-01", "date=2025-03-02"]
    day1 = pq.read_table(paths[0])
    assert tuple(day1.schema.names) == COLUMNS  # no date column in the files: it is the folder
    assert day1.to_pylist()[1] == {
        "request_id": "late",
        "row": 1,
        "text": "late text 1",
        "prediction": "billing_refund",
        "score": 0.75,
        "model_name": "support-intent",
        "model_version": "3",
        "latency_ms": 12.5,
        "requested_at": DAY1,
    }
    assert pq.read_table(paths[1]).column("request_id").to_pylist() == ["early"]
    assert writer.flush() == []  # nothing buffered: no empty file


def test_a_file_becomes_visible_only_whole_through_a_rename_from_a_hidden_name(tmp_path, monkeypatch):
    root = tmp_path / "cap"
    renames = []
    real_replace = os.replace

    def spying_replace(src, dst):
        hidden = Path(src)
        assert hidden.name.startswith(".") and hidden.parent == Path(dst).parent
        assert not _parts(root), "the final name existed before the rename"
        assert pq.read_table(hidden).num_rows == 5  # complete before it gets its name
        renames.append((hidden.name, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(capture_module.os, "replace", spying_replace)
    writer = CaptureWriter(str(root))
    _add(writer, "whole", 5)
    writer.flush()
    assert len(renames) == 1 and renames[0][1].startswith("part-") and renames[0][1].endswith(".parquet")
    assert [p.name for p in root.rglob("*") if p.is_file()] == [renames[0][1]]


def test_rows_are_kept_while_the_table_cannot_be_written_and_the_oldest_dropped_past_the_cap(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the capture folder should be")
    writer = CaptureWriter(str(blocker / "cap"), max_pending_rows=5)
    _add(writer, "first", 3)
    assert writer.flush() == []
    assert writer.stats.rows_pending == 3 and writer.stats.last_error
    _add(writer, "second", 3)
    assert writer.flush() == []
    assert writer.stats.rows_pending == 5 and writer.stats.rows_dropped == 1
    blocker.unlink()  # the location is writable again: the kept rows go out, oldest first
    paths = writer.flush()
    table = pq.read_table(paths[0])
    assert table.column("text").to_pylist() == ["first text 1", "first text 2"] + [
        f"second text {i}" for i in range(3)
    ]
    assert writer.stats.last_error is None and writer.stats.rows_written == 5


@pytest.mark.spark
def test_spark_reads_the_capture_table_with_its_date_partition(tmp_path, spark):
    root = tmp_path / "cap"
    writer = CaptureWriter(str(root))
    _add(writer, "a", 2, DAY1)
    _add(writer, "b", 1, DAY2)
    writer.flush()
    frame = spark.read.parquet(str(root))
    assert set(frame.columns) == {*COLUMNS, "date"}
    counts = {str(r["date"]): r["count"] for r in frame.groupBy("date").count().collect()}
    assert counts == {"2025-03-01": 2, "2025-03-02": 1}
