"""spark-submit application: score a table or path with models:/NAME@alias, write dated Parquet.

    spark-submit --master local[2] include/sparktune/jobs/batch_inference.py \\
        --source /lake/incoming/tickets.parquet --text-column message --id-column ticket_id \\
        --output-uri /lake/predictions --model-name support-intent --model-alias champion \\
        --run-date 2025-03-04 --scored-at 2025-03-04T00:00:00+00:00 --summary-path /tmp/summary.json

The model folder is downloaded once on the driver into ``--download-dir``, which every executor
must read under the same path (shared storage; see ``sparktune.serve.inference``). Exit codes as for
every sparktune job: 0 done, 2 bad input (the summary holds the error), else retry.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import date, datetime

from sparktune.jobs.summary import bad_input, write_summary

APP_NAME = "sparktune-batch_inference"
log = logging.getLogger("sparktune.jobs.batch_inference")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="batch_inference", description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="Path or URI of the texts, or a catalog table name")
    parser.add_argument("--source-format", default="auto", help="auto, parquet, csv, json or table")
    parser.add_argument("--text-column", default="text", help="Column holding the text to score")
    parser.add_argument("--id-column", default="id", help="Column identifying each row")
    parser.add_argument("--output-uri", required=True, help="Parquet root; rows go to <uri>/date=<run date>")
    parser.add_argument("--model-name", required=True, help="Registered model name in MLflow")
    parser.add_argument("--model-alias", default="champion", help="Alias of the version to use")
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)"
    )
    parser.add_argument("--download-dir", default=None, help="Shared folder for model downloads")
    parser.add_argument("--batch-size", type=int, default=64, help="Texts per forward pass")
    parser.add_argument("--min-score", type=float, default=0.0, help="Keep rows whose score is at least this")
    parser.add_argument(
        "--run-date", required=True, help="The run's logical date (YYYY-MM-DD): its partition"
    )
    parser.add_argument(
        "--scored-at",
        default=None,
        help="ISO timestamp written in scored_at (default: run date, midnight UTC)",
    )
    parser.add_argument(
        "--feedback-uri",
        default=None,
        help="Feedback table root: the scored rows and their texts also go to <uri>/predictions for review",
    )
    parser.add_argument("--labels", default=None, help="JSON list of candidate labels (causal LM; optional)")
    parser.add_argument("--summary-path", default=None, help="Local path or file:// URI for the summary JSON")
    parser.add_argument(
        "--trust-remote-code",
        choices=("true", "false"),
        default="false",
        help="Let a model that ships its own Python code (auto_map) load; default false: refused.",
    )
    return parser.parse_args(argv)


def _parse_times(args: argparse.Namespace) -> tuple[date, datetime]:
    problems = []
    run_date = scored_at = None
    try:
        run_date = date.fromisoformat(args.run_date)
    except ValueError:
        problems.append(f"--run-date must be YYYY-MM-DD, got {args.run_date!r}")
    try:
        scored_at = datetime.fromisoformat(args.scored_at or f"{args.run_date}T00:00:00+00:00")
    except ValueError:
        problems.append(f"--scored-at must be an ISO timestamp, got {args.scored_at!r}")
    if problems:
        raise ValueError("; ".join(problems))
    assert run_date is not None and scored_at is not None
    return run_date, scored_at


def _write_review_rows(spark, source, args: argparse.Namespace, run_date: date) -> int:
    """The predictions just written (read back, not scored again) with their texts, for review."""
    from pyspark.sql import functions as F
    from sparktune.serve.feedback import write_review_rows

    written = spark.read.parquet(args.output_uri).where(F.col("date") == F.lit(run_date.isoformat()))
    texts = source.select(
        F.col(args.id_column).cast("string").alias("id"), F.col(args.text_column).cast("string").alias("text")
    )
    return write_review_rows(spark, written.drop("date"), texts, args.feedback_uri, run_date)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)

    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_source import load_source
    from sparktune.serve.inference import (
        InferenceInputError,
        resolve_model,
        score_dataframe,
        write_predictions,
    )

    try:
        run_date, scored_at = _parse_times(args)
        labels = json.loads(args.labels) if args.labels else None
        if labels is not None and not isinstance(labels, list):
            raise ValueError(f"--labels must be a JSON list, got {args.labels!r}")
        ref = resolve_model(
            args.model_name,
            args.model_alias,
            args.tracking_uri,
            download_dir=args.download_dir,
            labels=labels,
            trust_remote_code=args.trust_remote_code == "true",
        )
    except (ValueError, InferenceInputError) as exc:
        return bad_input(log, exc, args.summary_path)

    from pyspark.sql import SparkSession

    owns_session = SparkSession.getActiveSession() is None
    spark = SparkSession.builder.appName(APP_NAME).getOrCreate()
    started = time.perf_counter()
    try:
        source = load_source(spark, args.source, args.source_format)
        scored = score_dataframe(
            source,
            ref,
            text_column=args.text_column,
            id_column=args.id_column,
            batch_size=args.batch_size,
            min_score=args.min_score,
            scored_at=scored_at,
        )
        rows = write_predictions(scored, args.output_uri, run_date)
        review_rows = None
        if args.feedback_uri:
            review_rows = _write_review_rows(spark, source, args, run_date)
    except (DataPreparationError, InferenceInputError) as exc:
        return bad_input(log, exc, args.summary_path)
    finally:
        if owns_session:
            spark.stop()
    seconds = time.perf_counter() - started
    summary = {
        "model": ref.to_summary(),
        "output_uri": args.output_uri,
        "partition": f"date={run_date.isoformat()}",
        "rows_written": rows,
        "feedback_uri": args.feedback_uri,
        "review_rows": review_rows,
        "min_score": args.min_score,
        "seconds": round(seconds, 3),
    }
    log.info(
        "scored with %s@%s (v%s): %d rows to %s/date=%s in %.1f s",
        ref.name,
        ref.alias,
        ref.version,
        rows,
        args.output_uri,
        run_date,
        seconds,
    )
    if args.summary_path:
        write_summary(summary, args.summary_path)
    else:
        print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
