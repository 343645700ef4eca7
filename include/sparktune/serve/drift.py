"""Drift of what the champion scores against what it was trained on, reported with Evidently.

Three comparisons, each one Evidently ``ValueDrift`` metric over one column (Evidently's own
statistics and its HTML report, not ours):

- **texts**: the window's texts against the champion's training split, by Evidently's text
  content drift: a domain classifier learns to tell the two apart, and its ROC AUC on held-out
  rows is the drift score (0.5: indistinguishable). Breached above ``thresholds.text``.
- **label mix**: the labels the champion predicted in the window against the training split's
  labels, by Jensen-Shannon distance. Breached above ``thresholds.label_mix``.
- **scores**: the champion's confidence (the probability of its predicted label) in the window
  against its confidence on its own held-out test split (the ``evaluation/predictions.csv`` its
  evaluation logged), by the two-sample Kolmogorov-Smirnov test. Breached when its p-value is
  below ``thresholds.score``. A rank test, because a fine-tuned classifier's probabilities sit near
  1 with a tiny spread: distances normed by that spread (Wasserstein) called a window drifted for
  a handful of doubtful texts whose median score was the test split's. Without that file, the
  check is reported as not run.

The window is every scoring of ``model_name`` (batch inference's review rows and the server's
captured answers, :func:`sparktune.serve.feedback.scored_rows`) in ``[start, end)``. Fewer than
``min_texts`` texts there gives a ``too_little_traffic`` result that says how many there were and
how many are needed, instead of statistics over a handful of rows.

Each run writes ``drift_report.html`` (Evidently's report) and ``drift_summary.json``
(:meth:`DriftResult.to_summary`) into its own folder, and the summary once more as
``<model folder>/latest_summary.json`` for the Models page. When drift is found, the window's texts
most unlike the training texts are written as a review queue (origin ``drift``) for a person to
label; nothing retrains on unlabelled traffic.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REPORT_NAME = "drift_report.html"
SUMMARY_NAME = "drift_summary.json"
LATEST_SUMMARY_NAME = "latest_summary.json"
DRIFT_ORIGIN = "drift"
# Evidently's method names (evidently.legacy.calculations.stattests).
TEXT_METHOD = "abs_text_content_drift"
LABEL_MIX_METHOD = "jensenshannon"
SCORE_METHOD = "ks"

Status = Literal["drift", "no_drift", "too_little_traffic"]


class DriftError(ValueError):
    """The monitor cannot compare: no training split, no champion, an unreadable reference."""


@dataclass(frozen=True)
class DriftThresholds:
    """Where each check counts as drift (each check's statistic is described in the module)."""

    # ROC AUC of the domain classifier. Evidently's default for the method is 0.55; new texts from
    # the very source the champion trained on read 0.52-0.58 here (a few hundred texts, a classifier
    # picking up names and numbers), texts in other words 0.99+.
    text: float = 0.6
    label_mix: float = 0.1  # Jensen-Shannon distance; Evidently's default for categorical columns
    score: float = 0.05  # the K-S test's p-value, drift below it; Evidently's default for the test


@dataclass(frozen=True)
class DriftCheck:
    name: str  # texts, label_mix, scores
    method: str
    threshold: float
    value: float | None  # None: not run (see note)
    drifted: bool
    note: str = ""


@dataclass(frozen=True)
class DriftResult:
    status: Status
    message: str
    model_name: str
    model_version: str
    window_start: str
    window_end: str
    texts: int  # scorings in the window (after de-duplication by id)
    min_texts: int
    reference_rows: int  # training rows compared (a sample when the split is larger)
    checks: list[DriftCheck] = field(default_factory=list)
    report_uri: str | None = None
    summary_uri: str | None = None
    review_csv_uri: str | None = None  # the drifted texts to label (drift only)
    drifted_texts: int = 0

    @property
    def drifted_checks(self) -> list[DriftCheck]:
        return [c for c in self.checks if c.drifted]

    def to_summary(self) -> dict[str, Any]:
        return asdict(self)


def traffic_window(
    spark: SparkSession,
    *,
    feedback_uri: str,
    captures_uri: str | None,
    model_name: str,
    start: datetime,
    end: datetime,
    max_rows: int,
    seed: int = 0,
) -> tuple[pd.DataFrame, int]:
    """The scorings of ``model_name`` in ``[start, end)`` with a text, one per id (its latest), at
    most ``max_rows`` of them (a seeded sample beyond); the frame and how many there were in all."""
    import pandas as pd
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from sparktune.serve.feedback import SCORED_COLUMNS, scored_rows

    scored = scored_rows(spark, feedback_uri, captures_uri)
    if scored is None:
        return pd.DataFrame(columns=list(SCORED_COLUMNS)), 0
    latest = Window.partitionBy("id").orderBy(F.col("scored_at").desc())
    window = (
        scored.where(
            (F.col("model_name") == model_name)
            & (F.col("scored_at") >= F.lit(start))
            & (F.col("scored_at") < F.lit(end))
            & F.col("text").isNotNull()
            & (F.trim(F.col("text")) != "")
        )
        .withColumn("_n", F.row_number().over(latest))
        .where("_n = 1")
        .drop("_n")
        .persist()
    )
    try:
        total = window.count()
        if total > max_rows:
            window = window.orderBy(F.rand(seed)).limit(max_rows)
        frame = window.toPandas()
    finally:
        window.unpersist()
    return frame, total


def reference_frame(
    dataset_uri: str,
    *,
    champion_predictions_csv: str | None,
    max_rows: int,
    seed: int = 0,
    storage_options: dict | None = None,
) -> pd.DataFrame:
    """The champion's training split (``text``, ``label`` by name), at most ``max_rows`` (a seeded
    sample beyond), with the champion's scores on its test split beside it in ``score`` (NaN
    elsewhere: each check reads only its own column's values).

    ``dataset_uri`` is what the champion trained on: the published DatasetDict, or with
    ``dataset_mode=streaming`` the prepared Parquet (``split=train/`` under it)."""
    import numpy as np
    import pandas as pd

    texts, labels = _training_split(dataset_uri, max_rows, seed, storage_options)
    frame = pd.DataFrame({"text": texts, "label": labels, "score": np.nan})
    if champion_predictions_csv:
        scores = pd.read_csv(champion_predictions_csv, usecols=["score"])["score"].to_numpy(dtype=float)
        # The test split is usually smaller than the train sample: the scores fill the first rows.
        scores = scores[: len(frame)]
        frame.loc[: len(scores) - 1, "score"] = scores
    return frame


def _training_split(
    dataset_uri: str, max_rows: int, seed: int, storage_options: dict | None
) -> tuple[list[str], list[str]]:
    import fsspec
    import numpy as np
    from sparktune.data.published_dataset import open_dataset

    fs, path = fsspec.core.url_to_fs(dataset_uri, **(storage_options or {}))
    prepared = f"{path.rstrip('/')}/split=train"
    if fs.exists(prepared):
        import pyarrow.dataset as ds

        table = ds.dataset(prepared, filesystem=fs, format="parquet").to_table(columns=["text", "label"])
        if table.num_rows > max_rows:
            rows = np.sort(np.random.default_rng(seed).choice(table.num_rows, max_rows, replace=False))
            table = table.take(rows)
        return table.column("text").to_pylist(), [str(v) for v in table.column("label").to_pylist()]
    try:
        train = open_dataset(dataset_uri, storage_options)["train"]
    except (FileNotFoundError, KeyError) as exc:
        raise DriftError(
            f"The champion's training split cannot be read from {dataset_uri}: {exc}. Fix: the data "
            "the champion trained on (its run's sparktune.dataset_path tag) must still exist; run "
            "llm_finetune again to materialize it, or promote a model whose dataset is kept."
        ) from exc
    if train.num_rows > max_rows:
        train = train.shuffle(seed=seed).select(range(max_rows))
    names = getattr(train.features.get("label"), "names", None)
    labels = train["label"]
    return train["text"], [names[i] for i in labels] if names else [str(v) for v in labels]


def compare(
    current: pd.DataFrame, reference: pd.DataFrame, thresholds: DriftThresholds, *, has_scores: bool
) -> tuple[Any, list[DriftCheck]]:
    """Evidently's report of ``current`` (``text``, ``prediction``, ``score``) against
    ``reference`` (``text``, ``label``, ``score``), and one :class:`DriftCheck` per comparison."""
    import pandas as pd
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import ValueDrift

    # One column per comparison, named alike on both sides: the predicted labels of the window
    # sit against the training labels in "label".
    now = pd.DataFrame(
        {
            "text": current["text"].astype(str).to_numpy(),
            "label": current["prediction"].astype(str).to_numpy(),
            "score": current["score"].astype(float).to_numpy(),
        }
    )
    then = reference[["text", "label", "score"]].copy()
    then["label"] = then["label"].astype(str)
    metrics = [
        ValueDrift(column="text", method=TEXT_METHOD, threshold=thresholds.text),
        ValueDrift(column="label", method=LABEL_MIX_METHOD, threshold=thresholds.label_mix),
    ]
    if has_scores:
        metrics.append(ValueDrift(column="score", method=SCORE_METHOD, threshold=thresholds.score))
    definition = DataDefinition(
        text_columns=["text"], categorical_columns=["label"], numerical_columns=["score"]
    )
    snapshot = Report(metrics).run(
        Dataset.from_pandas(now, data_definition=definition),
        Dataset.from_pandas(then, data_definition=definition),
    )
    values = [float(m["value"]) for m in snapshot.dict()["metrics"]]
    checks = [
        DriftCheck("texts", TEXT_METHOD, thresholds.text, values[0], values[0] > thresholds.text),
        DriftCheck(
            "label_mix", LABEL_MIX_METHOD, thresholds.label_mix, values[1], values[1] > thresholds.label_mix
        ),
    ]
    if has_scores:
        checks.append(
            DriftCheck("scores", SCORE_METHOD, thresholds.score, values[2], values[2] < thresholds.score)
        )
    else:
        checks.append(
            DriftCheck(
                "scores",
                SCORE_METHOD,
                thresholds.score,
                None,
                False,
                "not run: the champion's run logged no evaluation/predictions.csv (its test split scores)",
            )
        )
    return snapshot, checks


def most_drifted_texts(
    current: pd.DataFrame, reference: pd.DataFrame, count: int, seed: int = 0
) -> pd.DataFrame:
    """The ``count`` rows of ``current`` most unlike the reference texts, most unlike first, with
    ``drift_score``: the out-of-fold probability that a text is from the window, not training.

    Evidently's text drift trains the same kind of domain classifier but reports the column only,
    not which rows drove it; this one is cross-validated so every window text gets a score from a
    model that did not see it.
    """
    import numpy as np
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sparktune.release.baseline import baseline_model

    texts = np.concatenate([reference["text"].astype(str).to_numpy(), current["text"].astype(str).to_numpy()])
    is_current = np.concatenate([np.zeros(len(reference), dtype=int), np.ones(len(current), dtype=int)])
    folds = int(min(5, len(current), len(reference)))
    if folds < 2:
        ranked = current.assign(drift_score=np.nan)
        return ranked.head(count)
    # The project's TF-IDF baseline, weighted: the window is usually far smaller than the reference.
    classifier = baseline_model(seed).set_params(logisticregression__class_weight="balanced")
    probability = cross_val_predict(
        classifier,
        texts,
        is_current,
        cv=StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed),
        method="predict_proba",
    )[:, 1]
    ranked = current.assign(drift_score=probability[len(reference) :])
    return ranked.sort_values(["drift_score", "id"], ascending=[False, True]).head(count)


