"""MLflow model-from-code: a fine-tuned classifier as a pyfunc that answers a label and its probability.

Every model version the pipeline registers is this pyfunc, so ``mlflow.pyfunc.load_model(
"models:/NAME@champion")``, the evaluation that gated it, batch inference over Spark and the
serving endpoint all predict through :func:`sparktune.core.label_scoring.score_texts`. The scoring
module is logged with the model (the ``scoring_code`` artifact): a served model carries the
scoring it was gated on, and loads without ``sparktune`` installed.

Two kinds of weights, told apart by the artifact logged:

- ``model``: a merged model and its tokenizer, ``save_pretrained`` folders (full fine-tuning, or
  LoRA merged into its base);
- ``adapter``: a LoRA/QLoRA adapter and its tokenizer, applied over the base named in
  ``model_config["base_model"]`` (a hub id or a path the serving host can read).
  ``mlflow.transformers.log_model`` of a ``PeftModel`` would store the base's *name* only and, for a
  base in a local folder, load it back with the adapted weights re-initialised.

Loading is safe as in ``sparktune.core.model_safety`` (this file cannot import it: it must load where
only torch, transformers, peft and mlflow are installed): weights as safetensors only, and the
model's or tokenizer's own Python code runs only when ``model_config`` says
``trust_remote_code: true``, which training records from its ``trust_remote_code`` param.

``predict`` takes texts (a DataFrame with a ``text`` column, or one column; a list of strings; a
string) and returns a DataFrame with ``prediction`` (always one of the model's labels) and
``score`` (its probability), one row per text, in order. The ``batch_size`` param sets how many
texts go through the model at once (default ``model_config["batch_size"]``, else 32).
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel

MERGED_ARTIFACT, ADAPTER_ARTIFACT = "model", "adapter"
# label_scoring.py as logged with the model: the scoring it was evaluated with.
SCORING_ARTIFACT = "scoring_code"
DEFAULT_BATCH_SIZE = 32


def scoring_module(path: str) -> Any:
    """The scoring module logged with a model, imported from its file under a name of its own.

    Not ``code_paths``: MLflow puts those folders first on ``sys.path``, where the first model a
    process loads would lend its ``label_scoring`` to every later one (a server switching to a
    version logged with newer scoring would keep the old). Named by content, each version gets the
    code it was logged with, and identical copies are imported once.
    """
    import hashlib
    import importlib.util
    import sys
    from pathlib import Path

    name = f"_sparktune_label_scoring_{hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def texts_of(model_input: Any) -> list[str]:
    """The texts of a pyfunc input: a ``text`` column (else the only column), a list, or a string."""
    if hasattr(model_input, "columns"):
        if "text" in model_input.columns:
            column = model_input["text"]
        elif len(model_input.columns) == 1:
            column = model_input.iloc[:, 0]
        else:
            raise ValueError(
                f"Send the texts in a column named 'text'; got the columns {list(model_input.columns)}."
            )
        return ["" if value is None else str(value) for value in column]
    if isinstance(model_input, str):
        return [model_input]
    return [str(value) for value in model_input]


class LabelModel(PythonModel):
    """The pyfunc. After ``load_context``: ``model``, ``tokenizer``, ``spec``, ``batch_size`` and
    ``scoring`` (the module whose ``score_texts`` predicts)."""

    def load_context(self, context: Any) -> None:
        from pathlib import Path

        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        self.scoring = label_scoring = scoring_module(context.artifacts[SCORING_ARTIFACT])
        config = dict(context.model_config or {})
        trust = config.get("trust_remote_code") is True
        load = {"trust_remote_code": trust, "use_safetensors": True}
        self.spec = label_scoring.LabelSpec(
            task=config.get("task", label_scoring.CAUSAL_LM),
            labels=tuple(config.get("labels") or ()),
            prompt_template=config.get("prompt_template", ""),
        )
        self.batch_size = int(config.get("batch_size", DEFAULT_BATCH_SIZE))
        classify = self.spec.task == label_scoring.SEQUENCE_CLASSIFICATION
        auto = AutoModelForSequenceClassification if classify else AutoModelForCausalLM
        dtype = config.get("dtype", "auto")
        dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        if MERGED_ARTIFACT in context.artifacts:
            folder = context.artifacts[MERGED_ARTIFACT]
            self.tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)
            self.model = auto.from_pretrained(folder, **load, dtype=dtype)
        else:
            from peft import PeftModel

            folder = context.artifacts[ADAPTER_ARTIFACT]
            if not (Path(folder) / "adapter_model.safetensors").is_file():
                raise ValueError(
                    f"The adapter at {folder} has no adapter_model.safetensors; pickled weights "
                    "(adapter_model.bin) are not loaded because they can run code. Fix: load it with peft "
                    "where you trust the files and save_pretrained() it again (peft writes safetensors)."
                )
            self.tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)
            head = {}
            if classify:
                labels = list(self.spec.labels)
                head = {
                    "num_labels": len(labels),
                    "id2label": dict(enumerate(labels)),
                    "label2id": {name: i for i, name in enumerate(labels)},
                }
            base = auto.from_pretrained(config["base_model"], **load, dtype=dtype, **head)
            self.model = PeftModel.from_pretrained(base, folder)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval()

    # No type hints on predict: MLflow would derive a schema from them; the logged signature says it.
    def predict(self, context, model_input, params=None):
        import pandas as pd
        import torch

        texts = texts_of(model_input)
        batch_size = int((params or {}).get("batch_size") or self.batch_size)
        with torch.inference_mode():
            predictions, scores = self.scoring.score_texts(
                self.model, self.tokenizer, texts, self.spec, batch_size
            )
        return pd.DataFrame({"prediction": predictions, "score": scores})


mlflow.models.set_model(LabelModel())
