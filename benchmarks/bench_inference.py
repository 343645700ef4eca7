"""Benchmark: rows/s of batch inference (``sparktune.serve.inference.score_dataframe``) vs the seed way.

    make bench-inference                       # 3,000 rows, local[2], 4 partitions
    BENCH_INFERENCE_ROWS=10000 make bench-inference
    python benchmarks/bench_inference.py --rows 1000 --repeats 3

Same Spark session (``local[2]``), same rows (the tests' trivially learnable intent texts, so the
model's answers mean something), same partitions and same model for both methods, run one after
the other in this one process:

- ``seed_pipeline``: the seed recipe: inside each partition call, a transformers
  ``pipeline("text-generation")`` is built from the model folder and generates the label
  (greedy, ``max_new_tokens`` = longest label + 2) for the partition's prompts at a fixed
  batch size of 8, unsorted;
- ``project``: ``score_dataframe``: the model loaded once per Python worker, texts sorted by
  token length, every candidate label scored in one forward pass per batch (batch 32).

The model is the tests' tiny LLaMA fully fine-tuned for 120 steps, logged to a throwaway SQLite
MLflow and registered as ``bench-intent@champion`` (resolved and downloaded once on the driver,
as the DAG does, before any clock starts). The input rows are cached in the JVM and counted
before any clock, and a warm-up job has every Python worker import torch, transformers and
the project's scoring module first, so that neither method pays the other's worker start or
imports (Spark reuses its Python workers between jobs, and whichever method ran first paid them).

The clock covers one Spark action per method: a ``noop`` write of every output row, with an
``Observation`` counting rows and right answers on the way (no rows come back to the driver).
Inside it: each worker loading the model (the project: once per worker; the seed: a pipeline
per partition call), tokenizing and scoring every row. ``--repeats`` alternates the methods
and reports the median run of each.

Target: the project's rows/s at least 2.5x the seed way's, in the same run. docs/benchmarks.md reports
3.7x-4.6x over four runs at 3,000 rows, timed before the warm-up existed: the seed, running
first, paid the workers' imports on its clock. With the warm-up this bench measured 3.17x at
3,000 rows and 3.31x and 6.87x at 1,000 rows (the seed slows more than the project under load,
so a busy machine flatters the ratio and a quiet one gives the lower figures). 2.5x is about a
fifth below the lowest of those.

Prints a table and writes SPARKTUNE_HOME/bench/inference.json; exits 1 when the target is missed.
Not a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import finish, target, tiny_champion  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = 2.5
SEED_BATCH_SIZE = 8
PROJECT_BATCH_SIZE = 32
MODEL_NAME = "bench-intent"


def sparktune_home() -> Path:
    """``SPARKTUNE_HOME``, default ``.local`` in the repository: where the benches write."""
    return Path(os.environ.get("SPARKTUNE_HOME", ROOT / ".local"))


def bench_champion(work: Path) -> tuple[Any, str]:
    """The tiny champion registered as ``MODEL_NAME`` under ``work``, resolved as batch inference
    resolves it, and the tiny model module that built it (its ``make_rows`` and ``LABELS``)."""
    from sparktune.serve.inference import resolve_model

    uri, _, tiny_model = tiny_champion(work, MODEL_NAME)
    return resolve_model(MODEL_NAME, "champion", uri, download_dir=work / "inference-models"), tiny_model


def _model_folder(ref: Any) -> str:
    """The Hugging Face folder (weights and tokenizer) inside the registered label pyfunc, where its
    MLmodel file says the ``model`` artifact is."""
    from mlflow.models import Model
    from sparktune.model.label_pyfunc import MERGED_ARTIFACT

    artifacts = Model.load(ref.local_path).flavors["python_function"]["artifacts"]
    return str(Path(ref.local_path) / artifacts[MERGED_ARTIFACT]["path"])


def _seed_way(df: Any, ref: Any, max_new_tokens: int) -> Any:
    """The seed recipe: a text-generation pipeline built inside each partition call."""
    from pyspark.sql.types import StringType, StructField, StructType

    model_dir = tokenizer_dir = _model_folder(ref)
    template = ref.prompt_template

    def predict(frames: Any) -> Any:
        import pandas as pd
        from sparktune.core.label_scoring import format_example
        from transformers import pipeline

        generator = pipeline("text-generation", model=model_dir, tokenizer=tokenizer_dir, device="cpu")
        generator.tokenizer.padding_side = "left"
        if generator.tokenizer.pad_token is None:
            generator.tokenizer.pad_token = generator.tokenizer.eos_token
        for frame in frames:
            prompts = [format_example(template, t, "")[0] for t in frame["text"]]
            outputs = generator(
                prompts,
                batch_size=SEED_BATCH_SIZE,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                return_full_text=False,
            )
            labels = [out[0]["generated_text"].strip() for out in outputs]
            yield pd.DataFrame({"id": frame["id"].values, "prediction": labels})

    schema = StructType([StructField("id", StringType()), StructField("prediction", StringType())])
    return df.mapInPandas(predict, schema)


def _warm_workers(data: Any) -> None:
    """One job whose Python workers import what both methods import (torch, transformers, the
    project's scoring and prompt modules): later jobs reuse these workers, already warm."""

    def warm(frames: Any) -> Any:
        import sparktune.core.label_scoring  # noqa: F401
        import sparktune.serve.inference  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401

        for frame in frames:
            yield frame.head(0)

    data.mapInPandas(warm, data.schema).write.format("noop").mode("overwrite").save()


def _timed(frame: Any, method: str, labels: tuple[str, ...]) -> tuple[float, int, int]:
    """(seconds, rows, right answers) of a noop write of every row of ``frame``, counted on the way.

    The row ids are ``<seed>-<i>`` and row ``i``'s label is ``labels[i % len(labels)]``
    (``tiny_model.make_rows``), so the answers are checked inside the job.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    index = F.substring_index(F.col("id"), "-", -1).cast("int")
    truth = F.element_at(F.array(*[F.lit(x) for x in labels]), (index % len(labels) + 1).cast("int"))
    observation = Observation(f"bench-{method}")
    observed = frame.observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        F.sum((F.col("prediction") == truth).cast("int")).alias("right"),
    )
    started = time.perf_counter()
    observed.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - started
    metrics = observation.get
    return seconds, int(metrics["rows"]), int(metrics["right"] or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_INFERENCE_ROWS", "3000")))
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate the methods this many times; report the median"
    )
    args = parser.parse_args(argv)
    if args.rows < 1 or args.partitions < 1 or args.repeats < 1:
        parser.error("--rows, --partitions and --repeats must be >= 1")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Two Spark tasks on two cores: one torch thread per Python worker avoids oversubscription.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from pyspark.sql import SparkSession
    from sparktune.serve.inference import score_dataframe

    out_dir = sparktune_home() / "bench"
    ref, tiny_model = bench_champion(out_dir / "inference")
    rows = tiny_model.make_rows(args.rows, 21)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("bench-inference")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.OMP_NUM_THREADS", "1")
        .getOrCreate()
    )
    data = spark.createDataFrame([(r["example_id"], r["text"]) for r in rows], "id string, text string")
    data = data.repartition(args.partitions).cache()
    data.count()
    _warm_workers(data)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(_model_folder(ref))
    max_new_tokens = (
        max(len(tokenizer(f" {x}", add_special_tokens=False)["input_ids"]) for x in ref.labels) + 2
    )

    methods = {
        "seed_pipeline": lambda: _seed_way(data, ref, max_new_tokens),
        "project": lambda: score_dataframe(
            data, ref, batch_size=PROJECT_BATCH_SIZE, scored_at=datetime(2025, 1, 1, tzinfo=UTC)
        ),
    }
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for repeat in range(args.repeats):
        for method, build in methods.items():
            seconds, scored, right = _timed(build(), method, tuple(tiny_model.LABELS))
            runs[method].append(
                {"seconds": seconds, "rows": scored, "accuracy": right / scored if scored else 0.0}
            )
            print(f"[{repeat + 1}/{args.repeats}] {method}: {scored} rows in {seconds:.1f} s", flush=True)
    spark.stop()

    results = []
    for method, method_runs in runs.items():
        median = sorted(method_runs, key=lambda r: r["seconds"])[(len(method_runs) - 1) // 2]
        results.append(
            {
                "method": method,
                "rows": median["rows"],
                "seconds": round(median["seconds"], 3),
                "rows_per_s": round(median["rows"] / median["seconds"], 1),
                "accuracy": round(median["accuracy"], 4),
                "batch_size": SEED_BATCH_SIZE if method == "seed_pipeline" else PROJECT_BATCH_SIZE,
                "runs_seconds": [round(r["seconds"], 3) for r in method_runs],
            }
        )
    seed = results[0]["rows_per_s"]
    for r in results:
        r["speedup_vs_seed"] = round(r["rows_per_s"] / seed, 2)
    print(f"\n{'method':<16}{'rows':>8}{'seconds':>10}{'rows/s':>10}{'accuracy':>10}{'speedup':>9}")
    for r in results:
        print(
            f"{r['method']:<16}{r['rows']:>8}{r['seconds']:>10.1f}{r['rows_per_s']:>10.1f}"
            f"{r['accuracy']:>10.3f}{r['speedup_vs_seed']:>8.2f}x"
        )
    project = results[1]
    complete = all(r["rows"] == args.rows for r in results)
    targets = [
        target(
            "project rows/s over the seed pipeline's",
            project["speedup_vs_seed"],
            at_least=TARGET_SPEEDUP,
            unit="x",
        )
    ]
    report = {
        "benchmark": "batch inference vs the seed pipeline",
        "results": results,
        "rows": args.rows,
        "partitions": args.partitions,
        "repeats": args.repeats,
        "master": args.master,
        "model": f"{ref.name} v{ref.version} (tiny LLaMA, {len(ref.labels)} labels)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "note": (
            "the clock covers one Spark action per method: a noop write of every output row with an "
            "Observation counting rows and right answers; workers warmed (imports) before any clock, "
            "model loading in the workers included"
        ),
    }
    if not complete:
        print(f"FAILED: a method scored fewer than the {args.rows} input rows", file=sys.stderr)
    return finish(out_dir / "inference.json", report, targets, ran=complete)


if __name__ == "__main__":
    sys.exit(main())
