"""Benchmark: rows/s of the preparation job, run through spark-submit as Airflow runs it.

    make bench-prepare                      # 1M and 5M rows on local[2]
    BENCH_ROWS=100000,1000000 make bench-prepare
    python benchmarks/bench_prepare.py --rows 200000 --master 'local[2]'

For each size: the generated demo tickets (Parquet, cached under SPARKTUNE_HOME/bench/data by
row count, so a rerun does not regenerate them) go through ``sparktune.jobs.prepare_data`` with
the built-in tiny model's tokenizer counting tokens in a pandas UDF, into a fresh lake (so that
nothing is reused). Wall seconds include the JVM start, as a task's would. Peak RSS, sampled every
0.25 s with psutil: the driver JVM (in local mode it also runs the executors) and the whole
process tree (JVM + Python driver + Python UDF workers).

Target: rows/s at the largest size at least 0.8x rows/s at the smallest, in the same run (two
sizes or more; one size checks nothing but that the job ran). docs/decisions/0021 records
14.7k rows/s at 1M and 22.3k at 5M (1.5x: the 15-20 s of fixed cost
of every run is spread over more rows), so throughput falling as data grows means a step that grew
worse than linearly (a shuffle that spills, a driver that collects), which is what broke 5M rows
before. 0.8x leaves room for the shared machine's noise (about 20% between runs). At small sizes
the fixed cost makes the target easy (10k -> 100k rows: 8.4x); it bites at 1M and up, so ``make
bench`` runs one size (100k rows: the job runs, its summary is read) to keep within its time.

Prints a table and writes SPARKTUNE_HOME/bench/prepare.json; exits 1 when a job fails or the
target is missed. Not a test.
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

DEFAULT_ROWS = "1000000,5000000"
# rows/s at the largest size over rows/s at the smallest (see the docstring).
TARGET_SCALING = 0.8


def parse_rows(text: str) -> list[int]:
    sizes = []
    for part in text.replace("_", "").split(","):
        part = part.strip().lower()
        if not part:
            continue
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1], 1)
        sizes.append(int(float(part.rstrip("km")) * scale))
    if not sizes or any(n <= 0 for n in sizes):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive row counts, got {text!r}")
    return sizes


def dataset(data_dir: Path, rows: int) -> tuple[Path, float | None]:
    """The cached Parquet file of ``rows`` demo tickets, and the seconds spent writing it (None: cached)."""
    from sparktune_dev.demo_data import write_demo_dataset

    path = data_dir / f"support_tickets_{rows}.parquet"
    if path.is_file():
        return path, None
    started = time.perf_counter()
    write_demo_dataset(path, rows, fmt="parquet")
    return path, time.perf_counter() - started


class TreeSampler:
    """Peak RSS of the JVM and of a process tree (summed), sampled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.pid = pid
        self.interval = interval
        self.peak_bytes = 0
        self.peak_jvm_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            import psutil
        except ImportError:  # optional: the getrusage figure is still reported
            return
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            total = 0
            try:
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        rss = proc.memory_info().rss
                        if proc.name() == "java":
                            self.peak_jvm_bytes = max(self.peak_jvm_bytes, rss)
                    except psutil.NoSuchProcess:
                        continue
                    total += rss
            except psutil.NoSuchProcess:
                return
            self.peak_bytes = max(self.peak_bytes, total)
            self._stop.wait(self.interval)


def run_job(
    source: Path,
    tokenizer: str,
    lake: Path,
    summary_path: Path,
    log_path: Path,
    master: str,
    extra_conf: list[str],
) -> tuple[float, int, dict[str, Any]]:
    """(wall seconds, exit code, summary) of one spark-submit of the preparation job."""
    from sparktune.jobs import prepare_data

    spark_submit, env = spark_submit_env()
    env["TOKENIZERS_PARALLELISM"] = "false"
    command = [
        spark_submit,
        "--master",
        master,
        "--name",
        "sparktune-bench-prepare",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        # What the Airflow operator passes: Spark's INFO lines would bury the step table.
        "--conf",
        "spark.log.level=WARN",
        *[arg for conf in extra_conf for arg in ("--conf", conf)],
        prepare_data.__file__,
        "--params-json",
        json.dumps({"source_uri": str(source)}),
        "--tokenizer",
        tokenizer,
        "--lake-uri",
        str(lake),
        "--summary-path",
        str(summary_path),
    ]
    wall, code, sampler = submit(command, env, log_path)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary["_peak_rss"] = (sampler.peak_jvm_bytes, sampler.peak_bytes)
    return wall, code, summary


def spark_submit_env() -> tuple[str, dict[str, str]]:
    """The venv's spark-submit, and an environment whose Spark Python (driver and workers) is this one."""
    venv_bin = Path(sys.executable).parent
    path = f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    spark_submit = shutil.which("spark-submit", path=path)
    if spark_submit is None:
        sys.exit("spark-submit not found next to this Python or on PATH: run from the project's venv")
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": path,
    }
    return spark_submit, env


def submit(
    command: list[str], env: dict[str, str], log_path: Path, sampler_type: type[TreeSampler] = TreeSampler
) -> tuple[float, int, Any]:
    """(wall seconds, exit code, sampler) of ``command`` run with its output in ``log_path``, its
    process tree sampled by ``sampler_type(pid)`` while it runs."""
    started = time.perf_counter()
    with log_path.open("w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        with sampler_type(process.pid) as sampler:
            code = process.wait()
    return time.perf_counter() - started, code, sampler


def machine_and_versions() -> dict[str, Any]:
    """The machine and the Python and PySpark versions, for a benchmark's JSON."""
    import pyspark

    return {
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "platform": platform.platform(),
        },
        "versions": {"python": platform.python_version(), "pyspark": pyspark.__version__},
    }


