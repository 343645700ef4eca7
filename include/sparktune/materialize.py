"""Spark data -> a Hugging Face ``DatasetDict`` on disk, written where the data is.

The result has the exact layout ``DatasetDict.save_to_disk`` produces (``<split>/data-*.arrow``,
``state.json``, ``dataset_info.json``, ``dataset_dict.json``), so ``datasets.load_from_disk``
opens it memory-mapped. One shard writer (pyarrow only) serves three ways in:

- Parquet (what prepare_data writes): Spark tasks read their row groups with pyarrow and write
  one shard each; no row is decoded into the JVM and converted back to Arrow;
- any other DataFrame (a table, a query): ``mapInArrow`` hands each task's rows to the writer;
- small Parquet, or a ``local[...]`` master: the same row-group units on a thread pool in this
  process, skipping a Spark job whose cold start costs more than the work.

Either way the driver receives one small record per shard and its memory does not grow with
the data. Why not a library call: ``Dataset.from_spark`` counts the rows, samples them,
repartitions (a full shuffle) once the data exceeds one shard, writes through ``mapInArrow`` and
renames the shards in another job, into a cache keyed on the plan's ``semanticHash`` (not the
data); the Parquet round trip writes compressed Parquet and converts it again in one driver
process. Measured side by side in ``benchmarks/bench_materialize.py``.

Content addressing: a dataset lives at ``<root>/<data fingerprint>``, and it is trusted only
when its ``_SPARKTUNE_COMPLETE.json`` marker exists, which is written last. Shards are written
to a temp folder, fsynced, then the folder is renamed, so a task killed halfway never leaves a
dataset that a later run would use. Checking for a published dataset needs no Spark at all.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import posixpath
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

MARKER = "_SPARKTUNE_COMPLETE.json"
FORMAT_VERSION = 1
DEFAULT_SPLIT = "train"
# Arrow batches Spark hands each Python worker; bigger batches mean fewer, larger IPC messages.
ARROW_BATCH_ROWS = 65_536
# Rows per record batch in the written shards (save_to_disk writes 1,000); readers iterate in
# their own batch sizes whatever the layout, and fewer batches mean less metadata.
WRITER_BATCH_ROWS = 10_000
# Parquet row groups are grouped into work units of about this many uncompressed bytes: one
# Spark task and one shard each.
UNIT_BYTES = 256 * 2**20
# Below this much Parquet the shards are written in the calling process (see
# write_dataset_dict_from_parquet): a cold Spark job with Python workers costs about 4 s.
LOCAL_BELOW_BYTES = 256 * 2**20
SHARD_RECORD_DDL = "split string, partition int, filename string, num_rows long, num_bytes long"
DATASET_MODES = ("materialized", "streaming")
log = logging.getLogger(__name__)


class MaterializeError(ValueError):
    """The source cannot become a dataset as asked (missing column, unknown labels)."""


# The errors a full volume gives: no space left, or the user's quota used up.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


class DiskFullError(OSError):
    """The datasets volume filled while a dataset was written; nothing was published.

    The message names the location, the sizes known and the fix. ``fits_on_volume`` is False
    when the dataset is larger than the whole volume (no retry can help), None when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        location: str,
        needed_bytes: int | None,
        written_bytes: int | None,
        volume_bytes: int | None,
        free_bytes: int | None,
    ) -> None:
        super().__init__(errno.ENOSPC, message)
        self.message = message
        self.location = location
        self.needed_bytes = needed_bytes
        self.written_bytes = written_bytes
        self.volume_bytes = volume_bytes
        self.free_bytes = free_bytes

    @property
    def fits_on_volume(self) -> bool | None:
        if self.needed_bytes is None or self.volume_bytes is None:
            return None
        return self.needed_bytes <= self.volume_bytes

    @property
    def retry_may_help(self) -> bool:
        """False only when the dataset is larger than the whole volume: freeing space cannot fit it."""
        return self.fits_on_volume is not False

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class MaterializedDataset:
    dataset_uri: str
    data_fingerprint: str
    rows: dict[str, int]
    labels: list[str]
    reused: bool
    seconds: float
    dataset_mode: str = "materialized"
    shards: dict[str, int] | None = None
    num_bytes: int | None = None

    def to_summary(self) -> dict[str, Any]:
        return asdict(self)


