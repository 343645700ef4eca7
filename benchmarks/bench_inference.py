"""Benchmark: rows/s of batch inference (``sparktune.serve.inference.score_dataframe``) vs the seed way,
on the tiny LLaMA and on SmolLM2-135M-Instruct.

    make bench-inference                       # tiny: 10,000 rows; SmolLM2: 240 rows; local[2], 4 partitions
    BENCH_INFERENCE_SMOLLM2_ROWS=0 make bench-inference   # the tiny row alone
    python benchmarks/bench_inference.py --rows 1000 --smollm2-rows 480 --repeats 3

Same Spark master (``local[2]``), same rows (the tests' trivially learnable intent texts, so the
model's answers mean something), same partitions and same model for both methods, run one after
the other in this one process, model by model, each run in a Spark session (and Python workers)
of its own:

- ``seed_pipeline``: the seed recipe: inside each partition call, a transformers
  ``pipeline("text-generation")`` is built from the model folder and generates the label
  (greedy, ``max_new_tokens`` = longest label + 2) for the partition's prompts at a fixed
  batch size of 8, unsorted;
- ``project``: ``score_dataframe``: the registered pyfunc loaded once per Python worker, texts
  sorted by token length, every candidate label scored (constrained scoring, the one prediction
  path) in batches of 64: what the batch's prompts share run once, the rest of each prompt once,
  all of a prompt's candidates in one row over that cache.

Models, each registered as ``<name>@champion`` in a throwaway SQLite MLflow and resolved and
downloaded once on the driver, as the DAG does, before any clock starts:

- ``tiny-llama``: the tests' tiny LLaMA fully fine-tuned for 120 steps (``bench-intent``), the
  ``[INST]`` prompt;
- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from its PyPI package, LoRA fine-tuned through
  ``sparktune.model.training.train`` for ``--smollm2-steps`` steps (default 20) on the same intent
  texts in its own chat template (``bench-intent-smollm2``; built once per scoring code, a few
  minutes, see ``bench_common.smollm2_champion``).

In each session the input rows are cached in the JVM and counted before any clock, and a warm-up
job has every Python worker import what either method imports once per worker (torch,
transformers' LLaMA classes and ``pipeline``, MLflow's pyfunc loader and the project's scoring):
Spark reuses its Python workers between jobs, so neither clock holds imports a long-lived worker
pays once, and neither method runs in workers the other has left its model (or a frozen garbage
collector) in.

The clock covers one Spark action per method: a ``noop`` write of every output row, with an
``Observation`` counting rows and right answers on the way (no rows come back to the driver).
Inside it: each worker loading the model (the project: once per worker; the seed: a pipeline
per partition call), tokenizing and scoring every row. ``--repeats`` alternates the methods
and reports the median run of each.

Targets, project rows/s over the seed's in the same run: at least 2.5x on the tiny model (whose
cost is mostly Python and tokenizing) and 3x on SmolLM2 (mostly matrix work). Prints a table and
writes SPARKTUNE_HOME/bench/inference.json; exits 1 when a target is missed. Not a test.
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

from bench_common import SMOLLM2, finish, not_checked, smollm2_champion, target, tiny_champion  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_SPEEDUP = 2.5
TARGET_SMOLLM2_SPEEDUP = 3.0
DEFAULT_SMOLLM2_ROWS = 240
DEFAULT_SMOLLM2_STEPS = 20
SMOLLM2_MODEL_NAME = "bench-intent-smollm2"
SEED_BATCH_SIZE = 8
PROJECT_BATCH_SIZE = 64  # score_dataframe's default, as the batch_inference DAG's
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


def bench_smollm2_champion(work: Path, steps: int) -> tuple[Any, Any]:
    """The SmolLM2 champion (:func:`bench_common.smollm2_champion`) resolved as batch inference
    resolves it, and the tiny model module (its texts and labels)."""
    from sparktune.serve.inference import resolve_model

    uri, _, tiny_model = smollm2_champion(work, SMOLLM2_MODEL_NAME, steps=steps)
    ref = resolve_model(SMOLLM2_MODEL_NAME, "champion", uri, download_dir=work / "inference-models")
    return ref, tiny_model


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
    """One job whose Python workers import what the methods import once per worker: torch,
    transformers' LLaMA classes (both models are LLaMA), the seed's ``pipeline`` and the project's
    scoring and its MLflow loader. Later jobs reuse these workers (Spark keeps its Python workers),
    so neither method's clock holds the imports a long-lived worker pays once, and each still loads
    its model on the clock."""

    def warm(frames: Any) -> Any:
        import mlflow.pyfunc  # noqa: F401
        import sparktune.core.label_scoring  # noqa: F401
        import sparktune.release.eval_inputs  # noqa: F401
        import sparktune.serve.inference  # noqa: F401
        import torch  # noqa: F401
        import transformers.models.llama.modeling_llama  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: F401

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


def _spark(master: str) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName("bench-inference")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.OMP_NUM_THREADS", "1")
        .getOrCreate()
    )


def _bench_model(
    master: str, model: str, ref: Any, tiny_model: Any, rows: int, partitions: int, repeats: int
) -> list[dict[str, Any]]:
    """Both methods on ``rows`` generated texts scored by ``ref``, alternated ``repeats`` times,
    each run in a Spark session of its own: one result per method (the median run), the seed's first.

    A session of its own per run: Spark keeps its Python workers between jobs, and what one method
    leaves in them (a loaded model, a frozen garbage collector) would change the other's time."""
    from sparktune.serve.inference import score_dataframe
    from transformers import AutoTokenizer

    texts = [(r["example_id"], r["text"]) for r in tiny_model.make_rows(rows, 21)]
    tokenizer = AutoTokenizer.from_pretrained(_model_folder(ref))
    max_new_tokens = (
        max(len(tokenizer(f" {x}", add_special_tokens=False)["input_ids"]) for x in ref.labels) + 2
    )
    methods = {
        "seed_pipeline": lambda data: _seed_way(data, ref, max_new_tokens),
        "project": lambda data: score_dataframe(
            data, ref, batch_size=PROJECT_BATCH_SIZE, scored_at=datetime(2025, 1, 1, tzinfo=UTC)
        ),
    }
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for repeat in range(repeats):
        for method, build in methods.items():
            spark = _spark(master)
            data = spark.createDataFrame(texts, "id string, text string").repartition(partitions).cache()
            data.count()
            _warm_workers(data)
            seconds, scored, right = _timed(build(data), method, tuple(tiny_model.LABELS))
            spark.stop()
            runs[method].append(
                {"seconds": seconds, "rows": scored, "accuracy": right / scored if scored else 0.0}
            )
            print(f"[{model} {repeat + 1}/{repeats}] {method}: {scored} rows in {seconds:.1f} s", flush=True)
    results = []
    for method, method_runs in runs.items():
        median = sorted(method_runs, key=lambda r: r["seconds"])[(len(method_runs) - 1) // 2]
        results.append(
            {
                "model": model,
                "method": method,
                "rows": median["rows"],
                "expected_rows": rows,
                "seconds": round(median["seconds"], 3),
                "rows_per_s": round(median["rows"] / median["seconds"], 2),
                "accuracy": round(median["accuracy"], 4),
                "batch_size": SEED_BATCH_SIZE if method == "seed_pipeline" else PROJECT_BATCH_SIZE,
                "runs_seconds": [round(r["seconds"], 3) for r in method_runs],
                "registered": f"{ref.name} v{ref.version}",
            }
        )
    for r in results:
        r["speedup_vs_seed"] = round(r["rows_per_s"] / results[0]["rows_per_s"], 2)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_INFERENCE_ROWS", "10000")))
    parser.add_argument(
        "--smollm2-rows",
        type=int,
        default=int(os.environ.get("BENCH_INFERENCE_SMOLLM2_ROWS", str(DEFAULT_SMOLLM2_ROWS))),
        help="rows for the SmolLM2 row (0: leave it out)",
    )
    parser.add_argument(
        "--smollm2-steps",
        type=int,
        default=int(os.environ.get("BENCH_INFERENCE_SMOLLM2_STEPS", str(DEFAULT_SMOLLM2_STEPS))),
        help="LoRA steps of the SmolLM2 champion (built once per scoring code)",
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--repeats",
        type=int,
        default=int(os.environ.get("BENCH_INFERENCE_REPEATS", "3")),
        help="alternate the methods this many times; report the median",
    )
    args = parser.parse_args(argv)
    if args.rows < 1 or args.partitions < 1 or args.repeats < 1 or args.smollm2_rows < 0:
        parser.error("--rows, --partitions and --repeats must be >= 1, --smollm2-rows >= 0")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Two Spark tasks on two cores: one torch thread per Python worker avoids oversubscription.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out_dir = sparktune_home() / "bench"
    ref, tiny_model = bench_champion(out_dir / "inference")
    models = [("tiny-llama", ref, args.rows)]
    if args.smollm2_rows:
        smol_ref, _ = bench_smollm2_champion(out_dir / "inference-smollm2", args.smollm2_steps)
        models.append((SMOLLM2, smol_ref, args.smollm2_rows))
    results = []
    for model, model_ref, rows in models:
        results += _bench_model(
            args.master, model, model_ref, tiny_model, rows, args.partitions, args.repeats
        )

    print(
        f"\n{'model':<24}{'method':<16}{'rows':>7}{'seconds':>10}{'rows/s':>10}{'accuracy':>10}{'speedup':>9}"
    )
    for r in results:
        print(
            f"{r['model']:<24}{r['method']:<16}{r['rows']:>7}{r['seconds']:>10.1f}{r['rows_per_s']:>10.1f}"
            f"{r['accuracy']:>10.3f}{r['speedup_vs_seed']:>8.2f}x"
        )
    speedups = {r["model"]: r["speedup_vs_seed"] for r in results if r["method"] == "project"}
    targets = [
        target(
            "tiny-llama: project rows/s over the seed pipeline's",
            speedups["tiny-llama"],
            at_least=TARGET_SPEEDUP,
            unit="x",
        )
    ]
    if args.smollm2_rows:
        targets.append(
            target(
                f"{SMOLLM2}: project rows/s over the seed pipeline's",
                speedups[SMOLLM2],
                at_least=TARGET_SMOLLM2_SPEEDUP,
                unit="x",
            )
        )
    else:
        targets.append(not_checked(f"{SMOLLM2}: project rows/s over the seed pipeline's", "--smollm2-rows 0"))
    complete = all(r["rows"] == r["expected_rows"] for r in results)
    report = {
        "benchmark": "batch inference vs the seed pipeline",
        "results": results,
        "rows": args.rows,
        "smollm2_rows": args.smollm2_rows,
        "smollm2_steps": args.smollm2_steps,
        "partitions": args.partitions,
        "repeats": args.repeats,
        "master": args.master,
        "models": {model: f"{r.name} v{r.version} ({len(r.labels)} labels)" for model, r, _ in models},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "note": (
            "the clock covers one Spark action per method: a noop write of every output row with an "
            "Observation counting rows and right answers; workers warmed (imports) before any clock, "
            "model loading in the workers included"
        ),
    }
    if not complete:
        print("FAILED: a method scored fewer rows than it was given", file=sys.stderr)
    return finish(out_dir / "inference.json", report, targets, ran=complete)


if __name__ == "__main__":
    sys.exit(main())
