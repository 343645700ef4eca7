"""A dataset on disk: the ``DatasetDict.save_to_disk`` layout, built in a temp folder and published
under ``<root>/<data fingerprint>`` with a completion marker written last; found and opened by it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sparktune.data.arrow_shards import DEFAULT_SPLIT
from sparktune.data.dataset_fs import filesystem, is_local, to_uri
from sparktune.data.materialize_errors import disk_full_error, executor_error, is_disk_full, written_bytes

if TYPE_CHECKING:
    import datasets

log = logging.getLogger(__name__)

MARKER = "_SPARKTUNE_COMPLETE.json"
FORMAT_VERSION = 1
STALE_TEMP_SECONDS = 24 * 3600


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


def dataset_uri_for(root_uri: str, data_fingerprint: str) -> str:
    return posixpath.join(str(root_uri).rstrip("/"), data_fingerprint)


def find_published(
    root_uri: str, data_fingerprint: str, storage_options: dict | None = None
) -> MaterializedDataset | None:
    """The published dataset of this data version, if any; reads one small file, starts no Spark."""
    started = time.monotonic()
    uri = dataset_uri_for(root_uri, data_fingerprint)
    fs, path = filesystem(uri, storage_options)
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


def open_dataset(dataset_uri: str, storage_options: dict | None = None) -> datasets.DatasetDict:
    """The published DatasetDict, memory-mapped; refuses a folder whose build never finished."""
    import datasets

    fs, path = filesystem(dataset_uri, storage_options)
    if not fs.exists(posixpath.join(path, MARKER)):
        raise FileNotFoundError(
            f"{dataset_uri} is not a finished dataset (no {MARKER}); run materialize_dataset for its "
            "data fingerprint, which replaces an unfinished folder"
        )
    return datasets.load_from_disk(dataset_uri, storage_options=storage_options)


def build_dataset(
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
    fs, final = filesystem(target_uri, storage_options)
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
            known = executor_error(exc)
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
        disk_full = isinstance(exc, Exception) and is_disk_full(exc, tmp)
        written = written_bytes(fs, tmp) if disk_full else None
        if fs.exists(tmp):
            fs.rm(tmp, recursive=True)
        if disk_full:
            error = disk_full_error(fs, parent, data_fingerprint, expected_bytes, written, exc)
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
    info.write_to_directory(to_uri(fs, split_path), pretty_print=True, storage_options=storage_options)


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
    if is_local(fs):
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
