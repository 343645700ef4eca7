"""Benchmark: accuracy and macro F1 of fine-tuned models beside the TF-IDF baseline, on two datasets
and on a hand-written set of helpdesk texts in other words.

    make bench-quality                          # every model below (about 50 minutes on 2 cores)
    BENCH_QUALITY_MODELS=tiny-llama make bench-quality            # the built-in model only (~4 min)
    BENCH_QUALITY_MODELS=all-minilm-l6-v2 python benchmarks/bench_quality.py --datasets helpdesk_csv
    python benchmarks/bench_quality.py --models smollm2-135m-instruct --param learning_rate=1e-3

Models (``BENCH_QUALITY_MODELS`` or ``--models``, comma-separated; default all three):

- ``tiny-llama``: the built-in 2-layer LLaMA (``task`` from ``BENCH_QUALITY_TASK``, default
  ``causal_lm``), on both datasets;
- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, a pretrained causal LM (LoRA, its chat
  template), on the helpdesk export;
- ``all-minilm-l6-v2``: all-MiniLM-L6-v2, a pretrained encoder with a new classification head
  (``task=sequence_classification``), on the helpdesk export.

The real checkpoints train on the helpdesk export only: an epoch of SmolLM2 there costs about
28 minutes on 2 cores, and the demo data (10 intents named by their keywords) tells nothing the
helpdesk export does not.

Two generated datasets of different shapes (``sparktune_dev.demo_data``):

- ``demo``: the demo support messages, JSON Lines, ``message`` / ``intent_label`` /
  ``quality_score``, 10 balanced intents, short texts, dirty rows (``BENCH_QUALITY_DEMO_ROWS``,
  default 3,000: the demo generator's own default);
- ``helpdesk_csv``: a helpdesk export, CSV with a BOM and CRLF line ends, ``body`` / ``category``,
  12 categories 10x apart in size, texts of a few hundred characters, duplicates and
  near-duplicates, 3 % mislabelled (``BENCH_QUALITY_HELPDESK_ROWS``, default 2,500).

And a generalization set, ``benchmarks/data/helpdesk_paraphrases.csv`` (``--paraphrases``; its
README says how it was written): 300 texts written by hand, 25 for each helpdesk category, that
say the same intents in other words than the generator's (no refund, password, crash, tracking,
...). Every model trained on the helpdesk export, and the baseline fit on the same train split, is
scored on it too: a model that learned the generator's keywords fails there, one that learned the
intents does not.

For each (dataset, model), in this one process, the pipeline's own code, not the DAG: preparation
(``sparktune.data.prepare_publish.run_prepare``, the prepare_data job's function, on a ``local[2]``
Spark session here instead of spark-submit; no quality gate), the Arrow dataset
(``sparktune.data.materialize``), training (``sparktune.model.training.train``), evaluation of the
logged model (``sparktune.release.evaluation.evaluate_model``, as the evaluate task scores it: the
logged pyfunc's predictions, loaded once and scored on the test split, then on the paraphrases
built into a split of their own with the model's logged prompt template) and of the baseline on the
same rows (``sparktune.release.baseline``: TF-IDF + logistic regression fit on the train split).
Training gets the DAG's DEFAULT params plus the column mapping, the base model and its task: the
recipe is what a user who sets nothing else gets, resolved from the base model by training itself
(``sparktune.model.recipes``; the table names it). ``--param KEY=VALUE`` (repeatable, or
``BENCH_QUALITY_PARAMS="k=v,k=v"``) overrides a param for every model of the run: how the recipes
were chosen.

Times: ``train s`` is the trainer's own clock (``TrainResult.train_seconds``: the optimizer steps,
not model loading, logging or verification); ``total s`` the model's whole budget in this bench:
preparation and the Arrow dataset for its tokenizer and prompt, the whole ``train()`` call
(loading, training, logging and checking the logged model) and its evaluation on every set; ``eval
s`` the scoring of that one set. For the baseline: its fit (``fit_predict``: TF-IDF + logistic
regression fit, and the rows predicted). Accuracy and macro F1 carry 95 % bootstrap intervals over
rows; the JSON adds the paired interval of (fine-tuned - baseline) accuracy on the same rows.

Everything is written under ``SPARKTUNE_HOME/bench/quality`` (data, lake, datasets, a throwaway
MLflow store, training runs), emptied at the start of every run; the base models are built once
into ``SPARKTUNE_HOME/models/base`` (``ensure_base_model``) and shared with ``make demo``.

Targets (points on the same rows; the baseline is fit on the model's own train split):

- ``tiny-llama``, every dataset's test split: baseline accuracy - model accuracy <= 0.05;
- each real model, the helpdesk test split: baseline accuracy - model accuracy <= 0.02;
- each real model, the paraphrases: model accuracy - baseline accuracy >= 0.05. (``tiny-llama`` is
  scored there too, with no target: a model pre-trained on the generator's own corpus only knows
  its words.)

Prints a table and writes ``SPARKTUNE_HOME/bench/quality.json``
(``{"results": [{"dataset", "eval_set", "model", "method", "accuracy", "macro_f1", "train_seconds",
"total_seconds", ...}], ...}``); exits 1 when a run fails or a target is missed. Not a test.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import logging
import os
import platform
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import finish, not_checked, target  # noqa: E402

DATASETS = ("demo", "helpdesk_csv")
TINY = "tiny-llama"
SMOLLM2 = "smollm2-135m-instruct"
MINILM = "all-minilm-l6-v2"
# Fastest first: a run's early results come in minutes, SmolLM2's after about 40.
MODELS = (TINY, MINILM, SMOLLM2)
# The datasets each model trains on (see the docstring: the real checkpoints on the helpdesk export).
MODEL_DATASETS = {TINY: DATASETS, MINILM: ("helpdesk_csv",), SMOLLM2: ("helpdesk_csv",)}
DEFAULT_DEMO_ROWS = 3000
DEFAULT_HELPDESK_ROWS = 2500
DATA_SEED = 7
PARAPHRASES = Path(__file__).resolve().parent / "data" / "helpdesk_paraphrases.csv"
TEST, PARAPHRASE = "test", "paraphrases"
# Issue 18: the built-in model may trail the baseline by at most this much accuracy.
MAX_ACCURACY_GAP = 0.05
# A real checkpoint matches the baseline on the texts it was trained like (within this much) ...
REAL_MAX_ACCURACY_GAP = 0.02
# ... and beats it by at least this much on texts in other words.
REAL_MIN_PARAPHRASE_MARGIN = 0.05
EXPERIMENT = "bench-quality"
_LIBRARY_ADVICE = (
    "Add type hints to the `predict`",
    "An input example was not provided",
    "is_gradient_checkpointing",
)


def settings_home() -> Path:
    return Path(os.environ.get("SPARKTUNE_HOME", ".local")).expanduser().resolve()


@dataclass
class Run:
    """One model trained on one dataset, and what it measured."""

    dataset: str
    model: str
    task: str
    params: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)  # what goes into the JSON's "runs"
    seconds: float = 0.0  # the model's whole budget: prepare + materialize + train() + evaluation
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.dataset}-{self.model}"


# --------------------------------------------------------------------------------------------
# The datasets


def write_source(name: str, folder: Path, rows: int) -> tuple[Path, dict[str, Any], str]:
    """(source file, the column mapping for it, a description) of dataset ``name``."""
    from sparktune_dev import demo_data

    if name == "demo":
        path = demo_data.write_demo_dataset(folder / "support_tickets.jsonl", rows, seed=DATA_SEED)
        # the DAG's defaults already name the demo's columns: only the source is set
        return path, {"source_uri": str(path)}, f"{rows:,} rows JSONL, message/intent_label, 10 labels"
    if name == "helpdesk_csv":
        path = demo_data.write_helpdesk_csv(folder / "helpdesk_export.csv", rows, seed=DATA_SEED)
        mapping = {
            "source_uri": str(path),
            "text_column": demo_data.HELPDESK_TEXT_COLUMN,
            "label_column": demo_data.HELPDESK_LABEL_COLUMN,
            "quality_column": "",
        }
        counts = demo_data.helpdesk_category_counts(rows)
        description = (
            f"{rows:,} rows CSV (BOM, CRLF), body/category, {len(counts)} labels "
            f"{max(counts.values())}..{min(counts.values())} rows"
        )
        return path, mapping, description
    raise ValueError(f"unknown dataset {name!r}; choose from {DATASETS}")


def read_paraphrases(path: Path) -> tuple[list[str], list[str]]:
    """(texts, categories) of the hand-written set; its categories must be the helpdesk export's."""
    from sparktune_dev.demo_data import HELPDESK_CATEGORIES, HELPDESK_LABEL_COLUMN, HELPDESK_TEXT_COLUMN

    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    texts = [r[HELPDESK_TEXT_COLUMN].strip() for r in rows]
    labels = [r[HELPDESK_LABEL_COLUMN].strip() for r in rows]
    unknown = sorted(set(labels) - set(HELPDESK_CATEGORIES))
    if unknown or not texts or not all(texts):
        raise ValueError(f"{path}: needs non-empty texts of the helpdesk categories (unknown: {unknown})")
    return texts, labels


