"""Evaluate a fine-tuned classifier on a frozen split of the materialized dataset.

A causal LM (``task=causal_lm``) predicts the candidate label most likely after the prompt
(constrained scoring, :mod:`sparktune.core.label_scoring`). The loss is the mean cross-entropy
over the completion tokens (label and eos), tokenized exactly as TRL tokenized them for training,
so it is comparable with the training run's ``val_loss`` per token. It is read from the forward
passes that score the candidates (the true label is one of them), so the model runs over the
split once.

A sequence classifier (``task=sequence_classification``, told apart by the loaded model's class)
predicts the argmax of its head's logits over the text, mapped through ``config.id2label``; the
loss is the mean cross-entropy of the true label, as the trainer's ``val_loss``, from the same logits.

Both return the same :class:`EvalResult`, so the gate and the registry downstream do not care.
It also records the labels the model itself answers with (``model_labels``): a champion trained
before a label was added or removed is scored on the split all the same (``allow_other_labels``,
even a classifier that shares no label with it), and :mod:`sparktune.release.comparison` pairs the two on
the rows whose label both know.

The result keeps every example's outcome (true and predicted class index, completion loss and
token count), so the 95% confidence intervals (:mod:`sparktune.release.metrics`) are a percentile
bootstrap over test examples (1,000 resamples with a fixed seed: the same seed and split give the
challenger and the champion the same resamples). The loss interval resamples whole examples and
recomputes the per-token mean, as the point estimate is computed. :func:`confusion_matrix_figure`
draws the confusion matrix as a PNG. The model and the split are loaded by
:mod:`sparktune.release.eval_inputs`.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from sparktune.core.label_scoring import completion_loss
from sparktune.model.classification import CLASSIFICATION_COLUMNS, is_sequence_classifier
from sparktune.model.process_setup import using_tracking_uri
from sparktune.release.eval_inputs import (
    REQUIRED_COLUMNS,
    EvaluationInputError,
    LabelScorer,
    label_strings,
    load_label_model,
    load_split,
    require_columns,
)
from sparktune.release.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    INVALID_PREDICTION,
    EvalResult,
    label_result,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger("sparktune.release.evaluation")

# The baseline's train rows at most: a yardstick needs no more, and its fit stays bounded.
BASELINE_MAX_TRAIN_ROWS = 200_000


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
    scorer: LabelScorer | None = None,
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

    ``scorer``: a model already loaded (:func:`load_for_evaluation`, or the base model in its
    challenger's label spec, :func:`sparktune.release.eval_inputs.load_base_label_model`) is scored
    as it is; ``model_uri`` then only names it in the result.
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
    if scorer is None:
        scorer = _load(model_uri, names, tracking_uri, trust_remote_code, prompt_template, batch_size)
    model, tokenizer = scorer.model, scorer.tokenizer
    classifier = is_sequence_classifier(model)
    required = CLASSIFICATION_COLUMNS if classifier else (*REQUIRED_COLUMNS, "text")
    require_columns(dataset, required, dataset_path, split)
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
    if scorer.predict_with_loss is not None:
        # The prediction path users get (the pyfunc's scoring, sparktune.core.label_scoring), whose
        # forward passes also give each row's loss: a causal LM's true completion is one of the
        # candidates it scores, a classifier's true label one of its head's. A causal LM row whose
        # prompt or completion is not what the model scores (a label it has no candidate for, a
        # split built with another template) gets completion_loss of its own strings, alone.
        targets = (
            truth
            if classifier
            else [(str(p), str(c)) for p, c in zip(dataset["prompt"], dataset["completion"], strict=True)]
        )
        predictions, scores, example_loss, example_tokens = scorer.predict_with_loss(texts, targets)
    else:
        # A model logged with an older scoring module: its predict, then the loss in a pass of its own.
        predictions, scores = scorer.predict(texts)
        with torch.inference_mode():
            if classifier:
                example_loss, example_tokens = classifier_loss(model, tokenizer, texts, truth, batch_size)
            else:
                example_loss, example_tokens = completion_loss(
                    model, tokenizer, list(dataset["prompt"]), list(dataset["completion"]), batch_size
                )
    # Every prediction is one of the model's labels: none is invalid, even one the split lacks.
    known = set(names) | set(scorer.spec.labels)
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


def load_for_evaluation(
    model_uri: str,
    dataset_path: str,
    *,
    split: str = "test",
    max_examples: int | None = None,
    tracking_uri: str | None = None,
    trust_remote_code: bool = False,
    prompt_template: str | None = None,
    batch_size: int = 32,
) -> LabelScorer:
    """The model at ``model_uri`` loaded as :func:`evaluate_model` loads it (a bare folder gets the
    split's labels as its candidates), for a caller that keeps what it loaded (its label spec and
    tokenizer) after passing it to :func:`evaluate_model` as ``scorer``."""
    names, _ = label_strings(load_split(dataset_path, split, max_examples, required=("label",)))
    return _load(model_uri, names, tracking_uri, trust_remote_code, prompt_template, batch_size)


def _load(
    model_uri: str,
    labels: list[str],
    tracking_uri: str | None,
    trust_remote_code: bool,
    prompt_template: str | None,
    batch_size: int,
) -> LabelScorer:
    with using_tracking_uri(tracking_uri) if tracking_uri else nullcontext():
        return load_label_model(
            model_uri,
            labels=labels,
            prompt_template=prompt_template,
            trust_remote_code=trust_remote_code,
            batch_size=batch_size,
        )


def _ci_text(result: EvalResult, name: str) -> str:
    if name not in result.ci:
        return ""
    low, high = result.ci[name]
    return f" [{low:.4f}, {high:.4f}]"