def _fs(uri: str, storage_options: dict | None = None) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    return url_to_fs(uri, **(storage_options or {}))


def _is_local(fs: Any) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _uri(fs: Any, path: str) -> str:
    """A path from ``url_to_fs`` back to a URI for libraries that open it themselves."""
    return path if _is_local(fs) else fs.unstrip_protocol(path)


def dataset_uri_for(root_uri: str, data_fingerprint: str) -> str:
    return posixpath.join(str(root_uri).rstrip("/"), data_fingerprint)


def find_published(
    root_uri: str, data_fingerprint: str, storage_options: dict | None = None
) -> MaterializedDataset | None:
    """The published dataset of this data version, if any; reads one small file, starts no Spark."""
    started = time.monotonic()
    uri = dataset_uri_for(root_uri, data_fingerprint)
    fs, path = _fs(uri, storage_options)
    marker = posixpath.join(path, MARKER)
    if not fs.exists(marker):
        return None
    record = json.loads(fs.cat_file(marker))
    return MaterializedDataset(
        dataset_uri=uri,
        data_fingerprint=data_fingerprint,
        rows=record["rows"],
        labels=record["labels"],
        reused=True,
        seconds=time.monotonic() - started,
        shards=record.get("shards"),
        num_bytes=record.get("num_bytes"),
    )


def dataset_features(
    df: DataFrame, split_column: str | None, label_column: str | None, label_names: list[str] | None
) -> datasets.Features:
    """The typed features of the written columns; the label becomes a ``ClassLabel``."""
    import datasets
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(df.drop(split_column).schema if split_column else df.schema)
    features = datasets.Features.from_arrow_schema(schema)
    if label_column and label_names is not None:
        features[label_column] = datasets.ClassLabel(names=list(label_names))
    return features


def _fsync(path: str, fs: Any) -> None:
    # Durable before the marker says "complete": a crash after publishing must not expose
    # shards whose pages never reached the disk. Object stores are durable on close.
    if _is_local(fs):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _open_sink(path: str, fs: Any) -> Any:
    import pyarrow as pa

    # pyarrow's own file for local disks (no Python in the write loop); fsspec elsewhere.
    return pa.OSFile(path, "wb") if _is_local(fs) else fs.open(path, "wb")


class _ShardSink:
    """One Arrow IPC stream file being written by an executor; fsynced when closed."""

    def __init__(self, fs: Any, tmp: str, split: str, partition: int, token: str, schema: pa.Schema):
        import pyarrow as pa

        if _is_local(fs):
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
        _fsync(self.path, self.fs)
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
            if _is_disk_full(exc):
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} writing shards to {tmp}") from exc
            raise

    return guard()


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _is_disk_full(exc: BaseException, path: str | None = None) -> bool:
    """An ENOSPC/EDQUOT in ``exc`` or its causes; with ``path``, also one an executor raised
    while writing under ``path`` (only its text survives Spark's PythonException)."""
    for error in _chain(exc):
        if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
            return True
        text = str(error)
        if path and path in text and any(t in text for t in _DISK_FULL_TEXTS):
            return True
    return False


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


