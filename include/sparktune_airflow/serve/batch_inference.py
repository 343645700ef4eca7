"""``BatchInferenceOperator``: scores a table with a registry alias over Spark, and what it reads from
the run: its day, and the champion-alias event that triggered it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException
from sparktune_airflow.core.assets import CHAMPION_ASSET_NAME
from sparktune_airflow.core.lineage import ReportsLineage
from sparktune_airflow.core.links import SparkUILink
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.spark_jobs import job_path, submit_and_read_summary
from sparktune_airflow.core.spark_submit import SparkSubmitOperator
from sparktune_airflow.core.task_context import check_allowed_location, task_scratch_dir, templated_bool


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
    :param text_column: column holding the text.
    :param id_column: column identifying each row.
    :param source_format: ``auto``, ``parquet``, ``csv``, ``json`` or ``table``.
    :param min_score: keep predictions whose score (the probability of the predicted label) is at
        least this; 0 keeps all.
    :param batch_size: texts per forward pass.
    :param feedback_uri: when set, the scored rows and their texts also go to
        ``<feedback_uri>/predictions`` for review (see ``sparktune.serve.feedback``).
    :param download_dir: where the model is downloaded once; every executor must read it under the
        same path (shared storage on a cluster). Default: ``SPARKTUNE_HOME/models/inference``.
    :param follow_champion_events: when a champion-alias event triggered the run, score with the
        model that event names (default True).
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
        batch_size: int = 64,
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
        from sparktune.core.params import InvalidParamsError, parse_params
        from sparktune.data.prepare_errors import DataPreparationError
        from sparktune.data.prepare_source import resolve_source_uri
        from sparktune.data.spark_jvm import input_bytes, short_job_conf

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
            "--tracking-uri", self.mlflow_hook.tracking_uri(),
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
        # The driver reaches MLflow with the connection's variables in spark-submit's environment.
        self.env_vars = {**(self.env_vars or {}), **self.mlflow_hook.tracking_env()}
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
        from sparktune_airflow.core.lineage import batch_inference_lineage

        return batch_inference_lineage(
            self._lineage_result, self._scored_source, self.mlflow_hook.tracking_uri()
        )
