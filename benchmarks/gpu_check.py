"""make gpu-check: the project's training and label scoring run on a CUDA GPU, each method on two
LLaMA-architecture models, with tokens/s, scoring rows/s, peak GPU memory and whether the adapter
merges and the model reloads.

    make gpu-check                                   # where the .venv's torch sees a CUDA GPU
    python benchmarks/gpu_check.py --dry-run         # tiny models, 2 steps, any device (here: CPU, ~30 s)
    python benchmarks/gpu_check.py --out /tmp/g.json --steps 20 --models smollm2-135m --methods lora

On a GPU machine without the .venv and without a network (the project's lent GPU machine has
torch, transformers, peft and accelerate), the rest travels as wheels: ``make gpu-check-wheels``
here fills ``.whl/`` (about 48 MB, bitsandbytes most of it), and the machine runs, from the
repository root with ``.whl`` carried:

    bash benchmarks/gpu_check_device.sh "$OUT/gpu_check.json"

What runs is the project's own code, not a copy of it:

- training: ``sparktune.model.training.build_trainer`` (the tokenizer, ``load_base_model`` with
  QLoRA's 4-bit NF4 ``BitsAndBytesConfig`` and ``prepare_model_for_kbit_training``, the LoRA config
  of the base model's recipe, TRL's SFT trainer with the project's label-position loss, dynamic
  padding and length-grouped batches, ``precision=auto``: bf16 autocast where the GPU has it,
  activation checkpointing on a GPU) over a dataset saved as materialize leaves one
  (``training_splits``), after ``check_hardware``; what ``sparktune.model.training.train`` adds
  around it (MLflow runs, logging, the registered pyfunc) is left out, since MLflow is not there;
- merging: ``sparktune.model.logged_model.save_adapter`` and ``merge_adapter`` (QLoRA's adapter
  into a 16-bit copy of the base), then ``to_stored_dtype``, as a run merges before logging;
- reloading: the saved adapter over a fresh base (``model_safety.load_adapter``; for QLoRA over the
  4-bit base loaded again by ``load_base_model``), and the merged model saved and loaded back
  (``model_safety.load_model``, dtype ``auto``), each compared with the trained model by
  ``max_logit_difference``. For QLoRA also the adapter as the label pyfunc serves it, over the
  16-bit base, against the trained model over the 4-bit one: the check ``log_adapter_model`` makes
  before a QLoRA run may finish (``served_16bit_*``, its tolerance 5e-2);
- scoring: ``sparktune.core.label_scoring.score_texts`` (constrained scoring of every candidate
  label, what evaluation, batch inference and serving call) on held-out texts, with the merged model
  and with the reloaded one, whose predictions must be the same.

Models, random weights from their configs (weights do not change the speed, and real ones of
these sizes cannot be carried to the GPU machine): ``smollm2-135m``, SmolLM2-135M's LlamaConfig
(30 layers, hidden 576, 9 heads, 3 KV heads, vocab 49,152, tied embeddings), and ``llama-1.1b``,
TinyLlama-1.1B's (22 layers, hidden 2048, 32 heads, 4 KV heads, intermediate 5632, vocab 32,000),
both stored in bf16 as their checkpoints are. The tokenizer is the project's byte-level BPE trained
on the demo corpus (SmolLM2's own is inside its 98 MB GGUF file); the data are demo support tickets,
one to four of one intent per text, in the pipeline's default prompt (the [INST] template: the
tokenizer has no chat template), at most 256 tokens. Methods: ``lora`` (the recipe's all-linear
adapters, float32 weights, bf16 autocast), ``qlora`` (4-bit NF4 base, bf16 compute), ``full``.

Per case: tokens/s of real (attention-mask) tokens over the whole ``trainer.train()`` (its
checkpoint at the end included, as ``TrainResult.tokens_per_second``) and over the steps after
the first (``steady_tokens_per_s``); peak GPU memory (``torch.cuda.max_memory_allocated``) of
training and of scoring; scoring rows/s; merges / reloads with their largest logit differences
and tolerances. A case that fails is recorded with its error and the others go on; one that cannot
run here (QLoRA without CUDA) is recorded as skipped; cases left when ``--budget-s`` is spent are
skipped too. The JSON is written after every case. Exits 1 when a case failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# bench_train (its demo tickets) beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The JSON default: SPARKTUNE_HOME/bench/gpu_check.json, as every bench writes its report.
OUT_ENV = "GPU_CHECK_OUT"
METHODS = ("lora", "qlora", "full")
MAX_LENGTH = 256
# Tolerances of the largest logit difference. The same weights reloaded: 1e-4, as training verifies
# what it logs (sparktune.model.logged_model); a QLoRA adapter over its 4-bit base loaded again: 1e-3
# (the 4-bit kernels may order their sums differently). Merging LoRA into float32 weights changes the
# sum's order only (1e-3); QLoRA's adapter is merged into the 16-bit base and rounded to bf16 (5e-2).
# QLoRA served over the 16-bit base (bitsandbytes is for training only) against the trained model
# over the 4-bit one: 5e-2, the tolerance of log_adapter_model, which fails a run beyond it.
RELOAD_TOLERANCE = 1e-4
MERGE_TOLERANCE = {"lora": 1e-3, "qlora": 5e-2}
ADAPTER_TOLERANCE = {"lora": 1e-4, "qlora": 1e-3}
SERVED_16BIT_TOLERANCE = 5e-2


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    config: dict[str, Any]


SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
TINYLLAMA_1B = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
MODELS = {
    "smollm2-135m": ModelSpec("smollm2-135m", "SmolLM2-135M's LlamaConfig, random weights", SMOLLM2_135M),
    "llama-1.1b": ModelSpec("llama-1.1b", "TinyLlama-1.1B's LlamaConfig, random weights", TINYLLAMA_1B),
}
# The dry run: the same two shapes (tied embeddings or not, grouped KV heads), tiny.
DRY_MODELS = {
    "smollm2-135m": ModelSpec(
        "smollm2-135m",
        "SmolLM2's shape, tiny (dry run)",
        {
            **SMOLLM2_135M,
            "hidden_size": 48,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 3,
            "num_key_value_heads": 1,
            "vocab_size": 2048,
        },
    ),
    "llama-1.1b": ModelSpec(
        "llama-1.1b",
        "TinyLlama's shape, tiny (dry run)",
        {
            **TINYLLAMA_1B,
            "hidden_size": 64,
            "intermediate_size": 176,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 2048,
        },
    ),
}


@dataclass(frozen=True)
class Sizes:
    steps: int
    batch_size: int
    train_rows: int
    validation_rows: int
    score_rows: int
    score_batch_size: int
    tokenizer_vocab: int
    tokenizer_texts: int


FULL_SIZES = Sizes(
    steps=30,
    batch_size=16,
    train_rows=512,
    validation_rows=32,
    score_rows=512,
    score_batch_size=64,
    tokenizer_vocab=8192,
    tokenizer_texts=20000,
)
DRY_SIZES = Sizes(
    steps=2,
    batch_size=4,
    train_rows=16,
    validation_rows=8,
    score_rows=16,
    score_batch_size=8,
    tokenizer_vocab=1024,
    tokenizer_texts=1000,
)


def default_out() -> Path:
    if os.environ.get(OUT_ENV):
        return Path(os.environ[OUT_ENV])
    home = Path(os.environ.get("SPARKTUNE_HOME", ".local")).expanduser()
    return home / "bench" / "gpu_check.json"


# --------------------------------------------------------------------------------------------
# Inputs: a tokenizer, the data, the random-weight base models


def build_tokenizer(folder: Path, sizes: Sizes) -> Path:
    """The project's byte-level BPE tokenizer trained on the demo corpus (``build_tiny_base_model``
    with one pre-training step: only its tokenizer is used)."""
    from sparktune.model.base_model import TINY_CORPUS_SEED, build_tiny_base_model
    from sparktune.model.builtin_corpus import demo_corpus

    corpus = demo_corpus(sizes.tokenizer_texts, TINY_CORPUS_SEED)
    return build_tiny_base_model(
        folder,
        corpus,
        vocab_size=sizes.tokenizer_vocab,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        intermediate_size=32,
        pretrain_steps=1,
    )


def ticket_rows(n: int, tokenizer: Any) -> list[dict[str, str]]:
    """``n`` rows (text, label, prompt, completion): one to four demo tickets of one intent per text
    (the tickets of ``make bench-train``: filtered as prepare_data does by default), in the default
    prompt, prompt + label + eos at most MAX_LENGTH tokens (prepare_data drops longer rows)."""
    from bench_train import demo_rows
    from sparktune.core.label_scoring import format_example
    from sparktune.core.params import MISTRAL_INSTRUCT_TEMPLATE

    by_label: dict[str, list[str]] = {}
    rows: list[dict[str, str]] = []
    for ticket in demo_rows(4 * n):
        label = ticket["label"]
        pending = by_label.setdefault(label, [])
        pending.append(ticket["text"])
        if len(pending) < 1 + len(rows) % 4:
            continue
        text = " ".join(pending)
        by_label[label] = []
        prompt, completion = format_example(MISTRAL_INSTRUCT_TEMPLATE, text, label)
        if len(tokenizer(prompt + completion + tokenizer.eos_token)["input_ids"]) <= MAX_LENGTH:
            rows.append({"text": text, "label": label, "prompt": prompt, "completion": completion})
        if len(rows) == n:
            return rows
    raise RuntimeError(f"only {len(rows)} of {n} demo rows fit in {MAX_LENGTH} tokens")


def write_dataset(folder: Path, rows: list[dict[str, str]], n_train: int) -> Path:
    """Train and validation splits saved as materialize leaves them (``DatasetDict.save_to_disk``)."""
    from datasets import Dataset, DatasetDict

    DatasetDict(
        {"train": Dataset.from_list(rows[:n_train]), "validation": Dataset.from_list(rows[n_train:])}
    ).save_to_disk(str(folder))
    return folder


def build_base_model(spec: ModelSpec, tokenizer_dir: Path, folder: Path, seed: int = 0) -> Path:
    """A LLaMA of ``spec``'s config with random weights, stored in bf16 with the tokenizer, as a
    base model folder. Built on the GPU when there is one (a 1.1B model initialises in seconds there)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(
        **{**spec.config, "vocab_size": max(spec.config["vocab_size"], len(tokenizer))},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    parameters = sum(p.numel() for p in model.parameters())
    del model
    free_memory()
    (folder / "gpu_check_model.json").write_text(
        json.dumps({"name": spec.name, "description": spec.description, "parameters": parameters}) + "\n"
    )
    return folder


# --------------------------------------------------------------------------------------------
# One case: train, merge, reload, score


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_mb() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return round(torch.cuda.max_memory_allocated() / 2**20, 1)


def step_timer() -> Any:
    """A callback that notes the time and the trainer's real-token count at the end of every step
    (before a checkpoint is saved: the trainer saves after ``on_step_end``)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.trainer: Any = None
            self.marks: list[tuple[float, int]] = []
            self.losses: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append((time.perf_counter(), int(self.trainer.real_tokens)))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    return StepTimer()


def check_batch(tokenizer: Any, texts: list[str], device: Any) -> dict[str, Any]:
    """The batch training verifies logged models on: prompt + label texts, padded on the right."""
    tokenizer.padding_side = "right"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    return {key: value.to(device) for key, value in batch.items()}


def run_case(
    record: dict[str, Any],
    model_name: str,
    base_model: Path,
    method: str,
    dataset: Path,
    score_rows: list[dict[str, str]],
    labels: list[str],
    sizes: Sizes,
    work: Path,
) -> dict[str, Any]:
    """Train ``method`` on ``base_model``, merge, reload and score, filling ``record`` as it goes:
    a later step that fails leaves the figures of the earlier ones there."""
    import torch
    from sparktune.core.label_scoring import CAUSAL_LM, LabelSpec, score_texts
    from sparktune.core.model_safety import load_adapter, load_model
    from sparktune.core.params import default_params, parse_params
    from sparktune.core.prompt_format import effective_prompt_template
    from sparktune.model.logged_model import (
        max_logit_difference,
        merge_adapter,
        save_adapter,
        to_stored_dtype,
    )
    from sparktune.model.sft_trainer import count_params
    from sparktune.model.train_inputs import check_hardware, training_splits
    from sparktune.model.train_request import TrainRequest
    from sparktune.model.training import build_trainer, resolve_recipe
    from sparktune.model.training_setup import TrainingInputError, load_base_model, without_autocast
    from transformers import AutoModelForCausalLM

    raw = {
        **default_params(),
        "peft_method": method,
        "max_steps": sizes.steps,
        "per_device_train_batch_size": sizes.batch_size,
        "gradient_accumulation_steps": 1,
        "max_length": MAX_LENGTH,
        # One checkpoint, at the end (the trainer saves there whatever the interval).
        "checkpoint_steps": sizes.steps,
    }
    params = parse_params(raw)
    try:
        check_hardware(params)
    except TrainingInputError as err:
        if not torch.cuda.is_available():
            record.update(status="skipped", reason=f"skipped: needs CUDA ({err})")
            return record
        raise
    resolved = resolve_recipe(params, str(base_model))
    params = resolved.params
    output_dir = work / "runs" / f"{model_name}-{method}"
    request = TrainRequest(
        dataset_path=str(dataset),
        base_model=str(base_model),
        output_dir=str(output_dir),
        params=raw,
        mlflow_tracking_uri="",
        experiment_name="gpu-check",
        train_key=f"gpu-check-{model_name}-{method}",
    )
    splits = training_splits(request, params)
    timer = step_timer()
    free_memory()
    reset_peak()
    trainer, tokenizer, _ = build_trainer(request, params, splits, output_dir, callbacks=[timer])
    timer.trainer = trainer
    trainable, total = count_params(trainer.model)
    started = time.perf_counter()
    output = trainer.train()
    train_seconds = time.perf_counter() - started
    train_peak = peak_mb()
    model = trainer.model
    record.update(
        recipe=resolved.recipe.name,
        learning_rate=params.learning_rate,
        lora_target_modules=params.lora_target_modules if method != "full" else "",
        device=str(next(model.parameters()).device),
        precision="bf16" if trainer.args.bf16 else "float32",
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        activation_checkpointing=bool(getattr(trainer.args, "gradient_checkpointing", False)),
        quantization="bitsandbytes 4-bit nf4, double quant, bf16 compute" if method == "qlora" else "",
        trainable_params=trainable,
        total_params=total,
        steps=int(output.global_step),
        batch_size=params.per_device_train_batch_size,
        train_seconds=round(train_seconds, 3),
        real_tokens=int(trainer.real_tokens),
        padded_tokens=int(trainer.padded_tokens),
        tokens_per_s=round(trainer.real_tokens / train_seconds, 1) if train_seconds > 0 else 0.0,
        padding_efficiency=round(trainer.real_tokens / max(trainer.padded_tokens, 1), 4),
        initial_loss=timer.losses[0] if timer.losses else None,
        final_loss=timer.losses[-1] if timer.losses else None,
        peak_gpu_mb_train=train_peak,
    )
    if len(timer.marks) >= 2:
        (t0, n0), (t1, n1) = timer.marks[0], timer.marks[-1]
        record["steady_tokens_per_s"] = round((n1 - n0) / (t1 - t0), 1) if t1 > t0 else None
        record["steady_seconds_per_step"] = round((t1 - t0) / (len(timer.marks) - 1), 4)

    # As a run does after training: the forward without the trainer's autocast, in eval mode.
    model = trainer.model = without_autocast(model)
    model.eval()
    device = next(model.parameters()).device
    texts = [row["prompt"] + row["completion"] for row in score_rows[:4]]
    batch = check_batch(tokenizer, texts, device)
    if method == "full":
        merged = model
        record.update(merges=None, adapter_reloads=None)
    else:
        adapter_dir = save_adapter(trainer, output_dir)
        if method == "qlora":
            # The saved adapter over the 4-bit base loaded again as training loads it: the reload alone.
            quantized = load_base_model(str(base_model), tokenizer, "qlora")
            reloaded_adapter = load_adapter(quantized, adapter_dir).eval()
            reload_diff = max_logit_difference(model, reloaded_adapter, batch)
            del reloaded_adapter, quantized
            free_memory()
        # The adapter model as the label pyfunc serves it: a fresh base (float32; bf16 under QLoRA,
        # whose 4-bit base is for training only) with the saved adapter over it.
        dtype = torch.bfloat16 if method == "qlora" else torch.float32
        base = load_model(AutoModelForCausalLM, str(base_model), trust_remote_code=False, dtype=dtype)
        base.config.pad_token_id = tokenizer.pad_token_id
        served_adapter = load_adapter(base, adapter_dir).to(device).eval()
        served_diff = max_logit_difference(model, served_adapter, batch)
        merged = merge_adapter(model, params, str(base_model), adapter_dir, tokenizer.pad_token_id)
        merged = merged.to(device).eval()
        merge_diff = max_logit_difference(served_adapter, merged, batch)
        del served_adapter, base
        if method == "lora":
            reload_diff = served_diff
        else:
            # What sparktune.model.logged_model.log_adapter_model checks before it lets a QLoRA run
            # finish: the trained model against its adapter served over the 16-bit base.
            record.update(
                served_16bit_max_logit_diff=served_diff,
                served_16bit_tolerance=SERVED_16BIT_TOLERANCE,
                served_16bit_within_tolerance=served_diff <= SERVED_16BIT_TOLERANCE,
            )
        record.update(
            adapter_reload_max_logit_diff=reload_diff,
            adapter_reload_tolerance=ADAPTER_TOLERANCE[method],
            adapter_reloads=reload_diff <= ADAPTER_TOLERANCE[method],
            merge_max_logit_diff=merge_diff,
            merge_tolerance=MERGE_TOLERANCE[method],
            merges=merge_diff <= MERGE_TOLERANCE[method],
        )
    timer.trainer = None  # the callback's reference would keep the trainer (and its optimizer) alive
    del trainer, model
    free_memory()
    merged = to_stored_dtype(merged, str(base_model))
    merged.eval()
    merged_dir = output_dir / "merged"
    merged.save_pretrained(str(merged_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(merged_dir))
    reloaded = load_model(AutoModelForCausalLM, str(merged_dir), trust_remote_code=False, dtype="auto")
    reloaded = reloaded.to(device).eval()
    reload_diff = max_logit_difference(merged, reloaded, batch)
    record.update(
        merged_dtype=str(merged.dtype).replace("torch.", ""),
        reload_max_logit_diff=reload_diff,
        reload_tolerance=RELOAD_TOLERANCE,
    )

    spec = LabelSpec(CAUSAL_LM, tuple(labels), effective_prompt_template("", tokenizer, labels))
    score_texts_list = [row["text"] for row in score_rows]
    # One small batch first: CUDA's kernels load and autotune on first use, outside the clock.
    score_texts(merged, tokenizer, score_texts_list[:2], spec, 2)
    reset_peak()
    started = time.perf_counter()
    predictions, _ = score_texts(merged, tokenizer, score_texts_list, spec, sizes.score_batch_size)
    score_seconds = time.perf_counter() - started
    score_peak = peak_mb()
    reloaded_predictions, _ = score_texts(reloaded, tokenizer, score_texts_list, spec, sizes.score_batch_size)
    same = sum(a == b for a, b in zip(predictions, reloaded_predictions, strict=True))
    correct = sum(p == row["label"] for p, row in zip(predictions, score_rows, strict=True))
    record.update(
        reloads=reload_diff <= RELOAD_TOLERANCE and same == len(predictions),
        reloaded_same_predictions=same,
        score_rows=len(score_texts_list),
        score_labels=len(labels),
        score_batch_size=sizes.score_batch_size,
        score_seconds=round(score_seconds, 3),
        score_rows_per_s=round(len(score_texts_list) / score_seconds, 1) if score_seconds > 0 else 0.0,
        score_accuracy=round(correct / len(score_rows), 4),
        peak_gpu_mb_scoring=score_peak,
        status="ok",
    )
    del merged, reloaded
    free_memory()
    shutil.rmtree(output_dir, ignore_errors=True)
    return record


# --------------------------------------------------------------------------------------------
# Report


def environment() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    packages = {}
    for name in (
        "torch",
        "transformers",
        "peft",
        "trl",
        "accelerate",
        "datasets",
        "bitsandbytes",
        "pydantic",
        "huggingface_hub",
        "tokenizers",
        "safetensors",
        "pyarrow",
        "numpy",
        "pandas",
    ):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "packages": packages,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            device=torch.cuda.get_device_name(0),
            device_memory_gb=round(props.total_memory / 2**30, 1),
            compute_capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            bf16_supported=bool(torch.cuda.is_bf16_supported()),
        )
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}), {os.cpu_count()} cores"
    return env


def _cell(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(cases: list[dict[str, Any]]) -> str:
    head = (
        "model",
        "method",
        "status",
        "tokens/s",
        "steady tok/s",
        "train s",
        "peak train MB",
        "score rows/s",
        "peak score MB",
        "adapter reloads",
        "merges",
        "reloads",
    )
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for case in cases:
        if case.get("status") != "ok":
            note = case.get("reason") or f"{case['status']}: {case.get('error', '')}"
            lines.append(f"{case['model']} | {case['method']} | {note[:200]}")
            continue
        lines.append(
            " | ".join(
                (
                    case["model"],
                    case["method"],
                    "ok",
                    _cell(case.get("tokens_per_s")),
                    _cell(case.get("steady_tokens_per_s")),
                    _cell(case.get("train_seconds"), 1),
                    _cell(case.get("peak_gpu_mb_train")),
                    _cell(case.get("score_rows_per_s"), 1),
                    _cell(case.get("peak_gpu_mb_scoring")),
                    _cell(case.get("adapter_reloads")),
                    _cell(case.get("merges")),
                    _cell(case.get("reloads")),
                )
            )
        )
    return "\n".join(lines)


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"the JSON report (default ${OUT_ENV}, else $SPARKTUNE_HOME/bench/gpu_check.json)",
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny models, 2 steps, on any device")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated, of " + ", ".join(METHODS)
    )
    parser.add_argument("--steps", type=int, default=None, help="training steps per case")
    parser.add_argument("--batch-size", type=int, default=None, help="training batch size")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=400.0,
        help="cases not started when this many seconds have passed are skipped",
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Everything is local (no hub), and the log is for the cases: no progress bars, no deprecation notes.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    out = args.out or default_out()
    models = DRY_MODELS if args.dry_run else MODELS
    sizes = DRY_SIZES if args.dry_run else FULL_SIZES
    overrides = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size)) if v}
    if overrides:
        from dataclasses import replace

        sizes = replace(sizes, **overrides)
        sizes = replace(sizes, train_rows=max(sizes.train_rows, sizes.steps * sizes.batch_size))
    chosen_models = [m.strip() for m in args.models.split(",") if m.strip()]
    chosen_methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(chosen_models) - set(models)) + sorted(set(chosen_methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown models or methods: {unknown}")

    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if args.dry_run and not torch.cuda.is_available():
        # Tiny matrices gain nothing from a second thread, and on a busy machine spinning threads
        # made steps several times slower.
        torch.set_num_threads(1)
    report: dict[str, Any] = {
        "bench": "gpu_check",
        "dry_run": args.dry_run,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment(),
        "sizes": asdict(sizes),
        "max_length": MAX_LENGTH,
        "models": {},
        "cases": [],
    }
    env = report["environment"]
    print(
        f"gpu-check on {env['device']}: torch {env['packages']['torch']}, transformers "
        f"{env['packages']['transformers']}, peft {env['packages']['peft']}, trl {env['packages']['trl']}, "
        f"bitsandbytes {env['packages']['bitsandbytes']}",
        flush=True,
    )
    if not torch.cuda.is_available() and not args.dry_run:
        print("no CUDA GPU here: the full check is for a GPU machine (--dry-run runs tiny models here)")
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        setup_started = time.perf_counter()
        tokenizer_dir = build_tokenizer(work / "tokenizer", sizes)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        rows = ticket_rows(sizes.train_rows + sizes.validation_rows + sizes.score_rows, tokenizer)
        train_val = rows[: sizes.train_rows + sizes.validation_rows]
        score_rows = rows[sizes.train_rows + sizes.validation_rows :]
        labels = sorted({row["label"] for row in train_val})
        dataset = write_dataset(work / "dataset", train_val, sizes.train_rows)
        report["data"] = {
            "train_rows": sizes.train_rows,
            "validation_rows": sizes.validation_rows,
            "score_rows": len(score_rows),
            "labels": len(labels),
            "tokenizer_vocab": len(tokenizer),
        }
        report["setup_seconds"] = round(time.perf_counter() - setup_started, 1)
        for model_name in chosen_models:
            spec = models[model_name]
            base_started = time.perf_counter()
            try:
                base = build_base_model(spec, tokenizer_dir, work / "models" / model_name)
            except Exception as err:  # noqa: BLE001 - recorded, the other model goes on
                failed = True
                message = f"{type(err).__name__}: {err}"
                report["models"][model_name] = {"error": message}
                for method in chosen_methods:
                    report["cases"].append(
                        {
                            "model": model_name,
                            "method": method,
                            "status": "error",
                            "error": f"base model not built: {message}",
                        }
                    )
                write(out, report)
                continue
            facts = json.loads((base / "gpu_check_model.json").read_text())
            report["models"][model_name] = {
                **facts,
                "config": spec.config,
                "build_seconds": round(time.perf_counter() - base_started, 1),
            }
            for method in chosen_methods:
                elapsed = time.perf_counter() - started
                if elapsed > args.budget_s:
                    record = {
                        "model": model_name,
                        "method": method,
                        "status": "skipped",
                        "reason": f"skipped: the time budget ({args.budget_s:.0f} s) was spent",
                    }
                else:
                    print(f"\n=== {model_name} / {method}", flush=True)
                    case_started = time.perf_counter()
                    record = {"model": model_name, "method": method}
                    try:
                        run_case(record, model_name, base, method, dataset, score_rows, labels, sizes, work)
                    except Exception as err:  # noqa: BLE001 - recorded, the other cases go on
                        failed = True
                        # The figures of the steps before the failure stay in the record.
                        record.update(
                            status="error",
                            error=f"{type(err).__name__}: {err}",
                            traceback=traceback.format_exc()[-4000:],
                        )
                        print(record["traceback"], file=sys.stderr)
                    record["case_seconds"] = round(time.perf_counter() - case_started, 1)
                    # A failed case leaves its checkpoints (a full 1.1B one is 13 GB) and GPU memory.
                    shutil.rmtree(work / "runs", ignore_errors=True)
                    free_memory()
                print(json.dumps({k: v for k, v in record.items() if k != "traceback"}), flush=True)
                report["cases"].append(record)
                report["seconds"] = round(time.perf_counter() - started, 1)
                write(out, report)
            shutil.rmtree(base, ignore_errors=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["cases_failed"] = sum(case["status"] == "error" for case in report["cases"])
    report["completed"] = True
    write(out, report)
    print("\n" + table(report["cases"]))
    print(f"\n{len(report['cases'])} cases in {report['seconds']:.0f} s on {env['device']}; written to {out}")
    if failed:
        print(f"FAILED: {report['cases_failed']} case(s) errored (see 'error' in the JSON)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
