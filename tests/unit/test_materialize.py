"""Executor-written Arrow datasets: the layout load_from_disk opens, content addressing, atomic publish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktune.data.materialize import materialize_dataset, write_dataset_dict
from sparktune.data.materialize_errors import MaterializeError
from sparktune.data.published_dataset import MARKER, find_published, open_dataset

LABELS = ["billing", "login", "shipping"]
SPLITS = ["train", "validation", "test"]


def _rows(split: str, n: int, part: int) -> pa.Table:
    ids = [f"{split}-{part}-{i:03d}" for i in range(n)]
    return pa.table(
        {
            "example_id": ids,
            "text": [f"text {i}" for i in ids],
            "label": [LABELS[i % 3] for i in range(n)],
            "prompt": [f"[INST] {i} [/INST]" for i in ids],
            "completion": [f" {LABELS[i % 3]}" for i in range(n)],
            "n_tokens": list(range(n)),
        }
    )


def _prepared(root, rows_per_split=(40, 5, 5)):
    """The layout prepare_data writes: Parquet partitioned by ``split=``, several part files."""
    for split, n in zip(SPLITS, rows_per_split, strict=True):
        folder = root / f"split={split}"
        folder.mkdir(parents=True)
        for part in range(2):
            pq.write_table(_rows(split, n, part), folder / f"part-{part:05d}.parquet")
    return root


def test_builds_a_memory_mapped_dataset_dict_with_class_labels(spark, tmp_path):
    prepared = _prepared(tmp_path / "prepared")
    result = materialize_dataset(
        spark,
        str(prepared),
        str(tmp_path / "datasets"),
        data_fingerprint="fp1",
        label_names=LABELS,
        splits=SPLITS,
    )
    assert not result.reused
    assert result.rows == {"train": 80, "validation": 10, "test": 10}
    assert result.dataset_uri == str(tmp_path / "datasets" / "fp1")
    loaded = datasets.load_from_disk(result.dataset_uri)
    assert isinstance(loaded, datasets.DatasetDict) and set(loaded) == set(SPLITS)
    train = loaded["train"]
    assert train.features["label"] == datasets.ClassLabel(names=LABELS)
    assert train.features["n_tokens"] == datasets.Value("int64")
    assert "split" not in train.column_names
    assert sorted(train["example_id"]) == sorted(f"train-{p}-{i:03d}" for p in range(2) for i in range(40))
    # Memory-mapped: every shard is a file on disk, none was copied into memory.
    assert train.cache_files and all(os.path.exists(f["filename"]) for f in train.cache_files)
    for row in loaded["test"]:
        assert loaded["test"].features["label"].int2str(row["label"]) == row["completion"].strip()
    # Nothing but the published folder is left under the root.
    assert [p.name for p in (tmp_path / "datasets").iterdir()] == ["fp1"]


def test_same_fingerprint_is_found_without_spark(spark, tmp_path):
    prepared = _prepared(tmp_path / "prepared")
    root = str(tmp_path / "datasets")
    first = materialize_dataset(spark, str(prepared), root, data_fingerprint="fp1", label_names=LABELS)
    marker = tmp_path / "datasets" / "fp1" / MARKER
    mtime = marker.stat().st_mtime_ns
    # spark=None: a second call with the same fingerprint must not need a session at all.
    again = materialize_dataset(None, str(prepared), root, data_fingerprint="fp1", label_names=LABELS)
    assert again.reused and again.dataset_uri == first.dataset_uri and again.rows == first.rows
    assert again.labels == LABELS and again.shards == first.shards
    assert marker.stat().st_mtime_ns == mtime
    assert find_published(root, "fp-other") is None


def test_a_changed_fingerprint_builds_a_new_dataset(spark, tmp_path):
    root = str(tmp_path / "datasets")
    materialize_dataset(
        spark, str(_prepared(tmp_path / "v1")), root, data_fingerprint="v1", label_names=LABELS
    )
    second = materialize_dataset(
        spark, str(_prepared(tmp_path / "v2", (20, 3, 3))), root, data_fingerprint="v2", label_names=LABELS
    )
    assert not second.reused and second.rows == {"test": 6, "train": 40, "validation": 6}
    assert sorted(p.name for p in (tmp_path / "datasets").iterdir()) == ["v1", "v2"]
    assert len(open_dataset(second.dataset_uri)["train"]) == 40


def test_unfinished_folder_is_never_trusted(spark, tmp_path):
    prepared = _prepared(tmp_path / "prepared")
    half_written = tmp_path / "datasets" / "fp1"
    (half_written / "train").mkdir(parents=True)
    (half_written / "train" / "data-00000-of-00001.arrow").write_bytes(b"truncated")
    with pytest.raises(FileNotFoundError, match="not a finished dataset"):
        open_dataset(str(half_written))
    assert find_published(str(tmp_path / "datasets"), "fp1") is None
    result = materialize_dataset(spark, str(prepared), str(tmp_path / "datasets"), data_fingerprint="fp1")
    assert not result.reused
    assert json.loads((half_written / MARKER).read_text())["rows"]["train"] == 80
    assert len(open_dataset(str(half_written))["train"]) == 80
    assert not (half_written / "train" / "data-00000-of-00001.arrow").exists()


def test_a_failing_job_leaves_nothing_a_later_run_would_trust(spark, tmp_path):
    from pyspark.sql import functions as F

    # Fails inside the writing stage, after other rows were written (a Python UDF would do too,
    # but Spark 4.2 hangs when a failing Python UDF feeds mapInArrow in local[1]: see
    # docs/known-issues.md, "Data").
    example_id = F.col("example_id")
    failing = F.when(example_id.endswith("-007"), F.raise_error(F.lit("executor lost halfway")))
    df = spark.read.parquet(str(_prepared(tmp_path / "prepared")))
    df = df.withColumn("example_id", failing.otherwise(example_id))
    with pytest.raises(Exception, match="executor lost halfway"):
        write_dataset_dict(df, str(tmp_path / "datasets" / "fp1"), data_fingerprint="fp1", arrow_batch_rows=4)
    assert list((tmp_path / "datasets").iterdir()) == []  # no target, no temp folder
    assert find_published(str(tmp_path / "datasets"), "fp1") is None


@pytest.mark.slow  # a Spark application of its own in a subprocess, a task killed mid-write
def test_retried_tasks_leave_only_the_winning_attempts_shards(tmp_path):
    # A task that dies after writing part of its shard is retried; the dead attempt's file must
    # not end up in the dataset. Needs task retries, so it runs in its own local[1,2] session.
    script = tmp_path / "retry.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            from pyspark import TaskContext
            from pyspark.sql import SparkSession, functions as F
            from pyspark.sql.types import LongType
            from sparktune.data.materialize import write_dataset_dict

            spark = SparkSession.builder.master("local[1,2]").getOrCreate()

            @F.udf(LongType())
            def fail_first_attempt(i):
                if i == 900 and TaskContext.get().attemptNumber() == 0:
                    raise RuntimeError("first attempt dies")
                return i

            df = spark.range(2000).repartition(1).select(
                F.col("id").cast("string").alias("example_id"),
                F.lit("some text").alias("text"),
                F.when(F.col("id") % 2 == 0, "even").otherwise("odd").alias("label"),
                fail_first_attempt("id").alias("n"),
            )
            result = write_dataset_dict(
                df, {str(tmp_path / "ds" / "fp")!r}, data_fingerprint="fp", arrow_batch_rows=100
            )
            print(json.dumps(result.to_summary()))
            """
        )
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "first attempt dies" in out.stderr  # the failure really happened after some writing
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rows"] == {"train": 2000} and summary["shards"] == {"train": 1}
    files = sorted(p.name for p in (tmp_path / "ds" / "fp" / "train").glob("*.arrow"))
    assert len(files) == 1
    loaded = open_dataset(str(tmp_path / "ds" / "fp"))["train"]
    assert sorted(map(int, loaded["example_id"])) == list(range(2000))
    assert loaded.features["label"].names == ["even", "odd"]


