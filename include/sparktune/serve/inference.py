"""Batch inference: a registered model (``models:/NAME@alias``) over a Spark DataFrame of texts.

Three plain functions the ``batch_inference`` DAG (and ``jobs/batch_inference.py``) chain:

1. :func:`resolve_model` asks the registry once, on the driver: which version the alias points at,
   that version's ``data_fingerprint`` tag, the task and prompt template of its training run, the
   label set, and downloads the model folder (``mlflow.artifacts.download_artifacts``) under
   ``download_dir/<name>/<version>``. Versions are immutable, so a folder already there is reused.
2. :func:`score_dataframe` runs ``mapInPandas``: each Python worker loads the model ONCE from that
   folder (a module-level cache keyed by path; Spark reuses Python workers across tasks) and never
   talks to the registry. Each partition's texts are sorted by token length, scored in batches,
   and put back in input order.
3. :func:`write_predictions` writes Parquet partitioned by ``date`` with dynamic partition
   overwrite: a rerun of the same run replaces its own partition, never adds rows beside it.

Where the model folder lives on a cluster: executors read ``ModelRef.local_path`` directly, so
``download_dir`` must be storage every executor sees under the same path (an NFS mount,
``/dbfs/...``, a Unity Catalog Volume ``/Volumes/...``). On ``local[*]`` any local folder is. We
chose shared storage over shipping the folder with ``SparkContext.addFile``: a multi-GB model
would be copied into every executor's work directory on every application, and a shared folder
keyed by immutable version is downloaded once for all runs.

Scoring is the logged model's own: each worker loads the version's folder as the label pyfunc
(:func:`sparktune.release.eval_inputs.load_label_model`) and calls its ``predict``, the path
evaluation scored and ``mlflow.pyfunc.load_model`` gives users (:mod:`sparktune.core.label_scoring`:
constrained scoring over the label set for a causal LM, the head's arg max for a classifier;
``score`` is the predicted label's probability). Each partition's texts are scored in length-sorted
batches.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

logger = logging.getLogger("sparktune.serve.inference")

OUTPUT_COLUMNS = (
    "id",
    "prediction",
    "score",
    "model_name",
    "model_version",
    "model_alias",
    "data_fingerprint",
    "scored_at",
)
PARTITION_COLUMN = "date"
CAUSAL_LM, SEQUENCE_CLASSIFICATION = "causal_lm", "sequence_classification"
LABELS_TAG = "labels"
DATA_FINGERPRINT_TAG = "data_fingerprint"


class InferenceInputError(ValueError):
    """The model, the alias or the input cannot be used for inference; the message says how to fix it."""


@dataclass(frozen=True)
class ModelRef:
    """A registered model version resolved on the driver, ready for executors to load from a path."""

    name: str
    version: str
    alias: str
    data_fingerprint: str
    local_path: str
    task: str
    labels: tuple[str, ...]
    prompt_template: str = ""
    # Executors load the model with it; resolve_model checked the folder with the same setting.
    trust_remote_code: bool = False

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"

    def to_summary(self) -> dict[str, Any]:
        out = asdict(self)
        out["labels"] = list(self.labels)
        return out


# --------------------------------------------------------------------------------------------
# Driver: resolve the alias and download the model once


def _default_download_dir() -> Path:
    from sparktune.core.config import settings

    return settings().home / "models" / "inference"


def resolve_model(
    model_name: str,
    alias: str,
    tracking_uri: str | None,
    *,
    download_dir: str | Path | None = None,
    labels: Sequence[str] | None = None,
    prompt_template: str | None = None,
    trust_remote_code: bool = False,
) -> ModelRef:
    """Resolve ``models:/model_name@alias`` and download that version's model folder once.

    ``download_dir`` (default ``SPARKTUNE_HOME/models``) must be readable by every executor under
    the same path (see the module docstring). The label set of a causal LM comes from ``labels``,
    else the version's ``labels`` tag (a JSON list), else the training run's dataset
    (``dataset_path`` param). The prompt template comes from ``prompt_template``, else the
    training run's ``prompt_template`` param. Raises :class:`InferenceInputError` when the alias
    does not exist, naming the versions and aliases there are. The downloaded folder is checked
    before any executor loads it (:mod:`sparktune.core.model_safety`): safetensors weights only, and no
    code shipped with the model unless ``trust_remote_code``.
    """
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from sparktune.model.process_setup import using_tracking_uri

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
    with using_tracking_uri(uri):
        client = MlflowClient(tracking_uri=uri)
        try:
            version = client.get_model_version_by_alias(model_name, alias)
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            raise InferenceInputError(_missing_alias_message(client, model_name, alias, uri)) from exc
        tags = dict(version.tags or {})
        run_params: dict[str, str] = {}
        if version.run_id:
            try:
                run_params = dict(client.get_run(version.run_id).data.params)
            except MlflowException:
                logger.warning("The run %s of %s v%s is gone.", version.run_id, model_name, version.version)
        local = _download(model_name, str(version.version), download_dir)
    from sparktune.core.model_safety import check_model_tree

    check_model_tree(local, trust_remote_code=trust_remote_code)

    logged = _label_model_config(local)
    if logged.get("labels"):
        # The label pyfunc carries its task, labels and template: what it was evaluated with.
        labels, prompt_template = logged["labels"], logged.get("prompt_template") or prompt_template
    task = logged.get("task") or _task_of(local, run_params)
    template = prompt_template or run_params.get("prompt_template", "")
    if task == CAUSAL_LM:
        if not template or "{text}" not in template or "{label}" not in template:
            raise InferenceInputError(
                f"{model_name} v{version.version} has no usable prompt_template (its training run logged "
                f"{template!r}); pass prompt_template= with {{text}} and {{label}}, as the model was trained."
            )
        if template.endswith("..."):  # training truncates params over 500 characters
            logger.warning(
                "The logged prompt_template of %s looks truncated; pass it explicitly.", model_name
            )
        found = list(labels) if labels else _labels_of(tags, run_params, model_name, str(version.version))
    else:
        found = list(labels) if labels else _classifier_labels(local)
    ref = ModelRef(
        name=model_name,
        version=str(version.version),
        alias=alias,
        data_fingerprint=tags.get(DATA_FINGERPRINT_TAG, ""),
        local_path=str(local),
        task=task,
        labels=tuple(str(label) for label in found),
        prompt_template=template if task == CAUSAL_LM else "",
        trust_remote_code=trust_remote_code,
    )
    logger.info(
        "Resolved %s@%s -> version %s (%s, %d labels, data %s) at %s",
        model_name,
        alias,
        ref.version,
        ref.task,
        len(ref.labels),
        ref.data_fingerprint or "?",
        ref.local_path,
    )
    return ref


def _missing_alias_message(client: Any, model_name: str, alias: str, uri: str) -> str:
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(model_name)
    except MlflowException:
        return (
            f"No registered model {model_name!r} in the MLflow registry at {uri}. Train and promote one "
            "first (the llm_finetune DAG), or pass the model_name it was registered under."
        )
    aliases = dict(model.aliases or {})
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{model_name}'"))
    known = ", ".join(f"{a} -> v{v}" for a, v in sorted(aliases.items())) or "none"
    return (
        f"{model_name!r} has no alias {alias!r} (aliases: {known}; versions: {versions or 'none'}). "
        f"Promote a version to {alias!r} first (the llm_finetune DAG's promote step, or "
        f"MlflowClient().set_registered_model_alias({model_name!r}, {alias!r}, <version>)), "
        "or pass model_alias= one of the aliases above."
    )


def _download(model_name: str, version: str, download_dir: str | Path | None) -> Path:
    import mlflow

    root = Path(download_dir) if download_dir else _default_download_dir()
    target = root / re.sub(r"[^0-9A-Za-z_.-]", "_", model_name) / version
    if (target / "MLmodel").exists() or (target / "config.json").exists():
        return target  # a version never changes: the folder a previous run downloaded is it
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{version}.{uuid.uuid4().hex}.partial"
    try:
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"models:/{model_name}/{version}", dst_path=str(partial)
        )
        try:
            partial.rename(target)
        except OSError:  # another run downloaded it meanwhile
            if not (target / "MLmodel").exists():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _label_model_config(local: Path) -> dict[str, Any]:
    """The ``model_config`` of a label pyfunc (:mod:`sparktune.model.label_pyfunc`); empty for a model
    logged otherwise (MLflow's transformers flavour, by an earlier version)."""
    import yaml

    mlmodel = local / "MLmodel"
    if not mlmodel.is_file():
        return {}
    flavors = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors", {})
    # MLflow stores a pyfunc's model_config under "config" in MLmodel.
    return dict((flavors.get("python_function") or {}).get("config") or {})


def _hf_config_dir(local: Path) -> Path:
    for candidate in (local, local / "model"):
        if (candidate / "config.json").exists():
            return candidate
    return local


def _task_of(local: Path, run_params: dict[str, str]) -> str:
    config = _hf_config_dir(local) / "config.json"
    if config.exists():
        architectures = json.loads(config.read_text()).get("architectures") or []
        if any(str(a).endswith("ForSequenceClassification") for a in architectures):
            return SEQUENCE_CLASSIFICATION
        if architectures:
            return CAUSAL_LM
    return run_params.get("task", CAUSAL_LM)


def _classifier_labels(local: Path) -> list[str]:
    config = _hf_config_dir(local) / "config.json"
    id2label = json.loads(config.read_text()).get("id2label", {}) if config.exists() else {}
    return [str(id2label[k]) for k in sorted(id2label, key=int)]


def _labels_of(tags: dict[str, str], run_params: dict[str, str], model_name: str, version: str) -> list[str]:
    if tags.get(LABELS_TAG):
        return [str(v) for v in json.loads(tags[LABELS_TAG])]
    dataset_path = run_params.get("dataset_path", "")
    if dataset_path and Path(dataset_path).exists():
        from sparktune.release.eval_inputs import label_strings, load_split

        names, _ = label_strings(load_split(dataset_path, "train", None, required=("label",)))
        if len(names) >= 2:
            return names
    raise InferenceInputError(
        f"Cannot tell the label set of {model_name} v{version}: it has no {LABELS_TAG!r} tag and its "
        "training "
        f"dataset ({dataset_path or 'not logged'}) is not readable here. Pass labels=, or tag the version: "
        f"MlflowClient().set_model_version_tag({model_name!r}, {version!r}, {LABELS_TAG!r}, "
        '\'["label_a", "label_b"]\').'
    )


# --------------------------------------------------------------------------------------------
# Executors: one model per Python worker

_MODEL_CACHE: dict[str, Any] = {}


def load_cached(ref: ModelRef, batch_size: int = 64) -> Any:
    """The model at ``ref.local_path`` as :func:`sparktune.release.eval_inputs.load_label_model` loads
    it (the logged pyfunc, the path evaluation scored), once per Python process."""
    key = f"{ref.local_path}\0{bool(ref.trust_remote_code)}\0{batch_size}"
    if key not in _MODEL_CACHE:
        import gc

        from sparktune.release.eval_inputs import load_label_model

        _MODEL_CACHE[key] = load_label_model(
            ref.local_path,
            labels=list(ref.labels),
            prompt_template=ref.prompt_template or None,
            trust_remote_code=ref.trust_remote_code,
            batch_size=batch_size,
        )
        # PySpark's daemon runs a full gc.collect() after every task of a reused Python worker: with
        # torch, transformers, MLflow and a model in it, 0.2-0.5 s a task (a third of the tiny
        # model's job over 3,000 rows). What is alive now lives as long as the worker: freezing it
        # takes it out of every later collection (reference counting still frees it). No collection
        # first (as long again): the cyclic garbage of one load is left, once per process.
        gc.freeze()
    return _MODEL_CACHE[key]


def score_dataframe(
    df: DataFrame,
    model_ref: ModelRef,
    *,
    text_column: str = "text",
    id_column: str = "id",
    batch_size: int = 64,
    min_score: float = 0.0,
    scored_at: datetime,
) -> DataFrame:
    """Predictions for every row of ``df``: :data:`OUTPUT_COLUMNS` plus ``date`` (from ``scored_at``).

    One output row per input row (before the ``min_score`` filter, which keeps rows whose score is
    at least ``min_score``; 0 keeps all). ``id`` is ``id_column`` as a string. ``scored_at`` is
    passed in (the run's logical time), never read from the clock, so a rerun writes the same rows.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    problems = []
    for name, column in (("text_column", text_column), ("id_column", id_column)):
        if column not in df.columns:
            problems.append(f"{name}: no column {column!r} in the input (it has {df.columns})")
    if batch_size < 1:
        problems.append(f"batch_size must be at least 1, got {batch_size}")
    if not 0.0 <= min_score <= 1.0:
        problems.append(f"min_score must be in [0, 1], got {min_score}")
    if model_ref.task == CAUSAL_LM and len(model_ref.labels) < 2:
        problems.append(f"a causal LM needs at least two candidate labels, got {list(model_ref.labels)}")
    if problems:
        raise InferenceInputError("Cannot score the input:\n- " + "\n- ".join(problems))

    schema = StructType(
        [
            StructField("id", StringType(), False),
            StructField("prediction", StringType(), True),
            StructField("score", DoubleType(), True),
        ]
    )
    ref = model_ref

    def score_partitions(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import pandas as pd

        scorer = load_cached(ref, batch_size)
        for frame in frames:
            texts = frame["text"].fillna("").astype(str).tolist()
            predictions, scores = scorer.predict(texts)
            yield pd.DataFrame({"id": frame["id"].values, "prediction": predictions, "score": scores})

    source = df.select(
        F.col(id_column).cast("string").alias("id"), F.col(text_column).cast("string").alias("text")
    )
    # Spark splits files by bytes: a few MB of text is one partition, i.e. one busy core for as long
    # as scoring takes. Fewer partitions than task slots are spread over all of them (a shuffle of
    # the texts, cheap beside scoring them); more are left as they are.
    slots = df.sparkSession.sparkContext.defaultParallelism
    if source.rdd.getNumPartitions() < slots:
        source = source.repartition(slots)
    scored = source.mapInPandas(score_partitions, schema)
    if min_score > 0:
        scored = scored.where(F.col("score") >= F.lit(float(min_score)))
    timestamp = F.lit(scored_at).cast("timestamp")
    return scored.select(
        "id",
        "prediction",
        "score",
        F.lit(ref.name).alias("model_name"),
        F.lit(ref.version).alias("model_version"),
        F.lit(ref.alias).alias("model_alias"),
        F.lit(ref.data_fingerprint).alias("data_fingerprint"),
        timestamp.alias("scored_at"),
        F.to_date(timestamp).alias(PARTITION_COLUMN),
    )


# --------------------------------------------------------------------------------------------
# Output


def write_predictions(df: DataFrame, output_uri: str, run_date: date | str) -> int:
    """Write ``df`` as Parquet under ``output_uri/date=<run_date>``; return the rows written.

    The ``date`` column is set to ``run_date`` (the run's logical date), and the write overwrites
    only the partitions it writes (``partitionOverwriteMode=dynamic``): a rerun of the same run
    replaces its own partition, other dates stay. Predictions are computed once, by the write, and
    counted on their way to it (an ``Observation``): nothing is cached or collected, so memory does
    not grow with the rows; each task streams its partition's batches into its Parquet files.
    """
    from pyspark.sql import functions as F

    day = date.fromisoformat(run_date) if isinstance(run_date, str) else run_date
    if isinstance(day, datetime):
        day = day.date()
    rows = write_dated_partition(
        df.withColumn(PARTITION_COLUMN, F.lit(day.isoformat()).cast("date")), output_uri
    )
    logger.info("Wrote %d predictions to %s/%s=%s", rows, output_uri, PARTITION_COLUMN, day.isoformat())
    return rows


# A partitioned write makes Spark sort each task's rows by the partition columns first, so that it
# can write one partition after another. A run's rows all carry one date: the sort buys nothing,
# and it held rows in the JVM up to its heap before spilling (1,376 MB at 5M rows). With concurrent
# output writers on, Spark plans no sort and keeps one open Parquet writer per date a task meets,
# falling back to the sort only past this many dates in one task.
_CONCURRENT_WRITERS_CONF = "spark.sql.maxConcurrentOutputFileWriters"
_CONCURRENT_WRITERS = 4


def write_dated_partition(df: DataFrame, output_uri: str) -> int:
    """Write ``df`` as Parquet partitioned by its ``date`` column, overwriting only the dates it
    holds; return the rows written, counted by an ``Observation`` as they pass to the writer (one
    pass over the data, nothing cached or collected)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    written = Observation("rows_written")
    conf = df.sparkSession.conf
    before = conf.get(_CONCURRENT_WRITERS_CONF, None)
    conf.set(_CONCURRENT_WRITERS_CONF, str(_CONCURRENT_WRITERS))
    try:
        (
            df.observe(written, F.count(F.lit(1)).alias("rows"))
            .write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy(PARTITION_COLUMN)
            .parquet(output_uri)
        )
    finally:
        if before is None:
            conf.unset(_CONCURRENT_WRITERS_CONF)
        else:
            conf.set(_CONCURRENT_WRITERS_CONF, before)
    return int(written.get["rows"])
