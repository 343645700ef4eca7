"""Benchmark: a Spark DataFrame -> a Hugging Face dataset on disk, four ways, side by side.

    make bench-materialize                      # about 0.1, 1 and 4 GB of text on local[2]
    BENCH_SIZES_GB=0.1,1 make bench-materialize
    BENCH_MATERIALIZE_METHODS=project,from_spark,parquet_roundtrip make bench-materialize
    python benchmarks/bench_materialize.py --sizes-gb 0.5 --master 'local[2]'

The input at each size is one generated table (id, text of pseudo-random words, one of 8
labels, a token count), written once as Parquet under SPARKTUNE_HOME/bench/materialize (the
form prepare_data leaves data in) and read back as ``spark.read.parquet`` by every method:

- ``project``: ``sparktune.data.materialize`` as the DAG calls it on Parquet (labels encoded as a
  ClassLabel, shards fsynced before publishing). On a ``local[...]`` master it writes the
  row-group units on threads of the driver process, since local executors are the same cores;
- ``project_executors``: the same units forced onto Spark tasks (what a cluster master gets):
  each task reads its row groups with pyarrow and writes one shard;
- ``project_dataframe``: the project's path for any other DataFrame (a table, a query): rows
  reach the executors' Python through ``mapInArrow``, then the same shard writer;
- ``from_spark``: ``datasets.Dataset.from_spark(df, cache_dir=...)``;
- ``parquet_roundtrip``: ``df.write.parquet`` then ``load_dataset("parquet", ...)`` (its Arrow cache);
- ``to_pandas``: ``toPandas()`` (Arrow enabled), ``Dataset.from_pandas``, ``save_to_disk``;
  skipped where the measured memory per GB says it would not fit in this machine's RAM;
- ``arrow_write_floor``: the project's Arrow table, already in memory, written with pyarrow
  alone to one IPC stream file on the same disk and fsynced (the bytes every method must write).

Every method runs in a fresh process with its own Spark session (started before the clock);
``os.sync()`` runs between methods so one method's dirty pages do not slow the next. Peak RSS is
sampled every 20 ms: ``peak_driver_rss_mb`` is the Python driver process (where from_spark and
toPandas bring data back), ``peak_jvm_rss_mb`` the local-mode JVM (driver + executors).

Targets (the materialize issue's), each a ratio of seconds measured side by side in this run:

- at every size, the project at least 1.5x faster than ``parquet_roundtrip`` and at least 2x
  faster than ``from_spark`` (docs/benchmarks.md: 6.7x / 7.1x / 5.2x and 13x / 8.4x / 6.6x at 0.1 / 1 / 4 GB);
- at the largest size, if it is 1 GB or more, the project within 2x of the pyarrow write floor
  (docs/benchmarks.md: 1.56x at 1 GB, 1.37x at 4 GB). Below 1 GB the project's fixed cost (a Spark plan,
  the label encoding, an fsync per shard) is most of its time, 7.7x the floor's 0.1 s at 0.1 GB,
  so the floor says nothing there and the target is reported as not checked;
- at the largest size, the project's driver peak RSS under 1 GB (a bound on memory, not time:
  docs/benchmarks.md measured 432 / 698 / 659 MB).

Prints a table and writes SPARKTUNE_HOME/bench/materialize.json; exits 1 when a method fails
or a target is missed. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import finish, not_checked, target  # noqa: E402

DEFAULT_SIZES_GB = "0.1,1,4"
# The project's speed-up over each method, at every size; see the docstring for the others.
TARGET_SPEEDUPS = (("parquet_roundtrip", 1.5), ("from_spark", 2.0))
TARGET_FLOOR_RATIO = 2.0
FLOOR_TARGET_MIN_GB = 1.0
TARGET_DRIVER_RSS_MB = 1024
METHODS = (
    "project",
    "project_executors",
    "project_dataframe",
    "from_spark",
    "parquet_roundtrip",
    "to_pandas",
    "arrow_write_floor",
)
LABELS = ("billing", "shipping", "login", "refund", "account", "cancel", "technical", "other")
MEAN_WORDS = 40  # about 250 bytes of text per row
ROW_BYTES = 250


def settings_home() -> Path:
    return Path(os.environ.get("SPARKTUNE_HOME", ".local")).expanduser().resolve()


def parse_sizes(text: str) -> list[float]:
    sizes = [float(part) for part in text.split(",") if part.strip()]
    if not sizes or any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive sizes in GB, got {text!r}")
    return sizes


def size_label(size_gb: float) -> str:
    return f"{size_gb:g}gb"


# --------------------------------------------------------------------------------------------
# Measurement inside one method's process


class PeakRss:
    """Peak RSS of this process and of its JVM child, sampled every ``interval`` seconds.

    Not bench_prepare's TreeSampler: that one sums a child's whole process tree, while the
    targets here are about the Python driver alone (where from_spark and toPandas land data).
    """

    def __init__(self, interval: float = 0.02):
        import psutil

        self.process = psutil.Process()
        self.interval = interval
        self.driver = 0
        self.jvm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        import psutil

        self.driver = max(self.driver, self.process.memory_info().rss)
        for child in self.process.children(recursive=True):
            try:
                if child.name() == "java":
                    self.jvm = max(self.jvm, child.memory_info().rss)
            except psutil.NoSuchProcess:
                continue

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()


def spark_session(master: str, driver_memory: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName("sparktune-bench-materialize")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # toPandas brings every row to the driver; its default 1 GB result cap would stop it at 1 GB.
        .config("spark.driver.maxResultSize", "0")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def generate_source(spark: Any, path: Path, size_gb: float) -> int:
    """Write the benchmark table as Parquet; returns its row count."""
    import random

    from pyspark.sql import functions as F

    rows = int(size_gb * 1e9 / ROW_BYTES)
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(2000)]
    words = F.array(*[F.lit(w) for w in vocab])
    n_words = (F.pmod(F.xxhash64("id", F.lit(1)), F.lit(2 * MEAN_WORDS - 10)) + 5).cast("int")
    text = F.concat_ws(
        " ",
        F.transform(
            F.sequence(F.lit(1), n_words),
            lambda i: F.element_at(words, (F.pmod(F.xxhash64("id", i), F.lit(len(vocab))) + 1).cast("int")),
        ),
    )
    labels = F.array(*[F.lit(label) for label in LABELS])
    partitions = max(2, int(size_gb * 8))
    df = spark.range(0, rows, numPartitions=partitions).select(
        F.format_string("ex-%012d", "id").alias("example_id"),
        text.alias("text"),
        F.element_at(labels, (F.pmod(F.col("id"), F.lit(len(LABELS))) + 1).cast("int")).alias("label"),
        (n_words + 12).alias("n_tokens"),
    )
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    df.write.parquet(str(tmp))
    tmp.rename(path)
    return rows


def run_method(method: str, source: Path, work: Path, master: str, driver_memory: str) -> dict[str, Any]:
    """Run one method in this process; returns seconds, rows and peaks."""
    import datasets

    datasets.disable_progress_bars()
    out = work / method
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    extra: dict[str, Any] = {}
    if method == "arrow_write_floor":
        import pyarrow as pa

        project = datasets.load_from_disk(str(work / "project" / "ds"))["train"]
        table = pa.concat_tables([pa.ipc.open_stream(f["filename"]).read_all() for f in project.cache_files])
        table = table.combine_chunks()  # in memory, one contiguous buffer per column
        target = out / "floor.arrow"
        with PeakRss() as peak:
            started = time.perf_counter()
            with pa.OSFile(str(target), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=10_000)
            cached = time.perf_counter() - started
            fd = os.open(target, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            seconds = time.perf_counter() - started
        extra["seconds_without_fsync"] = round(cached, 3)
        extra["bytes"] = target.stat().st_size
        return {"seconds": seconds, "rows": table.num_rows, "peak": peak, **extra}

    spark = spark_session(master, driver_memory)
    df = spark.read.parquet(str(source))
    with PeakRss() as peak:
        started = time.perf_counter()
        if method.startswith("project"):
            from sparktune.data.materialize import write_dataset_dict, write_dataset_dict_from_parquet

            # As the DAG calls it: the label names come from prepare_data's summary.
            options = {"data_fingerprint": "bench", "split_column": None, "label_names": sorted(LABELS)}
            if method == "project":  # what materialize_dataset does with a Parquet source
                result = write_dataset_dict_from_parquet(spark, str(source), str(out / "ds"), **options)
            elif method == "project_executors":  # the same, forced onto the Spark executors
                result = write_dataset_dict_from_parquet(
                    spark, str(source), str(out / "ds"), executors=True, **options
                )
            else:  # any other DataFrame (a table, a query): rows go through mapInArrow
                result = write_dataset_dict(df, str(out / "ds"), **options)
            rows = result.rows["train"]
            extra["shards"] = result.shards["train"]
            extra["bytes"] = result.num_bytes
        elif method == "from_spark":
            ds = datasets.Dataset.from_spark(df, cache_dir=str(out / "cache"))
            rows = len(ds)
        elif method == "parquet_roundtrip":
            df.write.parquet(str(out / "parquet"))
            ds = datasets.load_dataset(
                "parquet",
                data_files=str(out / "parquet" / "*.parquet"),
                split="train",
                cache_dir=str(out / "cache"),
            )
            rows = len(ds)
        elif method == "to_pandas":
            ds = datasets.Dataset.from_pandas(df.toPandas(), preserve_index=False)
            ds.save_to_disk(str(out / "ds"))
            rows = len(ds)
        else:
            raise ValueError(f"unknown method {method!r}")
        seconds = time.perf_counter() - started
    spark.stop()
    return {"seconds": seconds, "rows": rows, "peak": peak, **extra}


def child_main(args: argparse.Namespace) -> int:
    result = run_method(args.one, Path(args.source), Path(args.work), args.master, args.driver_memory)
    peak = result.pop("peak")
    result["peak_driver_rss_mb"] = round(peak.driver / 2**20, 1)
    result["peak_jvm_rss_mb"] = round(peak.jvm / 2**20, 1) if peak.jvm else None
    Path(args.result).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------
# Orchestration


def run_child(method: str, source: Path, work: Path, args: argparse.Namespace) -> dict[str, Any] | str:
    """One method in a fresh process: its result, or the tail of its log when it failed."""
    result_path = work / f"{method}.result.json"
    result_path.unlink(missing_ok=True)
    os.sync()  # the previous method's dirty pages must not be flushed on this one's clock
    command = [
        sys.executable,
        __file__,
        "--one",
        method,
        "--source",
        str(source),
        "--work",
        str(work),
        "--result",
        str(result_path),
        "--master",
        args.master,
        "--driver-memory",
        args.driver_memory,
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TOKENIZERS_PARALLELISM": "false"}
    log_path = work / f"{method}.log"
    with log_path.open("w") as log:
        code = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0 or not result_path.exists():
        lines = log_path.read_text().splitlines()
        causes = [line.strip() for line in lines if "Error" in line or "Exception:" in line]
        causes = [c for c in causes if not c.startswith("at ")]
        return f"exit code {code}: " + (causes[0][:300] if causes else " | ".join(lines[-3:]))
    return json.loads(result_path.read_text())


def to_pandas_fits(size_gb: float, results: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether toPandas at ``size_gb`` would fit in RAM, judged from the largest measured run."""
    import psutil

    # Below 0.5 GB the fixed memory of the JVM and Python dominates: no basis to extrapolate.
    measured = [
        r
        for r in results
        if r["method"] == "to_pandas" and r.get("peak_driver_rss_mb") and r["size_gb"] >= 0.5
    ]
    if not measured:
        return True, ""
    largest = max(measured, key=lambda r: r["size_gb"])
    per_gb = (largest["peak_driver_rss_mb"] + (largest.get("peak_jvm_rss_mb") or 0)) / largest["size_gb"]
    needed_mb = per_gb * size_gb
    available_mb = psutil.virtual_memory().available / 2**20
    if needed_mb < 0.8 * available_mb:
        return True, ""
    return False, (
        f"skipped: at {per_gb:,.0f} MB of driver + JVM memory per GB (measured at {largest['size_gb']:g} GB) "
        f"it would need about {needed_mb / 1024:,.1f} GB; {available_mb / 1024:,.1f} GB are available"
    )


