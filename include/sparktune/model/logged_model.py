"""The trained model as MLflow keeps it: merged (and its adapter) logged as the label pyfunc
(:mod:`sparktune.model.label_pyfunc`) with the packages serving needs, then loaded back and
checked to reproduce the trained model's logits.
"""

from __future__ import annotations

import logging
import math
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import PipelineParams

if TYPE_CHECKING:
    import torch
    from sparktune.model.train_request import TrainRequest
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

MODEL_ARTIFACT = "model"
ADAPTER_ARTIFACT = "adapter"
ADAPTER_MODEL_ARTIFACT = "adapter_model"
# What the logged text-generation model writes per prompt when served: a label and its eos.
GENERATED_TOKENS = 32
# The logged model must give the same logits as the one in memory, up to float noise.
MAX_LOGIT_DIFF = 1e-4
# Packages the serving side needs for a merged transformers model. Listed explicitly because the
# flavour's own inference looks for torchvision and fails when it is absent.
SERVING_PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "safetensors")


class ModelVerificationError(RuntimeError):
    """The model logged to MLflow does not reproduce the trained model's outputs."""


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
    from sparktune.core.model_safety import check_model_tree, local_model_dir

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


def label_model_kwargs(artifacts: dict[str, Path], config: dict[str, Any]) -> dict[str, Any]:
    """``mlflow.pyfunc.log_model``/``save_model`` arguments of the label pyfunc
    (:mod:`sparktune.model.label_pyfunc`).

    ``artifacts`` holds ``model`` (a merged ``save_pretrained`` folder with its tokenizer) or
    ``adapter`` (an adapter folder with its tokenizer, ``config["base_model"]`` naming the base);
    ``config`` is the pyfunc's ``model_config``: ``task``, ``labels``, ``prompt_template``,
    ``trust_remote_code``, ``dtype``. The scoring module goes with it (an artifact), so the model
    is served with the scoring it was evaluated with.
    """
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from sparktune.core import label_scoring
    from sparktune.model import label_pyfunc

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


def log_adapter_model(
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
    from sparktune.model import label_pyfunc

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
    from sparktune.core.model_safety import check_model_tree, local_model_dir

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


def to_stored_dtype(
    model: PreTrainedModel, base_model: str, *, trust_remote_code: bool = False
) -> PreTrainedModel:
    """The merged model in the dtype its base is stored in: 16-bit for hub LLMs, not a 2x float32 copy."""
    import torch
    from sparktune.core.model_safety import load_config

    try:
        config = load_config(base_model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return model
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    if stored in (torch.bfloat16, torch.float16) and model.dtype != stored:
        logger.info("Casting the merged model to the base's stored dtype %s.", stored)
        # Weights only, as from_pretrained(dtype=...) loads them (RoPE's inv_freq stays float32), and the
        # config says so: a reload with dtype "auto" otherwise computes in float32, ~1 away in the logits.
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.data = parameter.data.to(stored)
        model.config.dtype = stored
    return model


def merge_trained(
    trainer: Any,
    params: PipelineParams,
    request: TrainRequest,
    output_dir: Path,
    auto_class: Any = None,
    **model_kwargs: Any,
) -> PreTrainedModel:
    """The trained weights as a plain transformers model; the adapter goes to ``adapter/`` too.

    ``auto_class`` and ``model_kwargs`` load the 16-bit base a QLoRA adapter merges into, as
    :func:`sparktune.model.training_setup.load_base_model` loaded it (default: a causal LM).
    """
    import mlflow

    model = trainer.model
    if params.peft_method == "full":
        return model
    adapter_dir = save_adapter(trainer, output_dir)
    mlflow.log_artifacts(str(adapter_dir), ADAPTER_ARTIFACT)
    pad_token_id = trainer.processing_class.pad_token_id
    return merge_adapter(
        model, params, request.base_model, adapter_dir, pad_token_id, auto_class, **model_kwargs
    )


def save_adapter(trainer: Any, output_dir: Path) -> Path:
    """The trained adapter and its tokenizer saved (safetensors) to ``<output_dir>/adapter``."""
    adapter_dir = output_dir / ADAPTER_ARTIFACT
    trainer.model.save_pretrained(str(adapter_dir), safe_serialization=True)
    trainer.processing_class.save_pretrained(str(adapter_dir))
    return adapter_dir


def merge_adapter(
    model: Any,
    params: PipelineParams,
    base_model: str,
    adapter_dir: Path,
    pad_token_id: int | None,
    auto_class: Any = None,
    **model_kwargs: Any,
) -> PreTrainedModel:
    """The trained ``PeftModel`` folded into its base (no MLflow here): LoRA in place, QLoRA's adapter
    (saved in ``adapter_dir``) over a 16-bit copy of ``base_model`` whose padding is ``pad_token_id``."""
    if params.peft_method == "qlora":
        # Merging into the 4-bit base would round the adapter into its quantization grid and
        # degrade the model: merge into a 16-bit copy of the base instead.
        import torch
        from sparktune.core.model_safety import load_adapter, load_model
        from transformers import AutoModelForCausalLM

        auto_class = auto_class or AutoModelForCausalLM
        base = load_model(
            auto_class,
            base_model,
            trust_remote_code=params.trust_remote_code,
            dtype=torch.bfloat16,
            **model_kwargs,
        )
        base.config.pad_token_id = pad_token_id
        return load_adapter(base, adapter_dir).merge_and_unload()
    # Logging the PeftModel itself loses the base weights on load when the base is a local
    # folder (peft stores the base's name only); the merged model round-trips exactly.
    return model.merge_and_unload()
