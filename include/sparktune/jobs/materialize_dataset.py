"""spark-submit application: a table or path -> a Hugging Face DatasetDict, written by the executors.

    spark-submit --master local[2] include/sparktune/jobs/materialize_dataset.py \\
        --source /lake/prepared/<fingerprint> --datasets-root /lake/datasets \\
        --data-fingerprint <fingerprint> --summary-path /tmp/summary.json

``--source`` is a Parquet / CSV / JSON Lines path or a catalog table. Rows go to the split named
in ``--split-column`` (the prepared data's ``split=`` folders) or all to ``train``. Exit codes
as for every sparktune job: 0 done, 2 bad input (the summary holds the error), else retry. A full
disk exits 1 with ``{"error", "kind": "DiskFullError", "retry"}`` in the summary: ``retry`` is
false when the dataset is larger than the whole volume.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from sparktune.jobs.summary import bad_input, write_summary

APP_NAME = "sparktune-materialize_dataset"
log = logging.getLogger("sparktune.jobs.materialize_dataset")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="materialize_dataset", description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="Path or URI of the data, or a catalog table name")
    parser.add_argument("--source-format", default="auto", help="auto, parquet, csv, json or table")
    parser.add_argument(
        "--datasets-root", required=True, help="fsspec URI; the dataset goes to <root>/<fingerprint>"
    )
    parser.add_argument(
        "--data-fingerprint",
        default=None,
        help="Key of this data version; without it the content fingerprint is computed (one pass)",
    )
    parser.add_argument(
        "--split-column", default="split", help="Column naming each row's split ('' for none)"
    )
    parser.add_argument("--label-column", default="label", help="Column to type as ClassLabel ('' for none)")
    parser.add_argument(
        "--label-names", default=None, help="JSON list fixing the ClassLabel order (default: sorted distinct)"
    )
    parser.add_argument("--splits", default=None, help="JSON list of the splits every dataset must have")
    parser.add_argument(
        "--storage-options",
        default=None,
        help="JSON object for fsspec (credentials come from the environment)",
    )
    parser.add_argument("--summary-path", default=None, help="Local path or file:// URI for the summary JSON")
    return parser.parse_args(argv)


def _json_arg(value: str | None, name: str, kind: type) -> object:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON ({exc.msg}): {value!r}") from exc
    if not isinstance(parsed, kind):
        raise ValueError(f"{name} must be a JSON {kind.__name__}, got {value!r}")
    return parsed


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)

    from sparktune.data.materialize import materialize_dataset
    from sparktune.data.materialize_errors import DiskFullError, MaterializeError
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.published_dataset import find_published

    try:
        label_names = _json_arg(args.label_names, "--label-names", list)
        splits = _json_arg(args.splits, "--splits", list)
        storage_options = _json_arg(args.storage_options, "--storage-options", dict)
    except ValueError as exc:
        return bad_input(log, exc, args.summary_path)

    # Checked before a Spark session exists: a rerun of a known data version costs no Spark at all.
    found = (
        find_published(args.datasets_root, args.data_fingerprint, storage_options)
        if args.data_fingerprint
        else None
    )
    if found is None:
        from pyspark.sql import SparkSession

        owns_session = SparkSession.getActiveSession() is None
        spark = SparkSession.builder.appName(APP_NAME).getOrCreate()
        try:
            found = materialize_dataset(
                spark,
                args.source,
                args.datasets_root,
                data_fingerprint=args.data_fingerprint,
                split_column=args.split_column or None,
                label_column=args.label_column or None,
                label_names=label_names,
                splits=splits,
                source_format=args.source_format,
                storage_options=storage_options,
            )
        except (DataPreparationError, MaterializeError) as exc:
            return bad_input(log, exc, args.summary_path)
        except DiskFullError as exc:
            log.error("%s", exc)
            if args.summary_path:
                record = {"error": str(exc), "kind": type(exc).__name__, "retry": exc.retry_may_help}
                write_summary(record, args.summary_path)
            return 1
        finally:
            if owns_session:
                spark.stop()
    summary = found.to_summary()
    log.info(
        "dataset %s: rows %s, %s in %.1f s",
        found.dataset_uri,
        found.rows,
        "reused" if found.reused else "built",
        found.seconds,
    )
    if args.summary_path:
        write_summary(summary, args.summary_path)
    else:
        print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
