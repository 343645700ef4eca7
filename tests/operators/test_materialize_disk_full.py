"""The disk fills during materialize_dataset: a real, small tmpfs as the datasets root.

What must hold on every path the pipeline writes a dataset by (the operator converting small
Parquet in its own process; spark-submit with the shards written by Spark executors): one error
naming the cause, the location, the size and the fix; nothing left that ``find_published`` or a
later run would trust, and the partial write removed; with free space, a later run builds the
same dataset a clean run does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sparktune.data.materialize import write_dataset_dict_from_parquet
from sparktune.data.published_dataset import MARKER, find_published, open_dataset

LABELS = ["billing", "login", "shipping"]
SPLITS = ["train", "validation", "test"]
FINGERPRINT = "fp-disk-full"
# 4 Parquet files of 320 rows of ~1 KB unique text: 4 shards of ~0.36 MB, ~1.4 MB as Arrow.
FILES_PER_SPLIT = {"train": 2, "validation": 1, "test": 1}
ROWS_PER_FILE = 320


def _prepared(root: Path) -> Path:
    """The layout prepare_data writes (Parquet under split=<name>), texts that do not compress away."""
    for split, n_files in FILES_PER_SPLIT.items():
        (root / f"split={split}").mkdir(parents=True)
        for part in range(n_files):
            ids = [f"{split}-{part}-{i:04d}" for i in range(ROWS_PER_FILE)]
            texts = ["".join(hashlib.sha256(f"{i}/{k}".encode()).hexdigest() for k in range(16)) for i in ids]
            table = pa.table(
                {
                    "example_id": ids,
                    "text": texts,
                    "label": [LABELS[i % 3] for i in range(ROWS_PER_FILE)],
                    "n_tokens": list(range(ROWS_PER_FILE)),
                }
            )
            pq.write_table(table, root / f"split={split}" / f"part-{part:05d}.parquet")
    return root


@pytest.fixture
def small_disk(tmp_path):
    """``mount(size)`` mounts a real tmpfs of that size at one folder (remounting replaces the
    last one: a bigger volume at the same path); every mount is undone after the test."""
    point = tmp_path / "disk"
    point.mkdir()
    mounted: list[Path] = []

    def unmount() -> None:
        while mounted:
            subprocess.run(["umount", str(mounted.pop())], check=True, capture_output=True)

    def mount(size: str) -> Path:
        unmount()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            reason = " ".join(done.stderr.split())  # one line in the -rs summary
            if os.geteuid() != 0 or "permission denied" in reason.lower() or "only root" in reason:
                pytest.skip(
                    f"cannot mount a tmpfs here ({reason or 'not root'}): the full-disk tests need root or "
                    "CAP_SYS_ADMIN; run them as root (CI does) or in a container started with "
                    "--cap-add SYS_ADMIN"
                )
            pytest.fail(f"mount -t tmpfs failed: {reason}")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(point)], check=False)


def _assert_nothing_left(disk: Path) -> None:
    """No dataset folder, no temp folder, no byte used: the partial write is gone."""
    assert find_published(str(disk / "datasets"), FINGERPRINT) is None
    assert [p.name for p in (disk / "datasets").iterdir()] == []
    assert shutil.disk_usage(disk).used == 0


def _assert_clear_message(message: str, disk: Path) -> float:
    """Cause, location, size and fix in the one message; returns the MB written before it filled."""
    assert "No space left on device" in message
    assert str(disk / "datasets") in message
    assert re.search(r"needs about \d+\.\d MB", message), message
    assert "datasets_root" in message and "SPARKTUNE_LAKE_URI" in message
    assert "Traceback" not in message and "PythonException" not in message and "py4j" not in message
    written = re.search(r"(\d+\.\d) MB had been written", message)
    assert written, message
    return float(written.group(1))


def _assert_same_dataset(built: str, reference: str) -> None:
    """What a clean run on a big disk builds: the same record, split infos and rows."""
    assert json.loads(Path(built, MARKER).read_text()) == json.loads(Path(reference, MARKER).read_text())
    loaded, expected = open_dataset(built), open_dataset(reference)
    for split in SPLITS:
        info = Path(built, split, "dataset_info.json").read_text()
        assert info == Path(reference, split, "dataset_info.json").read_text()
        assert loaded[split].features == expected[split].features
        key = lambda row: row["example_id"]  # noqa: E731
        assert sorted(loaded[split].to_list(), key=key) == sorted(expected[split].to_list(), key=key)


@pytest.fixture(scope="module")
def prepared_and_reference(tmp_path_factory):
    """The prepared data and the dataset a clean run builds from it on a big disk."""
    folder = tmp_path_factory.mktemp("disk-full")
    prepared = _prepared(folder / "prepared")
    reference = write_dataset_dict_from_parquet(
        None, str(prepared), str(folder / "reference" / FINGERPRINT), data_fingerprint=FINGERPRINT
    )
    return str(prepared), reference.dataset_uri


def _operator(prepared: str, disk: Path):
    from sparktune_airflow import MaterializeDatasetOperator

    # As llm_finetune wires it: prepare_data's output, fingerprint and labels, the three splits.
    return MaterializeDatasetOperator(
        task_id="materialize_dataset",
        source=prepared,
        datasets_root=str(disk / "datasets"),
        data_fingerprint=FINGERPRINT,
        label_names=LABELS,
        splits=SPLITS,
        spark_binary="/nonexistent/spark-submit",  # small Parquet: converted in the task's process
    )


def test_a_dataset_bigger_than_its_volume_fails_at_once_and_a_bigger_volume_then_works(
    small_disk, prepared_and_reference
):
    prepared, reference = prepared_and_reference
    disk = small_disk("1m")  # the dataset is ~1.4 MB
    operator = _operator(prepared, disk)
    with pytest.raises(AirflowFailException) as failed:  # no retry can make it fit
        operator.execute(context={})
    message = str(failed.value)
    written = _assert_clear_message(message, disk)
    assert 0.3 <= written <= 1.1  # it failed part-way, after whole shards (~0.36 MB) were written
    assert "larger than the whole volume" in message
    _assert_nothing_left(disk)

    disk = small_disk("8m")  # the fix the message names: a bigger volume at the same datasets_root
    summary = operator.execute(context={})
    assert not summary["reused"] and summary["rows"] == {"train": 640, "validation": 320, "test": 320}
    _assert_same_dataset(summary["dataset_uri"], reference)


def test_a_volume_filled_by_other_files_is_retried_and_the_retry_works_once_space_is_freed(
    small_disk, prepared_and_reference
):
    prepared, reference = prepared_and_reference
    disk = small_disk("6m")
    filler = disk / "someone-elses-checkpoint.bin"
    filler.write_bytes(b"\0" * (5 * 2**20))  # 1 MB free for a ~1.4 MB dataset that would fit alone
    operator = _operator(prepared, disk)
    with pytest.raises(AirflowException) as failed:
        operator.execute(context={})
    assert not isinstance(failed.value, AirflowFailException)  # space may be freed: worth a retry
    message = str(failed.value)
    _assert_clear_message(message, disk)
    assert re.search(r"free at least \d+\.\d MB", message), message
    assert find_published(str(disk / "datasets"), FINGERPRINT) is None
    assert [p.name for p in (disk / "datasets").iterdir()] == []
    assert shutil.disk_usage(disk).used == filler.stat().st_size  # only the other file remains

    filler.unlink()  # the space is freed before the retry
    summary = operator.execute(context={})
    assert not summary["reused"]
    _assert_same_dataset(summary["dataset_uri"], reference)


@pytest.fixture
def spark_submit_here(spark, monkeypatch):
    """The operator's spark-submit path with the job's ``main`` run on this process's session
    (no JVM start); a non-zero exit code raised as SparkSubmitHook raises it. The Parquet is
    small, so the operator is told it does not convert without Spark, as for big data."""
    import sparktune.data.materialize
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from sparktune.jobs.materialize_dataset import main

    def spark_submit(self, context):
        code = main(list(self.application_args))
        if code:
            raise AirflowException(f"Cannot execute: spark-submit. Error code is: {code}.")

    monkeypatch.setattr(SparkSubmitOperator, "execute", spark_submit)
    monkeypatch.setattr(sparktune.data.materialize, "converts_without_spark", lambda *args, **kwargs: False)
    return lambda try_number: {
        "ti": SimpleNamespace(
            dag_id="llm_finetune",
            run_id="manual__disk_full",
            task_id="materialize_dataset",
            try_number=try_number,
        )
    }


@pytest.mark.spark
def test_shards_written_by_spark_executors_fill_the_disk_the_same_clear_way(
    spark_submit_here, small_disk, prepared_and_reference, monkeypatch, caplog
):
    """spark-submit on a cluster master with big Parquet: Spark tasks write the shards (the two
    decisions a cluster would make are forced: not a local master, above the local size)."""
    import logging

    import sparktune.data.materialize

    monkeypatch.setattr(sparktune.data.materialize, "_local_master", lambda session: False)
    monkeypatch.setitem(write_dataset_dict_from_parquet.__kwdefaults__, "local_below_bytes", 0)
    caplog.set_level(logging.INFO, logger="sparktune.data.materialize")
    prepared, reference = prepared_and_reference
    disk = small_disk("1m")
    operator = _operator(prepared, disk)
    with pytest.raises(AirflowFailException) as failed:
        operator.execute(context=spark_submit_here(1))
    assert "writing shards on the Spark executors" in caplog.text
    message = str(failed.value)
    assert message.startswith("materialize_dataset failed: ")  # not "rejected its input"
    assert 0.3 <= _assert_clear_message(message, disk) <= 1.1
    _assert_nothing_left(disk)

    disk = small_disk("8m")
    summary = operator.execute(context=spark_submit_here(2))
    assert not summary["reused"] and summary["shards"] == {"train": 2, "validation": 1, "test": 1}
    _assert_same_dataset(summary["dataset_uri"], reference)


@pytest.mark.spark
def test_spark_submit_on_a_local_master_retries_a_volume_filled_by_others(
    spark_submit_here, small_disk, prepared_and_reference
):
    """The job on a local master (the embedded default) writes the shards on threads of the
    spark-submit driver; a full disk it cannot blame on the dataset's size is retried."""
    prepared, reference = prepared_and_reference
    disk = small_disk("6m")
    filler = disk / "someone-elses-checkpoint.bin"
    filler.write_bytes(b"\0" * (5 * 2**20))
    operator = _operator(prepared, disk)
    with pytest.raises(AirflowException) as failed:
        operator.execute(context=spark_submit_here(1))
    assert not isinstance(failed.value, AirflowFailException)
    assert str(failed.value).startswith("materialize_dataset failed: No space left on device")
    _assert_clear_message(str(failed.value), disk)
    assert [p.name for p in (disk / "datasets").iterdir()] == []

    filler.unlink()
    summary = operator.execute(context=spark_submit_here(2))
    assert not summary["reused"]
    _assert_same_dataset(summary["dataset_uri"], reference)
