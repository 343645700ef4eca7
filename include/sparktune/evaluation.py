"""Evaluate a fine-tuned classifier on a frozen split of the materialized dataset.

A causal LM (``task=causal_lm``) generates the label after the prompt (greedy, batched,
left-padded) and a prediction counts when the generated text, stripped, equals the label
string. The loss is the mean cross-entropy over the completion tokens (label and eos), tokenized
exactly as TRL tokenized them for training, so it is comparable with the training run's
``val_loss`` per token.

A sequence classifier (``task=sequence_classification``, told apart by the loaded model's class)
predicts the argmax of its head's logits over the text, mapped through ``config.id2label``; the
loss is the mean cross-entropy of the true label, as the trainer's ``val_loss``.

Both return the same :class:`EvalResult`, so the gate and the registry downstream do not care.
It also records the labels the model itself answers with (``model_labels``): a champion trained
before a label was added or removed is scored on the split all the same (``allow_other_labels``,
even a classifier that shares no label with it), and :mod:`sparktune.comparison` pairs the two on
the rows whose label both know.

The result keeps every example's outcome (true and predicted class index, completion loss and
token count), so the 95% confidence intervals (:mod:`sparktune.metrics`) are a percentile
bootstrap over test examples (1,000 resamples with a fixed seed: the same seed and split give the
challenger and the champion the same resamples). The loss interval resamples whole examples and
recomputes the per-token mean, as the point estimate is computed. :func:`confusion_matrix_figure`
draws the confusion matrix as a PNG.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sparktune.classification import CLASSIFICATION_COLUMNS, is_sequence_classifier
from sparktune.label_scoring import completion_loss  # noqa: F401 (re-exported)
from sparktune.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    INVALID_PREDICTION,
    EvalResult,
    label_result,
)
from sparktune.model_safety import UnsafeModelError
from sparktune.training import configure_process_logging, using_tracking_uri

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger("sparktune.evaluation")

REQUIRED_COLUMNS = ("prompt", "completion", "label")
# The baseline's train rows at most: a yardstick needs no more, and its fit stays bounded.
BASELINE_MAX_TRAIN_ROWS = 200_000


class EvaluationInputError(ValueError):
    """The model or the dataset cannot be evaluated; the message says how to fix it."""


# --------------------------------------------------------------------------------------------
# Confusion matrix image


def confusion_columns(result: EvalResult) -> list[str]:
    """Prediction columns: the labels, then other predicted classes, then ``<invalid>`` if any."""
    predicted = {p for row in result.confusion.values() for p, count in row.items() if count}
    labels = list(result.labels) or sorted(result.confusion)
    others = sorted(predicted - set(labels) - {INVALID_PREDICTION})
    return labels + others + ([INVALID_PREDICTION] if INVALID_PREDICTION in predicted else [])


def confusion_matrix_figure(result: EvalResult, path: str | Path, *, title: str | None = None) -> Path:
    """Write the confusion matrix of ``result`` as a PNG at ``path`` and return the path.

    True labels are rows, predictions columns (``<invalid>`` last when a generation matched no
    label); cells show counts and are shaded by the share of their row, so rare classes read as
    well as frequent ones. Drawn with matplotlib's Agg canvas (no display, no pyplot state).
    """
    from matplotlib.figure import Figure

    rows = list(result.labels) or sorted(result.confusion)
    columns = confusion_columns(result)
    counts = np.array(
        [[result.confusion.get(t, {}).get(p, 0) for p in columns] for t in rows], dtype=np.int64
    ).reshape(len(rows), len(columns))
    totals = counts.sum(axis=1, keepdims=True)
    shares = np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)

    size = max(len(rows), len(columns))
    fontsize = 10 if size <= 10 else 8 if size <= 25 else 6
    figure = Figure(
        figsize=(min(4.0 + 0.55 * len(columns), 40.0), min(3.0 + 0.45 * len(rows), 40.0)),
        dpi=100,
        layout="constrained",
    )
    axes = figure.add_subplot()
    image = axes.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    figure.colorbar(image, ax=axes, label="share of the true label", shrink=0.8)
    axes.set_xticks(range(len(columns)), columns, rotation=45, ha="right", fontsize=fontsize)
    axes.set_yticks(range(len(rows)), rows, fontsize=fontsize)
    axes.set_xlabel("predicted label")
    axes.set_ylabel("true label")
    for i in range(len(rows)):
        for j in range(len(columns)):
            if counts[i, j] or size <= 30:
                color = "white" if shares[i, j] > 0.5 else "black"
                axes.text(j, i, str(counts[i, j]), ha="center", va="center", color=color, fontsize=fontsize)
    if title is None:
        accuracy = f"accuracy {result.eval_accuracy:.3f}"
        if "eval_accuracy" in result.ci:
            low, high = result.ci["eval_accuracy"]
            accuracy += f" [{low:.3f}, {high:.3f}]"
        title = (
            f"{result.model_uri or 'model'}\n{result.split or 'split'} n={result.n_examples}, {accuracy}, "
            f"macro F1 {result.eval_macro_f1:.3f}"
        )
    axes.set_title(title, fontsize=fontsize + 1)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    figure.savefig(partial, format="png")
    partial.replace(target)
    return target


PREDICTION_COLUMNS = ("example_id", "label", "prediction", "score")


def write_predictions_csv(result: EvalResult, path: str | Path) -> Path:
    """The per-example predictions of ``result`` as CSV (:data:`PREDICTION_COLUMNS`), written
    atomically: what the parity checks compare the served model against, row by row."""
    import csv

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    with partial.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(PREDICTION_COLUMNS)
        for example_id, truth, predicted, score in zip(
            result.example_ids, result.y_true, result.y_pred, result.scores, strict=True
        ):
            writer.writerow([example_id, result.classes[truth], result.classes[predicted], repr(score)])
    partial.replace(target)
    return target


# --------------------------------------------------------------------------------------------
# Loading


@dataclass
class LabelScorer:
    """A model ready to predict through the pyfunc path: ``predict(texts)`` returns (labels, scores)
    exactly as ``mlflow.pyfunc.load_model(uri).predict`` does; ``model`` and ``tokenizer`` are the
    pyfunc's own, for the loss."""

    predict: Callable[[list[str]], tuple[list[str], list[float]]]
    model: Any
    tokenizer: Any
    spec: Any


