"""The Parquet a dataset is converted from, read from its files alone (no Spark): the data files per
``split=`` folder, their row groups in work units, their size and the labels they hold.
"""

from __future__ import annotations

import posixpath
from typing import Any

from sparktune.data.dataset_fs import absolute_uri, filesystem, to_uri

# Parquet row groups are grouped into work units of about this many uncompressed bytes: one
# Spark task and one shard each.
UNIT_BYTES = 256 * 2**20


def parquet_files_by_split(
    uri: str, split_column: str | None = "split", storage_options: dict | None = None
) -> dict[str | None, list[str]]:
    """The data files of a Parquet folder (or one file) by their ``<split_column>=<name>`` folder.

    Skips ``_``/``.`` entries like Spark does. Files outside any such folder (or every file,
    when ``split_column`` is None) are under ``None``.
    """
    from urllib.parse import unquote

    fs, root = filesystem(absolute_uri(uri), storage_options)
    root = root.rstrip("/")
    grouped: dict[str | None, list[str]] = {}
    for path in [root] if fs.isfile(root) else sorted(fs.find(root)):
        parts = path[len(root) + 1 :].split("/") if path != root else [posixpath.basename(path)]
        if not path.endswith(".parquet") or any(p.startswith(("_", ".")) for p in parts):
            continue
        prefix = f"{split_column}=" if split_column else None
        found = [unquote(p[len(prefix) :]) for p in parts[:-1] if prefix and p.startswith(prefix)]
        grouped.setdefault(found[0] if found else None, []).append(to_uri(fs, path))
    return grouped


def parquet_files(uri: str, storage_options: dict | None = None) -> list[str]:
    """Every data file of a Parquet folder (or one file), in path order."""
    return sorted(f for files in parquet_files_by_split(uri, None, storage_options).values() for f in files)


def parquet_units(files: list[str], storage_options: dict | None) -> list[tuple[str, list[int], int]]:
    """``(file, row groups, uncompressed bytes)`` work units of about UNIT_BYTES each, from the footers."""
    import pyarrow.parquet as pq

    units = []
    for uri in files:
        fs, path = filesystem(uri, storage_options)
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


def total_size(files: list[str], storage_options: dict | None) -> int:
    """The bytes of ``files`` on their store (compressed Parquet, as stored)."""
    total = 0
    for uri in files:
        fs, path = filesystem(uri, storage_options)
        total += fs.size(path)
    return total


def distinct_labels_in_files(files: list[str], label_column: str, storage_options: dict | None) -> list[str]:
    """The sorted distinct values of ``label_column`` over the Parquet ``files`` (any fsspec URI),
    read without Spark: the label column only, one batch at a time; nulls left out."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found: set[str] = set()
    for uri in files:
        fs, path = filesystem(uri, storage_options)
        with fs.open(path, "rb") as handle:
            for batch in pq.ParquetFile(handle).iter_batches(columns=[label_column]):
                found.update(str(v) for v in pc.unique(batch.column(0)).to_pylist() if v is not None)
    return sorted(found)


def parquet_source(source: Any, source_format: str, storage_options: dict | None) -> str | None:
    """The path when ``source`` is a Parquet folder or file (the fast path), else None."""
    if not isinstance(source, str) or source_format not in ("auto", "parquet"):
        return None
    if "/" not in source and "://" not in source:  # a catalog table name
        return None
    try:
        return source if parquet_files(source, storage_options) else None
    except (FileNotFoundError, OSError, ValueError):
        return None
