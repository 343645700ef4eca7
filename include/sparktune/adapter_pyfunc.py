"""MLflow model-from-code: a LoRA/QLoRA adapter served over its base model, as a pyfunc.

``mlflow.transformers.log_model`` of a ``PeftModel`` stores the adapter and the *name* of the
base; for a base in a local folder it loads back with the base's adapted weights missing and
re-initialised at random, silently (DESIGN.md). This file is logged as the model's code instead
(self-contained: it needs torch, transformers, peft and mlflow, not sparktune). Loading reads the
base from ``model_config["base_model"]`` (a hub id, or a path the serving host can read) and
applies the adapter logged as the artifact ``adapter``.

Loading is safe as in ``sparktune.model_safety`` (this file cannot import it): weights as
safetensors only (``use_safetensors=True``; an adapter without ``adapter_model.safetensors`` is
refused), and the base's or tokenizer's own Python code runs only when ``model_config`` says
``trust_remote_code: true``, which training records from its ``trust_remote_code`` param.

``predict`` takes prompts (a list of strings, or a DataFrame with a ``prompt`` or ``text``
column) and returns the label each gets: the greedy completion for a causal LM, the arg max of
the head through ``id2label`` for a sequence classifier.
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel

CAUSAL_LM = "causal_lm"
SEQUENCE_CLASSIFICATION = "sequence_classification"


def _prompts(model_input: Any) -> list[str]:
    if hasattr(model_input, "columns"):
        for column in ("prompt", "text"):
            if column in model_input.columns:
                return [str(v) for v in model_input[column]]
        return [str(v) for v in model_input.iloc[:, 0]]
    if isinstance(model_input, str):
        return [model_input]
    return [str(v) for v in model_input]


class AdapterModel(PythonModel):
    def load_context(self, context):
        from pathlib import Path

        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        config = context.model_config
        adapter_dir = context.artifacts["adapter"]
        trust = config.get("trust_remote_code") is True
        load = {"trust_remote_code": trust, "use_safetensors": True}
        if not (Path(adapter_dir) / "adapter_model.safetensors").is_file():
            raise ValueError(
                f"The adapter at {adapter_dir} has no adapter_model.safetensors; pickled weights "
                "(adapter_model.bin) are not loaded because they can run code. Fix: load it with peft where "
                "you trust the files and save_pretrained() it again (peft writes safetensors)."
            )
        self.task = config.get("task", CAUSAL_LM)
        self.tokenizer = AutoTokenizer.from_pretrained(adapter_dir, trust_remote_code=trust)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = getattr(torch, config.get("dtype", "float32"))
        if self.task == SEQUENCE_CLASSIFICATION:
            labels = config["labels"]
            base = AutoModelForSequenceClassification.from_pretrained(
                config["base_model"],
                **load,
                dtype=dtype,
                num_labels=len(labels),
                id2label=dict(enumerate(labels)),
                label2id={name: i for i, name in enumerate(labels)},
            )
        else:
            base = AutoModelForCausalLM.from_pretrained(config["base_model"], **load, dtype=dtype)
        base.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = PeftModel.from_pretrained(base, adapter_dir)
        self.model.eval()
        self.max_new_tokens = int(config.get("max_new_tokens", 16))

    # No type hints on predict: MLflow would derive a schema from them; the logged signature says it.
    def predict(self, context, model_input, params=None):
        import torch

        prompts = _prompts(model_input)
        if not prompts:
            return []
        if self.task == SEQUENCE_CLASSIFICATION:
            self.tokenizer.padding_side = "right"
            batch = self.tokenizer(prompts, return_tensors="pt", padding=True, truncation=True)
            with torch.inference_mode():
                logits = self.model(**batch).logits
            id2label = self.model.config.id2label
            return [id2label[int(i)] for i in logits.argmax(dim=-1)]
        # Left padding: every prompt ends where generation starts.
        self.tokenizer.padding_side = "left"
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True)
        max_new = int((params or {}).get("max_new_tokens", self.max_new_tokens))
        with torch.inference_mode():
            out = self.model.generate(
                **batch,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )
        new_tokens = out[:, batch["input_ids"].shape[1] :]
        return [text.strip() for text in self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


mlflow.models.set_model(AdapterModel())