def load_label_model(
    model_uri: str,
    *,
    labels: list[str] | None = None,
    prompt_template: str | None = None,
    trust_remote_code: bool = False,
    batch_size: int = 32,
) -> LabelScorer:
    """The model at ``model_uri`` as the label pyfunc users load (:mod:`sparktune.label_pyfunc`).

    An MLflow model (``models:/name/3``, ``models:/name@champion``, ``runs:/<id>/model`` or its
    folder) is downloaded, checked (safetensors weights only; its own code only with
    ``trust_remote_code``, :mod:`sparktune.model_safety`) and loaded with
    ``mlflow.pyfunc.load_model``; predictions go through its ``predict``. A Hugging Face
    ``save_pretrained`` folder, or a model an earlier sparktune logged with MLflow's transformers
    flavour, carries no label set or prompt template: ``labels`` (a causal LM's candidates) and
    ``prompt_template`` (default: the pipeline's) say them, and it is wrapped in the same pyfunc
    class.
    """
    import pandas as pd

    pyfunc, model, tokenizer = _load_any(model_uri, trust_remote_code)
    if pyfunc is None:  # a bare folder, or MLflow's transformers flavour (an earlier version)
        return _wrap(model, tokenizer, labels, prompt_template, batch_size)
    inner = pyfunc.unwrap_python_model()

    def predict(texts: list[str]) -> tuple[list[str], list[float]]:
        out = pyfunc.predict(pd.DataFrame({"text": texts}), params={"batch_size": batch_size})
        return [str(v) for v in out["prediction"]], [float(v) for v in out["score"]]

    return LabelScorer(predict, model, tokenizer, inner.spec)


