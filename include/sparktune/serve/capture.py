"""Request capture: every text the server answered, appended to a Parquet table in the lake.

Layout (``<lake>/serving_captures``, ``SPARKTUNE_SERVING_CAPTURES_URI`` to move it), partitioned
like the other dated lake tables so Spark reads it with ``spark.read.parquet(root)`` and gets a
``date`` column::

    <root>/date=YYYY-MM-DD/part-<utc time>-<id>.parquet

One row per text: ``request_id``, ``row`` (its place in the request), ``text``, ``prediction``,
``score``, ``model_name``, ``model_version``, ``latency_ms`` (request received to answer ready)
and ``requested_at`` (UTC; its date is the partition).

Writing is off the request path: :meth:`CaptureWriter.add` appends to an in-memory buffer, and a
background thread writes the buffer every ``flush_rows`` rows or ``flush_seconds`` seconds,
whichever comes first, and once more on :meth:`CaptureWriter.close`. Each file is written under a
hidden name (``.part-...``, which Spark and pyarrow skip) and renamed into place, so a reader
never sees half a file. When the table cannot be written (a full disk, a lost mount) the rows stay
buffered and are tried again; past ``max_pending_rows`` the oldest are dropped and counted in
:attr:`CaptureWriter.stats`, so a broken lake never takes the server's memory with it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PARTITION_COLUMN = "date"
COLUMNS = (
    "request_id",
    "row",
    "text",
    "prediction",
    "score",
    "model_name",
    "model_version",
    "latency_ms",
    "requested_at",
)


def capture_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("request_id", pa.string()),
            ("row", pa.int32()),
            ("text", pa.string()),
            ("prediction", pa.string()),
            ("score", pa.float64()),
            ("model_name", pa.string()),
            ("model_version", pa.string()),
            ("latency_ms", pa.float64()),
            ("requested_at", pa.timestamp("us", tz="UTC")),
        ]
    )


@dataclass
class CaptureStats:
    rows_written: int = 0
    files_written: int = 0
    rows_pending: int = 0
    rows_dropped: int = 0
    last_error: str | None = None

    def to_summary(self) -> dict[str, Any]:
        return asdict(self)


def _filesystem(root_uri: str) -> tuple[Any, str]:
    """(pyarrow file system, path in it); a plain path is local, made absolute."""
    from pyarrow import fs

    if "://" not in root_uri:
        return fs.LocalFileSystem(), str(Path(root_uri).expanduser().absolute())
    return fs.FileSystem.from_uri(root_uri)


class CaptureWriter:
    """Buffers captured rows and appends them to the capture table from a background thread."""

    def __init__(
        self,
        root_uri: str,
        *,
        flush_rows: int = 1000,
        flush_seconds: float = 5.0,
        max_pending_rows: int = 200_000,
    ) -> None:
        self.root_uri = root_uri
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.max_pending_rows = max_pending_rows
        self.stats = CaptureStats()
        self._fs, self._root = _filesystem(root_uri)
        self._columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
        self._pending = 0
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()  # one writer at a time: the thread, flush() or close()
        self._closing = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sparktune-capture", daemon=True)
        self._thread.start()

    def add(
        self,
        request_id: str,
        texts: Sequence[str],
        predictions: Sequence[str],
        scores: Sequence[float],
        model_name: str,
        model_version: str,
        latency_ms: float,
        requested_at: datetime,
    ) -> None:
        """Queue one answered request's rows; returns at once (the write happens on the thread)."""
        n = len(texts)
        with self._cond:
            columns = self._columns
            columns["request_id"].extend([request_id] * n)
            columns["row"].extend(range(n))
            columns["text"].extend(texts)
            columns["prediction"].extend(predictions)
            columns["score"].extend(scores)
            columns["model_name"].extend([model_name] * n)
            columns["model_version"].extend([model_version] * n)
            columns["latency_ms"].extend([latency_ms] * n)
            columns["requested_at"].extend([requested_at] * n)
            self._pending += n
            self.stats.rows_pending = self._pending
            if self._pending >= self.flush_rows:
                self._cond.notify()

    def flush(self) -> list[str]:
        """Write every buffered row now; the paths of the files written (one per date)."""
        with self._write_lock:
            with self._cond:
                columns, rows = self._columns, self._pending
                self._columns, self._pending = {name: [] for name in COLUMNS}, 0
            if not rows:
                return []
            try:
                paths = self._write(columns)
            except Exception as exc:
                self._keep_for_retry(columns, rows, exc)
                return []
            with self._cond:
                self.stats.rows_written += rows
                self.stats.files_written += len(paths)
                self.stats.rows_pending = self._pending
                self.stats.last_error = None
            return paths

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after a last flush of everything buffered."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush()  # rows added after the thread's last write, or all of them if it never started

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._due, self.flush_seconds)
                closing = self._closing
            self.flush()
            if closing:
                return

    def _due(self) -> bool:
        return self._closing or self._pending >= self.flush_rows

    def _write(self, columns: dict[str, list[Any]]) -> list[str]:
        import pyarrow as pa
        import pyarrow.compute as pc

        table = pa.Table.from_pydict(columns, schema=capture_schema())
        days = pc.strftime(table["requested_at"], format="%Y-%m-%d")
        unique = sorted(set(days.to_pylist()))
        if len(unique) == 1:
            return [self._write_file(unique[0], table)]
        return [self._write_file(day, table.filter(pc.equal(days, day))) for day in unique]

    def _write_file(self, day: str, table: Any) -> str:
        import pyarrow.parquet as pq

        folder = f"{self._root}/{PARTITION_COLUMN}={day}"
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"part-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
        final, hidden = f"{folder}/{name}", f"{folder}/.{name}.inprogress"
        self._fs.create_dir(folder, recursive=True)
        if isinstance(self._fs, _local_fs_type()):
            # fsync before the rename: after a crash the file is either whole or not there at all.
            with open(hidden, "wb") as out:
                pq.write_table(table, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(hidden, final)
        else:
            with self._fs.open_output_stream(hidden) as out:
                pq.write_table(table, out)
            self._fs.move(hidden, final)
        return final

    def _keep_for_retry(self, columns: dict[str, list[Any]], rows: int, exc: Exception) -> None:
        with self._cond:
            for name in COLUMNS:  # older rows first, ahead of what arrived meanwhile
                self._columns[name] = columns[name] + self._columns[name]
            self._pending += rows
            over = self._pending - self.max_pending_rows
            if over > 0:
                for name in COLUMNS:
                    del self._columns[name][:over]
                self._pending -= over
                self.stats.rows_dropped += over
            self.stats.rows_pending = self._pending
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
        log.error(
            "Could not write %d captured rows to %s (%s); keeping them to try again%s. Check that the "
            "location is writable (SPARKTUNE_SERVING_CAPTURES_URI / --capture-uri).",
            rows,
            self.root_uri,
            self.stats.last_error,
            f", {over} oldest dropped" if over > 0 else "",
        )


def _local_fs_type() -> type:
    from pyarrow import fs

    return fs.LocalFileSystem
