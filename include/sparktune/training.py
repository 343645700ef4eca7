"""Supervised fine-tuning (LoRA or full) of a causal LM on the materialized dataset, logged to MLflow.

The training task of the pipeline runs this module as a subprocess
(``python -m sparktune.training --request request.json``) so that torch and the model live and
die with one process. :func:`train` is idempotent on ``TrainRequest.train_key``: a finished run
with that key and a logged model is returned as is, so an Airflow retry after a successful
training never trains, or registers, a second model.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.params import PipelineParams, parse_params

if TYPE_CHECKING:
    import torch
    from datasets import DatasetDict
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Named explicitly: run as `python -m`, __name__ would be "__main__".
logger = logging.getLogger("sparktune.training")

TRAIN_KEY_TAG = "sparktune.train_key"
MODEL_URI_TAG = "sparktune.model_uri"
MODEL_ARTIFACT = "model"
ADAPTER_ARTIFACT = "adapter"
RESULT_ARTIFACT = "train_result.json"
REQUIRED_SPLITS = ("train", "validation")
REQUIRED_COLUMNS = ("prompt", "completion")
# The logged model must give the same logits as the one in memory, up to float noise.
MAX_LOGIT_DIFF = 1e-4
# Packages the serving side needs for a merged transformers model. Listed explicitly because the
# flavour's own inference looks for torchvision and fails when it is absent (DESIGN.md).
SERVING_PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "safetensors")


class TrainingInputError(ValueError):
    """The request, the dataset or the base model is not usable; the message says how to fix it."""


class ModelVerificationError(RuntimeError):
    """The model logged to MLflow does not reproduce the trained model's outputs."""


@dataclass
class TrainRequest:
    dataset_path: str
    base_model: str
    output_dir: str
    params: dict[str, Any]
    mlflow_tracking_uri: str
    experiment_name: str
    train_key: str
    tags: dict[str, str] = field(default_factory=dict)
    run_name: str = ""
    # Where a newly created experiment keeps its artifacts. Empty: beside a local SQLite
    # tracking database (``<db folder>/artifacts``), else the tracking server's default.
    artifact_location: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainRequest:
        raw = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise TrainingInputError(
                f"Unknown train request fields {unknown}; expected only {sorted(known)}."
            )
        missing = sorted(
            f.name
            for f in fields(cls)
            if f.name not in raw and f.name not in ("tags", "run_name", "artifact_location")
        )
        if missing:
            raise TrainingInputError(f"Train request is missing fields {missing}.")
        return cls(**raw)


@dataclass
class TrainResult:
    mlflow_run_id: str
    model_uri: str
    trainable_params: int
    total_params: int
    trainable_percent: float
    train_loss: float
    initial_loss: float
    tokens_per_second: float
    padding_efficiency: float
    train_seconds: float
    global_steps: int
    reused: bool = False
    val_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


# --------------------------------------------------------------------------------------------
# MLflow bookkeeping


def _artifact_location(request: TrainRequest) -> str | None:
    if request.artifact_location:
        return request.artifact_location
    uri = request.mlflow_tracking_uri
    if uri.startswith("sqlite:///"):
        # MLflow's default for a database store is ./mlruns under the current directory, which
        # scatters artifacts wherever the task happens to run.
        return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").resolve().as_uri()
    return None