def _load_any(model_uri: str, trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(the label pyfunc or None, model, tokenizer) of a Hugging Face folder (no pyfunc) or an
    MLflow model URI or folder (:func:`_load_mlflow_model`)."""
    local = Path(model_uri).expanduser()
    if local.is_dir() and not (local / "MLmodel").exists():
        if not (local / "config.json").exists():
            raise EvaluationInputError(
                f"{model_uri!r} is a folder but neither an MLflow model (no MLmodel file) nor a Hugging Face "
                "model (no config.json); pass a models:/ or runs:/ URI or a save_pretrained folder."
            )
        return None, *_load_folder(local, trust_remote_code)
    if "://" not in model_uri and ":/" not in model_uri and not local.exists():
        raise EvaluationInputError(
            f"Model {model_uri!r} is neither an existing folder nor an MLflow URI "
            "(models:/name/3, models:/name@champion, runs:/<run id>/model)."
        )
    return _load_mlflow_model(model_uri, trust_remote_code)


def _load_mlflow_model(model_uri: str, trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(the pyfunc or None, model, tokenizer) of an MLflow model: the label pyfunc, or a
    transformers-flavour model (no pyfunc of ours: None)."""
    import mlflow
    from sparktune import model_safety as safe

    # MLflow would load a class transformers lacks with trust_remote_code=True on its own: check first.
    downloaded = safe.local_model_dir(model_uri)
    safe.check_model_tree(downloaded, trust_remote_code=trust_remote_code)
    import yaml

    flavors = (yaml.safe_load((downloaded / "MLmodel").read_text()) or {}).get("flavors", {})
    if "transformers" in flavors:
        components = mlflow.transformers.load_model(str(downloaded), return_type="components")
        return None, components["model"], components["tokenizer"]
    pyfunc = mlflow.pyfunc.load_model(str(downloaded))
    inner = pyfunc.unwrap_python_model()
    if not hasattr(inner, "spec"):
        raise EvaluationInputError(
            f"{model_uri!r} is a pyfunc of class {type(inner).__name__}, not sparktune's label model "
            "(sparktune.label_pyfunc); evaluate a model the llm_finetune DAG logged."
        )
    return pyfunc, inner.model, inner.tokenizer


def _load_folder(local: Path, trust_remote_code: bool) -> tuple[Any, Any]:
    from sparktune import model_safety as safe
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = safe.load_config(local, trust_remote_code=trust_remote_code)
    auto = AutoModelForSequenceClassification if is_sequence_classifier(config) else AutoModelForCausalLM
    return (
        safe.load_model(auto, local, trust_remote_code=trust_remote_code),
        safe.load_tokenizer(local, trust_remote_code=trust_remote_code),
    )


def _wrap(
    model: Any, tokenizer: Any, labels: list[str] | None, prompt_template: str | None, batch_size: int
) -> LabelScorer:
    """A bare model in the label pyfunc class, with the label set and template it cannot carry."""
    import pandas as pd
    from sparktune import label_pyfunc, label_scoring
    from sparktune.params import MISTRAL_INSTRUCT_TEMPLATE

    if is_sequence_classifier(model):
        head = [str(model.config.id2label[i]) for i in sorted(model.config.id2label, key=int)]
        spec = label_scoring.LabelSpec(label_scoring.SEQUENCE_CLASSIFICATION, tuple(head))
    else:
        spec = label_scoring.LabelSpec(
            label_scoring.CAUSAL_LM, tuple(labels or ()), prompt_template or MISTRAL_INSTRUCT_TEMPLATE
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    wrapped = label_pyfunc.LabelModel()
    wrapped.model, wrapped.tokenizer, wrapped.spec = model, tokenizer, spec
    wrapped.batch_size, wrapped.scoring = batch_size, label_scoring

    def predict(texts: list[str]) -> tuple[list[str], list[float]]:
        out = wrapped.predict(None, pd.DataFrame({"text": texts}))
        return [str(v) for v in out["prediction"]], [float(v) for v in out["score"]]

    return LabelScorer(predict, model, tokenizer, spec)


def load_components(
    model_uri: str, *, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer of an MLflow model URI or folder, or a Hugging Face folder (checked as
    :func:`load_label_model` checks them)."""
    _, model, tokenizer = _load_any(model_uri, trust_remote_code)
    return model, tokenizer


def load_split(
    dataset_path: str, split: str, max_examples: int | None, required: tuple[str, ...] = REQUIRED_COLUMNS
) -> Dataset:
    """One split of a materialized dataset (or, ``dataset_mode=streaming``, of the prepared Parquet),
    its first ``max_examples`` rows (all when None), checked to hold the ``required`` columns.

    Raises :class:`EvaluationInputError` naming the fix for a missing dataset, split or column and
    for an empty split.
    """
    from datasets import DatasetDict, load_from_disk
    from sparktune.streaming import is_prepared_parquet, read_split

    if not Path(dataset_path).exists():
        raise EvaluationInputError(
            f"Dataset {dataset_path!r} does not exist; pass the materialize step's output path."
        )
    if is_prepared_parquet(dataset_path):  # dataset_mode=streaming: the prepared Parquet itself
        try:
            dataset = read_split(dataset_path, split)
        except FileNotFoundError as err:
            raise EvaluationInputError(str(err)) from err
    else:
        dataset = load_from_disk(dataset_path)
    if isinstance(dataset, DatasetDict):
        if split not in dataset:
            raise EvaluationInputError(
                f"Dataset {dataset_path!r} has no split {split!r}; it has {sorted(dataset)}."
            )
        dataset = dataset[split]
    _require_columns(dataset, required, dataset_path, split)
    if max_examples is not None:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    if len(dataset) == 0:
        raise EvaluationInputError(f"Split {split!r} of {dataset_path!r} is empty: nothing to evaluate.")
    return dataset


def _require_columns(dataset: Dataset, required: tuple[str, ...], dataset_path: str, split: str) -> None:
    missing = [c for c in required if c not in dataset.column_names]
    if missing:
        raise EvaluationInputError(
            f"Split {split!r} of {dataset_path!r} lacks columns {missing}; "
            "rebuild it with the materialize step."
        )


def label_strings(dataset: Dataset) -> tuple[list[str], list[str]]:
    """(label names in class order, the true label string of each example) of a split from
    :func:`load_split`: its ``ClassLabel`` names, or the sorted distinct labels (and completions)
    when the label column holds strings."""
    from datasets import ClassLabel

    feature = dataset.features["label"]
    completions = [c.strip() for c in dataset["completion"]] if "completion" in dataset.column_names else []
    if isinstance(feature, ClassLabel):
        names = list(feature.names)
        truth = [names[i] for i in dataset["label"]]
    else:
        truth = [str(v) for v in dataset["label"]]
        names = sorted(set(truth) | set(completions))
    return names, truth


# --------------------------------------------------------------------------------------------
# Scoring


def classifier_loss(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    truth: list[str],
    batch_size: int,
) -> tuple[list[float], list[int]]:
    """A sequence classifier's loss on the true labels: per text, the cross-entropy of the true
    label and 1 if the model knows that label (else 0, with a loss of 0). Texts are truncated at
    the tokenizer's ``model_max_length``, which training sets to its ``max_length``."""
    import torch

    label2id = {str(name): int(i) for i, name in model.config.id2label.items()}
    losses: list[float] = []
    counts: list[int] = []
    for begin in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[begin : begin + batch_size], return_tensors="pt", padding=True, truncation=True
        )
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        targets = torch.tensor([label2id.get(t, -100) for t in truth[begin : begin + batch_size]])
        losses.extend(
            torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="none").tolist()
        )
        counts.extend((targets != -100).long().tolist())
    return losses, counts


def evaluate_model(
    model_uri: str,
    dataset_path: str,
    *,
    split: str = "test",
    batch_size: int = 32,
    max_examples: int | None = None,
    tracking_uri: str | None = None,
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES,
    bootstrap_seed: int = BOOTSTRAP_SEED,
    trust_remote_code: bool = False,
    prompt_template: str | None = None,
    allow_other_labels: bool = False,
) -> EvalResult:
    """Score the model at ``model_uri`` on ``split`` of the dataset: loss, accuracy, macro and per-class F1,
    per-class recall, with 95% bootstrap intervals of accuracy, macro F1 and loss.

    ``model_uri`` is an MLflow model URI (``models:/name/3``, ``models:/name@champion``,
    ``runs:/<id>/model``) or a local folder; ``tracking_uri`` sets where ``models:/`` and ``runs:/``
    resolve (default: ``MLFLOW_TRACKING_URI``). ``bootstrap_resamples=0`` skips the intervals.
    ``trust_remote_code`` lets a model that ships its own Python code load (default: refused).

    Predictions are the logged pyfunc's (:func:`load_label_model`): the label and probability a
    user of ``mlflow.pyfunc.load_model`` gets, kept per example (``example_ids``, ``scores``).
    ``prompt_template`` is used only for a model that does not carry one (a bare Hugging Face
    folder); default: the pipeline's.

    A classifier that knows none of the split's labels is refused, unless ``allow_other_labels``
    (the champion, when the challenger brings a new label set): then every row is an error, the
    loss is NaN, and :attr:`EvalResult.model_labels` says what it was trained on.
    """
    import torch

    if batch_size < 1:
        raise EvaluationInputError(f"batch_size must be at least 1, got {batch_size}.")
    if bootstrap_resamples < 0:
        raise EvaluationInputError(f"bootstrap_resamples must be 0 or more, got {bootstrap_resamples}.")
    started = time.perf_counter()
    # The columns each kind of model needs are checked once the model tells its kind.
    dataset = load_split(dataset_path, split, max_examples, required=("label",))
    names, truth = label_strings(dataset)
    with using_tracking_uri(tracking_uri) if tracking_uri else nullcontext():
        scorer = load_label_model(
            model_uri,
            labels=names,
            prompt_template=prompt_template,
            trust_remote_code=trust_remote_code,
            batch_size=batch_size,
        )
    model, tokenizer = scorer.model, scorer.tokenizer
    classifier = is_sequence_classifier(model)
    required = CLASSIFICATION_COLUMNS if classifier else (*REQUIRED_COLUMNS, "text")
    _require_columns(dataset, required, dataset_path, split)
    if tokenizer.pad_token is None and tokenizer.eos_token is None:
        raise EvaluationInputError(
            f"The tokenizer of {model_uri!r} has neither a pad nor an eos token; "
            + ("batches cannot be padded." if classifier else "a label's end cannot be scored.")
        )
    if tokenizer.eos_token is None and not classifier:
        raise EvaluationInputError(
            f"The tokenizer of {model_uri!r} has no eos token; a label's end cannot be scored."
        )

    texts = [str(t) for t in dataset["text"]]
    # The prediction path users get: the pyfunc's predict (sparktune.label_scoring.score_texts).
    predictions, scores = scorer.predict(texts)
    # Every prediction is one of the model's labels: none is invalid, even one the split lacks.
    known = set(names) | set(scorer.spec.labels)
    with torch.inference_mode():
        if classifier:
            example_loss, example_tokens = classifier_loss(model, tokenizer, texts, truth, batch_size)
        else:
            example_loss, example_tokens = completion_loss(
                model, tokenizer, list(dataset["prompt"]), list(dataset["completion"]), batch_size
            )
    loss_tokens = sum(example_tokens)
    # Not one row has a label the classifier knows: a loss over no token would read 0, not "none".
    disjoint = classifier and loss_tokens == 0
    if disjoint and allow_other_labels:
        logger.warning(
            "The classifier %s has labels %s, none of which is a label of split %r (%s): every row "
            "counts as an error and it has no loss.",
            model_uri,
            sorted(scorer.spec.labels),
            split,
            names,
        )
    elif disjoint:
        raise EvaluationInputError(
            f"The classifier {model_uri!r} has labels {sorted(scorer.spec.labels)}, none of "
            f"which is a label of split {split!r} ({names}); it was trained on other labels."
        )
    elif classifier and loss_tokens < len(truth):
        logger.warning(
            "%d of %d %s examples have labels the classifier %s does not know; they count as errors "
            "and are left out of the loss.",
            len(truth) - loss_tokens,
            len(truth),
            split,
            model_uri,
        )

    predicted = [p if p in known else INVALID_PREDICTION for p in predictions]
    result = label_result(
        truth,
        predicted,
        names,
        example_loss=None if disjoint else example_loss,
        example_tokens=None if disjoint else example_tokens,
        bootstrap_resamples=bootstrap_resamples,
        bootstrap_seed=bootstrap_seed,
        seconds=time.perf_counter() - started,
        model_uri=model_uri,
        split=split,
        invalid_samples=[
            raw for raw, p in zip(predictions, predicted, strict=True) if p == INVALID_PREDICTION
        ][:5],
        example_ids=(
            [str(v) for v in dataset["example_id"]]
            if "example_id" in dataset.column_names
            else [str(i) for i in range(len(truth))]
        ),
        scores=[float(v) for v in scores],
        model_labels=[str(label) for label in scorer.spec.labels],
    )
    logger.info(
        "Evaluated %s on %d %s examples in %.1f s: loss %.4f%s, accuracy %.4f%s, macro F1 %.4f%s, "
        "%d invalid.",
        model_uri,
        result.n_examples,
        split,
        result.seconds,
        result.eval_loss,
        _ci_text(result, "eval_loss"),
        result.eval_accuracy,
        _ci_text(result, "eval_accuracy"),
        result.eval_macro_f1,
        _ci_text(result, "eval_macro_f1"),
        result.n_invalid,
    )
    return result


def _ci_text(result: EvalResult, name: str) -> str:
    if name not in result.ci:
        return ""
    low, high = result.ci[name]
    return f" [{low:.4f}, {high:.4f}]"


# --------------------------------------------------------------------------------------------
# CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparktune.evaluation", description="Evaluate a fine-tuned model on a dataset split."
    )
    parser.add_argument(
        "--model-uri", required=True, help="models:/name/3, models:/name@alias, runs:/id/model or a folder."
    )
    parser.add_argument(
        "--dataset-path", required=True, help="DatasetDict folder written by the materialize step."
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)."
    )
    parser.add_argument("--output", required=True, help="Where to write the result JSON.")
    parser.add_argument(
        "--predictions",
        default=None,
        help="Where to write the per-example predictions CSV (default: <output stem>_predictions.csv).",
    )
    parser.add_argument(
        "--prompt-template",
        default=None,
        help="The template of a bare Hugging Face folder's prompts (an MLflow model carries its own).",
    )
    parser.add_argument(
        "--confusion-matrix",
        default=None,
        help="Where to write the confusion matrix PNG (default: <output stem>_confusion.png beside it).",
    )
    parser.add_argument(
        "--bootstrap-resamples",
        type=int,
        default=BOOTSTRAP_RESAMPLES,
        help="Resamples of the test examples for the 95%% confidence intervals (0: none).",
    )
    parser.add_argument("--bootstrap-seed", type=int, default=BOOTSTRAP_SEED)
    parser.add_argument(
        "--trust-remote-code",
        choices=("true", "false"),
        default="false",
        help="Let a model that ships its own Python code (auto_map) load; default false: refused.",
    )
    parser.add_argument(
        "--champion-model-uri",
        default=None,
        help="Also evaluate this model on the same split, in this process (the model it must beat); its "
        "files go to the --champion-* paths.",
    )
    parser.add_argument("--champion-output", default=None, help="The champion's result JSON.")
    parser.add_argument("--champion-predictions", default=None, help="The champion's predictions CSV.")
    parser.add_argument(
        "--champion-confusion-matrix", default=None, help="The champion's confusion matrix PNG."
    )
    parser.add_argument(
        "--baseline-output",
        default=None,
        help="Also score the TF-IDF + logistic regression baseline (sparktune.baseline), trained on the "
        "dataset's train split, on the same rows; its result JSON.",
    )
    parser.add_argument(
        "--baseline-max-train-rows",
        type=int,
        default=BASELINE_MAX_TRAIN_ROWS,
        help="The baseline trains on a seeded sample of at most this many train rows.",
    )
    args = parser.parse_args(argv)
    if args.champion_model_uri and not args.champion_output:
        parser.error("--champion-model-uri needs --champion-output")
    # One process for both models: torch, transformers and MLflow are imported once (about 7 s).
    code = _evaluate_and_write(args, args.model_uri, args.output, args.predictions, args.confusion_matrix)
    if code == 0 and args.champion_model_uri:
        code = _evaluate_and_write(
            args,
            args.champion_model_uri,
            args.champion_output,
            args.champion_predictions,
            args.champion_confusion_matrix,
            # A champion trained before a label-set change is still scored; the gate names the change.
            allow_other_labels=True,
        )
    if code == 0 and args.baseline_output:
        code = _baseline_and_write(args)
    return code


