"""``task=sequence_classification``: a classification head over the text, one logit per label.

The causal path (:mod:`sparktune.model.training`) teaches the model to write the label after a prompt;
this one puts a linear head (``score``) on the base model's last non-padding token and trains it
with cross-entropy over the labels. The label order is the dataset's ``ClassLabel`` names, or in
streaming mode the sorted distinct labels of the prepared Parquet, which is the order
prepare_data and materialize give the ``ClassLabel`` too; it is saved in the model's config
(``id2label``), so evaluation and serving map logits back to label strings without the data.

Everything else (MLflow run, checkpoints and resume, rank-0 logging, token counts, merge, logging
and verifying the model) is the training module's; these functions are the pieces that differ:
loading the model, tokenizing the splits and building the ``Trainer``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PipelineParams
from sparktune.model.training_setup import (
    TokenCountingMixin,
    TrainingInputError,
    load_base_model,
    lora_config_from_params,
    trainer_arguments,
)

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback

logger = logging.getLogger("sparktune.model.classification")

TASK = "sequence_classification"
# What a classifier trains on: the raw text and its label (ClassLabel id, or the label string in
# streaming mode).
CLASSIFICATION_COLUMNS = ("text", "label")
# The transformers pipeline task the logged model serves.
PIPELINE_TASK = "text-classification"


def is_sequence_classifier(model: Any) -> bool:
    """True for a model (or a model's config) with a sequence classification head.

    Judged by the class (``*ForSequenceClassification``), else by ``config.architectures``.
    """
    if type(model).__name__.endswith("ForSequenceClassification"):
        return True
    config = getattr(model, "config", model)
    architectures = getattr(config, "architectures", None) or []
    return any(str(name).endswith("ForSequenceClassification") for name in architectures)


def label_names(train_ds: Any, val_ds: Any, dataset_path: str, streaming: bool) -> list[str]:
    """The label order of the classification head.

    A materialized dataset carries it in its ``ClassLabel`` feature. The prepared Parquet that
    streaming mode reads has label strings: the labels are then the sorted distinct values of the
    label column over every split (only that column is read), the order prepare_data reports and
    materialize gives the ``ClassLabel``.
    """
    from datasets import ClassLabel

    feature = (getattr(train_ds, "features", None) or {}).get("label")
    if isinstance(feature, ClassLabel):
        names = list(feature.names)
    elif streaming:
        from sparktune.data.parquet_files import distinct_labels_in_files, parquet_files

        names = distinct_labels_in_files(parquet_files(dataset_path), "label", None)
    else:
        values = list(train_ds["label"]) + list(val_ds["label"])
        if not all(isinstance(v, str) for v in values):
            raise TrainingInputError(
                f"task={TASK} needs label names: the 'label' column of {dataset_path!r} is neither a "
                "ClassLabel nor strings; rebuild the dataset with the materialize step (it types labels "
                "as ClassLabel)."
            )
        names = sorted(set(values))
    if len(names) < 2:
        raise TrainingInputError(f"task={TASK} needs at least two labels; {dataset_path!r} has {names}.")
    return names


def head_config(labels: Sequence[str]) -> dict[str, Any]:
    """The ``from_pretrained`` arguments that size the head and name its outputs."""
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {name: i for i, name in enumerate(labels)},
    }


def model_kwargs(labels: Sequence[str]) -> dict[str, Any]:
    """``auto_class`` and head arguments for :func:`sparktune.model.training_setup.load_base_model` and
    :func:`sparktune.model.logged_model.merge_trained`."""
    from transformers import AutoModelForSequenceClassification

    return {"auto_class": AutoModelForSequenceClassification, **head_config(labels)}


def load_classifier(
    base_model: str,
    tokenizer: PreTrainedTokenizerBase,
    peft_method: str,
    labels: Sequence[str],
    *,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """The base model with a fresh classification head of ``len(labels)`` outputs (seeded by the caller)."""
    return load_base_model(
        base_model, tokenizer, peft_method, trust_remote_code=trust_remote_code, **model_kwargs(labels)
    )


def lora_config(params: PipelineParams, model: Any) -> Any:
    """LoRA for ``SEQ_CLS``: peft trains and saves the head (``score``/``classifier``) in full itself.

    Names in ``lora_modules_to_save`` that the classifier lacks (``lm_head``, the causal head the
    tiny-model recipe trains) are dropped with a warning rather than failing the run.
    """
    config = lora_config_from_params(params, task_type="SEQ_CLS")
    if config.modules_to_save:
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [name for name in config.modules_to_save if name not in present]
        if missing:
            logger.warning(
                "lora_modules_to_save %s: no such module in %s; ignored for task=%s (the classification "
                "head is trained in full anyway).",
                missing,
                type(model).__name__,
                TASK,
            )
            config.modules_to_save = [name for name in config.modules_to_save if name in present] or None
    return config


def tokenize_split(
    dataset: datasets.Dataset | datasets.IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    labels: Sequence[str],
) -> datasets.Dataset | datasets.IterableDataset:
    """``text`` -> unpadded ``input_ids``/``attention_mask`` cut at ``max_length``; ``label`` -> ``labels``.

    Labels are ClassLabel ids (checked against the head) or label strings (streaming mode).
    """
    label2id = {name: i for i, name in enumerate(labels)}

    def label_id(value: Any) -> int:
        if isinstance(value, str):
            if value not in label2id:
                raise TrainingInputError(
                    f"Label {value!r} is not one of the classifier's labels {list(labels)}."
                )
            return label2id[value]
        if value is None or not 0 <= int(value) < len(labels):
            raise TrainingInputError(f"Label id {value!r} is outside the labels {list(labels)}.")
        return int(value)

    def encode(batch: dict[str, list]) -> dict[str, list]:
        encoded = tokenizer(batch["text"], truncation=True, max_length=max_length)
        return {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": [label_id(v) for v in batch["label"]],
        }

    columns = getattr(dataset, "column_names", None) or list(CLASSIFICATION_COLUMNS)
    return dataset.map(encode, batched=True, remove_columns=columns)


def _accuracy(eval_prediction: Any) -> dict[str, float]:
    logits, label_ids = eval_prediction.predictions, eval_prediction.label_ids
    if isinstance(logits, tuple):
        logits = logits[0]
    return {"accuracy": float((logits.argmax(-1) == label_ids).mean())}


def build_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    params: PipelineParams,
    output_dir: Path,
    train_ds: datasets.Dataset | datasets.IterableDataset,
    val_ds: datasets.Dataset,
    n_train: int,
    *,
    stream_shards: int = 0,
    world_size: int = 1,
    callbacks: Sequence[TrainerCallback] = (),
) -> Trainer:
    """A token-counting ``Trainer`` over the tokenized splits, with LoRA adapters for lora/qlora.

    Dynamic padding (``DataCollatorWithPadding``) and length-grouped batches, as the SFT path; the
    shared arguments (steps, seeds, logging, checkpoints, DeepSpeed, bf16) are
    :func:`sparktune.model.training_setup.trainer_arguments`. The validation split is scored for loss and
    accuracy by ``trainer.evaluate()``.
    """
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    args = TrainingArguments(
        **trainer_arguments(params, output_dir, n_train, stream_shards, world_size),
        # Ignored (with a warning) for a stream, which has no length to sort by.
        train_sampling_strategy="group_by_length",
    )
    if params.peft_method in ("lora", "qlora"):
        from peft import get_peft_model

        # gradient_checkpointing: the name every transformers 5.x has (a mirror of activation_checkpointing
        # in the releases that have that one).
        if args.gradient_checkpointing and params.peft_method == "lora":
            # Checkpointed blocks under frozen embeddings need an input that requires grad
            # (prepare_model_for_kbit_training does this for qlora).
            model.enable_input_require_grads()
        model = get_peft_model(model, lora_config(params, model))

    class CountingClassificationTrainer(TokenCountingMixin, Trainer):
        """A Trainer that counts the tokens of its training batches."""

    return CountingClassificationTrainer(
        model=model,
        args=args,
        train_dataset=tokenize_split(train_ds, tokenizer, params.max_length, labels),
        eval_dataset=tokenize_split(val_ds, tokenizer, params.max_length, labels),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=None),
        compute_metrics=_accuracy,
        callbacks=list(callbacks),
    )


__all__ = [
    "CLASSIFICATION_COLUMNS",
    "PIPELINE_TASK",
    "TASK",
    "build_trainer",
    "head_config",
    "is_sequence_classifier",
    "label_names",
    "load_classifier",
    "lora_config",
    "model_kwargs",
    "tokenize_split",
]