def test_a_table_without_split_column_is_one_train_split(spark, tmp_path):
    df = spark.createDataFrame(
        [("a", "hello", "x"), ("b", "world", "y"), ("c", "again", "x")],
        "id string, text string, intent string",
    )
    df.createOrReplaceTempView("tickets_view")
    result = materialize_dataset(
        spark, "tickets_view", str(tmp_path / "datasets"), data_fingerprint="t1", label_column="intent"
    )
    loaded = open_dataset(result.dataset_uri)
    assert list(loaded) == ["train"] and len(loaded["train"]) == 3
    assert loaded["train"].features["intent"].names == ["x", "y"]
    keep_text = materialize_dataset(
        spark, df, str(tmp_path / "datasets"), data_fingerprint="t2", label_column=None
    )
    assert open_dataset(keep_text.dataset_uri)["train"].features["intent"] == datasets.Value("string")


def test_without_a_fingerprint_the_content_decides(spark, tmp_path):
    root = str(tmp_path / "datasets")
    rows = [("a", "hello", "x"), ("b", "world", "y")]
    first = materialize_dataset(
        spark, spark.createDataFrame(rows, "id string, text string, label string"), root
    )
    shuffled = spark.createDataFrame(rows[::-1], "id string, text string, label string")
    assert materialize_dataset(spark, shuffled, root).data_fingerprint == first.data_fingerprint
    changed = spark.createDataFrame(rows + [("c", "new", "x")], "id string, text string, label string")
    assert materialize_dataset(spark, changed, root).data_fingerprint != first.data_fingerprint


