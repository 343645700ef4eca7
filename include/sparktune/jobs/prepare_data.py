"""spark-submit application: prepare the training data and write a JSON summary.

    spark-submit --master local[2] include/sparktune/jobs/prepare_data.py \\
        --params-json '{"source_uri": "/data/tickets.jsonl"}' --tokenizer /models/base \\
        --lake-uri /lake --summary-path /tmp/summary.json

The master, executors and Spark conf come from spark-submit (or the Airflow Spark connection).
Exit codes: 0 done; 2 bad params or bad data (deterministic: retrying will not help; the summary
file then holds ``{"error": message, "kind": exception class}``); anything else is an unexpected
failure worth a retry.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from sparktune.jobs.summary import bad_input, write_summary

APP_NAME = "sparktune-prepare_data"
log = logging.getLogger("sparktune.jobs.prepare_data")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="prepare_data", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--params-json", default="{}", help="JSON object of pipeline params (defaults fill the rest)"
    )
    parser.add_argument(
        "--tokenizer", required=True, help="Local folder or hub id of the base model's tokenizer"
    )
    parser.add_argument(
        "--lake-uri",
        default=None,
        help="Root of the lake (default: SPARKTUNE_LAKE_URI or SPARKTUNE_HOME/lake)",
    )
    parser.add_argument("--summary-path", default=None, help="Local path or file:// URI for the summary JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)

    from sparktune.model_safety import UnsafeModelError
    from sparktune.params import InvalidParamsError, parse_params
    from sparktune.prepare import DataPreparationError, run_prepare

    try:
        raw = json.loads(args.params_json)
        if not isinstance(raw, dict):
            raise InvalidParamsError([f"--params-json must be a JSON object, got {type(raw).__name__}"])
        params = parse_params(raw)
    except (json.JSONDecodeError, InvalidParamsError) as exc:
        return bad_input(log, exc, args.summary_path)
    if args.lake_uri is None:
        from sparktune.config import settings

        args.lake_uri = settings().lake_uri

    from pyspark.sql import SparkSession

    # Stop only a session this call started: main() may run inside a process that owns one
    # (a test, a notebook), and stopping that would pull it from under its owner.
    owns_session = SparkSession.getActiveSession() is None
    spark = SparkSession.builder.appName(APP_NAME).getOrCreate()
    try:
        summary = run_prepare(spark, params, args.tokenizer, args.lake_uri)
    except (DataPreparationError, UnsafeModelError) as exc:  # UnsafeModelError: the tokenizer's folder
        return bad_input(log, exc, args.summary_path)
    finally:
        if owns_session:
            spark.stop()
    if args.summary_path:
        written = write_summary(summary, args.summary_path)
        log.info("summary written to %s", written)
    else:
        print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