def _dataframe_shard_writer(
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
        fs, tmp = _fs(tmp_uri, storage_options)
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


def _parquet_unit_writer(
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
        fs, tmp = _fs(tmp_uri, storage_options)
        records = []
        opened: list[_ShardSink] = []  # what this attempt wrote, removed if it fails
        with _writing(opened, tmp):
            for batch in ids:
                for unit_id in batch.column(0).to_pylist():
                    unit = units[unit_id]
                    shard = _ShardSink(fs, tmp, unit["split"], unit_id, token, schema)
                    opened.append(shard)
                    source_fs, path = _fs(unit["file"], storage_options)
                    # Local files are read by pyarrow's native reader; fsspec serves other stores.
                    with (
                        contextlib.nullcontext(path)
                        if _is_local(source_fs)
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


def _executor_error(exc: Exception) -> MaterializeError | None:
    """The MaterializeError an executor raised, out of the PythonException Spark wraps it in."""
    text = str(exc)
    marker = "MaterializeError: "
    if marker not in text:
        return None
    return MaterializeError(text.split(marker, 1)[1].strip().splitlines()[0])


def _write_split_metadata(
    fs: Any,
    split_path: str,
    split: str,
    files: list[dict],
    features: datasets.Features,
    fingerprint: str,
    storage_options: dict | None,
) -> None:
    import datasets

    num_rows = sum(f["num_rows"] for f in files)
    num_bytes = sum(f["num_bytes"] for f in files)
    state = {
        "_data_files": [{"filename": f["filename"]} for f in files],
        "_fingerprint": hashlib.sha256(f"{fingerprint}/{split}".encode()).hexdigest()[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": split,
    }
    splits = datasets.SplitDict()
    splits.add(datasets.SplitInfo(name=split, num_bytes=num_bytes, num_examples=num_rows))
    info = datasets.DatasetInfo(features=features, splits=splits, dataset_size=num_bytes)
    with fs.open(posixpath.join(split_path, "state.json"), "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=2, sort_keys=True)
    info.write_to_directory(_uri(fs, split_path), pretty_print=True, storage_options=storage_options)


def _empty_shard(fs: Any, split_path: str, features: datasets.Features, storage_options: dict | None) -> dict:
    """A split with no rows still needs one (empty) Arrow file: load_from_disk concatenates shards."""
    from datasets.arrow_writer import ArrowWriter

    fs.makedirs(split_path, exist_ok=True)
    name = "data-00000-empty.arrow"
    writer = ArrowWriter(
        features=features, path=posixpath.join(split_path, name), storage_options=storage_options
    )
    num_rows, num_bytes = writer.finalize()
    writer.close()
    return {"filename": name, "num_rows": num_rows, "num_bytes": num_bytes}


def _publish(fs: Any, tmp: str, final: str, record: dict) -> bool:
    """Make ``tmp`` the dataset at ``final``; False when another writer published it first."""
    marker = posixpath.join(final, MARKER)
    if fs.exists(marker):
        fs.rm(tmp, recursive=True)
        return False
    if fs.exists(final):  # no marker: a crashed writer's leftovers, nothing may trust them
        log.warning("removing unfinished dataset folder %s", final)
        fs.rm(final, recursive=True)
    if _is_local(fs):
        # The marker goes in before the rename, so the folder appears complete in one step.
        with fs.open(posixpath.join(tmp, MARKER), "w") as handle:
            json.dump(record, handle, indent=2, sort_keys=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not fs.exists(marker):
                raise
            fs.rm(tmp, recursive=True)
            return False
        return True
    # Object stores cannot rename a folder atomically: copy, then write the marker last.
    fs.mv(tmp, final, recursive=True)
    with fs.open(marker, "w") as handle:
        json.dump(record, handle, indent=2, sort_keys=True)
    return True


def _absolute(uri: str) -> str:
    # Executors resolve relative paths against their own working directory.
    return uri if "://" in uri else os.path.abspath(uri)


def _build(
    target_uri: str,
    *,
    write_shards: Any,
    features: datasets.Features,
    data_fingerprint: str,
    label_column: str | None,
    label_names: list[str] | None,
    splits: list[str] | None,
    storage_options: dict | None,
    started: float,
    expected_bytes: int | None = None,
) -> MaterializedDataset:
    """Run ``write_shards(tmp_uri) -> shard records`` into a temp folder, then describe and publish it.

    ``expected_bytes``: about how big the dataset will be, when known, for the error a full disk gives.
    """
    fs, final = _fs(target_uri, storage_options)
    name = posixpath.basename(final.rstrip("/"))
    parent = posixpath.dirname(final.rstrip("/"))
    tmp_name = f"_tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp = posixpath.join(parent, tmp_name)
    tmp_uri = target_uri.rstrip("/").rsplit("/", 1)[0] + "/" + tmp_name
    _remove_stale_temp_folders(fs, parent, name)
    try:
        fs.makedirs(tmp, exist_ok=True)
        try:
            records = write_shards(tmp_uri)
        except Exception as exc:
            known = _executor_error(exc)
            if known is not None:
                raise known from None
            raise
        by_split: dict[str, list[dict]] = {}
        for record in sorted(records, key=lambda r: (r["split"], r["partition"])):
            by_split.setdefault(record["split"], []).append(record)
        wanted = list(splits) if splits else sorted(by_split) or [DEFAULT_SPLIT]
        _remove_unlisted_files(fs, tmp, by_split)
        for split in wanted:
            split_path = posixpath.join(tmp, split)
            files = by_split.get(split) or [_empty_shard(fs, split_path, features, storage_options)]
            by_split[split] = files
            _write_split_metadata(fs, split_path, split, files, features, data_fingerprint, storage_options)
        with fs.open(posixpath.join(tmp, "dataset_dict.json"), "w") as handle:
            json.dump({"splits": wanted}, handle)
        rows = {s: sum(f["num_rows"] for f in by_split[s]) for s in wanted}
        shards = {s: len(by_split[s]) for s in wanted}
        num_bytes = sum(f["num_bytes"] for s in wanted for f in by_split[s])
        record = {
            "format_version": FORMAT_VERSION,
            "data_fingerprint": data_fingerprint,
            "rows": rows,
            "shards": shards,
            "num_bytes": num_bytes,
            "labels": list(label_names or []),
            "label_column": label_column,
        }
        published = _publish(fs, tmp, final, record)
    except BaseException as exc:
        disk_full = isinstance(exc, Exception) and _is_disk_full(exc, tmp)
        written = _written_bytes(fs, tmp) if disk_full else None
        if fs.exists(tmp):
            fs.rm(tmp, recursive=True)
        if disk_full:
            error = _disk_full_error(fs, parent, data_fingerprint, expected_bytes, written, exc)
            # A local OSError's chain is short and says which file; Spark's wrapper is noise.
            raise error from (exc if isinstance(exc, OSError) else None)
        raise
    if not published:
        log.info("another task published %s first; keeping that one", target_uri)
        found = find_published(posixpath.dirname(target_uri.rstrip("/")), data_fingerprint, storage_options)
        if found is not None:
            return found
    return MaterializedDataset(
        dataset_uri=target_uri,
        data_fingerprint=data_fingerprint,
        rows=rows,
        labels=list(label_names or []),
        reused=False,
        seconds=time.monotonic() - started,
        shards=shards,
        num_bytes=num_bytes,
    )


def _written_bytes(fs: Any, path: str) -> int | None:
    try:
        return int(fs.du(path, total=True)) if fs.exists(path) else 0
    except Exception:  # the size is for the message only
        return None


def _mount_point(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _disk_full_error(
    fs: Any,
    parent: str,
    data_fingerprint: str,
    expected_bytes: int | None,
    written_bytes: int | None,
    cause: BaseException,
) -> DiskFullError:
    """One message with the cause, the location, the sizes known and the fix."""
    location = _uri(fs, parent)
    volume_bytes = free_bytes = None
    volume = location
    if _is_local(fs):
        with contextlib.suppress(OSError):
            usage = os.statvfs(parent)
            volume_bytes, free_bytes = usage.f_blocks * usage.f_frsize, usage.f_bavail * usage.f_frsize
            volume = _mount_point(parent)
    needed = expected_bytes if expected_bytes and expected_bytes > (written_bytes or 0) else None
    what = os.strerror(errno.EDQUOT) if _is_quota(cause) else os.strerror(errno.ENOSPC)
    parts = [f"{what}: the dataset {data_fingerprint} under {location} did not fit"]
    if written_bytes is not None:
        parts.append(f" ({_mb(written_bytes)} had been written in finished shards)")
    if needed is not None:
        parts.append(f"; it needs about {_mb(needed)} (the Parquet source's uncompressed size)")
    elif written_bytes:
        parts.append(f"; it needs more than {_mb(written_bytes)}")
    if volume_bytes is not None:
        parts.append(
            f"; the volume mounted at {volume} holds {_mb(volume_bytes)} in all, {_mb(free_bytes)} free now"
        )
    parts.append(". Nothing was published and the partial write was removed. ")
    elsewhere = (
        "point the datasets at a bigger volume (the datasets_root of materialize_dataset, or "
        "SPARKTUNE_LAKE_URI for the pipeline, whose datasets go to <lake>/datasets)"
    )
    if needed is not None and volume_bytes is not None and needed > volume_bytes:
        parts.append(f"The dataset is larger than the whole volume; to fix, {elsewhere}.")
    elif needed is not None and free_bytes is not None and needed > free_bytes:
        parts.append(f"To fix, free at least {_mb(needed - free_bytes)} on {volume}, or {elsewhere}.")
    else:
        parts.append(f"To fix, free space on {volume}, or {elsewhere}.")
    return DiskFullError(
        "".join(parts),
        location=location,
        needed_bytes=needed,
        written_bytes=written_bytes,
        volume_bytes=volume_bytes,
        free_bytes=free_bytes,
    )


def _is_quota(exc: BaseException) -> bool:
    return any(
        (isinstance(e, OSError) and e.errno == errno.EDQUOT) or os.strerror(errno.EDQUOT) in str(e)
        for e in _chain(exc)
    )


def _distinct_labels(df: DataFrame, label_column: str) -> list[str]:
    # The one pass over the data besides the write: a distinct of a low-cardinality column.
    # The pipeline passes the labels prepare_data found instead, and executors check them.
    from pyspark.sql import functions as F

    found = df.select(label_column).where(F.col(label_column).isNotNull()).distinct().collect()
    return sorted(str(row[0]) for row in found)


def _missing_label_column(label_column: str, columns: list[str]) -> MaterializeError:
    return MaterializeError(
        f"label column {label_column!r} is not in the data (columns: {columns}); "
        "pass label_column=<your label column>, or label_column=None for no ClassLabel"
    )


def write_dataset_dict(
    df: DataFrame,
    target_uri: str,
    *,
    data_fingerprint: str,
    split_column: str | None = "split",
    label_column: str | None = "label",
    label_names: list[str] | None = None,
    splits: list[str] | None = None,
    storage_options: dict | None = None,
    arrow_batch_rows: int = ARROW_BATCH_ROWS,
) -> MaterializedDataset:
    """Write any DataFrame as a DatasetDict at ``target_uri`` through the executors (``mapInArrow``).

    ``split_column`` names the column that assigns rows to splits (dropped from the features);
    without it every row goes to ``train``. ``label_names`` fixes the ``ClassLabel`` order;
    ``None`` takes the sorted distinct labels (a small aggregation, not the data). Set
    ``label_column=None`` to keep labels as they are (e.g. free text for generation tasks).
    Nothing is collected but one small record per shard.
    """
    started = time.monotonic()
    target_uri = _absolute(target_uri)
    if split_column and split_column not in df.columns:
        split_column = None
    if label_column and label_column not in df.columns:
        raise _missing_label_column(label_column, df.columns)
    if label_column and label_names is None:
        label_names = _distinct_labels(df, label_column)
    features = dataset_features(df, split_column, label_column, label_names)
    spark = df.sparkSession

    def write_shards(tmp_uri: str) -> list[dict]:
        writer = _dataframe_shard_writer(
            tmp_uri=tmp_uri,
            schema=features.arrow_schema,
            split_column=split_column,
            label_column=label_column,
            label_names=label_names,
            expected_splits=list(splits) if splits else None,
            storage_options=storage_options,
        )
        previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", None)
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch_rows))
        try:
            return [row.asDict() for row in df.mapInArrow(writer, SHARD_RECORD_DDL).collect()]
        finally:
            if previous is None:
                spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
            else:
                spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)

    return _build(
        target_uri,
        write_shards=write_shards,
        features=features,
        data_fingerprint=data_fingerprint,
        label_column=label_column,
        label_names=label_names,
        splits=splits,
        storage_options=storage_options,
        started=started,
    )


def parquet_files_by_split(
    uri: str, split_column: str | None = "split", storage_options: dict | None = None
) -> dict[str | None, list[str]]:
    """The data files of a Parquet folder (or one file) by their ``<split_column>=<name>`` folder.

    Skips ``_``/``.`` entries like Spark does. Files outside any such folder (or every file,
    when ``split_column`` is None) are under ``None``.
    """
    from urllib.parse import unquote

    fs, root = _fs(_absolute(uri), storage_options)
    root = root.rstrip("/")
    grouped: dict[str | None, list[str]] = {}
    for path in [root] if fs.isfile(root) else sorted(fs.find(root)):
        parts = path[len(root) + 1 :].split("/") if path != root else [posixpath.basename(path)]
        if not path.endswith(".parquet") or any(p.startswith(("_", ".")) for p in parts):
            continue
        prefix = f"{split_column}=" if split_column else None
        found = [unquote(p[len(prefix) :]) for p in parts[:-1] if prefix and p.startswith(prefix)]
        grouped.setdefault(found[0] if found else None, []).append(_uri(fs, path))
    return grouped


def parquet_files(uri: str, storage_options: dict | None = None) -> list[str]:
    """Every data file of a Parquet folder (or one file), in path order."""
    return sorted(f for files in parquet_files_by_split(uri, None, storage_options).values() for f in files)


def _parquet_units(files: list[str], storage_options: dict | None) -> list[tuple[str, list[int], int]]:
    """``(file, row groups, uncompressed bytes)`` work units of about UNIT_BYTES each, from the footers."""
    import pyarrow.parquet as pq

    units = []
    for uri in files:
        fs, path = _fs(uri, storage_options)
        with fs.open(path, "rb") as handle:
            metadata = pq.ParquetFile(handle).metadata
        group: list[int] = []
        size = 0
        for index in range(metadata.num_row_groups):
            group.append(index)
            size += metadata.row_group(index).total_byte_size
            if size >= UNIT_BYTES:
                units.append((uri, group, size))
                group, size = [], 0
        if group or not units or units[-1][0] != uri:
            units.append((uri, group, size))
    return units


def write_dataset_dict_from_parquet(
    spark: SparkSession | None,
    parquet_uri: str,
    target_uri: str,
    *,
    data_fingerprint: str,
    split_column: str | None = "split",
    label_column: str | None = "label",
    label_names: list[str] | None = None,
    splits: list[str] | None = None,
    storage_options: dict | None = None,
    local_below_bytes: int = LOCAL_BELOW_BYTES,
    executors: bool | None = None,
) -> MaterializedDataset:
    """Like ``write_dataset_dict`` for Parquet (what prepare_data writes), and faster.

    Spark only schedules the work: each task reads its Parquet row groups with pyarrow and writes
    them as one Arrow shard, so no row is decoded into the JVM and converted back to Arrow.
    Splits come from ``<split_column>=<name>`` folders (Hive partitioning, as Spark writes them).

    Where executors bring nothing the same units are written by a thread pool in this process
    instead (``executors=None`` decides, ``True``/``False`` force it):

    - below ``local_below_bytes`` of Parquet: a cold Spark job with Python workers costs about
      4 s here, more than converting 256 MB takes;
    - on a ``local[...]`` master: its executors are this machine's cores too, so threads do the
      same parallel work without the JVM job (measured side by side in bench_materialize);
    - ``spark=None``.

    Memory stays about one row group per thread either way; nothing is collected.
    """
    import datasets
    import pyarrow.parquet as pq

    started = time.monotonic()
    parquet_uri, target_uri = _absolute(parquet_uri), _absolute(target_uri)
    by_split = parquet_files_by_split(parquet_uri, split_column, storage_options)
    files = sorted(f for group in by_split.values() for f in group)
    if not files:
        raise MaterializeError(
            f"{parquet_uri} holds no .parquet files; point source at prepare_data's output"
        )
    if list(by_split) == [None]:  # not partitioned by split: every row is train
        split_column, by_split = None, {DEFAULT_SPLIT: by_split[None]}
    if None in by_split:
        raise MaterializeError(
            f"{len(by_split[None])} Parquet file(s) are outside any {split_column}=<name> folder, "
            f"e.g. {by_split[None][0]}"
        )
    split_of = {f: split for split, group in by_split.items() for f in group}
    extra = sorted(set(split_of.values()) - set(splits or split_of.values()))
    if extra:
        raise MaterializeError(
            f"{parquet_uri} has split(s) {extra} beyond the expected {list(splits or [])}; "
            "pass splits=None to keep every split"
        )
    fs, first = _fs(files[0], storage_options)
    with fs.open(first, "rb") as handle:
        file_schema = pq.read_schema(handle)
    if split_column in file_schema.names:
        file_schema = file_schema.remove(file_schema.get_field_index(split_column))
    if label_column and label_column not in file_schema.names:
        raise _missing_label_column(label_column, file_schema.names)
    if label_column and label_names is None:
        label_names = (
            _distinct_labels(spark.read.parquet(parquet_uri), label_column)
            if spark is not None
            else distinct_labels_in_files(files, label_column, storage_options)
        )
    features = datasets.Features.from_arrow_schema(file_schema.remove_metadata())
    if label_column:
        features[label_column] = datasets.ClassLabel(names=list(label_names))
    units = [
        {"file": uri, "row_groups": groups, "split": split_of[uri], "bytes": size}
        for uri, groups, size in _parquet_units(files, storage_options)
    ]

    parquet_bytes = _total_size(files, storage_options)
    in_process = spark is None or (
        not executors and (executors is False or parquet_bytes < local_below_bytes or _local_master(spark))
    )

    def write_shards(tmp_uri: str) -> list[dict]:
        writer = _parquet_unit_writer(
            tmp_uri=tmp_uri,
            units=units,
            schema=features.arrow_schema,
            label_column=label_column,
            label_names=label_names,
            storage_options=storage_options,
        )
        if in_process:
            return _write_units_in_process(writer, len(units))
        ids = spark.range(0, len(units), numPartitions=len(units))
        return [row.asDict() for row in ids.mapInArrow(writer, SHARD_RECORD_DDL).collect()]

    log.info(
        "%d Parquet file(s), %.1f MB, %d unit(s): writing shards %s",
        len(files),
        parquet_bytes / 1e6,
        len(units),
        "on threads of this process" if in_process else "on the Spark executors",
    )

    return _build(
        target_uri,
        write_shards=write_shards,
        features=features,
        data_fingerprint=data_fingerprint,
        label_column=label_column,
        label_names=label_names,
        splits=splits,
        storage_options=storage_options,
        started=started,
        expected_bytes=sum(unit["bytes"] for unit in units),
    )


STALE_TEMP_SECONDS = 24 * 3600


def _remove_stale_temp_folders(fs: Any, parent: str, name: str) -> None:
    """Temp folders of builds killed long ago (a concurrent build's is young, so it is kept)."""
    if not fs.exists(parent):
        return
    for path in fs.glob(posixpath.join(parent, f"_tmp-{name}-*")):
        try:
            modified = fs.modified(path).timestamp()
        except (NotImplementedError, OSError, AttributeError):
            continue
        if time.time() - modified > STALE_TEMP_SECONDS:
            log.warning("removing %s, left by a build that was killed", path)
            fs.rm(path, recursive=True)


def _remove_unlisted_files(fs: Any, tmp: str, by_split: dict[str, list[dict]]) -> None:
    # Failed or speculative task attempts may have left shards nobody reported: drop them.
    listed = {posixpath.join(tmp, split, f["filename"]) for split, files in by_split.items() for f in files}
    for path in fs.find(tmp):
        if path.endswith(".arrow") and path not in listed:
            fs.rm(path)


def materialize_dataset(
    spark: SparkSession | None,
    source: str | DataFrame,
    datasets_root: str,
    *,
    data_fingerprint: str | None = None,
    split_column: str | None = "split",
    label_column: str | None = "label",
    label_names: list[str] | None = None,
    splits: list[str] | None = None,
    source_format: str = "auto",
    storage_options: dict | None = None,
) -> MaterializedDataset:
    """Find or build the dataset of one data version under ``datasets_root``.

    ``source`` is a DataFrame, a path (Parquet, CSV, JSON Lines; the prepared splits are
    Parquet partitioned by ``split=``) or a catalog table. Without ``data_fingerprint`` the
    content fingerprint of the source is computed first (one Spark pass over the data).
    ``spark`` may be None for a Parquet source with a fingerprint that ``converts_without_spark``.
    """
    if data_fingerprint:
        found = find_published(datasets_root, data_fingerprint, storage_options)
        if found is not None:
            log.info(
                "dataset for fingerprint %s already published at %s", data_fingerprint, found.dataset_uri
            )
            return found
    parquet = _parquet_source(source, source_format, storage_options)
    if parquet and data_fingerprint:
        df = None  # the files are read directly; no DataFrame needed
    elif parquet:
        df = spark.read.parquet(parquet)
    elif isinstance(source, str):
        from sparktune.prepare import load_source

        df = load_source(spark, source, source_format)
    else:
        df = source
    if not data_fingerprint:
        from sparktune.fingerprint import rows_digest

        digest = rows_digest(df)
        payload = json.dumps({"rows": digest, "columns": sorted(df.columns)}, sort_keys=True)
        data_fingerprint = hashlib.sha256(payload.encode()).hexdigest()[:20]
        found = find_published(datasets_root, data_fingerprint, storage_options)
        if found is not None:
            return found
    options = {
        "data_fingerprint": data_fingerprint,
        "split_column": split_column,
        "label_column": label_column,
        "label_names": label_names,
        "splits": splits,
        "storage_options": storage_options,
    }
    target = dataset_uri_for(datasets_root, data_fingerprint)
    if parquet:
        return write_dataset_dict_from_parquet(spark, parquet, target, **options)
    return write_dataset_dict(df, target, **options)


def _total_size(files: list[str], storage_options: dict | None) -> int:
    total = 0
    for uri in files:
        fs, path = _fs(uri, storage_options)
        total += fs.size(path)
    return total


def distinct_labels_in_files(files: list[str], label_column: str, storage_options: dict | None) -> list[str]:
    """The sorted distinct values of ``label_column`` over the Parquet ``files`` (any fsspec URI),
    read without Spark: the label column only, one batch at a time; nulls left out."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found: set[str] = set()
    for uri in files:
        fs, path = _fs(uri, storage_options)
        with fs.open(path, "rb") as handle:
            for batch in pq.ParquetFile(handle).iter_batches(columns=[label_column]):
                found.update(str(v) for v in pc.unique(batch.column(0)).to_pylist() if v is not None)
    return sorted(found)


def _local_master(spark: SparkSession) -> bool:
    return str(spark.conf.get("spark.master", "")).startswith("local")


def _write_units_in_process(writer: Any, n_units: int) -> list[dict]:
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


def converts_without_spark(
    source: str, source_format: str = "auto", storage_options: dict | None = None
) -> bool:
    """True when ``source`` is Parquet small enough to be converted in the calling process."""
    parquet = _parquet_source(source, source_format, storage_options)
    return (
        bool(parquet)
        and _total_size(parquet_files(parquet, storage_options), storage_options) < LOCAL_BELOW_BYTES
    )


def _parquet_source(source: Any, source_format: str, storage_options: dict | None) -> str | None:
    """The path when ``source`` is a Parquet folder or file (the fast path), else None."""
    if not isinstance(source, str) or source_format not in ("auto", "parquet"):
        return None
    if "/" not in source and "://" not in source:  # a catalog table name
        return None
    try:
        return source if parquet_files(source, storage_options) else None
    except (FileNotFoundError, OSError, ValueError):
        return None


def open_dataset(dataset_uri: str, storage_options: dict | None = None) -> datasets.DatasetDict:
    """The published DatasetDict, memory-mapped; refuses a folder whose build never finished."""
    import datasets

    fs, path = _fs(dataset_uri, storage_options)
    if not fs.exists(posixpath.join(path, MARKER)):
        raise FileNotFoundError(
            f"{dataset_uri} is not a finished dataset (no {MARKER}); run materialize_dataset for its "
            "data fingerprint, which replaces an unfinished folder"
        )
    return datasets.load_from_disk(dataset_uri, storage_options=storage_options)
