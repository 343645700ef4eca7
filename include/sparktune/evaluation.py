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
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.classification import CLASSIFICATION_COLUMNS, is_sequence_classifier
from sparktune.training import configure_process_logging, using_tracking_uri

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger("sparktune.evaluation")

INVALID_PREDICTION = "<invalid>"
REQUIRED_COLUMNS = ("prompt", "completion", "label")


class EvaluationInputError(ValueError):
    """The model or the dataset cannot be evaluated; the message says how to fix it."""


@dataclass
class EvalResult:
    eval_loss: float
    perplexity: float
    eval_accuracy: float
    eval_macro_f1: float
    per_class_f1: dict[str, float]
    n_examples: int
    # confusion[true_label][predicted_label] = count; predictions that are no label count as "<invalid>".
    confusion: dict[str, dict[str, int]]
    seconds: float
    model_uri: str = ""
    split: str = ""
    n_invalid: int = 0
    labels: list[str] = field(default_factory=list)
    # A few generations that matched no label, to see why (no eos learned, a misspelt label...).
    invalid_samples: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Flat metric names for MLflow and the gate."""
        out = {
            "eval_loss": self.eval_loss,
            "eval_perplexity": self.perplexity,
            "eval_accuracy": self.eval_accuracy,
            "eval_macro_f1": self.eval_macro_f1,
        }
        for label, value in self.per_class_f1.items():
            out[f"eval_f1_{metric_safe(label)}"] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field plus the flat ``metrics`` a reader without torch can use as they are."""
        return {**asdict(self), "metrics": self.metrics()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EvalResult:
        return cls(**{k: v for k, v in raw.items() if k != "metrics"})


def metric_safe(label: str) -> str:
    """A label as MLflow accepts it in a metric name (alphanumerics, _ - . / and space)."""
    return re.sub(r"[^0-9A-Za-z_\-./ ]", "_", label)


# --------------------------------------------------------------------------------------------
# Loading


def load_components(model_uri: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer from an MLflow model URI, a saved MLflow model folder, or a Hugging Face folder."""
    import mlflow
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    local = Path(model_uri).expanduser()
    if local.is_dir() and not (local / "MLmodel").exists():
        if not (local / "config.json").exists():
            raise EvaluationInputError(
                f"{model_uri!r} is a folder but neither an MLflow model (no MLmodel file) nor a Hugging Face "
                "model (no config.json); pass a models:/ or runs:/ URI or a save_pretrained folder."
            )
        config = AutoConfig.from_pretrained(str(local))
        auto = AutoModelForSequenceClassification if is_sequence_classifier(config) else AutoModelForCausalLM
        return auto.from_pretrained(str(local)), AutoTokenizer.from_pretrained(str(local))
    if "://" not in model_uri and ":/" not in model_uri and not local.exists():
        raise EvaluationInputError(
            f"Model {model_uri!r} is neither an existing folder nor an MLflow URI "
            "(models:/name/3, models:/name@champion, runs:/<run id>/model)."
        )
    components = mlflow.transformers.load_model(model_uri, return_type="components")
    return components["model"], components["tokenizer"]


def _load_split(
    dataset_path: str, split: str, max_examples: int | None, required: tuple[str, ...] = REQUIRED_COLUMNS
) -> Dataset:
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


def _label_strings(dataset: Dataset) -> tuple[list[str], list[str]]:
    """(label names in class order, the true label string of each example)."""
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


def _completion_token_ids(
    tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str
) -> tuple[list, int]:
    """Token ids of prompt+completion+eos and where the completion starts, as TRL builds them."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    full_ids = tokenizer(prompt + completion + tokenizer.eos_token)["input_ids"]
    start = 0
    for a, b in zip(prompt_ids, full_ids, strict=False):
        if a != b:
            break
        start += 1
    return full_ids, start


def completion_loss(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    completions: list[str],
    batch_size: int,
) -> tuple[float, int]:
    """(summed cross-entropy over completion tokens, number of those tokens)."""
    import torch

    total, count = 0.0, 0
    pad_id = tokenizer.pad_token_id
    for begin in range(0, len(prompts), batch_size):
        rows = [
            _completion_token_ids(tokenizer, p, c)
            for p, c in zip(
                prompts[begin : begin + batch_size], completions[begin : begin + batch_size], strict=True
            )
        ]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, (ids, start) in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attention[i, : len(ids)] = 1
            labels[i, start : len(ids)] = torch.tensor(ids[start:])
        logits = model(input_ids=input_ids, attention_mask=attention).logits.float()
        shifted_logits = logits[:, :-1].reshape(-1, logits.size(-1))
        shifted_labels = labels[:, 1:].reshape(-1)
        total += float(torch.nn.functional.cross_entropy(shifted_logits, shifted_labels, reduction="sum"))
        count += int((shifted_labels != -100).sum())
    return total, count


def generate_labels(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
) -> list[str]:
    """Greedy completions of ``prompts``, stripped, generated in left-padded batches."""
    from transformers import GenerationConfig

    # An explicit config: a base model's saved generation config may ask for sampling.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    previous_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        outputs: list[str] = []
        for begin in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[begin : begin + batch_size], return_tensors="pt", padding=True)
            generated = model.generate(**batch, generation_config=config)
            new_tokens = generated[:, batch["input_ids"].shape[1] :]
            outputs.extend(t.strip() for t in tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
        return outputs
    finally:
        tokenizer.padding_side = previous_side


def classify_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    truth: list[str],
    batch_size: int,
) -> tuple[list[str], float, int]:
    """A sequence classifier's labels for ``texts`` and its loss on the true labels.

    Returns (the argmax label of each text through ``config.id2label``, summed cross-entropy of the
    true labels the model knows, how many texts that sum covers). Texts are truncated at the
    tokenizer's ``model_max_length``, which training sets to its ``max_length``.
    """
    import torch

    id2label = {int(i): str(name) for i, name in model.config.id2label.items()}
    label2id = {name: i for i, name in id2label.items()}
    predictions: list[str] = []
    total, count = 0.0, 0
    for begin in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[begin : begin + batch_size], return_tensors="pt", padding=True, truncation=True
        )
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        predictions.extend(id2label[int(i)] for i in logits.argmax(-1))
        targets = torch.tensor([label2id.get(t, -100) for t in truth[begin : begin + batch_size]])
        scored = int((targets != -100).sum())
        if scored:
            total += float(
                torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
            )
            count += scored
    return predictions, total, count


