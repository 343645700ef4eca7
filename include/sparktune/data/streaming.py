"""``dataset_mode=streaming``: training reads the prepared Parquet shards as they are.

For data larger than the local disk of the training machine nothing is materialized: the
train split becomes a ``datasets.IterableDataset`` over the Parquet files (any fsspec URI),
shuffled through a buffer and prefetched by DataLoader workers; the small validation split is
read into memory. Row counts come from the Parquet footers, so no data is scanned to plan steps.
"""

from __future__ import annotations

import posixpath
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasets

SPLITS = ("train", "validation", "test")
SHUFFLE_BUFFER = 10_000


def _fs(uri: str, storage_options: dict | None) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    return url_to_fs(uri, **(storage_options or {}))


def parquet_split_files(
    prepared_uri: str, splits: tuple[str, ...] = SPLITS, storage_options: dict | None = None
) -> dict[str, list[str]]:
    """``split -> Parquet files`` of a folder partitioned by ``split=`` (what prepare_data writes)."""
    from sparktune.data.parquet_files import parquet_files_by_split

    grouped = parquet_files_by_split(prepared_uri, "split", storage_options)
    files: dict[str, list[str]] = {}
    for split in splits:
        if not grouped.get(split):
            raise FileNotFoundError(
                f"{prepared_uri} has no Parquet files for split {split!r} (expected "
                f"{posixpath.join(prepared_uri, f'split={split}')}/*.parquet); run prepare_data first"
            )
        files[split] = grouped[split]
    return files


def footer_rows(files: list[str], storage_options: dict | None = None) -> int:
    """Rows in Parquet files, read from their footers only."""
    import pyarrow.parquet as pq

    total = 0
    for uri in files:
        fs, path = _fs(uri, storage_options)
        with fs.open(path, "rb") as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


def describe_parquet_splits(
    prepared_uri: str,
    data_fingerprint: str | None,
    label_names: list[str] | None,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """The materialize summary of a streaming run: where the shards are and how many rows each split has."""
    started = time.monotonic()
    files = parquet_split_files(prepared_uri, storage_options=storage_options)
    return {
        "dataset_uri": prepared_uri,
        "dataset_mode": "streaming",
        "data_fingerprint": data_fingerprint,
        "rows": {split: footer_rows(paths, storage_options) for split, paths in files.items()},
        "shards": {split: len(paths) for split, paths in files.items()},
        "labels": list(label_names or []),
        "reused": False,
        "num_bytes": None,
        "seconds": time.monotonic() - started,
    }


def open_streaming_splits(
    prepared_uri: str,
    columns: list[str],
    storage_options: dict | None = None,
) -> tuple[datasets.IterableDataset, datasets.Dataset, int]:
    """``(train stream, validation in memory, train rows)`` for a training run in streaming mode.

    The train stream comes in file order: :func:`shuffle_stream` shuffles it once the trainer has
    looked at it.
    """
    import datasets

    files = parquet_split_files(prepared_uri, ("train", "validation"), storage_options)
    train = datasets.load_dataset(
        "parquet",
        data_files={"train": files["train"]},
        split="train",
        streaming=True,
        columns=columns,
        storage_options=storage_options,
    )
    validation = read_split(prepared_uri, "validation", columns, storage_options, files["validation"])
    return train, validation, footer_rows(files["train"], storage_options)


def shuffle_stream(
    stream: datasets.IterableDataset, seed: int, *, read_in_worker_processes: bool = False
) -> datasets.IterableDataset:
    """Shards shuffled per epoch and rows through a buffer: the streaming stand-in for a full random
    permutation, which would need random access to the whole split.

    Applied after the trainer is built, not when the stream is opened: TRL reads the first example
    of the train set three or four times while it prepares it, and every read of a shuffled Parquet
    stream that stops early ends with a 5-second pause in ``datasets`` (5.2,
    ``config.SLEEP_TIME_ON_THREADS_SHUTDOWN``, a guard against apache/arrow#45214) that the
    unshuffled stream does not make: 15-20 s of every streaming run's start.

    ``read_in_worker_processes``: only DataLoader worker processes iterate the stream. The same
    pause then ends every pass, 5 s per epoch. It guards against Arrow's reader threads outliving
    the interpreter's finalization, which a forked DataLoader worker never runs (it leaves through
    ``os._exit``), so this process's ``datasets`` is set to skip it; the workers fork with that.
    """
    if read_in_worker_processes:
        import datasets

        datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0
    return stream.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)


def is_prepared_parquet(uri: str, storage_options: dict | None = None) -> bool:
    """True for a prepare_data output (``split=`` folders of Parquet) rather than a saved dataset."""
    fs, root = _fs(uri, storage_options)
    return bool(fs.glob(posixpath.join(root, "split=*")))


def read_split(
    prepared_uri: str,
    split: str,
    columns: list[str] | None = None,
    storage_options: dict | None = None,
    files: list[str] | None = None,
) -> datasets.Dataset:
    """One (small) split of the prepared Parquet, in memory: validation and test in streaming mode."""
    import datasets

    files = files or parquet_split_files(prepared_uri, (split,), storage_options)[split]
    stream = datasets.load_dataset(
        "parquet",
        data_files={split: files},
        split=split,
        streaming=True,
        columns=columns,
        storage_options=storage_options,
    )
    return datasets.Dataset.from_list(list(stream))