def test_bad_input_fails_with_the_cause_and_leaves_nothing(spark, tmp_path):
    df = spark.read.parquet(str(_prepared(tmp_path / "prepared")))
    target = str(tmp_path / "datasets" / "fp")
    with pytest.raises(
        MaterializeError, match=r"labels \['shipping'\] are not among the declared label names"
    ):
        write_dataset_dict(df, target, data_fingerprint="fp", label_names=["billing", "login"])
    with pytest.raises(MaterializeError, match=r"'split' = 'validation', not one of the expected splits"):
        write_dataset_dict(df, target, data_fingerprint="fp", splits=["train", "test"])
    with pytest.raises(MaterializeError, match="label column 'intent' is not in the data"):
        write_dataset_dict(df, target, data_fingerprint="fp", label_column="intent")
    from pyspark.sql import functions as F

    with pytest.raises(MaterializeError, match="'split' = None, not one of the expected splits"):
        write_dataset_dict(df.withColumn("split", F.lit(None).cast("string")), target, data_fingerprint="fp")
    assert not (tmp_path / "datasets").exists() or list((tmp_path / "datasets").iterdir()) == []


def test_an_expected_split_without_rows_is_an_empty_split(spark, tmp_path):
    df = spark.read.parquet(str(_prepared(tmp_path / "prepared"))).where("split != 'test'")
    result = write_dataset_dict(df, str(tmp_path / "ds"), data_fingerprint="fp", splits=SPLITS)
    assert result.rows["test"] == 0
    assert len(open_dataset(result.dataset_uri)["test"]) == 0


def test_file_uris_work_like_paths(spark, tmp_path):
    prepared = f"file://{_prepared(tmp_path / 'prepared')}"
    root = f"file://{tmp_path / 'datasets'}"
    result = materialize_dataset(spark, prepared, root, data_fingerprint="fp1")
    assert result.dataset_uri == f"{root}/fp1"
    # The split= folders are recognised behind a file:// URI too (not everything in train).
    assert result.rows == {"test": 10, "train": 80, "validation": 10}
    assert len(open_dataset(result.dataset_uri)["validation"]) == 10
    assert materialize_dataset(None, prepared, root, data_fingerprint="fp1").reused


def test_job_reuses_without_a_session_and_reports_bad_input(spark, tmp_path, monkeypatch):
    import sparktune.data.materialize
    from sparktune.jobs.materialize_dataset import main

    prepared = _prepared(tmp_path / "prepared")
    summary = tmp_path / "summary.json"
    args = [
        "--source",
        str(prepared),
        "--datasets-root",
        str(tmp_path / "ds"),
        "--summary-path",
        str(summary),
    ]
    assert main([*args, "--data-fingerprint", "fp1", "--label-names", json.dumps(LABELS)]) == 0
    built = json.loads(summary.read_text())
    assert built["rows"]["train"] == 80 and not built["reused"]
    with monkeypatch.context() as patched:

        def no_spark(*args, **kwargs):
            raise AssertionError("a published data version must not start a Spark job")

        patched.setattr(sparktune.data.materialize, "materialize_dataset", no_spark)
        patched.setattr("pyspark.sql.SparkSession.builder", None)
        assert main([*args, "--data-fingerprint", "fp1"]) == 0
    assert json.loads(summary.read_text())["reused"]

    assert main([*args, "--data-fingerprint", "fp2", "--label-names", '["billing"]']) == 2
    assert "not among the declared label names" in json.loads(summary.read_text())["error"]
    assert main([*args, "--label-names", "not json"]) == 2
    assert "--label-names is not valid JSON" in json.loads(summary.read_text())["error"]


