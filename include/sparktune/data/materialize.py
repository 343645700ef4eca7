"""Spark data -> a Hugging Face ``DatasetDict`` on disk, written where the data is.

The result has the exact layout ``DatasetDict.save_to_disk`` produces (``<split>/data-*.arrow``,
``state.json``, ``dataset_info.json``, ``dataset_dict.json``), so ``datasets.load_from_disk``
opens it memory-mapped. One shard writer (pyarrow only, :mod:`sparktune.data.arrow_shards`)
serves three ways in:

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

Content addressing (:mod:`sparktune.data.published_dataset`): a dataset lives at
``<root>/<data fingerprint>``, and it is trusted only when its ``_SPARKTUNE_COMPLETE.json`` marker
exists, which is written last. Shards are written to a temp folder, fsynced, then the folder is
renamed, so a task killed halfway never leaves a dataset that a later run would use. Checking for a
published dataset needs no Spark at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING

from sparktune.data.arrow_shards import (
    ARROW_BATCH_ROWS,
    DEFAULT_SPLIT,
    SHARD_RECORD_DDL,
    dataframe_shard_writer,
    parquet_unit_writer,
    write_units_in_process,
)
from sparktune.data.dataset_fs import absolute_uri, filesystem
from sparktune.data.materialize_errors import (
    MaterializeError,
)
from sparktune.data.parquet_files import (
    distinct_labels_in_files,
    parquet_files,
    parquet_files_by_split,
    parquet_source,
    parquet_units,
    total_size,
)
from sparktune.data.published_dataset import (
    MaterializedDataset,
    build_dataset,
    dataset_uri_for,
    find_published,
)

if TYPE_CHECKING:
    import datasets
    from pyspark.sql import DataFrame, SparkSession

# Below this much Parquet the shards are written in the calling process (see
# write_dataset_dict_from_parquet): a cold Spark job with Python workers costs about 4 s.
LOCAL_BELOW_BYTES = 256 * 2**20
DATASET_MODES = ("materialized", "streaming")
log = logging.getLogger(__name__)


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
    target_uri = absolute_uri(target_uri)
    if split_column and split_column not in df.columns:
        split_column = None
    if label_column and label_column not in df.columns:
        raise _missing_label_column(label_column, df.columns)
    if label_column and label_names is None:
        label_names = _distinct_labels(df, label_column)
    features = dataset_features(df, split_column, label_column, label_names)
    spark = df.sparkSession

    def write_shards(tmp_uri: str) -> list[dict]:
        writer = dataframe_shard_writer(
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

    return build_dataset(
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
    parquet_uri, target_uri = absolute_uri(parquet_uri), absolute_uri(target_uri)
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
    fs, first = filesystem(files[0], storage_options)
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
        for uri, groups, size in parquet_units(files, storage_options)
    ]

    parquet_bytes = total_size(files, storage_options)
    in_process = spark is None or (
        not executors and (executors is False or parquet_bytes < local_below_bytes or _local_master(spark))
    )

    def write_shards(tmp_uri: str) -> list[dict]:
        writer = parquet_unit_writer(
            tmp_uri=tmp_uri,
            units=units,
            schema=features.arrow_schema,
            label_column=label_column,
            label_names=label_names,
            storage_options=storage_options,
        )
        if in_process:
            return write_units_in_process(writer, len(units))
        ids = spark.range(0, len(units), numPartitions=len(units))
        return [row.asDict() for row in ids.mapInArrow(writer, SHARD_RECORD_DDL).collect()]

    log.info(
        "%d Parquet file(s), %.1f MB, %d unit(s): writing shards %s",
        len(files),
        parquet_bytes / 1e6,
        len(units),
        "on threads of this process" if in_process else "on the Spark executors",
    )

    return build_dataset(
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
    parquet = parquet_source(source, source_format, storage_options)
    if parquet and data_fingerprint:
        df = None  # the files are read directly; no DataFrame needed
    elif parquet:
        df = spark.read.parquet(parquet)
    elif isinstance(source, str):
        from sparktune.data.prepare_source import load_source

        df = load_source(spark, source, source_format)
    else:
        df = source
    if not data_fingerprint:
        from sparktune.data.fingerprint import rows_digest

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


def _local_master(spark: SparkSession) -> bool:
    return str(spark.conf.get("spark.master", "")).startswith("local")


def converts_without_spark(
    source: str, source_format: str = "auto", storage_options: dict | None = None
) -> bool:
    """True when ``source`` is Parquet small enough to be converted in the calling process."""
    parquet = parquet_source(source, source_format, storage_options)
    return (
        bool(parquet)
        and total_size(parquet_files(parquet, storage_options), storage_options) < LOCAL_BELOW_BYTES
    )
