"""The review queue's operator, a thin shell over ``sparktune.serve.review_queue``:
``ReviewQueueOperator`` writes the scored rows the model is least sure of as a file to fill in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune.core.config import settings
from sparktune.core.paths import path_segment
from sparktune_airflow.core.spark_jobs import session_jvm_conf
from sparktune_airflow.core.task_context import check_allowed_location

# Where the queues go by default, one folder per DAG run under it.
QUEUE_FOLDER = "review_queue"


def _build_review_queue(
    feedback_uri: str,
    captures_uri: str,
    model_name: str,
    size: int,
    output_uri: str,
    spark: Any = None,
) -> dict[str, Any]:
    from sparktune.serve.feedback import FeedbackError
    from sparktune.serve.review_queue import build_review_queue

    try:
        result = build_review_queue(
            spark,
            feedback_uri=feedback_uri,
            captures_uri=captures_uri or None,
            model_name=model_name,
            size=size,
            output_uri=output_uri,
        )
    except FeedbackError as exc:
        raise AirflowFailException(str(exc)) from exc
    print(
        f"review queue: {result.rows} rows, the least confident of {result.candidates} scored texts "
        f"({result.already_corrected} already corrected, left out)\n"
        f"  fill in the label column of: {result.csv_uri}\n"
        f"  the same rows as Parquet:   {result.parquet_uri}\n"
        "  then record it: the record_corrections DAG with corrections_uri set to that file"
    )
    return result.to_summary()


class ReviewQueueOperator(PySparkOperator):
    """Writes the ``size`` scored rows the model is least sure of (lowest score), one per distinct
    text and none already corrected, from batch inference's review rows and the serving endpoint's
    captured answers, as ``<output_uri>/<run id>/review_queue.csv`` and ``review_queue.parquet``
    with an empty ``label`` column for a reviewer. The filled file is what ``record_corrections``
    takes (rows left without a label are skipped). Returns the files' URIs and the row counts.

    Nothing scored yet, or no scored row of ``model_name``, fails the task without retries.

    :param model_name: (templated) whose scored rows to queue; empty: every model's.
    :param size: (templated) how many rows the queue holds, at least 1.
    :param output_uri: (templated) folder of the queues; each run writes its own subfolder (a rerun
        of a run replaces its files). Default ``<feedback_uri>/review_queue``.
    :param feedback_uri: the feedback table (default ``SPARKTUNE_FEEDBACK_URI`` or ``<lake>/feedback``).
    :param captures_uri: the serving endpoint's captured answers (default
        ``SPARKTUNE_SERVING_CAPTURES_URI`` or ``<lake>/serving_captures``).
    :param conn_id: the Spark connection (default ``spark_default``).
    """

    template_fields: Sequence[str] = (*PySparkOperator.template_fields, "model_name", "size", "output_uri")

    def __init__(
        self,
        *,
        model_name: str = "",
        size: int | str = 100,
        output_uri: str | None = None,
        feedback_uri: str | None = None,
        captures_uri: str | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(python_callable=_build_review_queue, conn_id=conn_id, **kwargs)
        self.model_name = model_name
        self.size = size
        self.output_uri = output_uri
        self.feedback_uri = feedback_uri
        self.captures_uri = captures_uri

    def execute(self, context: Any) -> Any:
        from pathlib import Path

        try:
            size = int(self.size)
        except (TypeError, ValueError):
            size = 0
        if size < 1:
            raise AirflowFailException(f"size is {self.size!r}. Fix: a whole number of rows, at least 1.")
        feedback_uri = self.feedback_uri or settings().feedback_uri
        root = str(self.output_uri or "").strip() or f"{feedback_uri.rstrip('/')}/{QUEUE_FOLDER}"
        # Before the Spark session starts: the tables to read and the folder to write.
        check_allowed_location("output_uri", root)
        check_allowed_location("feedback_uri", self.feedback_uri)
        check_allowed_location("captures_uri", self.captures_uri)
        if "://" not in root:
            root = str(Path(root).expanduser().resolve())
        self.op_kwargs = {
            "feedback_uri": feedback_uri,
            "captures_uri": self.captures_uri or settings().serving_captures_uri,
            "model_name": str(self.model_name or "").strip(),
            "size": size,
            # One folder per run: a queue being filled in is never overwritten by the next run.
            "output_uri": f"{root.rstrip('/')}/{path_segment(context['ti'].run_id)}",
        }
        # It reads the feedback table and the serving captures: the inputs' size is not known.
        self.config_kwargs = session_jvm_conf(self.conn_id, self.config_kwargs, None)
        return super().execute(context)
