"""``MaterializeDatasetOperator``: a table or path -> a Hugging Face ``DatasetDict``, written by Spark
executors or, for small Parquet, converted in the task."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sparktune.core.config import settings
from sparktune.data.spark_jvm import input_bytes, short_job_conf
from sparktune_airflow.core.lineage import ReportsLineage
from sparktune_airflow.core.links import SparkUILink
from sparktune_airflow.core.spark_jobs import job_path, submit_and_read_summary
from sparktune_airflow.core.spark_submit import SparkSubmitOperator
from sparktune_airflow.core.task_context import check_allowed_location, task_scratch_dir


def _disk_full_failure(exc: Any) -> AirflowException:
    """A full datasets volume: retried, unless the dataset is larger than the whole volume.

    Retry: the failed attempt removed its partial write, and the rest of the volume may be freed
    before the retry (a concurrent run's temp folder or checkpoints, a cleanup, an operator
    answering the alert). Fail at once when the dataset needs more than the volume holds in all:
    no retry can fit it, and waiting out the backoff only delays the message.
    """
    failure = AirflowException if exc.retry_may_help else AirflowFailException
    return failure(str(exc))


class MaterializeDatasetOperator(ReportsLineage, SparkSubmitOperator):
    """A table or path -> a Hugging Face DatasetDict at ``<datasets_root>/<data fingerprint>``.

    Spark executors write the Arrow shards (``sparktune.jobs.materialize_dataset`` through
    spark-submit, on whatever ``conn_id`` points at). A data version that is already published
    returns at once, before any Spark starts. Reusable on its own::

        MaterializeDatasetOperator(task_id="to_arrow", source="catalog.db.tickets",
                                   datasets_root="s3://bucket/datasets", label_column="intent")

    ``dataset_mode="streaming"`` builds nothing: training then streams the Parquet shards.

    Returns ``dataset_uri``, ``data_fingerprint``, rows and shards per split, ``labels``, ``reused``.

    :param source: (templated) a Parquet, CSV or JSON Lines path or URI, or a catalog table.
    :param datasets_root: (templated) where datasets go, any fsspec URI the driver and executors
        share; default ``<lake>/datasets``, the lake being ``$SPARKTUNE_LAKE_URI`` or
        ``$SPARKTUNE_HOME/lake``.
    :param data_fingerprint: (templated) the data version's key; a version already published
        returns at once. None: the content fingerprint is computed first (one Spark pass).
    :param label_column: the column typed as a ``ClassLabel``; None keeps labels as they are.
    :param label_names: (templated) the ``ClassLabel`` names, in order; default (None): the sorted
        distinct labels of the data. A label outside the list fails the task.
    :param split_column: the column naming each row's split, dropped from the features; None, or a
        source without that column: every row goes to ``train``.
    :param splits: the splits every dataset must have (a split with no rows is written empty);
        default (None): the splits found.
    :param source_format: ``auto`` (by extension; a name without a path separator is a table),
        ``parquet``, ``csv``, ``json`` or ``table``.
    :param dataset_mode: (templated) ``materialized`` (default) or ``streaming``.
    :param storage_options: fsspec options for the source and ``datasets_root`` (credentials
        come from the environment).
    :param conn_id: the Spark connection spark-submit runs against (default ``spark_default``).

    Other keyword arguments go to ``SparkSubmitOperator``.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "source",
        "datasets_root",
        "data_fingerprint",
        "label_names",
        "dataset_mode",
    )
    operator_extra_links = (SparkUILink(),)

    def __init__(
        self,
        *,
        source: str,
        datasets_root: str | None = None,
        data_fingerprint: str | None = None,
        label_column: str | None = "label",
        label_names: list[str] | None = None,
        split_column: str | None = "split",
        splits: list[str] | None = None,
        source_format: str = "auto",
        dataset_mode: str = "materialized",
        storage_options: dict[str, Any] | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "sparktune-materialize_dataset")
        kwargs.setdefault("conf", {"spark.log.level": "WARN"})
        kwargs.setdefault("multiple_outputs", True)  # dataset_uri is read by the tasks after it
        super().__init__(conn_id=conn_id, **kwargs)
        self.source = source
        self.datasets_root = datasets_root
        self.data_fingerprint = data_fingerprint
        self.label_column = label_column
        self.label_names = label_names
        self.split_column = split_column
        self.splits = splits
        self.source_format = source_format
        self.dataset_mode = dataset_mode
        self.storage_options = storage_options

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.data.materialize import DATASET_MODES, converts_without_spark, materialize_dataset
        from sparktune.data.materialize_errors import DiskFullError, MaterializeError
        from sparktune.data.published_dataset import find_published
        from sparktune.data.streaming import describe_parquet_splits

        check_allowed_location("source", self.source, self.source_format)
        if self.dataset_mode not in DATASET_MODES:
            raise AirflowFailException(
                f"dataset_mode must be one of {list(DATASET_MODES)}, got {self.dataset_mode!r}"
            )
        if self.dataset_mode == "streaming":
            try:
                summary = describe_parquet_splits(
                    self.source, self.data_fingerprint, self.label_names, self.storage_options
                )
            except (FileNotFoundError, ValueError) as exc:
                raise AirflowFailException(str(exc)) from exc
            self.log.info("streaming mode: training reads %s directly, rows %s", self.source, summary["rows"])
            return self._keep(summary)
        root = self.datasets_root or f"{settings().lake_uri}/datasets"
        if self.data_fingerprint:
            found = find_published(root, self.data_fingerprint, self.storage_options)
            if found is not None:
                self.log.info("dataset %s already published: reused, no Spark job", found.dataset_uri)
                return self._keep(found.to_summary())
        if self.data_fingerprint and converts_without_spark(
            self.source, self.source_format, self.storage_options
        ):
            # Small Parquet: converting it here beats the seconds a spark-submit costs to start.
            try:
                result = materialize_dataset(
                    None,
                    self.source,
                    root,
                    data_fingerprint=self.data_fingerprint,
                    split_column=self.split_column,
                    label_column=self.label_column,
                    label_names=self.label_names,
                    splits=self.splits,
                    storage_options=self.storage_options,
                )
            except MaterializeError as exc:
                raise AirflowFailException(f"materialize_dataset rejected its input: {exc}") from exc
            except DiskFullError as exc:
                raise _disk_full_failure(exc) from exc
            self.log.info("dataset %s: rows %s, built in this process", result.dataset_uri, result.rows)
            return self._keep(result.to_summary())
        self.conf = short_job_conf(self.conf, input_bytes(self.source, self.storage_options))
        self.application = self.application or job_path("materialize_dataset")
        summary_path = task_scratch_dir(context) / "materialize_summary.json"
        summary_path.unlink(missing_ok=True)
        args = [
            "--source", self.source,
            "--source-format", self.source_format,
            "--datasets-root", root,
            "--split-column", self.split_column or "",
            "--label-column", self.label_column or "",
            "--summary-path", str(summary_path),
        ]  # fmt: skip
        if self.data_fingerprint:
            args += ["--data-fingerprint", self.data_fingerprint]
        if self.label_names is not None:
            args += ["--label-names", json.dumps(list(self.label_names))]
        if self.splits is not None:
            args += ["--splits", json.dumps(list(self.splits))]
        if self.storage_options:
            args += ["--storage-options", json.dumps(self.storage_options)]
        self.application_args = args
        summary = submit_and_read_summary(self, context, summary_path, "materialize_dataset")
        self.log.info(
            "dataset %s: rows %s in %s shards, %.1f MB, %s in %.1f s",
            summary["dataset_uri"],
            summary["rows"],
            summary.get("shards"),
            (summary.get("num_bytes") or 0) / 1e6,
            "reused" if summary["reused"] else "built",
            summary["seconds"],
        )
        return self._keep(summary)

    def _lineage(self):
        """The prepared splits (the source itself when it has no split folders) -> the dataset."""
        from sparktune_airflow.core.lineage import has_split_folders, materialize_lineage

        source = str(self.source)
        partitioned = bool(self.split_column) and has_split_folders(
            source, self.split_column, self.storage_options
        )
        return materialize_lineage(
            self._lineage_result, source, split_column=self.split_column, partitioned=partitioned
        )