def run_params(mapping: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The DAG's default params with the column mapping (and ``--param`` overrides), validated as a
    DAG run's params are; the recipe fields not overridden stay unset, for training to fill from the
    base model."""
    from sparktune.core.params import default_params, parse_params

    return parse_params({**default_params(), **mapping, **overrides}).to_dict()


# --------------------------------------------------------------------------------------------
# The pipeline's steps


def start_spark(app: str = "sparktune-bench-quality") -> Any:
    from pyspark.sql import SparkSession
    from sparktune.data.spark_jvm import short_job_conf

    # Spark's Python workers (the tokenizer UDF) must run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config(map=short_job_conf({}, None))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def prepare(spark: Any, params: dict[str, Any], tokenizer: str, lake: Path) -> dict[str, Any]:
    from sparktune.core.params import parse_params
    from sparktune.data.prepare_publish import run_prepare

    return run_prepare(spark, parse_params(params), tokenizer, str(lake))


def materialize(spark: Any, summary: dict[str, Any], datasets_root: Path) -> Any:
    from sparktune.data.materialize import converts_without_spark, materialize_dataset

    source = summary["prepared_uri"]
    # as the materialize task does: small Parquet is converted here, without Spark
    session = None if converts_without_spark(source) else spark
    return materialize_dataset(
        session, source, str(datasets_root), data_fingerprint=summary["data_fingerprint"]
    )


def train_model(run: Run, base_model: str, work: Path) -> tuple[Any, float]:
    """(TrainResult, wall seconds of the whole train() call)."""
    from sparktune.model.train_request import TrainRequest
    from sparktune.model.training import train

    fingerprint = run.info["data_fingerprint"]
    request = TrainRequest(
        dataset_path=run.info["dataset_uri"],
        base_model=base_model,
        output_dir=str(work / "runs" / run.key),
        params=run.params,
        mlflow_tracking_uri=tracking_uri(work),
        experiment_name=EXPERIMENT,
        train_key=f"{EXPERIMENT}-{run.key}-{fingerprint}",
        tags={"data_fingerprint": fingerprint, "bench": "quality"},
        run_name=f"{EXPERIMENT}-{run.key}",
    )
    started = time.perf_counter()
    result = train(request)
    return result, time.perf_counter() - started


def tracking_uri(work: Path) -> str:
    return f"sqlite:///{work / 'mlflow' / 'mlflow.db'}"


def paraphrase_split(
    texts: list[str], labels: list[str], names: list[str], prompt_template: str, folder: Path
) -> str:
    """The paraphrases saved as the ``test`` split of a dataset with the columns evaluate_model reads:
    ``label`` in the train split's ClassLabel order and, for a causal LM, ``prompt``/``completion``
    built with the model's logged template (``format_example``, the Python reference of the Spark
    expression that built its training prompts). Returns its path."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
    from sparktune.core.label_scoring import format_example

    columns: dict[str, list] = {
        "example_id": [f"paraphrase-{i:04d}" for i in range(len(texts))],
        "text": texts,
        "label": [names.index(label) for label in labels],
    }
    features = {"example_id": Value("string"), "text": Value("string"), "label": ClassLabel(names=names)}
    if prompt_template:
        pairs = [format_example(prompt_template, t, label) for t, label in zip(texts, labels, strict=True)]
        columns["prompt"], columns["completion"] = [p for p, _ in pairs], [c for _, c in pairs]
        features.update(prompt=Value("string"), completion=Value("string"))
    path = folder / "paraphrases"
    DatasetDict({"test": Dataset.from_dict(columns, features=Features(features))}).save_to_disk(str(path))
    return str(path)