def write_outputs(
    output_uri: str, latest_uri: str, snapshot: Any, summary: dict[str, Any]
) -> tuple[str | None, str]:
    """The report (when there is one) and the summary under ``output_uri``, the summary again at
    ``latest_uri``; each written whole (:func:`sparktune.core.files.publish_file`)."""
    import fsspec
    from sparktune.core.files import publish_file

    root = output_uri.rstrip("/")
    fs, path = fsspec.core.url_to_fs(root)

    def publish(target_fs: Any, target: str, data: bytes) -> None:
        publish_file(target_fs, target, lambda stream: stream.write(data))

    report_uri = None
    if snapshot is not None:
        report_uri = f"{root}/{REPORT_NAME}"
        summary = {**summary, "report_uri": report_uri}
        publish(fs, f"{path}/{REPORT_NAME}", snapshot.get_html_str(as_iframe=False).encode())
    summary_uri = f"{root}/{SUMMARY_NAME}"
    summary = {**summary, "summary_uri": summary_uri}
    text = json.dumps(summary, indent=2, default=str).encode()
    publish(fs, f"{path}/{SUMMARY_NAME}", text)
    latest_fs, latest_path = fsspec.core.url_to_fs(latest_uri)
    publish(latest_fs, latest_path, text)
    return report_uri, summary_uri