def test_every_path_writes_the_same_dataset(spark, tmp_path):
    from sparktune.data.materialize import write_dataset_dict_from_parquet

    prepared = str(_prepared(tmp_path / "prepared"))
    results = {
        # Small Parquet on a local master is converted in this process; executors=True forces Spark.
        "in_process": write_dataset_dict_from_parquet(
            None, prepared, str(tmp_path / "a"), data_fingerprint="fp", label_names=LABELS
        ),
        "executors": write_dataset_dict_from_parquet(
            spark,
            prepared,
            str(tmp_path / "b"),
            data_fingerprint="fp",
            label_names=LABELS,
            executors=True,
        ),
        "dataframe": write_dataset_dict(
            spark.read.parquet(prepared), str(tmp_path / "c"), data_fingerprint="fp", label_names=LABELS
        ),
        "labels_found_without_spark": write_dataset_dict_from_parquet(
            None, prepared, str(tmp_path / "d"), data_fingerprint="fp"
        ),
    }
    reference = open_dataset(results["dataframe"].dataset_uri)
    for name, result in results.items():
        assert result.rows == {"test": 10, "train": 80, "validation": 10}, name
        assert result.labels == LABELS, name
        loaded = open_dataset(result.dataset_uri)
        for split in SPLITS:
            assert loaded[split].features == reference[split].features, name
            assert sorted(loaded[split].to_list(), key=lambda r: r["example_id"]) == sorted(
                reference[split].to_list(), key=lambda r: r["example_id"]
            ), name
    assert results["executors"].shards == {"test": 2, "train": 2, "validation": 2}  # one per file


def test_parquet_path_bad_input_names_the_cause(spark, tmp_path):
    from sparktune.data.materialize import write_dataset_dict_from_parquet

    prepared = str(_prepared(tmp_path / "prepared"))
    target = str(tmp_path / "datasets" / "fp")
    for executors in (True, False):  # the executors' error and the in-process one alike
        with pytest.raises(MaterializeError, match=r"labels \['shipping'\] are not among the declared"):
            write_dataset_dict_from_parquet(
                spark,
                prepared,
                target,
                data_fingerprint="fp",
                label_names=["billing", "login"],
                executors=executors,
            )
    with pytest.raises(MaterializeError, match=r"split\(s\) \['validation'\] beyond the expected"):
        write_dataset_dict_from_parquet(
            spark, prepared, target, data_fingerprint="fp", splits=["train", "test"]
        )
    with pytest.raises(MaterializeError, match="label column 'intent' is not in the data"):
        write_dataset_dict_from_parquet(spark, prepared, target, data_fingerprint="fp", label_column="intent")
    with pytest.raises(MaterializeError, match="holds no .parquet files"):
        write_dataset_dict_from_parquet(spark, str(tmp_path / "empty"), target, data_fingerprint="fp")
    assert list((tmp_path / "datasets").iterdir()) == []


def test_every_rank_memory_maps_the_one_published_dataset(tmp_path):
    # What each training rank does: open the published folder. Nothing is rebuilt or copied.
    from sparktune.data.materialize import write_dataset_dict_from_parquet

    result = write_dataset_dict_from_parquet(
        None, str(_prepared(tmp_path / "prepared")), str(tmp_path / "ds" / "fp"), data_fingerprint="fp"
    )
    marker = tmp_path / "ds" / "fp" / MARKER
    built_at = marker.stat().st_mtime_ns
    probe = textwrap.dedent(
        """
        import json, sys
        import pyarrow as pa
        from sparktune.data.published_dataset import open_dataset
        train = open_dataset(sys.argv[1])["train"]
        files = sorted(f["filename"] for f in train.cache_files)
        # Backed by files, and the rows were not copied into Arrow's memory pool.
        mapped = bool(files) and pa.total_allocated_bytes() < train.data.nbytes
        print(json.dumps({"mapped": mapped, "files": files, "rows": len(train)}))
        """
    )
    ranks = [
        subprocess.Popen([sys.executable, "-c", probe, result.dataset_uri], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    seen = [json.loads(rank.communicate(timeout=120)[0]) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks)
    assert seen[0] == seen[1] and seen[0]["mapped"] and seen[0]["rows"] == 80
    assert all(f.startswith(result.dataset_uri) for f in seen[0]["files"])
    assert marker.stat().st_mtime_ns == built_at


def test_shards_are_fsynced_before_publishing_and_old_temp_folders_go(tmp_path, monkeypatch):
    from sparktune.data.materialize import write_dataset_dict_from_parquet
    from sparktune.data.published_dataset import STALE_TEMP_SECONDS

    datasets_root = tmp_path / "datasets"
    killed_long_ago = datasets_root / "_tmp-fp-dead0001"
    concurrent = datasets_root / "_tmp-fp-young001"
    for folder in (killed_long_ago, concurrent):
        (folder / "train").mkdir(parents=True)
    old = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(killed_long_ago, (old, old))
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))

    result = write_dataset_dict_from_parquet(
        None, str(_prepared(tmp_path / "prepared")), str(datasets_root / "fp"), data_fingerprint="fp"
    )
    assert len(synced) == sum(result.shards.values()) == 6  # every shard, in-process path
    assert not killed_long_ago.exists()
    assert concurrent.exists()  # may belong to a build still running
