"""Operators of the loop around training: score with the champion, record corrections, merge them
into the next training data version, and skip a retraining run that would change nothing.

Thin shells over ``sparktune.inference``, ``sparktune.feedback`` and ``sparktune.retrain``; the
conventions are those of :mod:`sparktune_airflow.operators`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.providers.standard.utils.skipmixin import SkipMixin
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune.config import settings
from sparktune_airflow.assets import CHAMPION_ASSET_NAME
from sparktune_airflow.lineage import ReportsLineage
from sparktune_airflow.links import MLflowModelVersionLink, SparkUILink
from sparktune_airflow.mlflow_connection import UsesMLflowConnection
from sparktune_airflow.operators import (
    check_allowed_location,
    config_hash,
    job_path,
    mlflow_client,
    pipeline_params,
    session_jvm_conf,
    skip_downstream,
    submit_and_read_summary,
    task_scratch_dir,
    templated_bool,
)
from sparktune_airflow.spark_submit import SparkSubmitOperator


def run_day(context: Any) -> str:
    """The run's day (YYYY-MM-DD): its logical date, or when it was due to run for runs without
    one (asset-triggered and API-triggered runs in Airflow 3)."""
    moment = context.get("logical_date") or context["dag_run"].run_after
    return moment.date().isoformat()


def champion_event(context: Any) -> dict[str, Any] | None:
    """The extra of the newest champion-alias event that triggered this run, if one did."""
    events = context.get("triggering_asset_events") or {}
    newest = None
    for asset in events:
        if getattr(asset, "name", None) != CHAMPION_ASSET_NAME:
            continue
        for event in events[asset]:
            if newest is None or event.timestamp > newest.timestamp:
                newest = event
    return dict(newest.extra) if newest is not None else None


class BatchInferenceOperator(UsesMLflowConnection, ReportsLineage, SparkSubmitOperator):
    """Scores a table or path with ``models:/<model_name>@<model_alias>`` over Spark.

    Runs ``sparktune.jobs.batch_inference`` through spark-submit on ``conn_id`` (``local[*]`` or a
    cluster: only the connection changes). The alias is resolved once on the driver; every
    executor loads the model once and scores length-sorted batches. Output: Parquet under
    ``output_uri/date=<run day>`` with ``id, prediction, score, model_name, model_version,
    model_alias, data_fingerprint, scored_at``; a rerun overwrites its own day, never adds rows.

    :param source_uri: table name or path (Parquet, CSV, JSON Lines) of the texts to score.
    :param output_uri: Parquet root of the predictions.
    :param model_name: registered model name. When the run was triggered by a champion-alias
        event (``follow_champion_events``), the event's model name wins.
    :param model_alias: alias to score with (default ``champion``).
    :param text_column: column holding the text; ``id_column``: column identifying each row.
    :param source_format: ``auto``, ``parquet``, ``csv``, ``json`` or ``table``.
    :param min_score: keep predictions whose score (the probability of the predicted label) is at
        least this; 0 keeps all.
    :param batch_size: texts per forward pass.
    :param feedback_uri: when set, the scored rows and their texts also go to
        ``<feedback_uri>/predictions`` for review (see ``sparktune.feedback``).
    :param download_dir: where the model is downloaded once; every executor must read it under the
        same path (shared storage on a cluster). Default: ``SPARKTUNE_HOME/models/inference``.
    :param trust_remote_code: (templated) let a model that ships its own Python code (``auto_map``)
        load; default False: such a model is refused before any executor loads it.
    :param conn_id: the Spark connection (default ``spark_default``).
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "source_uri",
        "source_format",
        "output_uri",
        "model_name",
        "model_alias",
        "text_column",
        "id_column",
        "min_score",
        "batch_size",
        "feedback_uri",
        "trust_remote_code",
    )
    operator_extra_links = (SparkUILink(),)

    def __init__(
        self,
        *,
        source_uri: str,
        output_uri: str,
        model_name: str,
        model_alias: str = "champion",
        text_column: str = "text",
        id_column: str = "id",
        source_format: str = "auto",
        min_score: float = 0.0,
        batch_size: int = 32,
        feedback_uri: str | None = None,
        download_dir: str | None = None,
        follow_champion_events: bool = True,
        trust_remote_code: bool | str = False,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "sparktune-batch_inference")
        kwargs.setdefault("conf", {"spark.log.level": "WARN"})
        super().__init__(conn_id=conn_id, **kwargs)
        self.source_uri = source_uri
        self.output_uri = output_uri
        self.model_name = model_name
        self.model_alias = model_alias
        self.text_column = text_column
        self.id_column = id_column
        self.source_format = source_format
        self.min_score = min_score
        self.batch_size = batch_size
        self.feedback_uri = feedback_uri
        self.download_dir = download_dir
        self.follow_champion_events = follow_champion_events
        self.trust_remote_code = trust_remote_code

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.params import InvalidParamsError, parse_params
        from sparktune.prepare import DataPreparationError, resolve_source_uri
        from sparktune.spark_jvm import input_bytes, short_job_conf

        model_name = str(self.model_name)
        event = champion_event(context) if self.follow_champion_events else None
        if event and event.get("model_name"):
            self.log.info(
                "Triggered by the promotion of %s v%s to champion (from v%s).",
                event["model_name"],
                event.get("version"),
                event.get("previous_version"),
            )
            model_name = str(event["model_name"])
        if not str(self.source_uri or "").strip():
            raise AirflowFailException("source_uri is empty: pass the table or path of the texts to score.")
        try:
            # The same path rules as training's source (relative paths made absolute for Spark).
            source = resolve_source_uri(
                parse_params({"source_uri": str(self.source_uri), "source_format": self.source_format})
            )
        except (DataPreparationError, InvalidParamsError) as exc:  # InvalidParamsError: allowed roots
            raise AirflowFailException(str(exc)) from exc
        # Where it writes, against SPARKTUNE_ALLOWED_ROOTS too, before spark-submit.
        check_allowed_location("output_uri", self.output_uri)
        check_allowed_location("feedback_uri", self.feedback_uri)
        day = run_day(context)
        summary_path = task_scratch_dir(context) / "batch_inference_summary.json"
        summary_path.unlink(missing_ok=True)
        self.application = self.application or job_path("batch_inference")
        self.conf = short_job_conf(self.conf, input_bytes(source))
        args = [
            "--source", source,
            "--source-format", str(self.source_format),
            "--text-column", str(self.text_column),
            "--id-column", str(self.id_column),
            "--output-uri", str(self.output_uri),
            "--model-name", model_name,
            "--model-alias", str(self.model_alias),
            "--tracking-uri", settings().mlflow_tracking_uri,
            "--batch-size", str(int(self.batch_size)),
            "--min-score", str(float(self.min_score)),
            "--run-date", day,
            "--scored-at", f"{day}T00:00:00+00:00",
            "--summary-path", str(summary_path),
            "--trust-remote-code", "true" if templated_bool(self.trust_remote_code) else "false",
        ]  # fmt: skip
        if self.feedback_uri:
            args += ["--feedback-uri", str(self.feedback_uri)]
        if self.download_dir:
            args += ["--download-dir", str(self.download_dir)]
        self.application_args = args
        summary = submit_and_read_summary(self, context, summary_path, "batch_inference")
        model = summary["model"]
        self.log.info(
            "%d predictions of %s v%s (@%s) in %s/%s, %.1f s",
            summary["rows_written"],
            model["name"],
            model["version"],
            model["alias"],
            summary["output_uri"],
            summary["partition"],
            summary["seconds"],
        )
        self._scored_source = source
        return self._keep(summary)

    def _lineage(self):
        """The texts + the model version -> the predictions (and the review rows)."""
        from sparktune_airflow.lineage import batch_inference_lineage

        return batch_inference_lineage(
            self._lineage_result, self._scored_source, settings().mlflow_tracking_uri
        )