def print_table(results: list[dict[str, Any]]) -> None:
    header = (
        f"{'size':>6} {'method':<18} {'seconds':>9} {'rows/s':>11} {'driver MB':>10} {'JVM MB':>8} "
        f"{'vs project':>10}  note"
    )
    print(header)
    print("-" * len(header))
    project = {r["size_gb"]: r["seconds"] for r in results if r["method"] == "project" and r.get("seconds")}
    for r in results:
        seconds = r.get("seconds")
        ratio = f"{seconds / project[r['size_gb']]:.2f}x" if seconds and r["size_gb"] in project else "-"
        print(
            f"{size_label(r['size_gb']):>6} {r['method']:<18} {_num(seconds, '.1f'):>9} "
            f"{_num(r.get('rows_per_s'), ',.0f'):>11} {_num(r.get('peak_driver_rss_mb'), ',.0f'):>10} "
            f"{_num(r.get('peak_jvm_rss_mb'), ',.0f'):>8} {ratio:>10}  {r.get('note', '')}"
        )


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def check_targets(results: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """The targets of the docstring; one that needs a method this run left out is not checked."""
    targets = []
    by = {(r["size_gb"], r["method"]): r for r in results if r.get("seconds")}
    sizes = sorted({r["size_gb"] for r in results})
    if "project" not in methods:
        return [not_checked("every target", "the project's method was not run")]
    for size in sizes:
        project = by.get((size, "project"))
        for method, speedup in TARGET_SPEEDUPS:
            name = f"{size_label(size)}: project's speed-up over {method}"
            if method not in methods:
                targets.append(not_checked(name, f"{method} was not run"))
                continue
            other = by.get((size, method))
            ratio = other["seconds"] / project["seconds"] if project and other else None
            targets.append(
                target(name, None if ratio is None else round(ratio, 2), at_least=speedup, unit="x")
            )
    largest = max(sizes)
    name = f"{size_label(largest)}: project's seconds over the pyarrow write floor's"
    if "arrow_write_floor" not in methods:
        targets.append(not_checked(name, "arrow_write_floor was not run"))
    elif largest < FLOOR_TARGET_MIN_GB:
        targets.append(
            not_checked(name, f"below {FLOOR_TARGET_MIN_GB:g} GB the project's fixed cost dominates")
        )
    else:
        project, floor = by.get((largest, "project")), by.get((largest, "arrow_write_floor"))
        ratio = project["seconds"] / floor["seconds"] if project and floor else None
        targets.append(
            target(name, None if ratio is None else round(ratio, 2), at_most=TARGET_FLOOR_RATIO, unit="x")
        )
    project = by.get((largest, "project"))
    targets.append(
        target(
            f"{size_label(largest)}: project's driver peak RSS",
            project["peak_driver_rss_mb"] if project else None,
            at_most=TARGET_DRIVER_RSS_MB,
            unit="MB",
        )
    )
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_materialize", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes-gb",
        type=parse_sizes,
        default=parse_sizes(os.environ.get("BENCH_SIZES_GB") or DEFAULT_SIZES_GB),
        help=f"comma-separated sizes of text in GB (default: BENCH_SIZES_GB or {DEFAULT_SIZES_GB})",
    )
    parser.add_argument(
        "--methods",
        default=os.environ.get("BENCH_MATERIALIZE_METHODS") or ",".join(METHODS),
        help="comma-separated subset of "
        + ",".join(METHODS)
        + " (default: BENCH_MATERIALIZE_METHODS or all)",
    )
    parser.add_argument("--master", default=os.environ.get("BENCH_MASTER", "local[2]"))
    parser.add_argument("--driver-memory", default=os.environ.get("BENCH_DRIVER_MEMORY", "4g"))
    parser.add_argument(
        "--out", default=None, help="JSON path (default SPARKTUNE_HOME/bench/materialize.json)"
    )
    # Internal: run one method in this process.
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return child_main(args)

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    if "arrow_write_floor" in methods and "project" not in methods:
        parser.error("arrow_write_floor writes the project's table: include project in --methods")
    bench = settings_home() / "bench"
    out = Path(args.out) if args.out else bench / "materialize.json"
    results: list[dict[str, Any]] = []
    for size in sorted(args.sizes_gb):
        source = bench / "materialize" / f"source-{size_label(size)}"
        if not source.exists():
            print(f"generating the {size_label(size)} source table at {source} ...", flush=True)
            spark = spark_session(args.master, args.driver_memory)
            generate_source(spark, source, size)
            spark.stop()
        work = bench / "materialize" / f"work-{size_label(size)}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for method in methods:
            record: dict[str, Any] = {"size_gb": size, "method": method}
            if method == "to_pandas":
                fits, why = to_pandas_fits(size, results)
                if not fits:
                    record.update(seconds=None, rows_per_s=None, peak_driver_rss_mb=None, note=why)
                    results.append(record)
                    print_progress(record)
                    continue
            outcome = run_child(method, source, work, args)
            if isinstance(outcome, str):
                record.update(
                    seconds=None, rows_per_s=None, peak_driver_rss_mb=None, note=f"failed: {outcome}"
                )
            else:
                record.update(
                    seconds=round(outcome["seconds"], 3),
                    rows_per_s=round(outcome["rows"] / outcome["seconds"]),
                    peak_driver_rss_mb=outcome["peak_driver_rss_mb"],
                    peak_jvm_rss_mb=outcome.get("peak_jvm_rss_mb"),
                    rows=outcome["rows"],
                    **{k: outcome[k] for k in ("shards", "bytes", "seconds_without_fsync") if k in outcome},
                )
            results.append(record)
            print_progress(record)
        shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(results)
    report = {
        "benchmark": "materialize",
        "results": results,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "master": args.master,
            "driver_memory": args.driver_memory,
        },
    }
    ran = not any(str(r.get("note", "")).startswith("failed") for r in results)
    return finish(out, report, check_targets(results, methods), ran=ran)


def print_progress(record: dict[str, Any]) -> None:
    seconds = record.get("seconds")
    shown = f"{seconds:.1f} s" if seconds else record.get("note", "")
    print(f"  {size_label(record['size_gb'])} {record['method']:<18} {shown}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
