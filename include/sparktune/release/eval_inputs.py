"""What an evaluation reads: the model, loaded as the label pyfunc users load (whatever form it was
saved in), and one split of the dataset, checked to hold the columns the model's kind needs.
Unusable input raises :class:`EvaluationInputError` naming the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.model.classification import is_sequence_classifier

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

REQUIRED_COLUMNS = ("prompt", "completion", "label")


class EvaluationInputError(ValueError):
    """The model or the dataset cannot be evaluated; the message says how to fix it."""


@dataclass
class LabelScorer:
    """A model ready to predict through the pyfunc path: ``predict(texts)`` returns (labels, scores)
    exactly as ``mlflow.pyfunc.load_model(uri).predict`` does; ``model`` and ``tokenizer`` are the
    pyfunc's own, for the loss.

    ``predict_with_loss(texts, targets)``: the same predictions from the pyfunc's own scoring
    module, with each target's loss and token count from the same forward passes
    (``score_texts_with_loss`` of :mod:`sparktune.core.label_scoring`); None for a model whose
    logged scoring predates it, whose loss then takes a pass of its own."""

    predict: Callable[[list[str]], tuple[list[str], list[float]]]
    model: Any
    tokenizer: Any
    spec: Any
    predict_with_loss: (
        Callable[[list[str], list[Any]], tuple[list[str], list[float], list[float], list[int]]] | None
    ) = None


def load_label_model(
    model_uri: str,
    *,
    labels: list[str] | None = None,
    prompt_template: str | None = None,
    trust_remote_code: bool = False,
    batch_size: int = 32,
) -> LabelScorer:
    """The model at ``model_uri`` as the label pyfunc users load (:mod:`sparktune.model.label_pyfunc`).

    An MLflow model (``models:/name/3``, ``models:/name@champion``, ``runs:/<id>/model`` or its
    folder) is downloaded, checked (safetensors weights only; its own code only with
    ``trust_remote_code``, :mod:`sparktune.core.model_safety`) and loaded with
    ``mlflow.pyfunc.load_model``; predictions go through its ``predict``. A Hugging Face
    ``save_pretrained`` folder, or a model an earlier sparktune logged with MLflow's transformers
    flavour, carries no label set or prompt template: ``labels`` (a causal LM's candidates) and
    ``prompt_template`` (default: as the pipeline chooses it, the model's chat template when it has
    one) say them, and it is wrapped in the same pyfunc class.
    """
    import pandas as pd

    pyfunc, model, tokenizer = _load_any(model_uri, trust_remote_code)
    if pyfunc is None:  # a bare folder, or MLflow's transformers flavour (an earlier version)
        return _wrap(model, tokenizer, labels, prompt_template, batch_size)
    inner = pyfunc.unwrap_python_model()

    def predict(texts: list[str]) -> tuple[list[str], list[float]]:
        out = pyfunc.predict(pd.DataFrame({"text": texts}), params={"batch_size": batch_size})
        return [str(v) for v in out["prediction"]], [float(v) for v in out["score"]]

    return LabelScorer(
        predict,
        model,
        tokenizer,
        inner.spec,
        _with_loss(getattr(inner, "scoring", None), model, tokenizer, inner.spec, batch_size),
    )


def _with_loss(scoring: Any, model: Any, tokenizer: Any, spec: Any, batch_size: int) -> Callable | None:
    """``scoring.score_texts_with_loss`` on the pyfunc's model, tokenizer, spec and batch size, as
    its ``predict`` calls ``scoring.score_texts`` (under inference mode); None when the scoring
    module (a model's logged copy) has no such function."""
    score = getattr(scoring, "score_texts_with_loss", None)
    if score is None:
        return None

    def predict_with_loss(texts: list[str], targets: list[Any]) -> tuple:
        import torch

        with torch.inference_mode():
            return score(model, tokenizer, texts, spec, batch_size, targets)

    return predict_with_loss


def _load_any(model_uri: str, trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(the label pyfunc or None, model, tokenizer) of a Hugging Face folder (no pyfunc) or an
    MLflow model URI or folder (:func:`_load_mlflow_model`)."""
    local = Path(model_uri).expanduser()
    if local.is_dir() and not (local / "MLmodel").exists():
        if not (local / "config.json").exists():
            raise EvaluationInputError(
                f"{model_uri!r} is a folder but neither an MLflow model (no MLmodel file) nor a Hugging Face "
                "model (no config.json); pass a models:/ or runs:/ URI or a save_pretrained folder."
            )
        return None, *_load_folder(local, trust_remote_code)
    if "://" not in model_uri and ":/" not in model_uri and not local.exists():
        raise EvaluationInputError(
            f"Model {model_uri!r} is neither an existing folder nor an MLflow URI "
            "(models:/name/3, models:/name@champion, runs:/<run id>/model)."
        )
    return _load_mlflow_model(model_uri, trust_remote_code)


def _load_mlflow_model(model_uri: str, trust_remote_code: bool) -> tuple[Any, Any, Any]:
    """(the pyfunc or None, model, tokenizer) of an MLflow model: the label pyfunc, or a
    transformers-flavour model (no pyfunc of ours: None)."""
    import mlflow
    from sparktune.core import model_safety as safe

    # MLflow would load a class transformers lacks with trust_remote_code=True on its own: check first.
    downloaded = safe.local_model_dir(model_uri)
    safe.check_model_tree(downloaded, trust_remote_code=trust_remote_code)
    import yaml

    flavors = (yaml.safe_load((downloaded / "MLmodel").read_text()) or {}).get("flavors", {})
    if "transformers" in flavors:
        components = mlflow.transformers.load_model(str(downloaded), return_type="components")
        return None, components["model"], components["tokenizer"]
    # suppress_warnings skips MLflow's requirements check, which maps every installed distribution's
    # files to its modules (2 s a load, in every Spark worker and server start) only to warn; the
    # model's pinned requirements are in its folder for whoever installs it elsewhere.
    pyfunc = mlflow.pyfunc.load_model(str(downloaded), suppress_warnings=True)
    inner = pyfunc.unwrap_python_model()
    if not hasattr(inner, "spec"):
        raise EvaluationInputError(
            f"{model_uri!r} is a pyfunc of class {type(inner).__name__}, not sparktune's label model "
            "(sparktune.model.label_pyfunc); evaluate a model the llm_finetune DAG logged."
        )
    return pyfunc, inner.model, inner.tokenizer


def _load_folder(local: Path, trust_remote_code: bool) -> tuple[Any, Any]:
    from sparktune.core import model_safety as safe
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = safe.load_config(local, trust_remote_code=trust_remote_code)
    auto = AutoModelForSequenceClassification if is_sequence_classifier(config) else AutoModelForCausalLM
    return (
        safe.load_model(auto, local, trust_remote_code=trust_remote_code),
        safe.load_tokenizer(local, trust_remote_code=trust_remote_code),
    )


def _wrap(
    model: Any, tokenizer: Any, labels: list[str] | None, prompt_template: str | None, batch_size: int
) -> LabelScorer:
    """A bare model in the label pyfunc class, with the label set and template it cannot carry."""
    from sparktune.core import label_scoring
    from sparktune.core.params import MISTRAL_INSTRUCT_TEMPLATE

    if is_sequence_classifier(model):
        head = [str(model.config.id2label[i]) for i in sorted(model.config.id2label, key=int)]
        spec = label_scoring.LabelSpec(label_scoring.SEQUENCE_CLASSIFICATION, tuple(head))
    else:
        spec = label_scoring.LabelSpec(
            label_scoring.CAUSAL_LM, tuple(labels or ()), prompt_template or MISTRAL_INSTRUCT_TEMPLATE
        )
    return wrap_label_model(model, tokenizer, spec, batch_size)


def wrap_label_model(model: Any, tokenizer: Any, spec: Any, batch_size: int) -> LabelScorer:
    """``model`` and ``tokenizer`` in the label pyfunc class with ``spec`` (a
    :class:`sparktune.core.label_scoring.LabelSpec`): predictions as a logged model gives them."""
    import pandas as pd
    from sparktune.core import label_scoring
    from sparktune.model import label_pyfunc

    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    wrapped = label_pyfunc.LabelModel()
    wrapped.model, wrapped.tokenizer, wrapped.spec = model, tokenizer, spec
    wrapped.batch_size, wrapped.scoring = batch_size, label_scoring

    def predict(texts: list[str]) -> tuple[list[str], list[float]]:
        out = wrapped.predict(None, pd.DataFrame({"text": texts}))
        return [str(v) for v in out["prediction"]], [float(v) for v in out["score"]]

    return LabelScorer(
        predict, model, tokenizer, spec, _with_loss(label_scoring, model, tokenizer, spec, batch_size)
    )


def load_base_label_model(
    base_model: str,
    spec: Any,
    tokenizer: Any,
    *,
    trust_remote_code: bool = False,
    batch_size: int = 32,
) -> LabelScorer:
    """The causal LM a challenger was fine-tuned from (a folder or hub id), scored as the challenger
    is: ``spec``'s labels and prompt template (the challenger's, as it was logged), through
    ``tokenizer`` (the challenger's, already loaded: the same tokens in, only the weights differ).

    Loaded with :mod:`sparktune.core.model_safety` (safetensors only, its own code only with
    ``trust_remote_code``) in the dtype it is stored in, as the logged merged model is loaded.
    Raises :class:`EvaluationInputError` for a task other than ``causal_lm`` (a classifier's base
    has no trained head for these labels) or a folder that does not exist.
    """
    from sparktune.core import label_scoring
    from sparktune.core import model_safety as safe
    from transformers import AutoModelForCausalLM

    if spec.task != label_scoring.CAUSAL_LM:
        raise EvaluationInputError(
            f"Only a causal LM's base model is scored with its challenger's labels, not task={spec.task}: "
            "a base model has no trained classification head for them."
        )
    # The challenger's spec may be its logged scoring module's class: rebuild it as this one's.
    spec = label_scoring.LabelSpec(label_scoring.CAUSAL_LM, tuple(spec.labels), str(spec.prompt_template))
    local = Path(base_model).expanduser()
    if base_model.startswith(("/", ".", "~")) and not local.is_dir():
        raise EvaluationInputError(
            f"Base model folder {base_model!r} does not exist here; run evaluate where training ran (the "
            "resolve_base_model task builds the folder), or pass a Hugging Face hub id."
        )
    model = safe.load_model(
        AutoModelForCausalLM, base_model, trust_remote_code=trust_remote_code, dtype="auto"
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    return wrap_label_model(model, tokenizer, spec, batch_size)


def load_components(
    model_uri: str, *, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer of an MLflow model URI or folder, or a Hugging Face folder (checked as
    :func:`load_label_model` checks them)."""
    _, model, tokenizer = _load_any(model_uri, trust_remote_code)
    return model, tokenizer


def load_split(
    dataset_path: str, split: str, max_examples: int | None, required: tuple[str, ...] = REQUIRED_COLUMNS
) -> Dataset:
    """One split of a materialized dataset (or, ``dataset_mode=streaming``, of the prepared Parquet),
    its first ``max_examples`` rows (all when None), checked to hold the ``required`` columns.

    Raises :class:`EvaluationInputError` naming the fix for a missing dataset, split or column and
    for an empty split.
    """
    from datasets import DatasetDict, load_from_disk
    from sparktune.data.streaming import is_prepared_parquet, read_split

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
    require_columns(dataset, required, dataset_path, split)
    if max_examples is not None:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    if len(dataset) == 0:
        raise EvaluationInputError(f"Split {split!r} of {dataset_path!r} is empty: nothing to evaluate.")
    return dataset


def require_columns(dataset: Dataset, required: tuple[str, ...], dataset_path: str, split: str) -> None:
    """Raise :class:`EvaluationInputError` when ``split`` of the dataset lacks any ``required`` column."""
    missing = [c for c in required if c not in dataset.column_names]
    if missing:
        raise EvaluationInputError(
            f"Split {split!r} of {dataset_path!r} lacks columns {missing}; "
            "rebuild it with the materialize step."
        )


def label_strings(dataset: Dataset) -> tuple[list[str], list[str]]:
    """(label names in class order, the true label string of each example) of a split from
    :func:`load_split`: its ``ClassLabel`` names, or the sorted distinct labels (and completions)
    when the label column holds strings."""
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
