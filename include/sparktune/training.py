"""Supervised fine-tuning (LoRA, QLoRA or full) of a causal LM on the materialized dataset, logged to MLflow.

Every backend runs this through ``sparktune.jobs.train`` (a local process, TorchDistributor
ranks on Spark executors, a Databricks job) so that torch and the model live and die with one
process. :func:`train` is keyed on ``TrainRequest.train_key``:

- a FINISHED run with that key and a verified model is returned as is, so a retry after a
  successful training never trains, or registers, a second model;
- otherwise the trainer resumes from the key's last checkpoint (saved every ``checkpoint_steps``
  under ``<output_dir>/checkpoints``) into the MLflow run the crashed attempt left behind, so
  finished steps are not redone and the loss curve continues in one run.

Under torch.distributed (``WORLD_SIZE`` > 1) rank 0 alone talks to MLflow.
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
from sparktune.training_setup import (
    CHECKPOINTS,
    TokenCountingMixin,
    TrainingInputError,
    deepspeed_config,
    load_base_model,
    lora_config_from_params,
    trainer_arguments,
)

if TYPE_CHECKING:
    import torch
    from datasets import DatasetDict
    from sparktune.recipes import ResolvedRecipe
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Named explicitly: run as `python -m`, __name__ would be "__main__".
logger = logging.getLogger("sparktune.training")

TRAIN_KEY_TAG = "sparktune.train_key"
MODEL_URI_TAG = "sparktune.model_uri"
MODEL_ARTIFACT = "model"
ADAPTER_ARTIFACT = "adapter"
ADAPTER_MODEL_ARTIFACT = "adapter_model"
# What the logged text-generation model writes per prompt when served: a label and its eos.
GENERATED_TOKENS = 32
RESULT_ARTIFACT = "train_result.json"
RESUMED_FROM_TAG = "sparktune.resumed_from_step"
CODE_VERSION_TAG = "sparktune.code_version"
CODE_FINGERPRINT_TAG = "sparktune.code_fingerprint"
REQUIRED_SPLITS = ("train", "validation")
REQUIRED_COLUMNS = ("prompt", "completion")
# The logged model must give the same logits as the one in memory, up to float noise.
MAX_LOGIT_DIFF = 1e-4
# Packages the serving side needs for a merged transformers model. Listed explicitly because the
# flavour's own inference looks for torchvision and fails when it is absent (DESIGN.md).
SERVING_PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "safetensors")


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
    # The adapter over its base, as a pyfunc model (LoRA and QLoRA runs); "" for full fine-tuning.
    adapter_model_uri: str = ""
    # sparktune.recipes.ResolvedRecipe.summary(): the recipe and which values came from it.
    recipe: dict[str, Any] = field(default_factory=dict)

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


def _experiment_id(client: Any, request: TrainRequest) -> str:
    from sparktune.experiments import (
        DeletedExperimentError,
        default_artifact_location,
        get_or_create_experiment,
    )

    location = request.artifact_location or default_artifact_location(request.mlflow_tracking_uri)
    try:
        return get_or_create_experiment(client, request.experiment_name, location)
    except DeletedExperimentError as exc:
        raise TrainingInputError(str(exc)) from exc


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


def load_finished_result(tracking_uri: str, experiment_name: str, train_key: str) -> dict[str, Any] | None:
    """The ``TrainResult`` (as a dict) of the finished run of ``train_key``, or None if there is none.

    This is how a caller learns the outcome whatever ran the training (a local process, a Spark
    application or a Databricks job): through the MLflow run, not through a local file.
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    run_id = find_finished_run(client, experiment.experiment_id, train_key)
    if run_id is None:
        return None
    local = client.download_artifacts(run_id, RESULT_ARTIFACT)
    return TrainResult.from_dict(json.loads(Path(local).read_text())).to_dict()


