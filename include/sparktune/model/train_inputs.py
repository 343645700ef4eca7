"""What training starts from, checked before any work: the dataset's splits and columns, the tokenizer,
and the hardware the method asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PipelineParams
from sparktune.model.training_setup import TrainingInputError

if TYPE_CHECKING:
    from datasets import DatasetDict
    from sparktune.model.train_request import TrainRequest
    from transformers import PreTrainedTokenizerBase

REQUIRED_SPLITS = ("train", "validation")
REQUIRED_COLUMNS = ("prompt", "completion")


def load_train_dataset(path: str, columns: tuple[str, ...] = REQUIRED_COLUMNS) -> DatasetDict:
    """The materialized dataset at ``path``, checked to hold non-empty train and validation splits
    with ``columns``; a :class:`TrainingInputError` names what is wrong."""
    from datasets import DatasetDict, load_from_disk

    if not Path(path).exists():
        raise TrainingInputError(
            f"Dataset {path!r} does not exist; run the materialize step first or pass its output path."
        )
    try:
        dataset = load_from_disk(path)
    except FileNotFoundError as err:
        raise TrainingInputError(
            f"{path!r} is not a dataset saved with DatasetDict.save_to_disk ({err}); "
            "point dataset_path at the materialize step's output."
        ) from err
    if not isinstance(dataset, DatasetDict):
        raise TrainingInputError(
            f"{path!r} holds a single Dataset; training needs a DatasetDict with splits."
        )
    problems = []
    for split in REQUIRED_SPLITS:
        if split not in dataset:
            problems.append(f"split {split!r} is missing (found {sorted(dataset)})")
            continue
        missing = [c for c in columns if c not in dataset[split].column_names]
        if missing:
            problems.append(f"split {split!r} lacks columns {missing}")
        elif len(dataset[split]) == 0:
            problems.append(f"split {split!r} is empty")
    if problems:
        raise TrainingInputError(
            f"Dataset {path!r} does not match the training contract:\n- "
            + "\n- ".join(problems)
            + "\nRebuild it with the materialize step."
        )
    return dataset


def load_train_tokenizer(
    base_model: str, *, trust_remote_code: bool = False, task: str = "causal_lm"
) -> PreTrainedTokenizerBase:
    """The base model's tokenizer; padding reuses eos when unset.

    A causal LM needs an eos token: it ends every completion, so the model learns where a label
    ends. A classification head reads the text alone and needs only a pad token (an encoder such
    as BERT has one and no eos)."""
    from sparktune.core.model_safety import load_tokenizer

    tokenizer = load_tokenizer(base_model, trust_remote_code=trust_remote_code)
    if task == "sequence_classification":
        if tokenizer.pad_token is None and tokenizer.eos_token is None:
            raise TrainingInputError(
                f"The tokenizer of {base_model!r} has neither a pad nor an eos token, so texts of different "
                "lengths cannot share a batch; set tokenizer.pad_token and save the tokenizer again."
            )
    elif tokenizer.eos_token is None:
        raise TrainingInputError(
            f"The tokenizer of {base_model!r} has no eos token, so the model could not learn where a label "
            "ends; set tokenizer.eos_token and save the tokenizer again, or use task=sequence_classification "
            "(a classification head needs no eos)."
        )
    if tokenizer.pad_token is None:
        # Padding positions are masked out of attention and loss, so reusing eos is harmless.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_hardware(params: PipelineParams) -> None:
    """Fail before any work when the method asked for cannot run here; never fall back silently."""
    import importlib.util

    import torch

    problems = []
    if params.peft_method == "qlora":
        if not torch.cuda.is_available():
            problems.append(
                "peft_method=qlora loads the base model in 4-bit NF4 with bitsandbytes, which needs a CUDA "
                "GPU, and this training process sees none (torch.cuda.is_available() is False). Use "
                "peft_method=lora on CPU, or train where there is a GPU (train_backend=spark with GPU "
                "executors, or databricks with a GPU node type)."
            )
        elif importlib.util.find_spec("bitsandbytes") is None:
            problems.append(
                "peft_method=qlora needs the bitsandbytes package on the training nodes: "
                "pip install bitsandbytes."
            )
    if params.deepspeed_stage > 0:
        if importlib.util.find_spec("deepspeed") is None:
            problems.append(
                f"deepspeed_stage={params.deepspeed_stage} needs the deepspeed package on the training nodes "
                "(pip install deepspeed), or set deepspeed_stage=0."
            )
        elif not torch.cuda.is_available():
            problems.append(
                f"deepspeed_stage={params.deepspeed_stage}: DeepSpeed ZeRO shards across GPUs and this "
                "process sees none; set deepspeed_stage=0 on CPU."
            )
    if params.precision == "bf16" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        problems.append(
            f"precision=bf16: the GPU this training process sees ({torch.cuda.get_device_name()}) has no "
            "bf16 support; set precision=auto (float32 here) or float32."
        )
    if problems:
        raise TrainingInputError("\n".join(problems))


def training_splits(request: TrainRequest, params: PipelineParams) -> tuple[Any, Any, int]:
    """``(train, validation, train rows)``: memory-mapped splits, or a Parquet stream in streaming mode."""
    columns = task_columns(params)
    if params.dataset_mode == "streaming":
        from sparktune.data.streaming import open_streaming_splits

        try:
            return open_streaming_splits(request.dataset_path, list(columns))
        except FileNotFoundError as err:
            raise TrainingInputError(str(err)) from err
    dataset = load_train_dataset(request.dataset_path, columns)
    train_ds = dataset["train"].select_columns(list(columns))
    return train_ds, dataset["validation"].select_columns(list(columns)), len(train_ds)


def task_columns(params: PipelineParams) -> tuple[str, ...]:
    """The dataset columns the task trains on: prompt/completion for SFT, text/label for a classifier."""
    if params.task == "sequence_classification":
        from sparktune.model.classification import CLASSIFICATION_COLUMNS

        return CLASSIFICATION_COLUMNS
    return REQUIRED_COLUMNS