def _record_corrections(
    corrections_uri: str,
    source_format: str,
    feedback_uri: str,
    model_name: str,
    batch_id: str,
    corrected_at: str,
    captures_uri: str = "",
    spark: Any = None,
) -> dict[str, Any]:
    from datetime import datetime

    from sparktune.feedback import FeedbackError, record_corrections
    from sparktune.prepare import DataPreparationError

    known_labels = _champion_labels(model_name)
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
        )
    except (FeedbackError, DataPreparationError) as exc:
        raise AirflowFailException(str(exc)) from exc
    print(f"recorded {result.rows} corrections into {result.batch_uri}: {json.dumps(result.labels)}")
    return result.to_summary()


def _champion_labels(model_name: str) -> list[str] | None:
    """The label set of the model's champion (its ``labels`` version tag), if there is one."""
    from sparktune.registry import CHAMPION, alias_version

    client = mlflow_client()
    version = alias_version(client, model_name, CHAMPION)
    if version is None:
        return None
    tag = client.get_model_version(model_name, version).tags.get("labels")
    return [str(label) for label in json.loads(tag)] if tag else None


class RecordCorrectionsOperator(UsesMLflowConnection, PySparkOperator):
    """Adds a file of human corrections (``id, label`` [, ``text``, ``corrected_at``]) to the feedback
    table as one batch per DAG run (a rerun replaces its own batch).

    Labels must be in the champion's label set; ids must have been scored by batch inference or
    carry their text. Every problem is reported at once and fails the task without retries. Give
    the task ``outlets=[feedback_asset()]`` so the corrections trigger retraining.

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
        }
        # It also reads the feedback table and the serving captures: the inputs' size is not known.
        self.config_kwargs = session_jvm_conf(self.conn_id, self.config_kwargs, None)
        return super().execute(context)


def _merge_feedback(
    pipeline_params_value: dict[str, Any] | None, params: Any = None, spark: Any = None
) -> dict[str, Any]:
    from sparktune.feedback import FeedbackError, merge_feedback
    from sparktune.prepare import DataPreparationError, load_source

    typed = pipeline_params(pipeline_params_value, {"params": params})
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
        f"source, {result.added_rows} added; training reads {result.source_uri}"
    )
    return result.to_summary()


def _source_uri(params: Any) -> str:
    from sparktune.prepare import DataPreparationError, resolve_source_uri

    try:
        return resolve_source_uri(params)
    except DataPreparationError as exc:
        raise AirflowFailException(str(exc)) from exc


class MergeFeedbackOperator(PySparkOperator):
    """The source the run trains on: the params' source plus the feedback table's corrected rows
    that it does not hold yet (deduplicated by text over every split), written as a new data
    version; with nothing new, the source itself. Returns ``source_uri`` and ``source_format``
    for ``PrepareDataOperator``.

    :param pipeline_params: the pipeline params (default: the DAG run's params).
    :param conn_id: the Spark connection (default ``spark_default``).
    """

    template_fields: Sequence[str] = (*PySparkOperator.template_fields, "pipeline_params")

    def __init__(
        self, *, pipeline_params: dict[str, Any] | None = None, conn_id: str = "spark_default", **kwargs: Any
    ) -> None:
        super().__init__(
            python_callable=_merge_feedback,
            conn_id=conn_id,
            op_kwargs={"pipeline_params_value": pipeline_params},
            **kwargs,
        )
        self.pipeline_params = pipeline_params

    def execute(self, context: Any) -> Any:
        from sparktune.feedback import MergeResult, corrections_present

        params = pipeline_params(self.pipeline_params, context)
        feedback_uri = settings().feedback_uri
        if params.merge_feedback and corrections_present(feedback_uri):
            from sparktune.spark_jvm import input_bytes

            size = input_bytes(_source_uri(params))
            self.config_kwargs = session_jvm_conf(self.conn_id, self.config_kwargs, size)
            return super().execute(context)
        # Nothing to merge: no Spark session is started for it.
        why = "merge_feedback is off" if not params.merge_feedback else f"no corrections in {feedback_uri}"
        self.log.info("%s: training reads the source as it is", why)
        return MergeResult.unchanged(_source_uri(params), params.source_format).to_summary()


class SkipUnchangedOperator(UsesMLflowConnection, BaseOperator, SkipMixin):
    """Skips everything downstream when the run would train the current champion again.

    Compares the run's data, config hash and code fingerprint with the champion version's tags;
    when all three match (and ``force_retrain`` is off) the downstream tasks are skipped and the
    reason is logged and returned. Otherwise it returns what changed and the run goes on. The data
    is the prepared rows' content fingerprint (``data_fingerprint``, after ``PrepareDataOperator``)
    or, before any Spark job, the source files' signature (``source_uri``: each file's path, size
    and modification time, see ``sparktune.fingerprint.source_signature``), returned as
    ``source_signature`` for the register step to tag the version with.

    :param model_name: the registered model whose champion is compared.
    :param data_fingerprint: (templated) the run's prepared data fingerprint.
    :param source_uri: (templated) the source to sign, when there is no fingerprint yet; a catalog
        table cannot be signed without Spark, and the run goes on.
    :param pipeline_params: the pipeline params (default: the DAG run's params).
    """

    template_fields: Sequence[str] = ("model_name", "data_fingerprint", "source_uri", "pipeline_params")
    # The champion version the run was compared with: what a skipped run would have trained again.
    operator_extra_links = (MLflowModelVersionLink(),)

    def __init__(
        self,
        *,
        model_name: str,
        data_fingerprint: str | None = None,
        source_uri: str | None = None,
        pipeline_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.data_fingerprint = data_fingerprint
        self.source_uri = source_uri
        self.pipeline_params = pipeline_params

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.fingerprint import source_signature
        from sparktune.registry import CHAMPION, alias_version
        from sparktune.retrain import retrain_decision
        from sparktune.training import code_fingerprint

        params = pipeline_params(self.pipeline_params, context)
        fingerprint = str(self.data_fingerprint or "").strip() or None
        signature = None
        if fingerprint is None:
            if not str(self.source_uri or "").strip():
                raise AirflowFailException("skip_unchanged needs data_fingerprint or source_uri; got neither")
            signature = source_signature(str(self.source_uri))
        client = mlflow_client()
        champion = alias_version(client, str(self.model_name), CHAMPION)
        tags = dict(client.get_model_version(str(self.model_name), champion).tags) if champion else {}
        decision = retrain_decision(
            champion_version=champion,
            champion_tags=tags,
            data_fingerprint=fingerprint,
            source_signature=signature,
            config_hash=config_hash(params),
            code_fingerprint=code_fingerprint(),
            force=params.force_retrain,
        )
        self.log.info("%s: %s", "training" if decision.train else "skipping training", decision.reason)
        if not decision.train:
            skip_downstream(self, context)
        summary = {**decision.to_summary(), "model_name": str(self.model_name), "version": champion}
        return {**summary, "source_signature": signature} if fingerprint is None else summary
