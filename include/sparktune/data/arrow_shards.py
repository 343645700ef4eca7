"""The shard writers that run in Spark tasks (or on threads of the driver): rows in, Arrow IPC shards
out, one small record per shard back to the driver.

Only pyarrow runs here, no ``datasets`` import per Python worker. A task attempt's files are
removed when it fails, and a full disk is re-raised with the path so the driver can tell it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sparktune.data.dataset_fs import filesystem, fsync, is_local
from sparktune.data.materialize_errors import MaterializeError, is_disk_full

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_SPLIT = "train"
# Arrow batches Spark hands each Python worker; bigger batches mean fewer, larger IPC messages.
ARROW_BATCH_ROWS = 65_536
# Rows per record batch in the written shards (save_to_disk writes 1,000); readers iterate in
# their own batch sizes whatever the layout, and fewer batches mean less metadata.
WRITER_BATCH_ROWS = 10_000
SHARD_RECORD_DDL = "split string, partition int, filename string, num_rows long, num_bytes long"


def _open_sink(path: str, fs: Any) -> Any:
    import pyarrow as pa

    # pyarrow's own file for local disks (no Python in the write loop); fsspec elsewhere.
    return pa.OSFile(path, "wb") if is_local(fs) else fs.open(path, "wb")


class _ShardSink:
    """One Arrow IPC stream file being written by an executor; fsynced when closed."""

    def __init__(self, fs: Any, tmp: str, split: str, partition: int, token: str, schema: pa.Schema):
        import pyarrow as pa

        if is_local(fs):
            # Not makedirs: a task still running after the driver gave up and removed the temp
            # folder must fail here, not bring the folder back.
            with contextlib.suppress(FileExistsError):
                os.mkdir(posixpath.join(tmp, split))
        else:
            fs.makedirs(posixpath.join(tmp, split), exist_ok=True)
        self.fs, self.split, self.partition = fs, split, partition
        self.path = posixpath.join(tmp, split, f"data-{partition:05d}-{token}.arrow")
        self.sink = _open_sink(self.path, fs)
        try:
            self.writer = pa.ipc.new_stream(self.sink, schema)
        except BaseException:
            with contextlib.suppress(Exception):
                self.sink.close()
                fs.rm(self.path)
            raise
        self.rows = 0
        self.bytes = 0

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table, max_chunksize=WRITER_BATCH_ROWS)
        self.rows += table.num_rows
        self.bytes += table.nbytes

    def close(self) -> dict[str, Any]:
        self.writer.close()
        self.sink.close()
        fsync(self.path, self.fs)
        return {
            "split": self.split,
            "partition": self.partition,
            "filename": posixpath.basename(self.path),
            "num_rows": self.rows,
            "num_bytes": self.bytes,
        }

    def abort(self) -> None:
        """Close and delete the file, whatever state it is in: a full disk gets its space back."""
        for close in (self.writer.close, self.sink.close):
            with contextlib.suppress(Exception):
                close()
        with contextlib.suppress(Exception):
            self.fs.rm(self.path)


def _writing(sinks: list[_ShardSink], tmp: str) -> contextlib.AbstractContextManager:
    """Around one task attempt's writing: on failure, its files go (a retried attempt or the next
    run gets the space back); a full disk is re-raised with the path, which the driver matches."""

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            for sink in sinks:
                sink.abort()
            if is_disk_full(exc):
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} writing shards to {tmp}") from exc
            raise

    return guard()


def _encoder(schema: pa.Schema, label_column: str | None, label_names: list[str] | None):
    """``table -> table`` in the dataset's types, labels as ClassLabel ids (unknown labels fail)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    value_set = pa.array(label_names, pa.string()) if label_column and label_names is not None else None

    def encode(table: pa.Table) -> pa.Table:
        if value_set is not None:
            labels = table[label_column]
            ids = pc.index_in(labels, value_set=value_set)
            unknown = pc.sum(pc.and_(pc.is_null(ids), pc.is_valid(labels))).as_py() or 0
            if unknown:
                examples = pc.unique(pc.filter(labels, pc.is_null(ids))).to_pylist()[:5]
                raise MaterializeError(
                    f"labels {sorted(examples)} are not among the declared label names "
                    f"{list(label_names)}; add them, or pass label_names=None to take them from the data"
                )
            table = table.set_column(table.schema.get_field_index(label_column), label_column, ids)
        return table.select(schema.names).cast(schema)

    return encode


