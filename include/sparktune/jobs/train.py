"""The one training entry point every backend runs: local subprocess, spark-submit, Databricks.

    python -m sparktune.jobs.train --request train_request.json                  # one process
    spark-submit --master spark://host:7077 include/sparktune/jobs/train.py \\
        --request-json '{...}' --num-workers 4 --distributor spark             # DDP over executors
    sparktune-train --request-json '{...}' --num-workers 8 --distributor spark  # Databricks wheel task

With ``--distributor spark`` the driver hands :func:`train_rank` to
``pyspark.ml.torch.distributor.TorchDistributor``, which starts ``--num-workers`` processes on the
executors with the torch.distributed environment set; the transformers Trainer picks it up and
runs DDP. Rank 0 alone writes to MLflow. The result travels back as rank 0's return value and,
for every backend, as the ``train_result.json`` artifact of the MLflow run tagged with the
request's train key, which is where the Airflow operator reads it.

Exit codes as for every sparktune job: 0 done, 2 bad input (a retry cannot help), 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
log = logging.getLogger("sparktune.jobs.train")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sparktune-train", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--request", help="Path of a TrainRequest JSON file")
    source.add_argument("--request-json", help="The TrainRequest itself, as JSON (for remote clusters)")
    parser.add_argument("--num-workers", type=int, default=1, help="Training processes (--distributor spark)")
    parser.add_argument(
        "--distributor",
        choices=("none", "spark"),
        default="none",
        help="none: train in this process; spark: TorchDistributor over the executors",
    )
    return parser.parse_args(argv)


def train_rank(request_json: str) -> dict[str, Any] | None:
    """Runs in every training process that TorchDistributor starts; rank 0 returns the result."""
    import os

    from sparktune.model.process_setup import configure_process_logging
    from sparktune.model.train_request import TrainRequest
    from sparktune.model.training import train

    configure_process_logging()
    result = train(TrainRequest.from_json(request_json))
    return result.to_dict() if int(os.environ.get("RANK", "0")) == 0 else None


def _spark_uses_gpu(spark: Any) -> bool:
    # TorchDistributor(use_gpu=True) asks every task for a GPU; only ask when the cluster hands them out.
    conf = spark.sparkContext.getConf()
    return float(conf.get("spark.task.resource.gpu.amount", "0") or 0) > 0


def run_distributed(request_json: str, num_workers: int) -> dict[str, Any]:
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    # No appName here: it would override spark-submit's --name, which carries the train key.
    spark = SparkSession.builder.getOrCreate()
    use_gpu = _spark_uses_gpu(spark)
    log.info("TorchDistributor: %d processes over the executors, use_gpu=%s", num_workers, use_gpu)
    distributor = TorchDistributor(num_processes=num_workers, local_mode=False, use_gpu=use_gpu)
    result = distributor.run(train_rank, request_json)
    if not isinstance(result, dict):
        raise RuntimeError(f"Rank 0 returned no training result (got {result!r}).")
    return result


def main(argv: list[str] | None = None) -> int:
    from sparktune.model.process_setup import configure_process_logging
    from sparktune.model.train_request import TrainRequest, TrainResult
    from sparktune.model.training import summary_line, train
    from sparktune.model.training_setup import TrainingInputError

    configure_process_logging()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        request_json = Path(args.request).read_text() if args.request else args.request_json
        request = TrainRequest.from_json(request_json)
    except (OSError, ValueError) as err:
        log.error("The train request is unusable: %s", err)
        return EXIT_BAD_INPUT
    if args.num_workers < 1:
        log.error("--num-workers must be at least 1, got %d", args.num_workers)
        return EXIT_BAD_INPUT
    try:
        if args.distributor == "spark":
            result = TrainResult.from_dict(run_distributed(request.to_json(), args.num_workers))
        else:
            result = train(request)
    except ValueError as err:  # TrainingInputError, InvalidParamsError: fix the input, do not retry
        log.error("%s", err)
        return EXIT_BAD_INPUT
    except Exception as err:
        # TorchDistributor re-raises a rank's failure as a RuntimeError holding its log; a bad
        # input on a rank is still a bad input.
        if TrainingInputError.__name__ in str(err) or "InvalidParamsError" in str(err):
            log.error("A training process rejected its input: %s", err)
            return EXIT_BAD_INPUT
        log.exception("Training failed")
        return 1
    print(summary_line(result), flush=True)
    return 0


def cli() -> None:
    """Console script ``sparktune-train`` (the Databricks python_wheel_task entry point)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