def _unfinished_runs(client: Any, experiment_id: str, train_key: str) -> list[Any]:
    """Runs of this key that an earlier attempt left behind (RUNNING, FAILED or KILLED), newest first."""
    return client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TRAIN_KEY_TAG}` = '{_quote(train_key)}' and attributes.status != 'FINISHED'",
        order_by=["attributes.start_time DESC"],
    )


def _close_abandoned_runs(client: Any, runs: list[Any], train_key: str) -> None:
    """Mark runs a killed attempt left RUNNING as KILLED, so the UI shows one live run per key."""
    for run in runs:
        if run.info.status == "RUNNING":
            logger.warning(
                "Run %s of train_key %s was left RUNNING by an earlier attempt and has no checkpoint to "
                "resume from; marking it KILLED.",
                run.info.run_id,
                train_key,
            )
            client.set_terminated(run.info.run_id, status="KILLED")


def last_checkpoint(output_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint under ``output_dir/checkpoints`` and its global step.

    transformers' ``get_last_checkpoint`` returns the highest-numbered folder, even one a crash cut
    mid-save. The Trainer writes ``trainer_state.json`` after the weights, optimizer and scheduler,
    so a checkpoint whose state parses is whole; a newer one whose state does not is passed over.
    """
    folder = output_dir / CHECKPOINTS
    if not folder.is_dir():
        return None
    for path in _numbered_checkpoints(folder):
        try:
            return path, int(json.loads((path / "trainer_state.json").read_text())["global_step"])
        except (OSError, ValueError, KeyError):
            logger.warning("%s is incomplete (a crash cut its save); looking at the one before.", path)
    return None


def _numbered_checkpoints(folder: Path) -> list[Path]:
    """``checkpoint-<step>`` folders, newest step first."""
    steps = {}
    for path in folder.iterdir():
        step = path.name.removeprefix("checkpoint-")
        if path.is_dir() and path.name.startswith("checkpoint-") and step.isdigit():
            steps[int(step)] = path
    return [steps[step] for step in sorted(steps, reverse=True)]


def code_fingerprint(package: Path | None = None) -> str:
    """sha256 of the installed ``sparktune`` package's Python sources (first 16 hex digits).

    What decides whether the same data and config would train the same model again: unlike the git
    commit in :func:`code_version`, a commit that touches only docs, tests or DAG wiring leaves it
    alone, and an uncommitted change to the trainer changes it.
    """
    import hashlib

    package = package or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def code_version() -> str:
    """The sparktune version, plus the git commit when it runs from a checkout (``0.1.0+g1a2b3c4``)."""
    import subprocess

    try:
        release = version("sparktune")
    except PackageNotFoundError:
        release = "unknown"
    source = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return release
    return f"{release}+g{sha}" if sha else release


def _pip_requirements() -> list[str]:
    return _package_pins(SERVING_PACKAGES)


def _package_pins(packages: tuple[str, ...]) -> list[str]:
    pins = []
    for package in packages:
        try:
            # Drop local version labels (torch 2.13.0+cpu): an index cannot resolve them.
            pins.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:
            continue
    return pins


# --------------------------------------------------------------------------------------------
# Inputs


def _load_dataset(path: str, columns: tuple[str, ...] = REQUIRED_COLUMNS) -> DatasetDict:
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


def _load_tokenizer(base_model: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    from sparktune.model_safety import load_tokenizer

    tokenizer = load_tokenizer(base_model, trust_remote_code=trust_remote_code)
    if tokenizer.eos_token is None:
        raise TrainingInputError(
            f"The tokenizer of {base_model!r} has no eos token, so the model could not learn where a label "
            "ends; set tokenizer.eos_token and save the tokenizer again."
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
    if problems:
        raise TrainingInputError("\n".join(problems))


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

    class CountingSFTTrainer(TokenCountingMixin, SFTTrainer):
        """An SFTTrainer that counts the tokens of its training batches and scores only the labels.

        TRL 1.16 computes the training loss with its fused LM head over every position (prompt
        and padding included) plus entropy and top-1 accuracy over the whole vocabulary: about 70%
        of a step on a CPU for prompt-completion data whose completion is a few tokens. The
        loss only needs the logits of the positions that predict a label token, which
        transformers' ``logits_to_keep`` computes alone (2.8x faster here, the same loss).
        """

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            import torch
            import torch.nn.functional as F

            labels = inputs.get("labels")
            if return_outputs or labels is None or not model.training:
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


def _sft_config(
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
        # machine 930 tokens/s padded to 512 vs 14,000 dynamic vs 22,000 length-sorted (DESIGN.md).
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
    """Largest absolute logit difference of two models on the non-padding positions of a batch.

    Token logits (batch, positions, vocab) are compared where the attention mask is set; sequence
    classification logits (batch, labels) have no positions and are compared whole.
    """
    import torch

    expected.eval()
    actual.eval()
    with torch.inference_mode():
        a = expected(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        b = actual(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    if a.shape != b.shape:
        return math.inf
    if a.dim() == 2:
        return float((a - b).abs().max())
    mask = batch["attention_mask"].bool()
    return float((a - b).abs()[mask].max())


def verify_logged_model(
    model_uri: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    *,
    tolerance: float = MAX_LOGIT_DIFF,
    trust_remote_code: bool = False,
) -> float:
    """Load ``model_uri`` back from MLflow and check it reproduces ``model`` on ``texts``.

    Raises ModelVerificationError when the tokenizer encodes differently or the logits differ by
    more than ``tolerance``; returns the largest logit difference. The logged folder is checked
    first as every later load checks it (safetensors weights, no unapproved code).
    """
    import mlflow
    from sparktune.model_safety import check_model_tree, local_model_dir

    local = local_model_dir(model_uri)
    check_model_tree(local, trust_remote_code=trust_remote_code)
    loaded = mlflow.pyfunc.load_model(str(local)).unwrap_python_model()
    loaded_model, loaded_tokenizer = loaded.model, loaded.tokenizer
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


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def train(request: TrainRequest) -> TrainResult:
    """Fine-tune ``request.base_model`` on the dataset, log everything and the merged model to MLflow.

    Returns the result of an earlier FINISHED run with the same ``train_key`` (``reused=True``)
    instead of training again; resumes from the key's last checkpoint when there is one.
    """
    params = parse_params(request.params)
    check_hardware(params)
    resolved = resolve_recipe(params, request.base_model)
    params = resolved.params
    output_dir = Path(request.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with using_tracking_uri(request.mlflow_tracking_uri):
        result = _train_or_reuse(request, params, output_dir, resolved.summary())
    if _rank() == 0:
        _write_result(output_dir, result)
    return result


def resolve_recipe(params: PipelineParams, base_model: str) -> ResolvedRecipe:
    """Fill the recipe fields the run left unset from the base model's recipe, and say so."""
    from sparktune import recipes

    resolved = recipes.resolve(
        params, recipes.describe_base_model(base_model, trust_remote_code=params.trust_remote_code)
    )
    for line in recipes.format_recipe(resolved.summary()):
        logger.info(line)
    return resolved


def _train_or_reuse(
    request: TrainRequest, params: PipelineParams, output_dir: Path, recipe: dict[str, Any]
) -> TrainResult:
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=request.mlflow_tracking_uri)
    experiment_id = _experiment_id(client, request)
    previous = find_finished_run(client, experiment_id, request.train_key)
    if previous is not None:
        logger.info("Reusing finished run %s for train_key %s: nothing trained.", previous, request.train_key)
        return _reuse(previous)

    checkpoint = last_checkpoint(output_dir)
    if _rank() != 0:
        # Every rank trains; only rank 0 owns the MLflow run.
        splits = _training_splits(request, params)
        return _train_in_run(None, request, params, splits, output_dir, checkpoint, recipe)

    unfinished = _unfinished_runs(client, experiment_id, request.train_key)
    resume_run = unfinished[0] if unfinished and checkpoint is not None else None
    _close_abandoned_runs(client, [r for r in unfinished if r is not resume_run], request.train_key)
    train_ds, val_ds, n_train = _training_splits(request, params)
    if resume_run is not None:
        logger.info(
            "Resuming run %s of train_key %s from %s (step %d).",
            resume_run.info.run_id,
            request.train_key,
            checkpoint[0].name,
            checkpoint[1],
        )
        run_context = mlflow.start_run(run_id=resume_run.info.run_id)
    else:
        if checkpoint is not None:
            logger.info("No MLflow run left to resume; a new run continues from %s.", checkpoint[0].name)
        tags = {
            **{k: str(v) for k, v in request.tags.items()},
            TRAIN_KEY_TAG: request.train_key,
            CODE_VERSION_TAG: code_version(),
            CODE_FINGERPRINT_TAG: code_fingerprint(),
            "sparktune.base_model": request.base_model,
            "sparktune.peft_method": params.peft_method,
            "sparktune.dataset_path": request.dataset_path,
        }
        run_context = mlflow.start_run(
            experiment_id=experiment_id, run_name=request.run_name or None, tags=tags
        )
    with run_context as run:
        result = _train_in_run(
            run.info.run_id, request, params, (train_ds, val_ds, n_train), output_dir, checkpoint, recipe
        )
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
    columns = _task_columns(params)
    if params.dataset_mode == "streaming":
        from sparktune.streaming import open_streaming_splits

        try:
            return open_streaming_splits(request.dataset_path, list(columns))
        except FileNotFoundError as err:
            raise TrainingInputError(str(err)) from err
    dataset = _load_dataset(request.dataset_path, columns)
    train_ds = dataset["train"].select_columns(list(columns))
    return train_ds, dataset["validation"].select_columns(list(columns)), len(train_ds)


def _task_columns(params: PipelineParams) -> tuple[str, ...]:
    """The dataset columns the task trains on: prompt/completion for SFT, text/label for a classifier."""
    if params.task == "sequence_classification":
        from sparktune.classification import CLASSIFICATION_COLUMNS

        return CLASSIFICATION_COLUMNS
    return REQUIRED_COLUMNS


def _all_ranks_sum(*values: int) -> list[int]:
    """Sum per-process counters over the ranks (each rank saw its own share of every batch)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return list(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    counts = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(counts)
    return [int(v) for v in counts.tolist()]


def _first_logged_loss(run_id: str) -> float | None:
    from mlflow import MlflowClient

    history = MlflowClient().get_metric_history(run_id, "train_loss")
    return min(history, key=lambda m: m.step).value if history else None


def _train_in_run(
    run_id: str | None,
    request: TrainRequest,
    params: PipelineParams,
    splits: tuple[Any, Any, int],
    output_dir: Path,
    checkpoint: tuple[Path, int] | None,
    recipe: dict[str, Any],
) -> TrainResult:
    """Train (resuming from ``checkpoint``), then on rank 0 (``run_id`` set) log and verify the model."""
    import mlflow
    from transformers import PrinterCallback, set_seed

    main_process = run_id is not None
    classify = params.task == "sequence_classification"
    train_ds, val_ds, n_train = splits
    streaming = params.dataset_mode == "streaming"
    set_seed(params.seed)
    # The one switch for the base's own code (auto_map); weights load as safetensors only.
    trust = params.trust_remote_code
    tokenizer = _load_tokenizer(request.base_model, trust_remote_code=trust)
    if classify:
        from sparktune import classification

        labels = classification.label_names(train_ds, val_ds, request.dataset_path, streaming)
        # Saved with the tokenizer: evaluation and serving truncate texts as training did.
        tokenizer.model_max_length = params.max_length
        model = classification.load_classifier(
            request.base_model, tokenizer, params.peft_method, labels, trust_remote_code=trust
        )
    else:
        model = load_base_model(request.base_model, tokenizer, params.peft_method, trust_remote_code=trust)
        if params.packing:
            check_packing_isolation(model, tokenizer)

    trainer_cls, callback_cls = _make_trainer_classes()
    step_logger = callback_cls()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    stream_shards = getattr(train_ds, "num_shards", 0) if streaming else 0
    if classify:
        trainer = classification.build_trainer(
            model,
            tokenizer,
            params,
            output_dir,
            train_ds,
            val_ds,
            n_train,
            stream_shards=stream_shards,
            world_size=world_size,
            callbacks=[step_logger],
        )
    else:
        trainer = trainer_cls(
            model=model,
            args=_sft_config(params, output_dir, n_train, stream_shards, world_size=world_size),
            train_dataset=train_ds,
            eval_dataset=val_ds,
            processing_class=tokenizer,
            peft_config=lora_config_from_params(params) if params.peft_method in ("lora", "qlora") else None,
            callbacks=[step_logger],
        )
    if streaming:
        from sparktune.streaming import shuffle_stream

        in_workers = trainer.args.dataloader_num_workers > 0
        trainer.train_dataset = shuffle_stream(
            trainer.train_dataset, params.seed, read_in_worker_processes=in_workers
        )
    # The step logger writes each logging step to the task log already; PrinterCallback would repeat it.
    trainer.remove_callback(PrinterCallback)
    trainable, total = _count_params(trainer.model)
    world_size = trainer.args.world_size
    if main_process:
        mlflow.log_params({k: _param_value(v) for k, v in params.to_dict().items()})
        mlflow.log_params(
            {
                "base_model_resolved": request.base_model,
                "recipe": recipe["name"],
                # Which of the logged recipe values the run set (the rest came from the recipe).
                "recipe_set_by_user": ",".join(sorted(recipe["set_by_user"])) or "(none)",
                "dataset_path": request.dataset_path,
                "n_train": n_train,
                "n_validation": len(val_ds),
                "train_key": request.train_key,
            }
        )
        mlflow.log_metrics(
            {
                "trainable_params": trainable,
                "total_params": total,
                "trainable_percent": 100.0 * trainable / total,
                "world_size": world_size,
            }
        )
        if checkpoint is not None:
            mlflow.set_tag(RESUMED_FROM_TAG, str(checkpoint[1]))
            mlflow.log_metric("resumed_from_step", checkpoint[1], step=checkpoint[1])
    logger.info(
        "Training %s (%s, world size %d): %d of %d parameters trainable (%.3f%%), %d train / %d validation "
        "examples%s.",
        request.base_model,
        params.peft_method,
        world_size,
        trainable,
        total,
        100.0 * trainable / total,
        n_train,
        len(val_ds),
        f", resuming from {checkpoint[0].name}" if checkpoint else "",
    )

    started = time.perf_counter()
    train_output = trainer.train(resume_from_checkpoint=str(checkpoint[0]) if checkpoint else None)
    train_seconds = time.perf_counter() - started
    global_steps = int(train_output.global_step)

    real_tokens, padded_tokens = _all_ranks_sum(trainer.real_tokens, trainer.padded_tokens)
    tokens_per_second = real_tokens / train_seconds if train_seconds > 0 else 0.0
    padding_efficiency = real_tokens / padded_tokens if padded_tokens else 1.0
    # Collective under DDP: every rank evaluates its share of the validation split.
    val_loss = float(trainer.evaluate()["eval_loss"])
    if not main_process:
        return TrainResult(
            mlflow_run_id="",
            model_uri="",
            trainable_params=trainable,
            total_params=total,
            trainable_percent=100.0 * trainable / total,
            train_loss=float("nan"),
            initial_loss=float("nan"),
            tokens_per_second=tokens_per_second,
            padding_efficiency=padding_efficiency,
            train_seconds=train_seconds,
            global_steps=global_steps,
            val_loss=val_loss,
            recipe=recipe,
        )

    if not step_logger.losses and checkpoint is None:
        raise RuntimeError("Training logged no loss: the dataset yielded no training steps.")
    # After a resume the curve's start is in the run already, from the attempt that crashed.
    initial_loss = _first_logged_loss(run_id) if checkpoint else None
    if initial_loss is None:
        initial_loss = step_logger.losses[0][1]
    final_loss = step_logger.losses[-1][1] if step_logger.losses else initial_loss
    steps_this_attempt = global_steps - (checkpoint[1] if checkpoint else 0)
    mlflow.log_metrics(
        {
            "initial_loss": initial_loss,
            "final_train_loss": final_loss,
            "val_perplexity": math.exp(min(val_loss, 50.0)),
            "tokens_per_second": tokens_per_second,
            "padding_efficiency": padding_efficiency,
            "train_seconds": train_seconds,
            "seconds_per_step": train_seconds / max(steps_this_attempt, 1),
            "global_steps": global_steps,
            "steps_this_attempt": steps_this_attempt,
            "train_tokens": real_tokens,
        }
    )
    logger.info(
        "Trained %d steps (%d in this attempt) in %.1f s (%.3f s/step): loss %.4f -> %.4f, val_loss %.4f "
        "(perplexity %.3g), %.0f tokens/s, padding efficiency %.3f.",
        global_steps,
        steps_this_attempt,
        train_seconds,
        train_seconds / max(steps_this_attempt, 1),
        initial_loss,
        final_loss,
        val_loss,
        math.exp(min(val_loss, 50.0)),
        tokens_per_second,
        padding_efficiency,
    )

    sample = val_ds.take(4) if streaming else val_ds.select(range(min(4, len(val_ds))))
    texts = [row["text"] if classify else row["prompt"] + row["completion"] for row in sample]
    # The label set the model answers in: the head's order for a classifier, the candidates a
    # causal LM is scored on (labels it never saw in training could not be its answers).
    if not classify:
        from sparktune import classification

        # The training splits hold prompt and completion only here; the labels are on disk.
        if streaming:
            labels = classification.label_names(None, None, request.dataset_path, streaming)
        else:
            on_disk = _load_dataset(request.dataset_path, ("label",))
            labels = classification.label_names(
                on_disk["train"], on_disk["validation"], request.dataset_path, streaming
            )
    spec = {
        "task": params.task,
        "labels": list(labels),
        "prompt_template": "" if classify else params.prompt_template,
        # Whoever loads the model loads it as training did: its own code only if trusted here.
        "trust_remote_code": params.trust_remote_code,
    }
    adapter_uri = ""
    if params.peft_method != "full":
        # Before merging: merge_and_unload folds the adapter into the base, in place.
        adapter_uri = _log_adapter_model(run_id, trainer, request, params, output_dir, texts, spec)
    merged = _merge(
        trainer, params, request, output_dir, **(classification.model_kwargs(labels) if classify else {})
    )
    merged = _to_stored_dtype(merged, request.base_model, trust_remote_code=params.trust_remote_code)
    merged.eval()
    from sparktune import label_pyfunc

    merged_dir = output_dir / "merged"
    merged.save_pretrained(str(merged_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(merged_dir))
    model_uri = log_label_model(
        MODEL_ARTIFACT, {label_pyfunc.MERGED_ARTIFACT: merged_dir}, {**spec, "dtype": "auto"}
    )
    diff = verify_logged_model(
        model_uri, merged, tokenizer, texts, trust_remote_code=params.trust_remote_code
    )
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
        adapter_model_uri=adapter_uri,
        recipe=recipe,
    )


def label_model_kwargs(artifacts: dict[str, Path], config: dict[str, Any]) -> dict[str, Any]:
    """``mlflow.pyfunc.log_model``/``save_model`` arguments of the label pyfunc
    (:mod:`sparktune.label_pyfunc`).

    ``artifacts`` holds ``model`` (a merged ``save_pretrained`` folder with its tokenizer) or
    ``adapter`` (an adapter folder with its tokenizer, ``config["base_model"]`` naming the base);
    ``config`` is the pyfunc's ``model_config``: ``task``, ``labels``, ``prompt_template``,
    ``trust_remote_code``, ``dtype``. The scoring module goes with it (an artifact), so the model
    is served with the scoring it was evaluated with.
    """
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from sparktune import label_pyfunc, label_scoring

    return {
        "python_model": label_pyfunc.__file__,
        "artifacts": {
            **{key: str(folder) for key, folder in artifacts.items()},
            label_pyfunc.SCORING_ARTIFACT: label_scoring.__file__,
        },
        "model_config": config,
        "signature": ModelSignature(
            # Unnamed: a list of texts, or a DataFrame whose "text" (or only) column holds them.
            inputs=Schema([ColSpec("string")]),
            outputs=Schema([ColSpec("string", "prediction"), ColSpec("double", "score")]),
            params=ParamSchema([ParamSpec("batch_size", "long", label_pyfunc.DEFAULT_BATCH_SIZE)]),
        ),
        "pip_requirements": [*_pip_requirements(), *_package_pins(("peft", "mlflow", "pandas"))],
    }


def log_label_model(name: str, artifacts: dict[str, Path], config: dict[str, Any]) -> str:
    """Log weights as the label pyfunc (:func:`label_model_kwargs`) under the active run; returns
    ``runs:/<run>/<name>``."""
    import mlflow

    mlflow.pyfunc.log_model(name=name, **label_model_kwargs(artifacts, config))
    return f"runs:/{mlflow.active_run().info.run_id}/{name}"


def _log_adapter_model(
    run_id: str,
    trainer: Any,
    request: TrainRequest,
    params: PipelineParams,
    output_dir: Path,
    texts: list[str],
    spec: dict[str, Any],
) -> str:
    """Log the adapter as the label pyfunc over its base, load it back and compare it with the trained one.

    ``mlflow.pyfunc.load_model`` serves it wherever ``request.base_model`` (a hub id or a readable
    path) and peft are available.
    """
    import mlflow
    from sparktune import label_pyfunc

    adapter_dir = output_dir / ADAPTER_ARTIFACT
    trainer.model.save_pretrained(str(adapter_dir), safe_serialization=True)
    trainer.processing_class.save_pretrained(str(adapter_dir))
    config = {
        **spec,
        "base_model": request.base_model,
        # A QLoRA adapter is served over the 16-bit base (bitsandbytes is for training only).
        "dtype": "bfloat16" if params.peft_method == "qlora" else "float32",
    }
    uri = log_label_model(ADAPTER_MODEL_ARTIFACT, {label_pyfunc.ADAPTER_ARTIFACT: adapter_dir}, config)
    from sparktune.model_safety import check_model_tree, local_model_dir

    local = local_model_dir(uri)
    check_model_tree(local, trust_remote_code=params.trust_remote_code)
    loaded = mlflow.pyfunc.load_model(str(local)).unwrap_python_model()
    batch = _verification_batch(trainer.processing_class, texts)
    diff = max_logit_difference(trainer.model, loaded.model, batch)
    # QLoRA trained over the 4-bit base and is served over the 16-bit one: close, not equal.
    tolerance = 5e-2 if params.peft_method == "qlora" else MAX_LOGIT_DIFF
    if not diff <= tolerance:
        raise ModelVerificationError(
            f"The adapter model logged at {uri} does not reproduce the trained model: max logit "
            f"difference {diff:.3g} > {tolerance:g}; the run is marked FAILED."
        )
    mlflow.log_metric("adapter_model_max_logit_diff", diff)
    logger.info("Logged adapter model %s reloads with max logit difference %.2g.", uri, diff)
    return uri


def _to_stored_dtype(
    model: PreTrainedModel, base_model: str, *, trust_remote_code: bool = False
) -> PreTrainedModel:
    """The merged model in the dtype its base is stored in: 16-bit for hub LLMs, not a 2x float32 copy."""
    import torch
    from sparktune.model_safety import load_config

    try:
        config = load_config(base_model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return model
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    if stored in (torch.bfloat16, torch.float16) and model.dtype != stored:
        logger.info("Casting the merged model to the base's stored dtype %s.", stored)
        return model.to(stored)
    return model


def _merge(
    trainer: Any,
    params: PipelineParams,
    request: TrainRequest,
    output_dir: Path,
    auto_class: Any = None,
    **model_kwargs: Any,
) -> PreTrainedModel:
    """The trained weights as a plain transformers model; the adapter goes to ``adapter/`` too.

    ``auto_class`` and ``model_kwargs`` load the 16-bit base a QLoRA adapter merges into, as
    :func:`sparktune.training_setup.load_base_model` loaded it (default: a causal LM).
    """
    import mlflow

    model = trainer.model
    if params.peft_method == "full":
        return model
    adapter_dir = output_dir / ADAPTER_ARTIFACT
    model.save_pretrained(str(adapter_dir), safe_serialization=True)
    trainer.processing_class.save_pretrained(str(adapter_dir))
    mlflow.log_artifacts(str(adapter_dir), ADAPTER_ARTIFACT)
    if params.peft_method == "qlora":
        # Merging into the 4-bit base would round the adapter into its quantization grid and
        # degrade the model: merge into a 16-bit copy of the base instead.
        import torch
        from sparktune.model_safety import load_adapter, load_model
        from transformers import AutoModelForCausalLM

        auto_class = auto_class or AutoModelForCausalLM
        base = load_model(
            auto_class,
            request.base_model,
            trust_remote_code=params.trust_remote_code,
            dtype=torch.bfloat16,
            **model_kwargs,
        )
        base.config.pad_token_id = trainer.processing_class.pad_token_id
        return load_adapter(base, adapter_dir).merge_and_unload()
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
    "check_hardware",
    "check_packing_isolation",
    "code_version",
    "deepspeed_config",
    "find_finished_run",
    "configure_process_logging",
    "last_checkpoint",
    "load_finished_result",
    "main",
    "max_logit_difference",
    "train",
    "using_tracking_uri",
    "verify_logged_model",
]
