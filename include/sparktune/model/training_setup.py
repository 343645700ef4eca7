"""What every training task builds its trainer from: the base model, the LoRA config, the
``TrainingArguments``, token counting, and the error for unusable input.

The causal LM (:mod:`sparktune.model.training`) and the sequence classifier
(:mod:`sparktune.model.classification`) train alike but for their head, data and trainer class; what
they share lives here, so that neither imports the other's internals.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PipelineParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
# Checkpoints kept per key: the newest is the one resumed from, one older in case it was half-written.
CHECKPOINTS_KEPT = 2


class TrainingInputError(ValueError):
    """The request, the dataset or the base model is not usable; the message says how to fix it."""


def deepspeed_config(stage: int) -> dict[str, Any] | None:
    """The DeepSpeed config for a ZeRO stage, "auto" where the trainer fills in its own values."""
    if stage == 0:
        return None
    if stage not in (1, 2, 3):
        raise TrainingInputError(f"deepspeed_stage must be 0, 1, 2 or 3, got {stage}.")
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if stage == 3:
        # Gather the full 16-bit weights on save, so a checkpoint or the final model loads without DeepSpeed.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }


def load_base_model(
    base_model: str,
    tokenizer: PreTrainedTokenizerBase,
    peft_method: str = "lora",
    auto_class: Any = None,
    *,
    trust_remote_code: bool = False,
    **model_kwargs: Any,
) -> PreTrainedModel:
    """The base model for training; ``auto_class`` (default AutoModelForCausalLM) and ``model_kwargs``
    (e.g. ``num_labels``) choose the head. Safetensors weights only; the folder's own code runs
    only with ``trust_remote_code`` (see :mod:`sparktune.core.model_safety`)."""
    import torch
    from sparktune.core.model_safety import load_model
    from transformers import AutoModelForCausalLM

    auto_class = auto_class or AutoModelForCausalLM
    if (base_model.startswith(("/", ".", "~")) or Path(base_model).exists()) and not Path(
        base_model
    ).expanduser().is_dir():
        raise TrainingInputError(
            f"Base model folder {base_model!r} does not exist; build the tiny base model first or pass a "
            "Hugging Face hub id."
        )
    if peft_method == "qlora":
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        # The seed recipe's QLoRA: 4-bit NF4 with double quantization, bf16 compute.
        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        model = load_model(
            auto_class,
            base_model,
            trust_remote_code=trust_remote_code,
            quantization_config=quantization,
            dtype=torch.bfloat16,
            **model_kwargs,
        )
        model = prepare_model_for_kbit_training(model)
    else:
        # Weights stay float32; bf16 is autocast by the trainer where the hardware supports it.
        model = load_model(
            auto_class, base_model, trust_remote_code=trust_remote_code, dtype=torch.float32, **model_kwargs
        )
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:  # heads that do not generate have none
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _split_modules(value: str) -> list[str] | str | None:
    value = value.strip()
    if not value:
        return None
    if value == "all-linear":
        return value
    return [name.strip() for name in value.split(",") if name.strip()]


def require_resolved_recipe(params: PipelineParams) -> None:
    """Refuse params whose training recipe is still unset (``auto`` / null): code that builds a trainer
    outside :func:`sparktune.model.training.train` must resolve it first, or peft reads ``auto`` as a
    module name and the trainer a learning rate of None."""
    from sparktune.model.recipes import unset_fields

    unset = unset_fields(params)
    if unset:
        raise TrainingInputError(
            f"The training recipe fields {unset} are unset: resolve them from the base model first "
            "(sparktune.model.training.resolve_recipe(params, base_model)) or set them."
        )


def lora_config_from_params(params: PipelineParams, task_type: str = "CAUSAL_LM") -> Any:
    """The PEFT ``LoraConfig`` of the params (rank, alpha, dropout, target modules, modules trained in
    full beside the adapters) for ``task_type``: ``CAUSAL_LM`` or ``SEQ_CLS``."""
    from peft import LoraConfig

    require_resolved_recipe(params)

    return LoraConfig(
        task_type=task_type,
        r=params.lora_r,
        lora_alpha=params.lora_alpha,
        lora_dropout=params.lora_dropout,
        target_modules=_split_modules(params.lora_target_modules),
        modules_to_save=_split_modules(params.lora_modules_to_save),
    )


# CPU features (``torch.cpu.get_capabilities()`` keys) that compute bf16 matmuls natively: x86's AVX512-BF16
# dot products and AMX tiles, Arm's BF16 (NEON or SVE). Without them oneDNN emulates bf16 through float32,
# slower than float32 itself. Here (AVX512-BF16) a 2048x2048 matmul ran 2.7x faster in bf16.
CPU_BF16_FEATURES = ("amx_bf16", "avx512_bf16", "bf16", "sve_bf16")
PRECISIONS = ("auto", "bf16", "float32")


def bf16_supported() -> bool:
    """Whether this process's device computes bf16 natively: its CUDA GPU when it has one, else its CPU."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is None:  # torch before 2.8 cannot say: float32, the safe choice
        return False
    capabilities = get_capabilities()
    return any(capabilities.get(feature) is True for feature in CPU_BF16_FEATURES)