def _experiment_id(client: Any, request: TrainRequest) -> str:
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(request.experiment_name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise TrainingInputError(
                f"MLflow experiment {request.experiment_name!r} is deleted; restore it (mlflow "
                f"experiments restore --experiment-id {experiment.experiment_id}) or use another name."
            )
        return experiment.experiment_id
    try:
        return client.create_experiment(
            request.experiment_name, artifact_location=_artifact_location(request)
        )
    except MlflowException:
        # Another task created it between our lookup and create.
        experiment = client.get_experiment_by_name(request.experiment_name)
        if experiment is None:
            raise
        return experiment.experiment_id


@contextmanager
def using_tracking_uri(uri: str) -> Iterator[None]:
    """Point MLflow's fluent API at ``uri`` for a block, then restore what the caller had.

    ``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI`` in the environment, which would
    otherwise leak into everything the process does afterwards.
    """
    import mlflow

    saved = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        # None also unsets the environment variable.
        mlflow.set_tracking_uri(saved)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def find_finished_run(client: Any, experiment_id: str, train_key: str) -> str | None:
    """The id of the newest FINISHED run tagged with ``train_key`` whose model was logged and verified."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TRAIN_KEY_TAG}` = '{_quote(train_key)}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=20,
    )
    for run in runs:
        # The tag is set only after the logged model was loaded back and matched.
        if run.data.tags.get(MODEL_URI_TAG):
            return run.info.run_id
    return None


def _close_abandoned_runs(client: Any, experiment_id: str, train_key: str) -> None:
    """Mark runs of this key that a killed attempt left RUNNING as KILLED, so the UI shows one live run."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TRAIN_KEY_TAG}` = '{_quote(train_key)}' and attributes.status = 'RUNNING'",
    )
    for run in runs:
        logger.warning(
            "Run %s of train_key %s was left RUNNING by an earlier attempt; marking it KILLED.",
            run.info.run_id,
            train_key,
        )
        client.set_terminated(run.info.run_id, status="KILLED")


def _pip_requirements() -> list[str]:
    requirements = []
    for package in SERVING_PACKAGES:
        try:
            # Drop local version labels (torch 2.13.0+cpu): an index cannot resolve them.
            requirements.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:
            continue
    return requirements


# --------------------------------------------------------------------------------------------
# Inputs


def _load_dataset(path: str) -> DatasetDict:
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
        missing = [c for c in REQUIRED_COLUMNS if c not in dataset[split].column_names]
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


def _load_tokenizer(base_model: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model)
    if tokenizer.eos_token is None:
        raise TrainingInputError(
            f"The tokenizer of {base_model!r} has no eos token, so the model could not learn where a label "
            "ends; set tokenizer.eos_token and save the tokenizer again."
        )
    if tokenizer.pad_token is None:
        # Padding positions are masked out of attention and loss, so reusing eos is harmless.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_model(base_model: str, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM

    if (base_model.startswith(("/", ".", "~")) or Path(base_model).exists()) and not Path(
        base_model
    ).expanduser().is_dir():
        raise TrainingInputError(
            f"Base model folder {base_model!r} does not exist; build the tiny base model first or pass a "
            "Hugging Face hub id."
        )
    # Weights stay float32; bf16 is autocast by the trainer where the hardware supports it.
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _split_modules(value: str) -> list[str] | str | None:
    value = value.strip()
    if not value:
        return None
    if value == "all-linear":
        return value
    return [name.strip() for name in value.split(",") if name.strip()]


def _lora_config(params: PipelineParams) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        task_type="CAUSAL_LM",
        r=params.lora_r,
        lora_alpha=params.lora_alpha,
        lora_dropout=params.lora_dropout,
        target_modules=_split_modules(params.lora_target_modules),
        modules_to_save=_split_modules(params.lora_modules_to_save),
    )


def _use_bf16() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def _count_params(model: torch.nn.Module) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


# --------------------------------------------------------------------------------------------
# Trainer pieces


