"""The drift monitor's operator, a thin shell over ``sparktune.serve.drift``:
``MonitorChampionOperator`` compares a window of the champion's traffic with its training data and
tells the team when it drifted."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
from airflow.sdk.exceptions import AirflowFailException
from sparktune.core import notifications
from sparktune.core.config import settings
from sparktune.core.paths import path_segment
from sparktune_airflow.core.links import DriftReportLink
from sparktune_airflow.core.mlflow import UsesMLflowConnection
from sparktune_airflow.core.notify import send, ui_base
from sparktune_airflow.core.spark_jobs import session_jvm_conf
from sparktune_airflow.core.task_context import check_allowed_location, task_scratch_dir

# The champion's run tag naming the DatasetDict it trained on, and its evaluation's scores file.
DATASET_TAG = "sparktune.dataset_path"
PREDICTIONS_ARTIFACT = "evaluation/predictions.csv"


def _monitor(
    model_name: str,
    model_version: str,
    dataset_uri: str,
    champion_predictions_csv: str | None,
    feedback_uri: str,
    captures_uri: str,
    start: str,
    end: str,
    output_uri: str,
    latest_uri: str,
    min_texts: int,
    thresholds: dict[str, float],
    review_size: int,
    max_rows: int,
    spark: Any = None,
) -> dict[str, Any]:
    # Named parameters, not **kwargs: PythonOperator would pass the whole task context into those.
    from datetime import datetime

    from sparktune.serve.drift import DriftError, DriftThresholds, monitor_champion

    kwargs = {
        "model_name": model_name,
        "model_version": model_version,
        "dataset_uri": dataset_uri,
        "champion_predictions_csv": champion_predictions_csv,
        "feedback_uri": feedback_uri,
        "captures_uri": captures_uri or None,
        "start": datetime.fromisoformat(start),
        "end": datetime.fromisoformat(end),
        "output_uri": output_uri,
        "latest_uri": latest_uri,
        "min_texts": min_texts,
        "thresholds": DriftThresholds(**thresholds),
        "review_size": review_size,
        "max_rows": max_rows,
    }
    try:
        result = monitor_champion(spark, **kwargs)
    except DriftError as exc:
        raise AirflowFailException(str(exc)) from exc
    print(result.message)
    for check in result.checks:
        value = "not run" if check.value is None else f"{check.value:.4g}"
        print(f"  {check.name:<10} {check.method:<24} {value:>8}  threshold {check.threshold}  {check.note}")
    if result.report_uri:
        print(f"  report:  {result.report_uri}")
    print(f"  summary: {result.summary_uri}")
    if result.review_csv_uri:
        print(f"  texts to label: {result.review_csv_uri} (then the record_corrections DAG)")
    return result.to_summary()


class MonitorChampionOperator(UsesMLflowConnection, PySparkOperator):
    """Compares the texts ``model_name``'s champion scored in the last ``window_hours`` (batch
    inference's review rows and the server's captured answers) with the training split it learned
    from, with Evidently: text drift, the predicted label mix against the training label mix, and
    its confidence against its confidence on its own test split (``sparktune.serve.drift``).

    Writes ``drift_report.html`` and ``drift_summary.json`` under
    ``<monitoring>/<model>/<run id>/`` (``SPARKTUNE_MONITORING_URI``, default ``<lake>/monitoring``;
    the "Drift report" link opens the report through the Models page) and the summary again as
    ``<monitoring>/<model>/latest_summary.json`` for the Models page. On
    drift, sends a ``drift_detected`` notification (the ``sparktune_smtp`` and ``sparktune_webhook``
    connections) and queues the most drifted texts as a review queue; the task succeeds either
    way. Too little traffic is a result too ("N texts since ...; need M"), not a failure.

    :param model_name: (templated) the registered model whose champion to watch.
    :param window_hours: (templated) the hours of traffic before the run that are compared.
    :param min_texts: (templated) fewer texts than this: nothing is compared.
    :param thresholds: (templated) ``{"text", "label_mix", "score"}``, see ``DriftThresholds``.
    :param review_size: (templated) drifted texts to queue for review on drift (0: none).
    :param max_rows: (templated) texts compared from each side at most.
    :param feedback_uri: the feedback table (default ``SPARKTUNE_FEEDBACK_URI`` or ``<lake>/feedback``).
    :param captures_uri: the server's captured answers (default ``SPARKTUNE_SERVING_CAPTURES_URI``).
    :param conn_id: the Spark connection (default ``spark_default``).
    """

    template_fields: Sequence[str] = (
        *PySparkOperator.template_fields,
        "model_name",
        "window_hours",
        "min_texts",
        "thresholds",
        "review_size",
        "max_rows",
    )
    operator_extra_links = (DriftReportLink(),)

    def __init__(
        self,
        *,
        model_name: str,
        window_hours: int | str = 24,
        min_texts: int | str = 300,
        thresholds: dict[str, Any] | None = None,
        review_size: int | str = 50,
        max_rows: int | str = 5000,
        feedback_uri: str | None = None,
        captures_uri: str | None = None,
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(python_callable=_monitor, conn_id=conn_id, **kwargs)
        self.model_name = model_name
        self.window_hours = window_hours
        self.min_texts = min_texts
        self.thresholds = thresholds
        self.review_size = review_size
        self.max_rows = max_rows
        self.feedback_uri = feedback_uri
        self.captures_uri = captures_uri

    def execute(self, context: Any) -> Any:
        from sparktune.serve.drift import LATEST_SUMMARY_NAME, DriftThresholds, model_folder

        check_allowed_location("feedback_uri", self.feedback_uri)
        check_allowed_location("captures_uri", self.captures_uri)
        model_name = str(self.model_name or "").strip()
        if not model_name:
            raise AirflowFailException("model_name is empty. Fix: name the registered model to monitor.")
        version, dataset_uri, predictions_csv = self._champion(model_name, context)
        end = context.get("logical_date") or context["dag_run"].run_after
        start = end - timedelta(hours=_whole(self.window_hours, "window_hours", 1))
        model_root = model_folder(settings().monitoring_uri, model_name)
        try:
            thresholds = DriftThresholds(**{k: float(v) for k, v in (self.thresholds or {}).items()})
        except (TypeError, ValueError) as exc:
            raise AirflowFailException(
                f"thresholds {self.thresholds!r} cannot be read: {exc}. Fix: a mapping of text, "
                "label_mix and score to numbers."
            ) from exc
        self.op_kwargs = {
            "model_name": model_name,
            "model_version": version,
            "dataset_uri": dataset_uri,
            "champion_predictions_csv": predictions_csv,
            "feedback_uri": self.feedback_uri or settings().feedback_uri,
            "captures_uri": self.captures_uri or settings().serving_captures_uri,
            # ISO text, as every other argument is a plain value the task log can show.
            "start": start.isoformat(),
            "end": end.isoformat(),
            "output_uri": f"{model_root}/{path_segment(context['ti'].run_id)}",
            "latest_uri": f"{model_root}/{LATEST_SUMMARY_NAME}",
            "min_texts": _whole(self.min_texts, "min_texts", 1),
            "thresholds": thresholds.__dict__,
            "review_size": _whole(self.review_size, "review_size", 0),
            "max_rows": _whole(self.max_rows, "max_rows", 1),
        }
        # It reads the feedback table and the serving captures: the inputs' size is not known.
        self.config_kwargs = session_jvm_conf(self.conn_id, self.config_kwargs, None)
        summary = super().execute(context)
        if summary.get("status") == "drift":
            ti = context["ti"]
            send(
                notifications.drift_detected(
                    dag_id=ti.dag_id,
                    run_id=ti.run_id,
                    model_name=model_name,
                    version=str(version),
                    message=summary["message"],
                    report_uri=summary.get("report_uri"),
                    review_csv_uri=summary.get("review_csv_uri"),
                    url=notifications.run_url(ui_base(), ti.dag_id, ti.run_id, ti.task_id),
                )
            )
        return summary

    def _champion(self, model_name: str, context: Any) -> tuple[str, str, str | None]:
        """The champion's version, the dataset it trained on, and its test-split scores (a local
        copy of its evaluation's predictions CSV; None when the run logged none)."""
        from mlflow.exceptions import MlflowException
        from sparktune.release.registry import CHAMPION, alias_version

        client = self.mlflow_hook.get_conn()
        version = alias_version(client, model_name, CHAMPION)
        if version is None:
            raise AirflowFailException(
                f"{model_name} has no champion to monitor. Fix: promote a version first (make demo, the "
                "llm_finetune DAG), or set model_name to a registered model that has one."
            )
        run_id = client.get_model_version(model_name, version).run_id
        dataset_uri = client.get_run(run_id).data.tags.get(DATASET_TAG)
        if not dataset_uri:
            raise AirflowFailException(
                f"{model_name} v{version}'s run {run_id} has no {DATASET_TAG} tag, so its training split "
                "is unknown. Fix: monitor a champion trained by this pipeline's train task."
            )
        try:
            predictions_csv = client.download_artifacts(
                run_id, PREDICTIONS_ARTIFACT, str(task_scratch_dir(context))
            )
        except (MlflowException, OSError) as exc:
            self.log.warning("no score reference for %s v%s: %s", model_name, version, exc)
            predictions_csv = None
        return str(version), dataset_uri, predictions_csv


def _whole(value: Any, name: str, least: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = least - 1
    if number < least:
        raise AirflowFailException(f"{name} is {value!r}. Fix: a whole number, at least {least}.")
    return number
