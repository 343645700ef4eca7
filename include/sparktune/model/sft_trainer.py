"""The causal LM's trainer: TRL's SFTTrainer counting its tokens and scoring only the label positions,
its config (packing or dynamic padding), the step logger both tasks' trainers report through, and
the checks and counters around them.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PipelineParams
from sparktune.model.training_setup import TokenCountingMixin, TrainingInputError, trainer_arguments

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def make_trainer_classes() -> tuple[type, type]:
    """Build the trainer subclass and the MLflow callback lazily, so importing this module stays light."""
    from transformers import TrainerCallback
    from trl import SFTTrainer

    class CountingSFTTrainer(TokenCountingMixin, SFTTrainer):
        """An SFTTrainer that counts the tokens of its training batches and scores only the labels.

        TRL 1.16 computes the loss with its fused LM head over every position (prompt and padding
        included) plus entropy and top-1 accuracy over the whole vocabulary: about 70% of a step
        on a CPU for prompt-completion data whose completion is a few tokens. The loss only needs
        the logits of the positions that predict a label token, which transformers'
        ``logits_to_keep`` computes alone (2.8x faster here, the same loss). The validation loss
        (``trainer.evaluate()``, which asks for the loss alone) takes the same path: with a 49k
        vocabulary, TRL's would cost more than the forward pass itself. Under bf16 autocast the
        logits come back in bf16 or float32; the cross-entropy runs in float32 either way.
        """

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            import torch
            import torch.nn.functional as F

            labels = inputs.get("labels")
            if return_outputs or labels is None:  # a caller that wants the logits gets TRL's path
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            targets = labels[:, 1:]
            # Positions whose next token is a label in any row; a batch shares one index list.
            keep = (targets != -100).any(dim=0).nonzero().squeeze(-1)
            model_inputs = {k: v for k, v in inputs.items() if k != "labels"}
            try:
                outputs = model(**model_inputs, use_cache=False, logits_to_keep=keep)
            except TypeError:  # a model without logits_to_keep: TRL's path
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            logits = outputs.logits.float()
            kept = targets[:, keep]
            loss = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)), kept.reshape(-1), ignore_index=-100, reduction="sum"
            )
            count = num_items_in_batch if num_items_in_batch is not None else (kept != -100).sum()
            loss = loss / torch.as_tensor(count, device=loss.device).clamp(min=1)
            # As Trainer.compute_loss: num_items_in_batch counts every rank's tokens and DDP averages.
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            return loss

    class MlflowStepLogger(TrainerCallback):
        """Logs each logging step to the run this module opened (not one the MLflow callback opens)."""

        def __init__(self) -> None:
            self.losses: list[tuple[int, float]] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            import mlflow

            if not state.is_world_process_zero:  # one writer per run: rank 0
                return
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


def sft_config(
    params: PipelineParams, output_dir: Path, n_train: int, stream_shards: int = 0, world_size: int = 1
) -> Any:
    """``stream_shards`` > 0: the train split is a Parquet stream with that many files."""
    from trl import SFTConfig

    if params.packing:
        # Best-fit decreasing packing, padding-free: rows of whole examples, never cut, each
        # example's positions restarting at 0 so attention stays inside it ("wrapped" packing
        # would cut examples and let them see each other). check_packing_isolation guards models
        # that ignore the positions.
        batching: dict[str, Any] = {"packing": True, "packing_strategy": "bfd", "padding_free": True}
    else:
        # Dynamic padding (pad to the longest in the batch) and length-grouped batches: on this
        # machine 930 tokens/s padded to 512 vs 14,000 dynamic vs 22,000 length-sorted (make bench-train).
        batching = {"packing": False, "padding_free": False, "train_sampling_strategy": "group_by_length"}
    config = SFTConfig(
        # Prompt-completion data: TRL masks the prompt out of the labels (completion_only_loss) and
        # appends eos to the completion, so the model learns to stop after the label.
        completion_only_loss=True,
        max_length=params.max_length,
        pad_to_multiple_of=None,
        **batching,
        **trainer_arguments(params, output_dir, n_train, stream_shards, world_size),
    )
    return config


def check_packing_isolation(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> float:
    """Check that two examples packed in one row do not see each other; return the largest logit gap.

    Packing here is padding-free: the examples of a row are concatenated, and only their position
    ids (restarting at 0) mark the boundaries. Models whose attention builds its mask from them
    (transformers' masking utilities, flash-attention varlen) keep each example to itself; others
    would let an example attend to the one before it, silently. Probed on the real model, because
    no config flag tells.
    """
    import torch

    first = tokenizer("billing question about my invoice", add_special_tokens=False)["input_ids"]
    second = tokenizer("the shipping box arrived broken", add_special_tokens=False)["input_ids"]
    packed_ids = torch.tensor([first + second])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        # use_cache=False as in training (TRL's compute_loss): with a KV cache the boundaries in the
        # position ids are not looked at.
        packed = model(input_ids=packed_ids, position_ids=positions, use_cache=False).logits
        packed = packed[0, len(first) :].float()
        alone = model(input_ids=torch.tensor([second]), use_cache=False).logits[0].float()
    model.train(was_training)
    gap = float((packed - alone).abs().max())
    if not gap <= 1e-3:
        raise TrainingInputError(
            f"packing=true would let packed examples attend to each other with this model "
            f"({type(model).__name__}, attention {model.config._attn_implementation!r}): the second of two "
            f"packed examples gets logits {gap:.3g} away from the same example alone. Set packing=false "
            "(dynamic padding), or use a model whose attention honours position ids (e.g. LLaMA/Mistral "
            "with sdpa or flash_attention_2)."
        )
    return gap


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters of ``model``."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def all_ranks_sum(*values: int) -> list[int]:
    """Sum per-process counters over the ranks (each rank saw its own share of every batch)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    counts = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    return [int(v) for v in counts.tolist()]