def _make_trainer_classes() -> tuple[type, type]:
    """Build the trainer subclass and the MLflow callback lazily, so importing this module stays light."""
    from transformers import TrainerCallback
    from trl import SFTTrainer

    class CountingSFTTrainer(SFTTrainer):
        """Counts real and padded tokens of every training batch, for tokens/s and padding efficiency."""

        real_tokens = 0
        padded_tokens = 0

        def training_step(self, model, inputs, num_items_in_batch=None):
            mask = inputs.get("attention_mask")
            if mask is not None:
                self.real_tokens += int(mask.sum())
                self.padded_tokens += int(mask.numel())
            else:  # padding-free batches carry no padding at all
                self.real_tokens += int(inputs["input_ids"].numel())
                self.padded_tokens += int(inputs["input_ids"].numel())
            return super().training_step(model, inputs, num_items_in_batch)

    class MlflowStepLogger(TrainerCallback):
        """Logs each logging step to the run this module opened (not one the MLflow callback opens)."""

        def __init__(self) -> None:
            self.losses: list[tuple[int, float]] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            import mlflow

            logs = dict(logs or {})
            step = state.global_step
            if "train_runtime" in logs:  # the end-of-training summary
                summary = {f"trainer_{k}": v for k, v in logs.items() if isinstance(v, int | float)}
                mlflow.log_metrics(summary, step=step)
                return
            if "eval_loss" in logs:  # trainer.evaluate() on the validation split: val_loss, ...
                metrics = {
                    k.replace("eval_", "val_", 1): v for k, v in logs.items() if isinstance(v, int | float)
                }
                mlflow.log_metrics(metrics, step=step)
                return
            if "loss" in logs:
                self.losses.append((step, float(logs["loss"])))
                metrics = {
                    ("train_loss" if k == "loss" else f"train_{k}"): v
                    for k, v in logs.items()
                    if isinstance(v, int | float) and math.isfinite(v) and k != "epoch"
                }
                mlflow.log_metrics(metrics, step=step)
                logger.info("step %d: %s", step, " ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))

    return CountingSFTTrainer, MlflowStepLogger


def _expected_steps(params: PipelineParams, n_train: int, world_size: int) -> int:
    if params.max_steps > 0:
        return params.max_steps
    per_step = params.per_device_train_batch_size * params.gradient_accumulation_steps * max(world_size, 1)
    return max(1, math.ceil(math.ceil(n_train / per_step) * params.num_train_epochs))


def _sft_config(params: PipelineParams, output_dir: Path, n_train: int, stream_shards: int = 0) -> Any:
    """``stream_shards`` > 0: the train split is a Parquet stream with that many files."""
    import torch
    from trl import SFTConfig

    on_gpu = torch.cuda.is_available()
    # A stream has no length: the step count comes from the footers' row count. DataLoader
    # workers read and tokenize ahead of the model (one file per worker at a time).
    max_steps = (
        params.max_steps if params.max_steps > 0 or not stream_shards else _expected_steps(params, n_train, 1)
    )
    workers = min(2, stream_shards)
    prefetch = {"dataloader_prefetch_factor": 4} if workers else {}
    config = SFTConfig(
        output_dir=str(output_dir / "checkpoints"),
        # Prompt-completion data: TRL masks the prompt out of the labels (completion_only_loss) and
        # appends eos to the completion, so the model learns to stop after the label.
        completion_only_loss=True,
        packing=False,
        padding_free=False,
        max_length=params.max_length,
        # Dynamic padding (pad to the longest in the batch) and length-grouped batches: on this
        # machine 930 tokens/s padded to 512 vs 14,000 dynamic vs 22,000 length-sorted (DESIGN.md).
        pad_to_multiple_of=None,
        train_sampling_strategy="group_by_length",
        learning_rate=params.learning_rate,
        num_train_epochs=params.num_train_epochs,
        max_steps=max_steps,
        per_device_train_batch_size=params.per_device_train_batch_size,
        per_device_eval_batch_size=max(params.per_device_train_batch_size, 8),
        gradient_accumulation_steps=params.gradient_accumulation_steps,
        # transformers 5 reads a warmup_steps below 1 as a ratio of the total steps.
        warmup_steps=params.warmup_ratio,
        seed=params.seed,
        data_seed=params.seed,
        bf16=_use_bf16(),
        fp16=False,
        # Recomputing activations saves GPU memory but only costs time on a small CPU model.
        activation_checkpointing=on_gpu,
        logging_strategy="steps",
        logging_first_step=True,
        # About 100 points on the loss curve whatever the run length.
        logging_steps=max(1, _expected_steps(params, n_train, 1) // 100),
        eval_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=workers,
        dataloader_pin_memory=on_gpu,
        **prefetch,
    )
    return config


# --------------------------------------------------------------------------------------------
# Verification of the logged model


def _verification_batch(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> dict[str, torch.Tensor]:
    tokenizer.padding_side = "right"
    return tokenizer(texts, return_tensors="pt", padding=True)


def max_logit_difference(
    expected: PreTrainedModel,
    actual: PreTrainedModel,
    batch: dict[str, torch.Tensor],
) -> float:
    """Largest absolute logit difference of two models on the non-padding positions of a batch."""
    import torch

    expected.eval()
    actual.eval()
    with torch.inference_mode():
        a = expected(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        b = actual(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    if a.shape != b.shape:
        return math.inf
    mask = batch["attention_mask"].bool()
    return float((a - b).abs()[mask].max())


def verify_logged_model(
    model_uri: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    *,
    tolerance: float = MAX_LOGIT_DIFF,
) -> float:
    """Load ``model_uri`` back from MLflow and check it reproduces ``model`` on ``texts``.

    Raises ModelVerificationError when the tokenizer encodes differently or the logits differ by
    more than ``tolerance``; returns the largest logit difference.
    """
    import mlflow

    components = mlflow.transformers.load_model(model_uri, return_type="components")
    loaded_model, loaded_tokenizer = components["model"], components["tokenizer"]
    if loaded_model.training:
        loaded_model.eval()
    expected_ids = tokenizer(texts)["input_ids"]
    loaded_ids = loaded_tokenizer(texts)["input_ids"]
    if expected_ids != loaded_ids:
        raise ModelVerificationError(
            f"The tokenizer logged at {model_uri} encodes text differently from the one trained with; "
            "the logged model would see different inputs. Check that the tokenizer files were saved intact."
        )
    batch = _verification_batch(tokenizer, texts)
    diff = max_logit_difference(model, loaded_model, batch)
    if not diff <= tolerance:
        raise ModelVerificationError(
            f"The model logged at {model_uri} does not reproduce the trained model: max logit "
            f"difference {diff:.3g} > {tolerance:g}. Its weights were lost or altered on save/load (a PEFT "
            "model must be merged with merge_and_unload() before logging); the run is marked FAILED."
        )
    return diff


# --------------------------------------------------------------------------------------------
# Training


def train(request: TrainRequest) -> TrainResult:
    """Fine-tune ``request.base_model`` on the dataset, log everything and the merged model to MLflow.

    Returns the result of an earlier FINISHED run with the same ``train_key`` (``reused=True``)
    instead of training again.
    """
    params = parse_params(request.params)
    output_dir = Path(request.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with using_tracking_uri(request.mlflow_tracking_uri):
        result = _train_or_reuse(request, params, output_dir)
    _write_result(output_dir, result)
    return result


def _train_or_reuse(request: TrainRequest, params: PipelineParams, output_dir: Path) -> TrainResult:
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=request.mlflow_tracking_uri)
    experiment_id = _experiment_id(client, request)
    previous = find_finished_run(client, experiment_id, request.train_key)
    if previous is not None:
        logger.info("Reusing finished run %s for train_key %s: nothing trained.", previous, request.train_key)
        return _reuse(previous)
    _close_abandoned_runs(client, experiment_id, request.train_key)

    train_ds, val_ds, n_train = _training_splits(request, params)
    tags = {
        **{k: str(v) for k, v in request.tags.items()},
        TRAIN_KEY_TAG: request.train_key,
        "sparktune.base_model": request.base_model,
        "sparktune.peft_method": params.peft_method,
        "sparktune.dataset_path": request.dataset_path,
    }
    with mlflow.start_run(experiment_id=experiment_id, run_name=request.run_name or None, tags=tags) as run:
        result = _train_in_run(run.info.run_id, request, params, (train_ds, val_ds, n_train), output_dir)
        mlflow.log_dict(result.to_dict(), RESULT_ARTIFACT)
        # Set last: find_finished_run only trusts runs that got this far.
        mlflow.set_tag(MODEL_URI_TAG, result.model_uri)
    return result


def _reuse(run_id: str) -> TrainResult:
    import mlflow

    raw = mlflow.artifacts.load_dict(f"runs:/{run_id}/{RESULT_ARTIFACT}")
    result = TrainResult.from_dict(raw)
    result.reused = True
    return result


def _write_result(output_dir: Path, result: TrainResult) -> None:
    path = output_dir / "result.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(result.to_json())
    tmp.replace(path)


def _training_splits(request: TrainRequest, params: PipelineParams) -> tuple[Any, Any, int]:
    """``(train, validation, train rows)``: memory-mapped splits, or a Parquet stream in streaming mode."""
    if params.dataset_mode == "streaming":
        from sparktune.streaming import open_streaming_splits

        try:
            return open_streaming_splits(request.dataset_path, list(REQUIRED_COLUMNS), params.seed)
        except FileNotFoundError as err:
            raise TrainingInputError(str(err)) from err
    dataset = _load_dataset(request.dataset_path)
    train_ds = dataset["train"].select_columns(list(REQUIRED_COLUMNS))
    return train_ds, dataset["validation"].select_columns(list(REQUIRED_COLUMNS)), len(train_ds)


def _train_in_run(
    run_id: str,
    request: TrainRequest,
    params: PipelineParams,
    splits: tuple[Any, Any, int],
    output_dir: Path,
) -> TrainResult:
    import mlflow
    from transformers import PrinterCallback, set_seed

    set_seed(params.seed)
    tokenizer = _load_tokenizer(request.base_model)
    model = _load_model(request.base_model, tokenizer)

    train_ds, val_ds, n_train = splits
    mlflow.log_params({k: _param_value(v) for k, v in params.to_dict().items()})
    mlflow.log_params(
        {
            "base_model_resolved": request.base_model,
            "dataset_path": request.dataset_path,
            "n_train": n_train,
            "n_validation": len(val_ds),
            "train_key": request.train_key,
        }
    )

    streaming = params.dataset_mode == "streaming"
    trainer_cls, callback_cls = _make_trainer_classes()
    step_logger = callback_cls()
    trainer = trainer_cls(
        model=model,
        args=_sft_config(params, output_dir, n_train, getattr(train_ds, "num_shards", 0) if streaming else 0),
        train_dataset=train_ds,
        eval_dataset=val_ds,
        processing_class=tokenizer,
        peft_config=_lora_config(params) if params.peft_method == "lora" else None,
        callbacks=[step_logger],
    )
    # The step logger writes each logging step to the task log already; PrinterCallback would repeat it.
    trainer.remove_callback(PrinterCallback)
    trainable, total = _count_params(trainer.model)
    world_size = trainer.args.world_size
    mlflow.log_metrics(
        {
            "trainable_params": trainable,
            "total_params": total,
            "trainable_percent": 100.0 * trainable / total,
            "world_size": world_size,
        }
    )
    logger.info(
        "Training %s (%s): %d of %d parameters trainable (%.3f%%), %d train / %d validation examples.",
        request.base_model,
        params.peft_method,
        trainable,
        total,
        100.0 * trainable / total,
        n_train,
        len(val_ds),
    )

    started = time.perf_counter()
    train_output = trainer.train()
    train_seconds = time.perf_counter() - started
    global_steps = int(train_output.global_step)

    # Counts are per process; each rank sees its own shard of every batch.
    real_tokens = trainer.real_tokens * world_size
    padded_tokens = trainer.padded_tokens * world_size
    tokens_per_second = real_tokens / train_seconds if train_seconds > 0 else 0.0
    padding_efficiency = real_tokens / padded_tokens if padded_tokens else 1.0
    val_loss = float(trainer.evaluate()["eval_loss"])

    if not step_logger.losses:
        raise RuntimeError("Training logged no loss: the dataset yielded no training steps.")
    initial_loss = step_logger.losses[0][1]
    final_loss = step_logger.losses[-1][1]
    mlflow.log_metrics(
        {
            "initial_loss": initial_loss,
            "final_train_loss": final_loss,
            "tokens_per_second": tokens_per_second,
            "padding_efficiency": padding_efficiency,
            "train_seconds": train_seconds,
            "seconds_per_step": train_seconds / max(global_steps, 1),
            "global_steps": global_steps,
            "train_tokens": real_tokens,
        }
    )
    logger.info(
        "Trained %d steps in %.1f s (%.3f s/step): loss %.4f -> %.4f, val_loss %.4f, "
        "%.0f tokens/s, padding efficiency %.3f.",
        global_steps,
        train_seconds,
        train_seconds / max(global_steps, 1),
        initial_loss,
        final_loss,
        val_loss,
        tokens_per_second,
        padding_efficiency,
    )

    merged = _merge(trainer, params, output_dir)
    merged.eval()
    mlflow.transformers.log_model(
        transformers_model={"model": merged, "tokenizer": tokenizer},
        name=MODEL_ARTIFACT,
        task="text-generation",
        pip_requirements=_pip_requirements(),
    )
    model_uri = f"runs:/{run_id}/{MODEL_ARTIFACT}"
    sample = val_ds.select(range(min(4, len(val_ds))))
    texts = [p + c for p, c in zip(sample["prompt"], sample["completion"], strict=True)]
    diff = verify_logged_model(model_uri, merged, tokenizer, texts)
    mlflow.log_metric("logged_model_max_logit_diff", diff)
    logger.info("Logged model %s reloads with max logit difference %.2g.", model_uri, diff)

    return TrainResult(
        mlflow_run_id=run_id,
        model_uri=model_uri,
        trainable_params=trainable,
        total_params=total,
        trainable_percent=100.0 * trainable / total,
        train_loss=final_loss,
        initial_loss=initial_loss,
        tokens_per_second=tokens_per_second,
        padding_efficiency=padding_efficiency,
        train_seconds=train_seconds,
        global_steps=global_steps,
        reused=False,
        val_loss=val_loss,
    )


def _merge(trainer: Any, params: PipelineParams, output_dir: Path) -> PreTrainedModel:
    """The trained weights as a plain transformers model; the LoRA adapter goes to ``adapter/`` too."""
    import mlflow

    model = trainer.model
    if params.peft_method != "lora":
        return model
    adapter_dir = output_dir / ADAPTER_ARTIFACT
    model.save_pretrained(str(adapter_dir))
    trainer.processing_class.save_pretrained(str(adapter_dir))
    mlflow.log_artifacts(str(adapter_dir), ADAPTER_ARTIFACT)
    # Logging the PeftModel itself loses the base weights on load when the base is a local
    # folder (DESIGN.md); the merged model round-trips exactly.
    return model.merge_and_unload()


def _param_value(value: Any) -> Any:
    # MLflow caps a param value at 6000 characters; a long prompt template would fail the run.
    if isinstance(value, str) and len(value) > 500:
        return value[:497] + "..."
    return value


# --------------------------------------------------------------------------------------------
# CLI


def configure_process_logging() -> None:
    """Send this process's logs, the libraries' included, to stdout, which the Airflow task streams."""
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from datasets.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    # Progress bars redraw with carriage returns, which a task log shows as noise.
    disable_progress_bars()
    hf_logging.disable_progress_bar()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def summary_line(result: TrainResult) -> str:
    return (
        f"sparktune.training {'reused' if result.reused else 'trained'} run={result.mlflow_run_id} "
        f"model_uri={result.model_uri} steps={result.global_steps} "
        f"loss={result.initial_loss:.4f}->{result.train_loss:.4f} "
        f"trainable={result.trainable_params}/{result.total_params} ({result.trainable_percent:.2f}%) "
        f"tokens_per_s={result.tokens_per_second:.0f} padding_efficiency={result.padding_efficiency:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: exit 0 on success, 2 on bad input (retrying cannot help), 1 on any other failure."""
    parser = argparse.ArgumentParser(
        prog="python -m sparktune.training", description="Fine-tune a causal LM and log it to MLflow."
    )
    parser.add_argument("--request", required=True, help="Path of a TrainRequest JSON file.")
    args = parser.parse_args(argv)
    try:
        request = TrainRequest.from_json(Path(args.request).read_text())
    except (OSError, ValueError) as err:
        logger.error("Train request %s is unusable: %s", args.request, err)
        return 2
    try:
        result = train(request)
    except ValueError as err:  # TrainingInputError, InvalidParamsError: deterministic, fix the input
        logger.error("%s", err)
        return 2
    except Exception:
        logger.exception("Training failed")
        return 1
    print(summary_line(result), flush=True)
    return 0


if __name__ == "__main__":
    configure_process_logging()
    sys.exit(main())


__all__ = [
    "ModelVerificationError",
    "TrainRequest",
    "TrainResult",
    "TrainingInputError",
    "find_finished_run",
    "configure_process_logging",
    "main",
    "max_logit_difference",
    "train",
    "using_tracking_uri",
    "verify_logged_model",
]
