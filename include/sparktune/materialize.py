"""Prepared Parquet splits -> a Hugging Face ``DatasetDict`` on disk, keyed by the data fingerprint.

The dataset is what training opens memory-mapped on every rank, so it is built once per data
version: a second call with the same fingerprint finds the published folder and returns at once.
Publishing is a rename of a finished temp folder, so a killed task never leaves a dataset that a
later run would trust.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

SPLITS = ("train", "validation", "test")
MARKER = "_SPARKTUNE_COMPLETE.json"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaterializedDataset:
    dataset_uri: str
    data_fingerprint: str
    rows: dict[str, int]
    labels: list[str]
    reused: bool
    seconds: float

    def to_summary(self) -> dict:
        return asdict(self)


def dataset_path_for(datasets_root: str | Path, data_fingerprint: str) -> Path:
    return Path(datasets_root) / data_fingerprint


def _local_path(uri: str) -> Path:
    if uri.startswith("file://"):
        return Path(uri[len("file://") :])
    if "://" in uri:
        raise ValueError(
            f"materialize_dataset writes to a local or mounted folder for now, got {uri!r}; "
            "mount the object store (e.g. /dbfs, s3fs) and pass the mount path"
        )
    return Path(uri)


def materialize_dataset(
    prepared_uri: str, datasets_root: str | Path, data_fingerprint: str, labels: list[str]
) -> MaterializedDataset:
    """Build (or find) the DatasetDict for one data version; ``labels`` fixes the ClassLabel order."""
    import datasets

    started = time.monotonic()
    target = dataset_path_for(_local_path(str(datasets_root)), data_fingerprint)
    marker = target / MARKER
    if marker.exists():
        record = json.loads(marker.read_text())
        log.info("dataset for fingerprint %s already published at %s: reusing it", data_fingerprint, target)
        return MaterializedDataset(
            str(target), data_fingerprint, record["rows"], record["labels"], True, time.monotonic() - started
        )

    source = _local_path(prepared_uri)
    missing = [s for s in SPLITS if not (source / f"split={s}").is_dir()]
    if missing:
        raise FileNotFoundError(
            f"prepared data at {source} has no split folder(s) {missing}; run prepare_data for "
            f"fingerprint {data_fingerprint} first"
        )
    if target.exists():  # a folder without the marker was never finished: nothing may trust it
        log.warning("removing unfinished dataset folder %s", target)
        shutil.rmtree(target)
    label_feature = datasets.ClassLabel(names=sorted(labels))
    tmp = target.parent / f"_tmp-{data_fingerprint}-{uuid.uuid4().hex[:8]}"
    cache = tmp.parent / f"{tmp.name}-cache"
    try:
        parts = {}
        for split in SPLITS:
            files = sorted(str(p) for p in (source / f"split={split}").glob("*.parquet"))
            ds = datasets.Dataset.from_parquet(files, cache_dir=str(cache), keep_in_memory=False)
            # Sorted by id so the dataset's row order does not depend on Spark's partitioning.
            ds = ds.sort("example_id").cast_column("label", label_feature)
            parts[split] = ds
        dataset = datasets.DatasetDict(parts)
        dataset.save_to_disk(str(tmp))
        rows = {split: len(ds) for split, ds in parts.items()}
        (tmp / MARKER).write_text(
            json.dumps({"data_fingerprint": data_fingerprint, "rows": rows, "labels": label_feature.names})
        )
        try:
            tmp.rename(target)
        except OSError:
            if not marker.exists():  # lost a race to nothing: a real error
                raise
            log.info("another task published %s first; keeping that one", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return MaterializedDataset(
        str(target), data_fingerprint, rows, label_feature.names, False, time.monotonic() - started
    )
