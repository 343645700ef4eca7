"""The feedback loop's operators, thin shells over ``sparktune.serve.feedback``:
``RecordCorrectionsOperator`` adds human corrections to the feedback table, and
``MergeFeedbackOperator`` merges them into the next version of the training data."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune.core.config import settings
from sparktune.core.params import DataSource
from sparktune_airflow.core.mlflow import MLflowHook, UsesMLflowConnection
from sparktune_airflow.core.spark_jobs import session_jvm_conf
from sparktune_airflow.core.task_context import check_allowed_location, typed_params


def _record_corrections(
    corrections_uri: str,
    source_format: str,
    feedback_uri: str,
    model_name: str,
    batch_id: str,
    corrected_at: str,
    captures_uri: str = "",
    corrected_by: str = "",
    mlflow_conn_id: str | None = None,
    spark: Any = None,
) -> dict[str, Any]:
    from datetime import datetime

    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.serve.feedback import FeedbackError, record_corrections

    known_labels = _champion_labels(model_name, mlflow_conn_id)
    try:
        result = record_corrections(
            spark,
            corrections_uri,
            feedback_uri,
            batch_id,
            source_format=source_format,
            known_labels=known_labels,
            corrected_at=datetime.fromisoformat(corrected_at),
            captures_uri=captures_uri or None,
            corrected_by=corrected_by or None,
        )
    except (FeedbackError, DataPreparationError) as exc:
        raise AirflowFailException(str(exc)) from exc
    print(
        f"recorded {result.rows} corrections into {result.batch_uri}: {json.dumps(result.labels)}; "
        f"{result.not_reviewed} rows without a label skipped (not reviewed)"
    )
    return result.to_summary()


def _champion_labels(model_name: str, mlflow_conn_id: str | None) -> list[str] | None:
    """The label set of the model's champion (its ``labels`` version tag), if there is one."""
    from sparktune.release.registry import CHAMPION, alias_version

    client = MLflowHook(mlflow_conn_id).get_conn()
    version = alias_version(client, model_name, CHAMPION)
    if version is None:
        return None
    tag = client.get_model_version(model_name, version).tags.get("labels")
    return [str(label) for label in json.loads(tag)] if tag else None