def monitor_champion(
    spark: SparkSession,
    *,
    model_name: str,
    model_version: str,
    dataset_uri: str,
    champion_predictions_csv: str | None,
    feedback_uri: str,
    captures_uri: str | None,
    start: datetime,
    end: datetime,
    output_uri: str,
    latest_uri: str,
    min_texts: int = 300,
    thresholds: DriftThresholds | None = None,
    max_rows: int = 5000,
    review_size: int = 50,
    seed: int = 0,
) -> DriftResult:
    """Compare the window's scorings of ``model_name`` with its champion's training split (see the
    module); write the report and summary under ``output_uri`` and, on drift, the drifted texts as
    a review queue there. Never fails on drift: the result says what was found."""
    thresholds = thresholds or DriftThresholds()
    if min_texts < 1:
        raise DriftError(f"min_texts is {min_texts}. Fix: at least 1 text.")
    current, total = traffic_window(
        spark,
        feedback_uri=feedback_uri,
        captures_uri=captures_uri,
        model_name=model_name,
        start=start,
        end=end,
        max_rows=max_rows,
        seed=seed,
    )
    base = {
        "model_name": model_name,
        "model_version": str(model_version),
        "window_start": start.isoformat(),
        "window_end": end.isoformat(),
        "texts": total,
        "min_texts": min_texts,
    }
    if total < min_texts:
        message = (
            f"{total} texts scored by {model_name} since {start.isoformat()}; need {min_texts} to compare "
            "with its training data. Nothing checked: score more texts (batch_inference, the server) "
            "or widen window_hours."
        )
        result = DriftResult(status="too_little_traffic", message=message, reference_rows=0, **base)
        _, summary_uri = write_outputs(output_uri, latest_uri, None, result.to_summary())
        return replace(result, summary_uri=summary_uri)
    reference = reference_frame(
        dataset_uri, champion_predictions_csv=champion_predictions_csv, max_rows=max_rows, seed=seed
    )
    snapshot, checks = compare(current, reference, thresholds, has_scores=bool(champion_predictions_csv))
    drifted = [c for c in checks if c.drifted]
    review_csv_uri = None
    drifted_rows = 0
    if drifted and review_size > 0:
        review_csv_uri, drifted_rows = _queue_drifted_texts(current, reference, review_size, output_uri, seed)
    if drifted:
        listed = ", ".join(
            f"{c.name} p={c.value:.3g} < {c.threshold}"
            if c.method == SCORE_METHOD
            else f"{c.name} {c.value:.3f} > {c.threshold}"
            for c in drifted
        )
        message = f"Drift in {total} texts scored by {model_name} since {start.isoformat()}: {listed}."
    else:
        message = f"No drift in {total} texts scored by {model_name} since {start.isoformat()}."
    result = DriftResult(
        status="drift" if drifted else "no_drift",
        message=message,
        reference_rows=len(reference),
        checks=checks,
        review_csv_uri=review_csv_uri,
        drifted_texts=drifted_rows,
        **base,
    )
    report_uri, summary_uri = write_outputs(output_uri, latest_uri, snapshot, result.to_summary())
    return replace(result, report_uri=report_uri, summary_uri=summary_uri)


