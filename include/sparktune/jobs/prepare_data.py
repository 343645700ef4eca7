"""spark-submit application: prepare the training data and write a JSON summary.

    spark-submit --master local[2] include/sparktune/jobs/prepare_data.py \\
        --params-json '{"source_uri": "/data/tickets.jsonl"}' --tokenizer /models/base \\
        --lake-uri /lake --summary-path /tmp/summary.json [--gx-root /gx --quality-run-id RUN]

The master, executors and Spark conf come from spark-submit (or the Airflow Spark connection).
With ``--gx-root`` the data quality gate (``sparktune.data.quality``) runs in the same application once
the data is published, on the source as it was read: one JVM, one read, and Great Expectations
imported while the JVM starts (docs/decisions/0007-quality-gate-in-the-prepare-job.md).
Exit codes: 0 done; 2 bad params or bad data (deterministic: retrying will not help; the summary
file then holds ``{"error": message, "kind": exception class}``); anything else is an unexpected
failure worth a retry.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    parser.add_argument(
        "--gx-root",
        default=None,
        help="Also run the data quality gate in this application, after publishing, with this Great "
        "Expectations project (a folder the driver can write); its report goes under 'quality'",
    )
    parser.add_argument(
        "--quality-run-id", default=None, help="The run id Data Docs file the validation under"
    )
    return parser.parse_args(argv)


def _import_in_background(module: str) -> None:
    """Import ``module`` on a thread while the driver waits on the JVM: great_expectations takes
    seconds to import, and the main thread spends those seconds blocked on py4j's socket."""
    threading.Thread(target=importlib.import_module, args=(module,), daemon=True).start()


def quality_gate(
    spark: Any, params: Any, gx_root: str, run_id: str | None
) -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
    """The quality gate as ``run_prepare``'s ``after_publish``: the source as preparation read it
    and the prepared rows as published, in this Spark application.

    An unexpected error is recorded (``quality_error``), not raised: the data is published, and the
    ``validate_data`` task runs the gate in an application of its own when no report came back.
    """

    def validate(source_df: Any, summary: dict[str, Any]) -> dict[str, Any]:
        from sparktune.data.quality import run_quality_gate

        try:
            report = run_quality_gate(
                spark,
                params,
                source_uri=summary["source_uri"],
                gx_root=Path(gx_root),
                prepared_uri=summary["prepared_uri"],
                run_id=run_id,
                raw_df=source_df,
            )
        except Exception as exc:  # noqa: BLE001 (see the docstring)
            log.warning("quality gate not run in this application (%s: %s)", type(exc).__name__, exc)
            return {"quality_error": f"{type(exc).__name__}: {exc}"}
        return {"quality": {**report.to_summary(), "source_uri": summary["source_uri"]}}

    return validate


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Great Expectations logs a few hundred lines of its own bookkeeping at INFO (registering functions).
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    args = parse_args(argv)
    if args.gx_root:
        _import_in_background("great_expectations")

    from sparktune.core.model_safety import UnsafeModelError
    from sparktune.core.params import InvalidParamsError, parse_params
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_publish import run_prepare

    try:
        raw = json.loads(args.params_json)
        if not isinstance(raw, dict):
            raise InvalidParamsError([f"--params-json must be a JSON object, got {type(raw).__name__}"])
        params = parse_params(raw)
    except (json.JSONDecodeError, InvalidParamsError) as exc:
        return bad_input(log, exc, args.summary_path)
    if args.lake_uri is None:
        from sparktune.core.config import settings

        args.lake_uri = settings().lake_uri

    from pyspark.sql import SparkSession

    # Stop only a session this call started: main() may run inside a process that owns one
    # (a test, a notebook), and stopping that would pull it from under its owner.
    owns_session = SparkSession.getActiveSession() is None
    spark = SparkSession.builder.appName(APP_NAME).getOrCreate()
    try:
        validate = quality_gate(spark, params, args.gx_root, args.quality_run_id) if args.gx_root else None
        summary = run_prepare(spark, params, args.tokenizer, args.lake_uri, after_publish=validate)
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
