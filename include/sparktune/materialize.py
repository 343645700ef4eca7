"""A Spark DataFrame -> a Hugging Face ``DatasetDict`` on disk, written by the executors.

Each Spark task turns its partition into Arrow IPC shards in the exact layout
``DatasetDict.save_to_disk`` produces (``<split>/data-*.arrow``, ``state.json``,
``dataset_info.json``, ``dataset_dict.json``), so ``datasets.load_from_disk`` opens the result
memory-mapped. The driver only receives one small record per shard (file name, rows, bytes).

Why not a library call: ``Dataset.from_spark`` also writes through ``mapInArrow``, but into a
cache keyed on the plan's ``semanticHash`` (not the data), then re-reads and copies every shard
on the driver; the Parquet round trip writes compressed Parquet and converts it to Arrow again
in a single driver process. Both pay for the data twice. Measured side by side in
``benchmarks/bench_materialize.py``.

Content addressing: a dataset lives at ``<root>/<data fingerprint>``, and it is trusted only
when its ``_SPARKTUNE_COMPLETE.json`` marker exists, which is written last. Shards are written
to a temp folder, fsynced, then the folder is renamed, so a task killed halfway never leaves a
dataset that a later run would use. Checking for a published dataset needs no Spark at all.
"""

from __future__ import annotations

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

SPLITS = ("train", "validation", "test")
MARKER = "_SPARKTUNE_COMPLETE.json"
FORMAT_VERSION = 1
DEFAULT_SPLIT = "train"
# Arrow batches Spark hands each Python worker; bigger batches mean fewer, larger IPC messages.
ARROW_BATCH_ROWS = 65_536
SHARD_RECORD_DDL = "split string, partition int, filename string, num_rows long, num_bytes long"
DATASET_MODES = ("materialized", "streaming")
log = logging.getLogger(__name__)


class MaterializeError(ValueError):
    """The source cannot become a dataset as asked (missing column, unknown labels)."""


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


