"""The review queue's operator, a thin shell over ``sparktune.serve.review_queue``:
``ReviewQueueOperator`` writes the training rows whose label is likely wrong and the scored rows
the model is least sure of as a file to fill in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune.core.config import settings
from sparktune.core.params import DataSource
from sparktune.core.paths import path_segment
from sparktune_airflow.core.spark_jobs import session_jvm_conf
from sparktune_airflow.core.task_context import check_allowed_location, typed_params

# Where the queues go by default, one folder per DAG run under it.
QUEUE_FOLDER = "review_queue"
DEFAULT_LABEL_ISSUES = 50


def _build_review_queue(
    feedback_uri: str,
    captures_uri: str,
    model_name: str,
    size: int,
    output_uri: str,
    label_issues: int = 0,
    label_issue_source: dict[str, Any] | None = None,
    spark: Any = None,
) -> dict[str, Any]:
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.serve.feedback import FeedbackError
    from sparktune.serve.review_queue import LabelIssueSource, build_review_queue

    try:
        result = build_review_queue(
            spark,
            feedback_uri=feedback_uri,
            captures_uri=captures_uri or None,
            model_name=model_name,
            size=size,
            output_uri=output_uri,
            label_issue_source=LabelIssueSource(**label_issue_source) if label_issue_source else None,
            label_issues=label_issues,
        )
    except (FeedbackError, DataPreparationError) as exc:
        raise AirflowFailException(str(exc)) from exc
    sampled = " (a fixed sample: more than label_issue_max_rows)" if result.label_issue_sampled else ""
    print(
        f"review queue: {result.rows} rows\n"
        f"  {result.label_issues} label issues first, of {result.label_issues_found} found in "
        f"{result.label_issue_source_rows} distinct training texts{sampled}\n"
        f"  then the least confident of {result.candidates} scored texts "
        f"({result.already_corrected} already corrected, left out)\n"
        f"  fill in the label column of: {result.csv_uri}\n"
        f"  the same rows as Parquet:   {result.parquet_uri}\n"
        "  then record it: the record_corrections DAG with corrections_uri set to that file"
    )
    return result.to_summary()


def _source_uri(params: DataSource) -> str:
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_source import resolve_source_uri

    try:
        return resolve_source_uri(params)
    except DataPreparationError as exc:
        raise AirflowFailException(
            f"The training source to look for label issues in: {exc} Or set label_issues to 0: the "
            "queue then holds scored rows only."
        ) from exc


def _whole_number(name: str, value: Any, least: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = least - 1
    if number < least:
        raise AirflowFailException(f"{name} is {value!r}. Fix: a whole number of rows, at least {least}.")
    return number


class ReviewQueueOperator(PySparkOperator):
    """Writes, as ``<output_uri>/<run id>/review_queue.csv`` and ``review_queue.parquet`` with an
    empty ``label`` column for a reviewer:

    1. up to ``label_issues`` rows of the training source ``source`` whose given label
       cross-validated TF-IDF + logistic regression contradicts (cleanlab; origin ``label_issue``,
       with ``given_label``, the suggested label as ``prediction`` and ``label_quality``), likeliest
       wrong first;
    2. the ``size`` scored rows the model is least sure of (lowest score), one per distinct text,
       from batch inference's review rows and the serving endpoint's captured answers.

    Texts already corrected are left out of both, and a text is queued once. The filled file is
    what ``record_corrections`` takes (rows left without a label are skipped). Returns the files'
    URIs and the row counts.

    Nothing to review (nothing scored and no label issue), no scored row of ``model_name``, or a
    training source that cannot be judged fails the task without retries.

    :param model_name: (templated) whose scored rows to queue; empty: every model's.
    :param size: (templated) how many scored rows the queue holds, at least 1.
    :param label_issues: (templated) how many label issues lead the queue; 0: none (the source is
        not read).
    :param source: (templated) the training source and its columns
        (:class:`sparktune.core.params.DataSource` or a dict of its fields: ``source_uri``,
        ``source_format``, ``text_column``, ``label_column``, ``id_column``); missing names (or None)
        take the pipeline's defaults.
    :param label_issue_max_rows: (templated) distinct source texts judged at most (collected to the
        driver); more: the same sample every run, by text hash.
    :param output_uri: (templated) folder of the queues; each run writes its own subfolder (a rerun
        of a run replaces its files). Default ``<feedback_uri>/review_queue``.
    :param feedback_uri: the feedback table (default ``SPARKTUNE_FEEDBACK_URI`` or ``<lake>/feedback``).
    :param captures_uri: the serving endpoint's captured answers (default
        ``SPARKTUNE_SERVING_CAPTURES_URI`` or ``<lake>/serving_captures``).
    :param conn_id: the Spark connection (default ``spark_default``).
    """

    template_fields: Sequence[str] = (
        *PySparkOperator.template_fields,
        "model_name",
        "size",
        "output_uri",
        "label_issues",
        "source",
        "label_issue_max_rows",
    )

    def __init__(
        self,
        *,
        model_name: str = "",
        size: int | str = 100,
        output_uri: str | None = None,
        label_issues: int | str = DEFAULT_LABEL_ISSUES,
        source: Any = None,
        label_issue_max_rows: int | str | None = None,
        feedback_uri: str | None = None,
        captures_uri: str | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(python_callable=_build_review_queue, conn_id=conn_id, **kwargs)
        self.model_name = model_name
        self.size = size
        self.output_uri = output_uri
        self.label_issues = label_issues
        self.source = source
        self.label_issue_max_rows = label_issue_max_rows
        self.feedback_uri = feedback_uri
        self.captures_uri = captures_uri

    def execute(self, context: Any) -> Any:
        from pathlib import Path

        from sparktune.data.spark_jvm import input_bytes
        from sparktune.serve.label_issues import DEFAULT_MAX_ROWS

        size = _whole_number("size", self.size, 1)
        label_issues = _whole_number("label_issues", self.label_issues, 0)
        feedback_uri = self.feedback_uri or settings().feedback_uri
        root = str(self.output_uri or "").strip() or f"{feedback_uri.rstrip('/')}/{QUEUE_FOLDER}"
        # Before the Spark session starts: the tables to read and the folder to write.
        check_allowed_location("output_uri", root)
        check_allowed_location("feedback_uri", self.feedback_uri)
        check_allowed_location("captures_uri", self.captures_uri)
        source = None
        if label_issues:
            # DataSource's own checks refuse a source outside SPARKTUNE_ALLOWED_ROOTS.
            params = typed_params(DataSource, self.source, "source")
            max_rows = self.label_issue_max_rows
            source = {
                "source_uri": _source_uri(params),
                "source_format": params.source_format,
                "text_column": params.text_column,
                "label_column": params.label_column,
                "id_column": params.id_column,
                "max_rows": DEFAULT_MAX_ROWS
                if max_rows in (None, "")
                else _whole_number("label_issue_max_rows", max_rows, 1),
            }
        if "://" not in root:
            root = str(Path(root).expanduser().resolve())
        self.op_kwargs = {
            "feedback_uri": feedback_uri,
            "captures_uri": self.captures_uri or settings().serving_captures_uri,
            "model_name": str(self.model_name or "").strip(),
            "size": size,
            # One folder per run: a queue being filled in is never overwritten by the next run.
            "output_uri": f"{root.rstrip('/')}/{path_segment(context['ti'].run_id)}",
            "label_issues": label_issues,
            "label_issue_source": source,
        }
        # The training source is the input whose size is known (the feedback tables are small).
        size_hint = input_bytes(source["source_uri"]) if source else None
        self.config_kwargs = session_jvm_conf(self.conn_id, self.config_kwargs, size_hint)
        return super().execute(context)