def fmt_int(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def print_table(runs: list[dict[str, Any]]) -> None:
    header = (
        f"{'rows':>11} {'wall s':>8} {'rows/s':>9} {'rows out':>11} {'dropped':>10} "
        f"{'JVM peak MB':>12} {'tree peak MB':>13} {'load 1m':>8}"
    )
    print(header)
    print("-" * len(header))
    for run in runs:
        print(
            f"{run['rows']:>11,} {run['wall_seconds']:>8.1f} {fmt_int(run['rows_per_second']):>9} "
            f"{fmt_int(run['rows_out']):>11} {fmt_int(run['rows'] - (run['rows_out'] or 0)):>10} "
            f"{fmt_int(run['peak_rss_mb_driver_jvm']):>12} {fmt_int(run['peak_rss_mb_tree']):>13} "
            f"{run['load_average_before'][0]:>4.1f}>{run['load_average_after'][0]:<3.1f}"
        )
    done = [run for run in runs if run.get("steps")]
    if not done:
        return
    print()
    print(f"{'step (rows out)':<18}" + "".join(f"{run['rows']:>14,}" for run in done))
    for i, step in enumerate(s["step"] for s in done[0]["steps"]):
        print(f"{step:<18}" + "".join(f"{run['steps'][i]['rows_out']:>14,}" for run in done))


def scaling_target(runs: list[dict[str, Any]], key: str = "rows_per_second") -> dict[str, Any]:
    """rows/s at the largest size over rows/s at the smallest (``TARGET_SCALING``); shared with
    bench_inference_scale, whose sizes are N/10 and N."""
    name = "rows/s at the largest size over rows/s at the smallest"
    sizes = sorted({run["rows"] for run in runs})
    if len(sizes) < 2:
        return not_checked(name, "one size: give two or more to compare")
    by_rows = {run["rows"]: run for run in runs}
    small, large = by_rows[sizes[0]].get(key), by_rows[sizes[-1]].get(key)
    ratio = large / small if small and large else None
    return target(
        name,
        None if ratio is None else round(ratio, 3),
        at_least=TARGET_SCALING,
        unit="x",
        note=f"{sizes[0]:,} -> {sizes[-1]:,} rows",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_prepare", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows",
        type=parse_rows,
        default=parse_rows(os.environ.get("BENCH_ROWS") or DEFAULT_ROWS),
        help=f"comma-separated sizes, 1m / 500k accepted (default: BENCH_ROWS or {DEFAULT_ROWS})",
    )
    parser.add_argument("--master", default=os.environ.get("BENCH_MASTER", "local[2]"))
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        help="extra Spark conf key=value passed to spark-submit (repeatable), e.g. spark.driver.memory=4g",
    )
    parser.add_argument("--keep-lake", action="store_true", help="keep the prepared data of each run")
    args = parser.parse_args(argv)

    from sparktune.core.config import settings
    from sparktune.model.base_model import ensure_base_model

    home = settings().home
    bench_dir = home / "bench"
    data_dir = bench_dir / "data"
    print(f"SPARKTUNE_HOME={home}; sizes {', '.join(f'{n:,}' for n in args.rows)} on {args.master}")
    tokenizer = ensure_base_model("tiny-llama")
    runs: list[dict[str, Any]] = []
    for rows in args.rows:
        source, generated = dataset(data_dir, rows)
        note = f"generated in {generated:.1f} s" if generated is not None else "cached"
        print(
            f"{rows:,} rows: {source} ({source.stat().st_size / 1e6:.0f} MB, {note}); running ...", flush=True
        )
        lake = bench_dir / "lake" / str(rows)
        shutil.rmtree(lake, ignore_errors=True)  # a reused dataset would time nothing
        work = bench_dir / "runs"
        work.mkdir(parents=True, exist_ok=True)
        summary_path = work / f"prepare_{rows}.summary.json"
        summary_path.unlink(missing_ok=True)
        log_path = work / f"prepare_{rows}.log"
        load_before = os.getloadavg()
        wall, code, summary = run_job(source, tokenizer, lake, summary_path, log_path, args.master, args.conf)
        peak_jvm, peak_tree = summary.pop("_peak_rss")
        run = {
            "rows": rows,
            "source": str(source),
            "source_bytes": source.stat().st_size,
            "generate_seconds": generated,
            "exit_code": code,
            "wall_seconds": round(wall, 2),
            "rows_per_second": round(rows / wall) if code == 0 else None,
            "rows_out": summary.get("rows_out"),
            "steps": summary.get("steps"),
            "split_counts": summary.get("split_counts"),
            "warnings": summary.get("warnings"),
            "peak_rss_mb_driver_jvm": round(peak_jvm / 2**20) or None,
            "peak_rss_mb_tree": round(peak_tree / 2**20) or None,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "log": str(log_path),
        }
        runs.append(run)
        if code != 0:
            print(f"  FAILED with exit code {code}; see {log_path}", file=sys.stderr)
            if summary.get("error"):
                print(f"  {summary['error']}", file=sys.stderr)
        else:
            print(f"  {wall:.1f} s, {rows / wall:,.0f} rows/s", flush=True)
        if not args.keep_lake:
            shutil.rmtree(lake, ignore_errors=True)

    report = {
        "benchmark": "prepare_data",
        "master": args.master,
        "extra_conf": args.conf,
        "tokenizer": tokenizer,
        **machine_and_versions(),
        "runs": runs,
    }
    print()
    print_table(runs)
    ran = all(run["exit_code"] == 0 for run in runs)
    return finish(bench_dir / "prepare.json", report, [scaling_target(runs)], ran=ran)


if __name__ == "__main__":
    sys.exit(main())
