"""Benchmark: rows/s of batch inference (``sparktune.inference.score_dataframe``) vs the seed way.

    make bench-inference                       # 3,000 rows, local[2], 4 partitions
    BENCH_INFERENCE_ROWS=10000 make bench-inference

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
MLflow and registered as ``bench-intent@champion`` (resolved and downloaded once, as the DAG
does). The clock covers the Spark action only (a ``noop`` write of every output row). Prints a
table and writes SPARKTUNE_HOME/bench/inference.json. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SEED_BATCH_SIZE = 8
PROJECT_BATCH_SIZE = 32
MODEL_NAME = "bench-intent"


def _home() -> Path:
    return Path(os.environ.get("SPARKTUNE_HOME", ROOT / ".local"))


def _model(work: Path) -> tuple[Any, str]:
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import tiny_model
    from mlflow.tracking import MlflowClient
    from sparktune.inference import resolve_model
    from sparktune.registry import register_run_model
    from sparktune.training import using_tracking_uri

    root = tiny_model.workspace(work)
    result = tiny_model.trained(root, "full")
    uri = tiny_model.tracking_uri(root)
    client = MlflowClient(tracking_uri=uri)
    with using_tracking_uri(uri):
        version = register_run_model(
            client, MODEL_NAME, result.mlflow_run_id, {"data_fingerprint": "fp-bench"}
        )
    client.set_registered_model_alias(MODEL_NAME, "champion", version)
    return resolve_model(MODEL_NAME, "champion", uri, download_dir=work / "inference-models"), tiny_model


def _seed_way(df: Any, ref: Any, max_new_tokens: int) -> Any:
    """The seed recipe: a text-generation pipeline built inside each partition call."""
    from pyspark.sql.types import StringType, StructField, StructType

    model_dir = str(Path(ref.local_path) / "model")
    tokenizer_dir = str(Path(ref.local_path) / "components" / "tokenizer")
    template = ref.prompt_template

    def predict(frames: Any) -> Any:
        import pandas as pd
        from sparktune.prepare import format_example
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_INFERENCE_ROWS", "3000")))
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Two Spark tasks on two cores: one torch thread per Python worker avoids oversubscription.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from pyspark.sql import SparkSession
    from sparktune.inference import score_dataframe

    out_dir = _home() / "bench"
    ref, tiny_model = _model(out_dir / "inference")
    rows = tiny_model.make_rows(args.rows, 21)
    truth = {r["example_id"]: tiny_model.LABELS[r["label"]] for r in rows}
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

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(Path(ref.local_path) / "components" / "tokenizer"))
    max_new_tokens = (
        max(len(tokenizer(f" {x}", add_special_tokens=False)["input_ids"]) for x in ref.labels) + 2
    )

    methods = {
        "seed_pipeline": lambda: _seed_way(data, ref, max_new_tokens),
        "project": lambda: score_dataframe(
            data, ref, batch_size=PROJECT_BATCH_SIZE, scored_at=datetime(2025, 1, 1, tzinfo=UTC)
        ),
    }
    results = []
    for method, build in methods.items():
        frame = build()
        started = time.perf_counter()
        predictions = {r["id"]: r["prediction"] for r in frame.select("id", "prediction").collect()}
        seconds = time.perf_counter() - started
        accuracy = sum(truth[i] == p for i, p in predictions.items()) / len(rows)
        results.append(
            {
                "method": method,
                "rows": len(predictions),
                "seconds": round(seconds, 3),
                "rows_per_s": round(len(predictions) / seconds, 1),
                "accuracy": round(accuracy, 4),
                "batch_size": SEED_BATCH_SIZE if method == "seed_pipeline" else PROJECT_BATCH_SIZE,
            }
        )
        print(f"{method}: {len(predictions)} rows in {seconds:.1f} s", flush=True)
    spark.stop()

    seed = results[0]["rows_per_s"]
    for r in results:
        r["speedup_vs_seed"] = round(r["rows_per_s"] / seed, 2)
    report = {
        "results": results,
        "rows": args.rows,
        "partitions": args.partitions,
        "master": args.master,
        "model": f"{ref.name} v{ref.version} (tiny LLaMA, {len(ref.labels)} labels)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "note": "the clock covers the Spark action that collects every prediction; model load included",
    }
    print(f"\n{'method':<16}{'rows':>8}{'seconds':>10}{'rows/s':>10}{'accuracy':>10}{'speedup':>9}")
    for r in results:
        print(
            f"{r['method']:<16}{r['rows']:>8}{r['seconds']:>10.1f}{r['rows_per_s']:>10.1f}"
            f"{r['accuracy']:>10.3f}{r['speedup_vs_seed']:>8.2f}x"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "inference.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out_dir / 'inference.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