def split_texts(dataset_uri: str) -> dict[str, Any]:
    """Texts, label strings and ids of the train and test splits, and the label order."""
    from sparktune.data.published_dataset import open_dataset

    dataset = open_dataset(dataset_uri)
    names = list(dataset["train"].features["label"].names)  # the ClassLabel order evaluate_model reports in
    out: dict[str, Any] = {"names": names}
    for split in ("train", "test"):
        rows = dataset[split]
        out[split] = (
            [str(t) for t in rows["text"]],
            [names[i] for i in rows["label"]],
            [str(v) for v in rows["example_id"]],
        )
    return out


def split_signature(splits: dict[str, Any]) -> str:
    """Which rows the train and test splits hold: runs with the same signature share one baseline."""
    digest = hashlib.sha256()
    for split in ("train", "test"):
        digest.update("\n".join(sorted(splits[split][2])).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def evaluate_baseline_on(
    splits: dict[str, Any], texts: list[str], truth: list[str], ids: list[str]
) -> tuple[Any, float]:
    """(EvalResult of the baseline fit on the train split and scored on ``texts``, fit seconds)."""
    from sparktune.release.baseline import evaluate_baseline

    train_texts, train_labels, _ = splits["train"]
    started = time.perf_counter()
    result = evaluate_baseline(train_texts, train_labels, texts, truth, splits["names"], example_ids=ids)
    return result, time.perf_counter() - started


# --------------------------------------------------------------------------------------------
# Report


def result_row(
    source: Run, eval_set: str, model: str, method: str, result: Any, seconds: float, **extra: Any
) -> dict[str, Any]:
    acc_ci = result.ci.get("eval_accuracy", [None, None])
    f1_ci = result.ci.get("eval_macro_f1", [None, None])
    return {
        "dataset": source.dataset,
        "run": source.key,  # the (dataset, model) run the row belongs to; a baseline has one per run
        "eval_set": eval_set,
        "model": model,
        "method": method,
        "accuracy": round(result.eval_accuracy, 4),
        "macro_f1": round(result.eval_macro_f1, 4),
        "train_seconds": round(seconds, 2),
        "eval_seconds": round(result.seconds, 1),
        "accuracy_ci_low": _round(acc_ci[0]),
        "accuracy_ci_high": _round(acc_ci[1]),
        "macro_f1_ci_low": _round(f1_ci[0]),
        "macro_f1_ci_high": _round(f1_ci[1]),
        "n_test": result.n_examples,
        **extra,
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def print_table(results: list[dict[str, Any]], runs: list[Run], datasets: dict[str, dict[str, Any]]) -> None:
    header = (
        f"{'dataset':<13} {'eval set':<11} {'model':<22} {'accuracy [95% CI]':<24} {'macro F1':>8} "
        f"{'train s':>8} {'total s':>8} {'eval s':>7} {'rows':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ci = (
            f"[{r['accuracy_ci_low']:.3f}, {r['accuracy_ci_high']:.3f}]"
            if r["accuracy_ci_low"] is not None
            else ""
        )
        # a model's train and total seconds are its budget, shown once, on its test row
        budget = r["method"] == "baseline" or r["eval_set"] == TEST
        total = f"{r['total_seconds']:>8.0f}" if budget else f"{'':>8}"
        train = f"{r['train_seconds']:>8.1f}" if budget else f"{'':>8}"
        print(
            f"{r['dataset']:<13} {r['eval_set']:<11} {r['model']:<22} {r['accuracy']:.3f} {ci:<18} "
            f"{r['macro_f1']:>8.3f} {train} {total} {r['eval_seconds']:>7.1f} {r['n_test']:>5,}"
        )
    for run in runs:
        if run.error:
            print(f"{run.dataset:<13} {'':<11} {run.model:<22} FAILED: {run.error}")
    print()
    for name, d in datasets.items():
        line = f"  {name}: {d['description']}"
        if d.get("split_counts"):
            line += (
                f"; prepared {d['rows_in']:,} -> {d['rows_out']:,} rows "
                f"(train {d['split_counts']['train']:,} / validation {d['split_counts']['validation']:,} "
                f"/ test {d['split_counts']['test']:,})"
            )
        print(line)
    for run in runs:
        if run.info.get("global_steps") is not None:
            print(
                f"  {run.key}: recipe {run.info['recipe'].get('name', '?')}, "
                f"{run.info['global_steps']} optimizer steps, train loss {run.info['train_loss']}"
            )


def check_targets(results: list[dict[str, Any]], runs: list[Run]) -> list[dict[str, Any]]:
    """The docstring's targets, one per (run, eval set) that has one."""

    def row(run: Run, eval_set: str, method: str) -> dict[str, Any] | None:
        wanted = (eval_set, run.key, method)
        return next((r for r in results if (r["eval_set"], r["run"], r["method"]) == wanted), None)

    targets = []
    for run in runs:
        sets = [TEST] + ([PARAPHRASE] if run.info.get("paraphrases") else [])
        for eval_set in sets:
            model, baseline = row(run, eval_set, "fine_tuned"), row(run, eval_set, "baseline")
            name = f"{run.dataset} {eval_set}, {run.model}"
            note = (
                f"fine-tuned {model['accuracy']:.3f}, baseline {baseline['accuracy']:.3f}"
                if model and baseline
                else "not measured: the run failed"
            )
            diff = round(model["accuracy"] - baseline["accuracy"], 4) if model and baseline else None
            if run.model == TINY and eval_set == TEST:
                gap = None if diff is None else -diff
                targets.append(
                    target(f"{name}: baseline minus model accuracy", gap, at_most=MAX_ACCURACY_GAP, note=note)
                )
            elif run.model == TINY:
                targets.append(
                    not_checked(
                        f"{name}: model minus baseline accuracy",
                        f"reported only ({note}): tiny-llama knows only the generator's words",
                    )
                )
            elif eval_set == TEST:
                gap = None if diff is None else -diff
                name = f"{name}: baseline minus model accuracy"
                targets.append(target(name, gap, at_most=REAL_MAX_ACCURACY_GAP, note=note))
            else:
                targets.append(
                    target(
                        f"{name}: model minus baseline accuracy",
                        diff,
                        at_least=REAL_MIN_PARAPHRASE_MARGIN,
                        note=note,
                    )
                )
    return targets


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Advice to library authors (type hints, input examples, a renamed method), not about this run.
    # Dropped where warnings are shown: MLflow re-enables UserWarnings around its calls.
    show = warnings.showwarning

    def showwarning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if not any(text in str(message) for text in _LIBRARY_ADVICE):
            show(message, category, *args, **kwargs)

    warnings.showwarning = showwarning
    from datasets.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    disable_progress_bars()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _error(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}"


# --------------------------------------------------------------------------------------------
# Main


def _csv_arg(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _param_arg(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as params: numbers and booleans as JSON reads them, the rest as strings."""
    import json

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--param wants KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_quality", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--datasets", default=",".join(DATASETS), help="comma-separated subset of " + ",".join(DATASETS)
    )
    parser.add_argument(
        "--models",
        default=os.environ.get("BENCH_QUALITY_MODELS") or ",".join(MODELS),
        help="comma-separated subset of " + ",".join(MODELS) + " (default: BENCH_QUALITY_MODELS or all)",
    )
    parser.add_argument(
        "--task",
        choices=("causal_lm", "sequence_classification"),
        default=os.environ.get("BENCH_QUALITY_TASK") or "causal_lm",
        help="the task param tiny-llama trains with (default: BENCH_QUALITY_TASK or causal_lm)",
    )
    parser.add_argument(
        "--demo-rows",
        type=int,
        default=int(os.environ.get("BENCH_QUALITY_DEMO_ROWS") or DEFAULT_DEMO_ROWS),
        help=f"rows of the demo data (default: BENCH_QUALITY_DEMO_ROWS or {DEFAULT_DEMO_ROWS})",
    )
    parser.add_argument(
        "--helpdesk-rows",
        type=int,
        default=int(os.environ.get("BENCH_QUALITY_HELPDESK_ROWS") or DEFAULT_HELPDESK_ROWS),
        help=f"rows of the helpdesk export (default: BENCH_QUALITY_HELPDESK_ROWS or {DEFAULT_HELPDESK_ROWS})",
    )
    parser.add_argument(
        "--paraphrases",
        default=os.environ.get("BENCH_QUALITY_PARAPHRASES", str(PARAPHRASES)),
        help="CSV (body, category) of helpdesk texts in other words; '' to skip (default: "
        "BENCH_QUALITY_PARAPHRASES or benchmarks/data/helpdesk_paraphrases.csv)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=_csv_arg(os.environ.get("BENCH_QUALITY_PARAMS", "")),
        metavar="KEY=VALUE",
        help="a pipeline param for every model of the run, e.g. learning_rate=1e-3 (repeatable; "
        "default: BENCH_QUALITY_PARAMS, comma-separated)",
    )
    parser.add_argument("--out", default=None, help="JSON path (default SPARKTUNE_HOME/bench/quality.json)")
    args = parser.parse_args(argv)
    args.datasets = _csv_arg(args.datasets)
    unknown = sorted(set(args.datasets) - set(DATASETS))
    if unknown or not args.datasets:
        parser.error(f"unknown or no datasets {unknown}; choose from {list(DATASETS)}")
    args.models = _csv_arg(args.models)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown or not args.models:
        parser.error(f"unknown or no models {unknown}; choose from {list(MODELS)}")
    if args.demo_rows < 200 or args.helpdesk_rows < 200:
        parser.error("--demo-rows and --helpdesk-rows must be at least 200 (the quality gates need rows)")
    args.overrides = _param_arg(args.param)
    return args


def plan_runs(args: argparse.Namespace, mappings: dict[str, dict[str, Any]]) -> list[Run]:
    """Every (dataset, model) of the run, models in the order given, each with its params."""
    from sparktune.model.packaged_models import PACKAGED_MODELS

    runs = []
    for model in args.models:
        task = args.task if model == TINY else PACKAGED_MODELS[model].task
        for dataset in args.datasets:
            if dataset in MODEL_DATASETS[model]:
                mapping = {**mappings[dataset], "base_model": model, "task": task}
                runs.append(Run(dataset, model, task, run_params(mapping, args.overrides)))
    return runs


def prepare_runs(runs: list[Run], resolved: dict[str, str], work: Path, datasets: dict) -> None:
    """Preparation and the Arrow dataset of every run (its tokenizer and prompt): one Spark session for
    all, stopped before training."""
    spark = start_spark()
    try:
        for run in runs:
            print(f"[{run.key}] prepare + materialize ...", flush=True)
            try:
                started = time.perf_counter()
                summary = prepare(spark, run.params, resolved[run.model], work / "lake")
                prepare_seconds = time.perf_counter() - started
                started = time.perf_counter()
                found = materialize(spark, summary, work / "datasets")
                materialize_seconds = time.perf_counter() - started
            except Exception as exc:  # one run's failure is reported, the others still run
                run.error = _error(exc)
                print(f"    failed: {run.error}", flush=True)
                continue
            run.seconds += prepare_seconds + materialize_seconds
            run.info.update(
                prepare_seconds=round(prepare_seconds, 1),
                materialize_seconds=round(materialize_seconds, 1),
                data_fingerprint=summary["data_fingerprint"],
                dataset_uri=found.dataset_uri,
                warnings=summary["warnings"],
            )
            datasets[run.dataset].setdefault("rows_in", summary["rows_in"])
            datasets[run.dataset].setdefault("rows_out", summary["rows_out"])
            datasets[run.dataset].setdefault("split_counts", summary["split_counts"])
            datasets[run.dataset].setdefault("labels", summary["labels"])
            datasets[run.dataset].setdefault("rows_per_label", summary["rows_per_label"])
            print(
                f"    {summary['rows_in']:,} rows -> {summary['rows_out']:,} prepared "
                f"({len(summary['labels'])} labels; split {summary['split_counts']}) "
                f"in {prepare_seconds:.0f} + {materialize_seconds:.0f} s",
                flush=True,
            )
    finally:
        spark.stop()


def train_and_score(
    run: Run, base_model: str, work: Path, paraphrases: tuple[list[str], list[str]] | None
) -> list[dict[str, Any]]:
    """Train ``run``'s model, score it and the baseline on the test split (and the paraphrases for the
    helpdesk export); the result rows."""
    from sparktune.release.comparison import paired_comparison
    from sparktune.release.evaluation import evaluate_model, load_for_evaluation

    print(f"[{run.key}] train ...", flush=True)
    trained, call_seconds = train_model(run, base_model, work)
    recipe = trained.recipe.get("name", "?")
    print(
        f"    recipe {recipe}: {trained.global_steps} steps in {trained.train_seconds:.0f} s "
        f"(train() {call_seconds:.0f} s), train loss {trained.train_loss:.3f}",
        flush=True,
    )
    run.seconds += call_seconds
    uri, dataset_uri = trained.model_uri, run.info["dataset_uri"]
    print(f"[{run.key}] evaluate the fine-tuned model and the baseline ...", flush=True)
    started = time.perf_counter()
    # Loaded once, as evaluate loads it, and scored on every set.
    scorer = load_for_evaluation(uri, dataset_uri, tracking_uri=tracking_uri(work))
    scored = {TEST: evaluate_model(uri, dataset_uri, tracking_uri=tracking_uri(work), scorer=scorer)}
    splits = split_texts(dataset_uri)
    test_texts, test_truth, test_ids = splits[TEST]
    baselines = {TEST: evaluate_baseline_on(splits, test_texts, test_truth, test_ids)}
    if paraphrases is not None and run.dataset == "helpdesk_csv":
        texts, labels = paraphrases
        folder = work / "paraphrases" / run.key
        path = paraphrase_split(texts, labels, splits["names"], scorer.spec.prompt_template, folder)
        scored[PARAPHRASE] = evaluate_model(uri, path, tracking_uri=tracking_uri(work), scorer=scorer)
        ids = [f"paraphrase-{i:04d}" for i in range(len(texts))]
        baselines[PARAPHRASE] = evaluate_baseline_on(splits, texts, labels, ids)
        run.info["paraphrases"] = True
    run.seconds += time.perf_counter() - started
    signature = split_signature(splits)
    run.info.update(
        recipe=trained.recipe,
        global_steps=trained.global_steps,
        train_loss=_round(trained.train_loss),
        val_loss=_round(trained.val_loss),
        train_seconds=round(trained.train_seconds, 1),
        train_call_seconds=round(call_seconds, 1),
        total_seconds=round(run.seconds, 1),
        split_signature=signature,
        n_train=len(splits["train"][0]),
    )
    rows = []
    for eval_set, model in scored.items():
        baseline, fit_seconds = baselines[eval_set]
        comparison = paired_comparison(model, baseline)
        run.info[eval_set] = {
            "model_invalid_predictions": model.n_invalid,
            "model_invalid_samples": model.invalid_samples[:3],
            "per_class_f1": {
                label: {"fine_tuned": _round(f1), "baseline": _round(baseline.per_class_f1.get(label))}
                for label, f1 in model.per_class_f1.items()
            },
            "vs_baseline": comparison.to_summary(),
        }
        rows.append(
            result_row(
                run,
                eval_set,
                run.model,
                "fine_tuned",
                model,
                trained.train_seconds,
                recipe=recipe,
                n_train=len(splits["train"][0]),
                total_seconds=round(run.seconds, 1),
            )
        )
        rows.append(
            result_row(
                run,
                eval_set,
                "tf-idf",
                "baseline",
                baseline,
                fit_seconds,
                n_train=len(splits["train"][0]),
                split_signature=signature,
                total_seconds=round(fit_seconds, 1),
            )
        )
    return rows


def table_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows in print order: by dataset and eval set, each baseline once per split it was fit on
    (the runs on one dataset usually share their split: it is seeded on the rows, not the model)."""
    order = {name: i for i, name in enumerate(DATASETS)}
    shown, out = set(), []
    key = lambda r: (order[r["dataset"]], r["eval_set"] != TEST, r["method"] == "baseline")  # noqa: E731
    for r in sorted(results, key=key):
        if r["method"] == "baseline":
            seen = (r["dataset"], r["eval_set"], r["split_signature"])
            if seen in shown:
                continue
            shown.add(seen)
        out.append(r)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wall_started = time.perf_counter()
    quiet_libraries()
    from sparktune.model.base_model import ensure_base_model

    bench = settings_home() / "bench"
    out = Path(args.out) if args.out else bench / "quality.json"
    work = bench / "quality"
    shutil.rmtree(work, ignore_errors=True)  # throwaway: data, lake, datasets, MLflow, runs
    for sub in ("data", "lake", "datasets", "mlflow", "runs"):
        (work / sub).mkdir(parents=True)
    resolved = {}
    for model in args.models:
        print(f"base model: {model} (built once if missing) ...", flush=True)
        resolved[model] = ensure_base_model(model)
    paraphrases = read_paraphrases(Path(args.paraphrases)) if args.paraphrases else None
    overrides = f", overrides {args.overrides}" if args.overrides else ""
    print(f"params: the DAG's defaults + the column mapping (recipe: from the base model){overrides}")

    rows_of = {"demo": args.demo_rows, "helpdesk_csv": args.helpdesk_rows}
    datasets: dict[str, dict[str, Any]] = {}
    mappings: dict[str, dict[str, Any]] = {}
    for name in args.datasets:
        path, mapping, description = write_source(name, work / "data", rows_of[name])
        mappings[name] = mapping
        datasets[name] = {"description": description, "source": str(path), "column_mapping": mapping}
    runs = plan_runs(args, mappings)
    if not runs:
        raise SystemExit(f"no model of {args.models} trains on {args.datasets} (see MODEL_DATASETS)")
    prepare_runs(runs, resolved, work, datasets)

    results: list[dict[str, Any]] = []
    for run in runs:
        if run.error:
            continue
        try:
            results.extend(train_and_score(run, resolved[run.model], work, paraphrases))
        except Exception as exc:
            run.error = _error(exc)
            print(f"    failed: {run.error}", flush=True)
            continue
        print(f"    {run.key}: {run.seconds:.0f} s in all", flush=True)

    print()
    print_table(table_rows(results), runs, datasets)
    wall = round(time.perf_counter() - wall_started, 1)
    print(f"\nwall time: {wall:.0f} s")
    report = {
        "benchmark": "quality",
        "results": results,
        "datasets": [{"dataset": name, **d} for name, d in datasets.items()],
        "runs": [
            {"dataset": r.dataset, "model": r.model, "task": r.task, "error": r.error, **r.info} for r in runs
        ],
        "conditions": {
            "params": "the DAG's defaults (sparktune.core.params.default_params) + the column mapping, "
            "base_model and task",
            "overrides": args.overrides,
            "models": args.models,
            "tiny_llama_task": args.task,
            "paraphrases": args.paraphrases or None,
            "spark": "local[2], in process (run_prepare), no quality gate",
            "baseline": "TF-IDF (word 1-2 grams) + logistic regression on the run's train split",
            "train_seconds": "fine_tuned: the trainer's optimizer steps; baseline: fit (+ predict)",
            "total_seconds": "fine_tuned: prepare + materialize + train() + evaluation on every set",
            "targets": (
                f"tiny-llama: baseline - model <= {MAX_ACCURACY_GAP} on every test split; real models: "
                f"baseline - model <= {REAL_MAX_ACCURACY_GAP} on the helpdesk test split, model - "
                f"baseline >= {REAL_MIN_PARAPHRASE_MARGIN} on the paraphrases"
            ),
        },
        "wall_seconds": wall,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
    failed = [r for r in runs if r.error]
    return finish(out, report, check_targets(results, runs), ran=not failed)


if __name__ == "__main__":
    sys.exit(main())