def resolve_precision(precision: str) -> str:
    """``bf16`` or ``float32``: what the param ``precision`` (auto, bf16, float32) means on this device."""
    if precision not in PRECISIONS:
        raise TrainingInputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}.")
    if precision == "auto":
        return "bf16" if bf16_supported() else "float32"
    if precision == "bf16" and not bf16_supported():
        logger.warning(
            "precision=bf16 on a device without native bf16: it is emulated, slower than float32; "
            "precision=auto picks float32 here."
        )
    return precision


def without_autocast(model: Any) -> Any:
    """``model`` (changed in place) with the bf16 autocast that accelerate wrapped its forward in for
    training taken off: the logged models serve in float32, and are checked against the trained
    weights computing in float32 too (a bf16 forward is about 0.03 away in the logits)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_fp32_wrapper=False)


def _expected_steps(params: PipelineParams, n_train: int, world_size: int) -> int:
    if params.max_steps > 0:
        return params.max_steps
    per_step = params.per_device_train_batch_size * params.gradient_accumulation_steps * max(world_size, 1)
    return max(1, math.ceil(math.ceil(n_train / per_step) * params.num_train_epochs))


def _checkpointing_argument() -> str:
    """The ``TrainingArguments`` name of activation recomputation: ``activation_checkpointing`` in the
    transformers releases that have it (``gradient_checkpointing`` is its deprecated alias there),
    ``gradient_checkpointing`` in earlier 5.x releases (5.17), which refuse the new name. Set either
    way, explicitly: TRL's configs default it to True."""
    from transformers import TrainingArguments

    fields = getattr(TrainingArguments, "__dataclass_fields__", {})
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def trainer_arguments(
    params: PipelineParams, output_dir: Path, n_train: int, stream_shards: int = 0, world_size: int = 1
) -> dict[str, Any]:
    """The ``TrainingArguments`` every task shares: steps, batches, seeds, logging, checkpoints, DeepSpeed.

    ``stream_shards`` > 0: the train split is a Parquet stream with that many files.
    """
    import torch

    require_resolved_recipe(params)

    on_gpu = torch.cuda.is_available()
    # A stream has no length: the step count comes from the footers' row count, and every
    # optimizer step consumes a batch from each of the world_size processes.
    max_steps = (
        params.max_steps
        if params.max_steps > 0 or not stream_shards
        else _expected_steps(params, n_train, world_size)
    )
    workers = min(2, stream_shards)
    prefetch = {"dataloader_prefetch_factor": 4} if workers else {}
    return dict(
        output_dir=str(output_dir / CHECKPOINTS),
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
        # Autocast: matmuls in bf16, weights, gradients and optimizer state in float32 (accelerate's
        # mixed precision on the CPU as on a GPU).
        bf16=resolve_precision(params.precision) == "bf16",
        fp16=False,
        # Without a GPU, accelerate only sets up DDP (gloo) over the torch.distributed environment
        # TorchDistributor provides when told to run on the CPU; otherwise each rank trains alone.
        use_cpu=not on_gpu,
        # Recomputing activations saves GPU memory but only costs time on a small CPU model.
        **{_checkpointing_argument(): on_gpu},
        logging_strategy="steps",
        logging_first_step=True,
        # About 100 points on the loss curve whatever the run length.
        logging_steps=max(1, _expected_steps(params, n_train, world_size) // 100),
        eval_strategy="no",
        # Checkpoints (weights or adapter, optimizer, scheduler, RNG states, data position) are what
        # a retry resumes from.
        save_strategy="steps",
        save_steps=params.checkpoint_steps,
        save_total_limit=CHECKPOINTS_KEPT,
        save_only_model=False,
        deepspeed=deepspeed_config(params.deepspeed_stage),
        # gloo on CPU, nccl on GPUs: the accelerate default for the device.
        ddp_find_unused_parameters=False,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=workers,
        dataloader_pin_memory=on_gpu,
        **prefetch,
    )


class TokenCountingMixin:
    """Counts real and padded tokens of every training batch, for tokens/s and padding efficiency.

    Mixed into a transformers ``Trainer`` subclass (before it in the bases): the SFT trainer and the
    sequence classification trainer count alike.
    """

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