class RecordCorrectionsOperator(UsesMLflowConnection, PySparkOperator):
    """Adds a file of human corrections (``id, label`` [, ``text``, ``corrected_at``,
    ``corrected_by``]) to the feedback table as one batch per DAG run (a rerun replaces its own
    batch); ``corrected_by`` defaults to the user who triggered the run.

    Labels must be in the champion's label set; ids must have been scored by batch inference or
    carry their text. Rows with a blank label are skipped as not reviewed, so a filled review
    queue (``ReviewQueueOperator``) is taken as it is. Every problem is reported at once and fails
    the task without retries. Give the task ``outlets=[feedback_asset()]`` so the corrections
    trigger retraining.

    :param corrections_uri: path of the corrections (Parquet, CSV, JSON Lines).
    :param model_name: whose champion's labels the corrections are checked against.
    :param feedback_uri: the feedback table (default ``SPARKTUNE_FEEDBACK_URI`` or ``<lake>/feedback``).
    :param captures_uri: the serving endpoint's captured answers, whose ids (``<request_id>:<row>``)
        are accepted too (default ``SPARKTUNE_SERVING_CAPTURES_URI`` or ``<lake>/serving_captures``).
    :param source_format: how to read ``corrections_uri`` (default: by extension).
    :param conn_id: the Spark connection (default ``spark_default``).
    """

    template_fields: Sequence[str] = (*PySparkOperator.template_fields, "corrections_uri", "model_name")

    def __init__(
        self,
        *,
        corrections_uri: str,
        model_name: str,
        feedback_uri: str | None = None,
        captures_uri: str | None = None,
        source_format: str = "auto",
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(python_callable=_record_corrections, conn_id=conn_id, **kwargs)
        self.corrections_uri = corrections_uri
        self.model_name = model_name
        self.feedback_uri = feedback_uri
        self.captures_uri = captures_uri
        self.source_format = source_format

    def execute(self, context: Any) -> Any:
        from pathlib import Path

        uri = str(self.corrections_uri)
        # Before the Spark session starts: the file to read and the table to write.
        check_allowed_location("corrections_uri", uri, self.source_format)
        check_allowed_location("feedback_uri", self.feedback_uri)
        check_allowed_location("captures_uri", self.captures_uri)
        if "://" not in uri:
            uri = str(Path(uri).expanduser().resolve())
        ti = context["ti"]
        self.op_kwargs = {
            "corrections_uri": uri,
            "source_format": self.source_format,
            "feedback_uri": self.feedback_uri or settings().feedback_uri,
            "captures_uri": self.captures_uri or settings().serving_captures_uri,
            "model_name": str(self.model_name),
            "batch_id": f"{ti.dag_id}__{ti.run_id}",
            "corrected_at": (context.get("logical_date") or context["dag_run"].run_after).isoformat(),
            # Who, when the file does not say per row: the user who triggered the run, else the run.
            "corrected_by": getattr(context.get("dag_run"), "triggering_user_name", None)
            or f"airflow:{ti.dag_id}/{ti.run_id}",
            "mlflow_conn_id": self.mlflow_conn_id,
        }
        # It also reads the feedback table and the serving captures: the inputs' size is not known.
        self.config_kwargs = session_jvm_conf(self.conn_id, self.config_kwargs, None)
        return super().execute(context)


def _merge_feedback(typed_params: DataSource, spark: Any = None) -> dict[str, Any]:
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_source import load_source
    from sparktune.serve.feedback import FeedbackError, merge_feedback

    typed = typed_params
    source_uri = _source_uri(typed)
    try:
        source = load_source(spark, source_uri, typed.source_format)
        result = merge_feedback(
            spark,
            source,
            source_uri=source_uri,
            source_format=typed.source_format,
            feedback_uri=settings().feedback_uri,
            # A version is named by its content (source + corrections), whatever model trains on it.
            versions_root=f"{settings().lake_uri}/sources",
            text_column=typed.text_column,
            label_column=typed.label_column,
            quality_column=typed.quality_column,
            id_column=typed.id_column,
            timestamp_column=typed.timestamp_column,
        )
    except (FeedbackError, DataPreparationError) as exc:
        raise AirflowFailException(str(exc)) from exc
    print(
        f"feedback: {result.corrections} corrected texts, {result.already_in_source} already in the "
        f"source, {result.labels_changed} source rows relabelled, {result.added_rows} added; training "
        f"reads {result.source_uri}"
    )
    return result.to_summary()


def _source_uri(params: Any) -> str:
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_source import resolve_source_uri

    try:
        return resolve_source_uri(params)
    except DataPreparationError as exc:
        raise AirflowFailException(str(exc)) from exc


class MergeFeedbackOperator(PySparkOperator):
    """The source the run trains on: the params' source with the feedback table's corrections
    applied (matched by normalized text over every split: a text it holds is relabelled in place,
    one it lacks is added), written as a new data version; when no correction changes anything,
    the source itself. Returns ``source_uri``, ``source_format``, ``labels_changed``,
    ``added_rows`` and ``overrides_uri`` (the relabelled rows) for the tasks after it.

    :param source: (templated) the source and its columns (:class:`sparktune.core.params.DataSource`
        or a dict of its fields, ``merge_feedback`` among them); missing names (or None) take their
        defaults.
    :param conn_id: the Spark connection (default ``spark_default``).
    """

    template_fields: Sequence[str] = (*PySparkOperator.template_fields, "source")

    def __init__(self, *, source: Any = None, conn_id: str = "spark_default", **kwargs: Any) -> None:
        kwargs.setdefault("multiple_outputs", True)  # source_uri, source_format, overrides_uri
        super().__init__(
            python_callable=_merge_feedback,
            conn_id=conn_id,
            **kwargs,
        )
        self.source = source

    def execute(self, context: Any) -> Any:
        from sparktune.serve.feedback import MergeResult, corrections_present

        params = typed_params(DataSource, self.source, "source")
        feedback_uri = settings().feedback_uri
        if params.merge_feedback and corrections_present(feedback_uri):
            from sparktune.data.spark_jvm import input_bytes

            size = input_bytes(_source_uri(params))
            self.config_kwargs = session_jvm_conf(self.conn_id, self.config_kwargs, size)
            self.op_kwargs = {"typed_params": params}  # parsed once, here
            return super().execute(context)
        # Nothing to merge: no Spark session is started for it.
        why = "merge_feedback is off" if not params.merge_feedback else f"no corrections in {feedback_uri}"
        self.log.info("%s: training reads the source as it is", why)
        return MergeResult.unchanged(_source_uri(params), params.source_format).to_summary()