def dataframe_shard_writer(
    *,
    tmp_uri: str,
    schema: pa.Schema,
    split_column: str | None,
    label_column: str | None,
    label_names: list[str] | None,
    expected_splits: list[str] | None,
    storage_options: dict | None,
):
    """What each Spark task runs on its rows: one Arrow shard per split, one record per shard.

    Only pyarrow runs here (no ``datasets`` import per Python worker, about 0.4 s each):
    ``schema`` already carries the Hugging Face features as metadata, as ``ArrowWriter`` writes.
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        # Unique per attempt: a retried or speculative task never appends to a dead attempt's file.
        token = uuid.uuid4().hex[:12]
        encode = _encoder(schema, label_column, label_names)
        fs, tmp = filesystem(tmp_uri, storage_options)
        shards: dict[str, _ShardSink] = {}
        opened: list[_ShardSink] = []  # what this attempt wrote, removed if it fails

        def shard_for(split: str | None) -> _ShardSink:
            if split not in shards:
                if split is None or (expected_splits is not None and split not in expected_splits):
                    raise MaterializeError(
                        f"a row has {split_column!r} = {split!r}, not one of the expected splits "
                        f"{expected_splits}; fix the {split_column!r} column or pass splits=None"
                    )
                shards[split] = _ShardSink(fs, tmp, split, partition, token, schema)
                opened.append(shards[split])
            return shards[split]

        with _writing(opened, tmp):
            for batch in batches:
                table = pa.Table.from_batches([batch])
                if split_column is None:
                    groups = [(DEFAULT_SPLIT, table)]
                else:
                    values = table[split_column]
                    splits = pc.unique(values).to_pylist()
                    table = table.drop_columns([split_column])
                    groups = (
                        [(splits[0], table)]
                        if len(splits) == 1
                        else [(s, table.filter(pc.equal(values, s))) for s in splits]
                    )
                for split, part in groups:
                    shard_for(split).write(encode(part))
            records = [shard.close() for shard in shards.values()]
        if records:
            yield pa.RecordBatch.from_pylist(records, schema=_shard_record_schema())

    return write


def parquet_unit_writer(
    *,
    tmp_uri: str,
    units: list[dict[str, Any]],
    schema: pa.Schema,
    label_column: str | None,
    label_names: list[str] | None,
    storage_options: dict | None,
):
    """What each Spark task runs for Parquet sources: read its unit (a file's row groups) with
    pyarrow and write it as one shard. No row passes through the JVM."""

    def write(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        token = uuid.uuid4().hex[:12]
        encode = _encoder(schema, label_column, label_names)
        fs, tmp = filesystem(tmp_uri, storage_options)
        records = []
        opened: list[_ShardSink] = []  # what this attempt wrote, removed if it fails
        with _writing(opened, tmp):
            for batch in ids:
                for unit_id in batch.column(0).to_pylist():
                    unit = units[unit_id]
                    shard = _ShardSink(fs, tmp, unit["split"], unit_id, token, schema)
                    opened.append(shard)
                    source_fs, path = filesystem(unit["file"], storage_options)
                    # Local files are read by pyarrow's native reader; fsspec serves other stores.
                    with (
                        contextlib.nullcontext(path)
                        if is_local(source_fs)
                        else source_fs.open(path, "rb") as src
                    ):
                        reader = pq.ParquetFile(src)
                        for part in reader.iter_batches(
                            batch_size=ARROW_BATCH_ROWS, row_groups=unit["row_groups"], columns=schema.names
                        ):
                            shard.write(encode(pa.Table.from_batches([part])))
                    records.append(shard.close())
        if records:
            yield pa.RecordBatch.from_pylist(records, schema=_shard_record_schema())

    return write


def _shard_record_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("split", pa.string()),
            ("partition", pa.int32()),
            ("filename", pa.string()),
            ("num_rows", pa.int64()),
            ("num_bytes", pa.int64()),
        ]
    )


def write_units_in_process(writer: Any, n_units: int) -> list[dict]:
    """Run the executors' unit writer on a thread pool here; pyarrow releases the GIL while it works.

    The first failure cancels the units not started yet (on a full disk they would only fail too)
    and is raised once the running ones have stopped, so nothing writes while the caller cleans up.
    """
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    import pyarrow as pa

    def run(unit_id: int) -> list[dict]:
        batch = pa.record_batch([pa.array([unit_id], pa.int64())], names=["id"])
        return [row for out in writer(iter([batch])) for row in out.to_pylist()]

    with ThreadPoolExecutor(max_workers=min(n_units, os.cpu_count() or 1) or 1) as pool:
        futures = [pool.submit(run, unit_id) for unit_id in range(n_units)]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()
        failed = next((f.exception() for f in futures if not f.cancelled() and f.exception()), None)
        if failed is not None:
            raise failed
        return [row for future in futures for row in future.result()]