def _baseline_and_write(args: argparse.Namespace) -> int:
    """Score the baseline on the CLI's split and write its result JSON; the CLI's exit code."""
    from sparktune.baseline import evaluate_baseline

    try:
        test = load_split(args.dataset_path, args.split, args.max_examples, required=("label", "text"))
        train = load_split(args.dataset_path, "train", None, required=("label", "text"))
    except EvaluationInputError as err:
        logger.error("%s", err)
        return 2
    if len(train) > args.baseline_max_train_rows:
        train = train.shuffle(seed=args.bootstrap_seed).select(range(args.baseline_max_train_rows))
    names, truth = label_strings(test)
    result = evaluate_baseline(
        [str(t) for t in train["text"]],
        label_strings(train)[1],
        [str(t) for t in test["text"]],
        truth,
        names,
        example_ids=[str(v) for v in test["example_id"]] if "example_id" in test.column_names else None,
        split=args.split,
        bootstrap_resamples=args.bootstrap_resamples,
        bootstrap_seed=args.bootstrap_seed,
    )
    output = Path(args.baseline_output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(result.to_json())
    print(
        f"sparktune.evaluation baseline (TF-IDF + logistic regression on {len(train)} train rows) "
        f"split={args.split} n={result.n_examples} accuracy={result.eval_accuracy:.4f} "
        f"macro_f1={result.eval_macro_f1:.4f}",
        flush=True,
    )
    return 0


def _evaluate_and_write(
    args: argparse.Namespace,
    model_uri: str,
    output_path: str,
    predictions: str | None,
    figure: str | None,
    *,
    allow_other_labels: bool = False,
) -> int:
    """Evaluate one model with the CLI's settings and write its files; the CLI's exit code."""
    try:
        result = evaluate_model(
            model_uri,
            args.dataset_path,
            split=args.split,
            batch_size=args.batch_size,
            max_examples=args.max_examples,
            tracking_uri=args.tracking_uri,
            bootstrap_resamples=args.bootstrap_resamples,
            bootstrap_seed=args.bootstrap_seed,
            trust_remote_code=args.trust_remote_code == "true",
            prompt_template=args.prompt_template,
            allow_other_labels=allow_other_labels,
        )
    except (EvaluationInputError, UnsafeModelError) as err:
        logger.error("%s", err)
        return 2
    except Exception:
        logger.exception("Evaluation of %s failed", model_uri)
        return 1
    output = Path(output_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(result.to_json())
    write_predictions_csv(result, predictions or output.with_name(f"{output.stem}_predictions.csv"))
    figure_path = Path(figure or output.with_name(f"{output.stem}_confusion.png"))
    try:
        confusion_matrix_figure(result, figure_path)
    except Exception:
        # The metrics decide the gate; a picture that failed to draw must not hold them back.
        logger.exception("Could not draw the confusion matrix %s", figure_path)
    print(
        f"sparktune.evaluation model={model_uri} split={args.split} n={result.n_examples} "
        f"loss={result.eval_loss:.4f} accuracy={result.eval_accuracy:.4f} "
        f"macro_f1={result.eval_macro_f1:.4f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    configure_process_logging()
    sys.exit(main())