def _shard_writer(
    *,
    tmp_uri: str,
    features_json: dict,
    split_column: str | None,
    label_column: str | None,
    label_names: list[str] | None,
    storage_options: dict | None,
):
    """The function each Spark task runs: its rows -> one Arrow shard per split, one record per shard."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import datasets
        import pyarrow as pa
        import pyarrow.compute as pc
        from datasets.arrow_writer import ArrowWriter
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        # Unique per attempt: a retried or speculative task never appends to a dead attempt's file.
        token = uuid.uuid4().hex[:12]
        features = datasets.Features.from_dict(features_json)
        value_set = pa.array(label_names, pa.string()) if label_names is not None else None
        fs, _ = _fs(tmp_uri, storage_options)
        writers: dict[str, tuple[Any, str]] = {}

        def writer_for(split: str) -> Any:
            if split not in writers:
                path = posixpath.join(tmp_uri, split, f"data-{partition:05d}-{token}.arrow")
                fs.makedirs(posixpath.dirname(_fs(path, storage_options)[1]), exist_ok=True)
                writers[split] = (
                    ArrowWriter(features=features, path=path, storage_options=storage_options),
                    path,
                )
            return writers[split][0]

        def encode(table: pa.Table) -> pa.Table:
            if value_set is None:
                return table
            labels = table[label_column]
            ids = pc.index_in(labels, value_set=value_set)
            unknown = pc.sum(pc.and_(pc.is_null(ids), pc.is_valid(labels))).as_py() or 0
            if unknown:
                examples = pc.unique(pc.filter(labels, pc.is_null(ids))).to_pylist()[:5]
                raise MaterializeError(
                    f"{unknown} row(s) have labels outside the declared label names {label_names}, "
                    f"e.g. {examples}; pass label_names=None to take them from the data"
                )
            return table.set_column(
                table.schema.get_field_index(label_column), label_column, ids.cast(pa.int64())
            )

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
                if split is None:
                    raise MaterializeError(f"rows with a null {split_column!r}: every row needs a split name")
                writer_for(split).write_table(encode(part))

        records = []
        for split, (writer, path) in writers.items():
            num_rows, num_bytes = writer.finalize()
            writer.close()
            _fsync(_fs(path, storage_options)[1], fs)
            records.append(
                {
                    "split": split,
                    "partition": partition,
                    "filename": posixpath.basename(path),
                    "num_rows": num_rows,
                    "num_bytes": num_bytes,
                }
            )
        if records:
            yield pa.RecordBatch.from_pylist(
                records,
                schema=pa.schema(
                    [
                        ("split", pa.string()),
                        ("partition", pa.int32()),
                        ("filename", pa.string()),
                        ("num_rows", pa.int64()),
                        ("num_bytes", pa.int64()),
                    ]
                ),
            )

    return write


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
    """Write ``df`` as a DatasetDict at ``target_uri`` through the executors; nothing is collected.

    ``split_column`` names the column that assigns rows to splits (dropped from the features);
    without it every row goes to ``train``. ``label_names`` fixes the ``ClassLabel`` order;
    ``None`` takes the sorted distinct labels (a small aggregation, not the data). Set
    ``label_column=None`` to keep labels as they are (e.g. free text for generation tasks).
    """
    started = time.monotonic()
    if "://" not in target_uri:  # executors resolve paths on their own working directory
        target_uri = os.path.abspath(target_uri)
    if split_column and split_column not in df.columns:
        split_column = None
    if label_column and label_column not in df.columns:
        raise MaterializeError(
            f"label column {label_column!r} is not in the data (columns: {df.columns}); "
            "pass label_column=<your label column>, or label_column=None for no ClassLabel"
        )
    # One small aggregation (two low-cardinality columns) checks the split and label values on
    # the driver, so bad input fails with a plain message before any shard is written.
    keys = [c for c in (split_column, label_column) if c]
    combos = [row.asDict() for row in df.select(*keys).distinct().collect()] if keys else []
    if split_column:
        found_splits = {c[split_column] for c in combos}
        if None in found_splits:
            raise MaterializeError(f"some rows have a null {split_column!r}: every row needs a split name")
        extra = sorted(found_splits - set(splits or found_splits))
        if extra:
            raise MaterializeError(
                f"the data has rows in split(s) {extra} beyond the expected {list(splits or [])}; "
                f"fix the {split_column!r} column or pass splits=None"
            )
    if label_column:
        found_labels = {str(c[label_column]) for c in combos if c[label_column] is not None}
        if label_names is None:
            label_names = sorted(found_labels)
        elif found_labels - set(label_names):
            raise MaterializeError(
                f"labels {sorted(found_labels - set(label_names))} are not among the declared label "
                f"names {list(label_names)}; add them, or pass label_names=None to take them from the data"
            )
    features = dataset_features(df, split_column, label_column, label_names)

    fs, final = _fs(target_uri, storage_options)
    parent = posixpath.dirname(final.rstrip("/"))
    tmp = posixpath.join(parent, f"_tmp-{posixpath.basename(final.rstrip('/'))}-{uuid.uuid4().hex[:8]}")
    tmp_uri = target_uri.rstrip("/").rsplit("/", 1)[0] + "/" + posixpath.basename(tmp)
    _remove_stale_temp_folders(fs, parent, posixpath.basename(final.rstrip("/")))
    fs.makedirs(tmp, exist_ok=True)
    spark = df.sparkSession
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", None)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch_rows))
    try:
        writer = _shard_writer(
            tmp_uri=tmp_uri,
            features_json=features.to_dict(),
            split_column=split_column,
            label_column=label_column,
            label_names=label_names,
            storage_options=storage_options,
        )
        records = [row.asDict() for row in df.mapInArrow(writer, SHARD_RECORD_DDL).collect()]
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
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp, recursive=True)
        raise
    finally:
        if previous is None:
            spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        else:
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
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
    spark: SparkSession,
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
    """
    if data_fingerprint:
        found = find_published(datasets_root, data_fingerprint, storage_options)
        if found is not None:
            log.info(
                "dataset for fingerprint %s already published at %s", data_fingerprint, found.dataset_uri
            )
            return found
    if isinstance(source, str):
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
    return write_dataset_dict(
        df,
        dataset_uri_for(datasets_root, data_fingerprint),
        data_fingerprint=data_fingerprint,
        split_column=split_column,
        label_column=label_column,
        label_names=label_names,
        splits=splits,
        storage_options=storage_options,
    )


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