def _queue_drifted_texts(
    current: pd.DataFrame, reference: pd.DataFrame, size: int, output_uri: str, seed: int
) -> tuple[str, int]:
    """The window's texts most unlike the training texts, as a review queue under ``output_uri``."""
    import pyarrow as pa
    from sparktune.serve.review_queue import write_review_queue

    rows = most_drifted_texts(current, reference, size, seed)
    table = pa.table(
        {
            "id": rows["id"].astype(str).tolist(),
            "text": rows["text"].astype(str).tolist(),
            "prediction": rows["prediction"].astype(str).tolist(),
            "score": rows["score"].astype(float).tolist(),
            "model_version": rows["model_version"].astype(str).tolist(),
            "scored_at": pa.array(rows["scored_at"].tolist(), pa.timestamp("us", tz="UTC")),
            "origin": [DRIFT_ORIGIN] * len(rows),
        }
    )
    csv_uri, _ = write_review_queue(table, output_uri)
    return csv_uri, len(rows)


def model_folder(monitoring_uri: str, model_name: str) -> str:
    """Where ``model_name``'s monitor runs write: one folder per run, and the latest summary."""
    from sparktune.core.paths import path_segment

    return f"{monitoring_uri.rstrip('/')}/{path_segment(model_name)}"


def latest_summary(monitoring_uri: str, model_name: str) -> dict[str, Any] | None:
    """The summary of ``model_name``'s latest monitor run, or None when it was never monitored."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(f"{model_folder(monitoring_uri, model_name)}/{LATEST_SUMMARY_NAME}")
    if not fs.exists(path):
        return None
    return json.loads(fs.cat_file(path))


def read_report(monitoring_uri: str, model_name: str, run_folder: str | None = None) -> str | None:
    """The HTML report of one monitor run of ``model_name`` (``run_folder``: its folder's name, the
    run id made a path segment; None: the latest run's), or None when there is none. Only folders
    under the model's own are read: a name that is not one path segment reads nothing."""
    import fsspec
    from sparktune.core.paths import path_segment

    folder = model_folder(monitoring_uri, model_name)
    if run_folder is None:
        latest = latest_summary(monitoring_uri, model_name) or {}
        report = latest.get("report_uri") or ""
        if not report.startswith(folder + "/"):
            return None
        run_folder = report[len(folder) + 1 :].split("/", 1)[0]
    if run_folder != path_segment(run_folder) or run_folder in {"", ".", ".."}:
        return None
    fs, path = fsspec.core.url_to_fs(f"{folder}/{run_folder}/{REPORT_NAME}")
    if not fs.exists(path):
        return None
    return fs.cat_file(path).decode()


def main(argv: list[str] | None = None) -> int:
    """``python -m sparktune.serve.drift [--model-name NAME]``: the latest monitor run's result and files."""
    import argparse

    from sparktune.core.config import DEFAULT_MODEL_NAME, settings

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--model-name", default="", help=f"registered model (default {DEFAULT_MODEL_NAME})")
    name = parser.parse_args(argv).model_name.strip() or DEFAULT_MODEL_NAME
    summary = latest_summary(settings().monitoring_uri, name)
    if summary is None:
        print(f"{name} was never monitored: run the monitor_champion DAG (make monitor) first.")
        return 1
    print(summary["message"])
    for check in summary.get("checks") or []:
        value = "not run" if check["value"] is None else f"{check['value']:.4g}"
        print(f"  {check['name']:<10} {value:>8} (threshold {check['threshold']}, {check['method']})")
    for key, what in (
        ("report_uri", "report"),
        ("summary_uri", "summary"),
        ("review_csv_uri", "texts to label"),
    ):
        if summary.get(key):
            print(f"{what}: {summary[key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