def _max_label_tokens(tokenizer: PreTrainedTokenizerBase, names: list[str], completions: list[str]) -> int:
    candidates = set(completions) | {f" {name}" for name in names}
    return max(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in candidates)


def evaluate_model(
    model_uri: str,
    dataset_path: str,
    *,
    split: str = "test",
    batch_size: int = 32,
    max_examples: int | None = None,
    tracking_uri: str | None = None,
) -> EvalResult:
    """Score the model at ``model_uri`` on ``split`` of the dataset: loss, accuracy, macro and per-class F1.

    ``model_uri`` is an MLflow model URI (``models:/name/3``, ``models:/name@champion``,
    ``runs:/<id>/model``) or a local folder; ``tracking_uri`` sets where ``models:/`` and ``runs:/``
    resolve (default: ``MLFLOW_TRACKING_URI``).
    """
    import torch
    from sklearn.metrics import f1_score

    if batch_size < 1:
        raise EvaluationInputError(f"batch_size must be at least 1, got {batch_size}.")
    started = time.perf_counter()
    # The columns each kind of model needs are checked once the model tells its kind.
    dataset = _load_split(dataset_path, split, max_examples, required=("label",))
    with using_tracking_uri(tracking_uri) if tracking_uri else nullcontext():
        model, tokenizer = load_components(model_uri)
    classifier = is_sequence_classifier(model)
    _require_columns(dataset, CLASSIFICATION_COLUMNS if classifier else REQUIRED_COLUMNS, dataset_path, split)
    names, truth = _label_strings(dataset)
    if tokenizer.pad_token is None and tokenizer.eos_token is None:
        raise EvaluationInputError(
            f"The tokenizer of {model_uri!r} has neither a pad nor an eos token; "
            + ("batches cannot be padded." if classifier else "generation could not stop after the label.")
        )
    if tokenizer.eos_token is None and not classifier:
        raise EvaluationInputError(
            f"The tokenizer of {model_uri!r} has no eos token; generation could not stop after the label."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()

    known = set(names)
    if classifier:
        texts = list(dataset["text"])
        with torch.inference_mode():
            predictions, loss_sum, loss_tokens = classify_texts(model, tokenizer, texts, truth, batch_size)
        # Every prediction is one of the head's labels: none is invalid, even one the split lacks.
        known |= {str(name) for name in model.config.id2label.values()}
        if loss_tokens == 0:
            raise EvaluationInputError(
                f"The classifier {model_uri!r} has labels {sorted(model.config.id2label.values())}, none of "
                f"which is a label of split {split!r} ({names}); it was trained on other labels."
            )
        if loss_tokens < len(truth):
            logger.warning(
                "%d of %d %s examples have labels the classifier %s does not know; they count as errors "
                "and are left out of the loss.",
                len(truth) - loss_tokens,
                len(truth),
                split,
                model_uri,
            )
    else:
        prompts = list(dataset["prompt"])
        completions = list(dataset["completion"])
        max_new_tokens = _max_label_tokens(tokenizer, names, completions) + 2
        with torch.inference_mode():
            loss_sum, loss_tokens = completion_loss(model, tokenizer, prompts, completions, batch_size)
            predictions = generate_labels(model, tokenizer, prompts, max_new_tokens, batch_size)

    eval_loss = loss_sum / max(loss_tokens, 1)
    predicted = [p if p in known else INVALID_PREDICTION for p in predictions]
    correct = sum(p == t for p, t in zip(predicted, truth, strict=True))
    per_class = f1_score(truth, predicted, labels=names, average=None, zero_division=0)
    macro = f1_score(truth, predicted, labels=names, average="macro", zero_division=0)
    confusion: dict[str, dict[str, int]] = {}
    for t, p in zip(truth, predicted, strict=True):
        row = confusion.setdefault(t, {})
        row[p] = row.get(p, 0) + 1

    result = EvalResult(
        eval_loss=eval_loss,
        perplexity=math.exp(min(eval_loss, 700.0)),
        eval_accuracy=correct / len(truth),
        eval_macro_f1=float(macro),
        per_class_f1={name: float(v) for name, v in zip(names, per_class, strict=True)},
        n_examples=len(truth),
        confusion=confusion,
        seconds=time.perf_counter() - started,
        model_uri=model_uri,
        split=split,
        n_invalid=sum(p == INVALID_PREDICTION for p in predicted),
        labels=names,
        invalid_samples=[
            raw for raw, p in zip(predictions, predicted, strict=True) if p == INVALID_PREDICTION
        ][:5],
    )
    logger.info(
        "Evaluated %s on %d %s examples in %.1f s: loss %.4f, accuracy %.4f, macro F1 %.4f, %d invalid.",
        model_uri,
        result.n_examples,
        split,
        result.seconds,
        result.eval_loss,
        result.eval_accuracy,
        result.eval_macro_f1,
        result.n_invalid,
    )
    return result


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
    args = parser.parse_args(argv)
    try:
        result = evaluate_model(
            args.model_uri,
            args.dataset_path,
            split=args.split,
            batch_size=args.batch_size,
            max_examples=args.max_examples,
            tracking_uri=args.tracking_uri,
        )
    except EvaluationInputError as err:
        logger.error("%s", err)
        return 2
    except Exception:
        logger.exception("Evaluation failed")
        return 1
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(result.to_json())
    print(
        f"sparktune.evaluation model={args.model_uri} split={args.split} n={result.n_examples} "
        f"loss={result.eval_loss:.4f} accuracy={result.eval_accuracy:.4f} "
        f"macro_f1={result.eval_macro_f1:.4f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    configure_process_logging()
    sys.exit(main())
