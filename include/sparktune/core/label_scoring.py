"""The one prediction path: a text in, one label of the model's label set and its probability out.

Evaluation (the number that promotes a model), the smoke test, batch inference over Spark, the
logged MLflow pyfunc (:mod:`sparktune.model.label_pyfunc`) and the serving endpoint all call
:func:`score_texts`, so the accuracy the gate sees is the accuracy users get.

A causal LM (``task=causal_lm``) scores every candidate label (constrained scoring): the prompt is
built with the training run's ``prompt_template`` (:func:`format_example`, the Python reference of
the Spark expression that built the training prompts), each candidate (its completion as training
built it, plus eos) gets the summed log-likelihood :func:`completion_loss` gives it, and the
prediction is the candidate with the highest; ``score`` is its probability after a softmax over
the candidates. It never answers outside the label set, and its score is a real probability, where
greedy generation can produce text that is no label and says nothing of its confidence (see
docs/decisions/0005-one-prediction-path.md). A batch runs its prompts through the model once and
reuses their KV cache for every candidate's tokens; prompts that fast path cannot score exactly (a
tokenizer merging the prompt's end with a label, a recurrent or short sliding-window cache) go
through :func:`completion_loss` itself. A sequence classifier predicts the argmax of its head
through ``config.id2label``; ``score`` is the softmax probability of that label.

Self-contained (the standard library, numpy, torch and transformers, imported lazily): the model
logs this file as its code (``code_paths``), so a served model carries the scoring it was gated on,
and a Spark worker or a server can import it without the rest of ``sparktune``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CAUSAL_LM, SEQUENCE_CLASSIFICATION = "causal_lm", "sequence_classification"


@dataclass(frozen=True)
class LabelSpec:
    """What turns a model's outputs into labels: its task, label set and (causal LM) prompt template."""

    task: str
    labels: tuple[str, ...]
    prompt_template: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(str(label) for label in self.labels))
        if self.task not in (CAUSAL_LM, SEQUENCE_CLASSIFICATION):
            raise ValueError(f"task must be {CAUSAL_LM!r} or {SEQUENCE_CLASSIFICATION!r}, got {self.task!r}")
        if self.task == CAUSAL_LM:
            if len(self.labels) < 2:
                raise ValueError(f"a causal LM needs at least two candidate labels, got {list(self.labels)}")
            if "{text}" not in self.prompt_template or "{label}" not in self.prompt_template:
                raise ValueError(
                    f"the prompt_template {self.prompt_template!r} needs {{text}} and {{label}}, "
                    "as the model was trained with"
                )


def format_example(template: str, text: str, label: str) -> tuple[str, str]:
    """(prompt, completion) for one row, in Python: the reference the Spark expression matches."""
    before, _, after = template.partition("{label}")
    filled = before.replace("{text}", text)
    prompt = filled.rstrip()
    return prompt, filled[len(prompt) :] + label + after


def fast_backend(tokenizer: Any) -> Any | None:
    """The Rust ``tokenizers.Tokenizer`` that a fast tokenizer's ``__call__`` runs, when calling it
    directly gives the ids the call gives (special tokens added, no truncation or padding); else None.

    ``backend.encode_batch_fast(texts, add_special_tokens=True)`` skips the character offsets and
    the Python ``BatchEncoding`` that transformers' call builds: the same ids for less CPU. A
    backend left truncating or padding, or splitting special tokens otherwise than the tokenizer
    says, would count differently (transformers sets those per call; a direct call cannot).
    """
    if hasattr(tokenizer, "encode_batch_fast"):  # already a bare tokenizers.Tokenizer
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        backend is None
        or not hasattr(backend, "encode_batch_fast")
        or backend.truncation is not None
        or backend.padding is not None
        or backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))
    ):
        return None
    return backend


def completion_token_ids(tokenizer: Any, prompt: str, completion: str) -> tuple[list, int]:
    """Token ids of prompt+completion+eos and where the completion starts, as TRL builds them."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    full_ids = tokenizer(prompt + completion + tokenizer.eos_token)["input_ids"]
    start = 0
    for a, b in zip(prompt_ids, full_ids, strict=False):
        if a != b:
            break
        start += 1
    return full_ids, start


def model_device(model: Any) -> Any:
    """Where the model's inputs go: its (first) weights' device, a CUDA GPU or the CPU."""
    device = getattr(model, "device", None)
    if device is not None:
        return device
    return next(model.parameters()).device


def on_model_device(model: Any) -> Any:
    """A context in which the tensors the scoring builds (``torch.tensor``, ``torch.zeros``, ...) are
    made on the model's device, so one code path scores on a GPU as on the CPU. On the CPU, where
    they are made anyway, nothing is entered (a default-device mode would add Python to every op)."""
    import contextlib

    import torch

    device = torch.device(model_device(model))
    return contextlib.nullcontext() if device.type == "cpu" else device


def completion_loss(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    completions: list[str],
    batch_size: int,
) -> tuple[list[float], list[int]]:
    """Per example: (summed cross-entropy over its completion tokens, number of those tokens)."""
    import torch

    losses: list[float] = []
    counts: list[int] = []
    pad_id = tokenizer.pad_token_id
    device = model_device(model)
    for begin in range(0, len(prompts), batch_size):
        rows = [
            completion_token_ids(tokenizer, p, c)
            for p, c in zip(
                prompts[begin : begin + batch_size], completions[begin : begin + batch_size], strict=True
            )
        ]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, (ids, start) in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attention[i, : len(ids)] = 1
            labels[i, start : len(ids)] = torch.tensor(ids[start:])
        logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits.float()
        shifted_labels = labels[:, 1:].to(device)
        token_losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), shifted_labels.reshape(-1), reduction="none"
        ).view(shifted_labels.shape)  # 0 where the label is -100
        losses.extend(token_losses.sum(dim=1).tolist())
        counts.extend((shifted_labels != -100).sum(dim=1).tolist())
    return losses, counts


def score_texts(
    model: Any, tokenizer: Any, texts: list[str], spec: LabelSpec, batch_size: int
) -> tuple[list[str], list[float]]:
    """(prediction, score) per text, in input order; texts are scored in length-sorted batches."""
    import numpy as np
    import torch

    if not texts:
        return [], []
    prompt_ids: list[list[int]] = []
    if spec.task == CAUSAL_LM:
        prompts = [format_example(spec.prompt_template, text, "")[0] for text in texts]
        # With special tokens, as completion_loss (and training) tokenizes a prompt: reused below.
        prompt_ids = _token_ids(tokenizer, prompts)
        lengths = [len(ids) for ids in prompt_ids]
    else:
        prompts = texts
        lengths = [len(ids) for ids in tokenizer(texts, truncation=True)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    predictions: list[str] = [""] * len(texts)
    scores: list[float] = [0.0] * len(texts)
    with torch.inference_mode(), on_model_device(model):
        for begin in range(0, len(order), batch_size):
            rows = [int(i) for i in order[begin : begin + batch_size]]
            batch = [prompts[i] for i in rows]
            if spec.task == CAUSAL_LM:
                labels, probs = _causal_lm_batch(model, tokenizer, batch, spec, [prompt_ids[i] for i in rows])
            else:
                labels, probs = _classifier_batch(model, tokenizer, batch)
            for i, label, prob in zip(rows, labels, probs, strict=True):
                predictions[i], scores[i] = label, prob
    return predictions, scores


def _token_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``tokenizer(texts)["input_ids"]`` (special tokens added, no truncation or padding), through
    the fast backend when that gives the same ids (:func:`fast_backend`)."""
    backend = fast_backend(tokenizer)
    if backend is None:
        return tokenizer(texts, return_attention_mask=False)["input_ids"]
    return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=True)]


_COMPLETIONS: dict[tuple[str, tuple[str, ...]], list[str]] = {}


def _completions(spec: LabelSpec) -> list[str]:
    """Each candidate's completion as training built it: the template's whitespace before {label},
    the label, the template's tail (eos is added by the caller). Built once per template and labels."""
    key = (spec.prompt_template, spec.labels)
    if key not in _COMPLETIONS:
        _COMPLETIONS[key] = [format_example(spec.prompt_template, "", label)[1] for label in spec.labels]
    return _COMPLETIONS[key]


def _causal_lm_batch(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    spec: LabelSpec,
    prompt_ids: list[list[int]] | None = None,
) -> tuple[list[str], list[float]]:
    """Each candidate label's log-likelihood after each prompt; softmax over the candidates.

    The numbers are those of :func:`completion_loss` (which tokenizes
    prompt + completion + eos as training did and scores the tokens after the prompt's), computed
    with one forward pass over the prompts and one over the candidates' tokens: see
    :func:`_shared_prompt_log_likelihood`. A prompt whose tokens are not a prefix of every
    prompt + completion (a tokenizer merging across the boundary) is scored by ``completion_loss``.
    """
    import torch

    n_labels = len(spec.labels)
    if prompt_ids is None:
        prompt_ids = _token_ids(tokenizer, prompts)
    eos = tokenizer.eos_token
    # One batched call for every prompt x candidate, as completion_loss tokenizes each pair.
    texts = [p + c + eos for p in prompts for c in _completions(spec)]
    joint = _token_ids(tokenizer, texts)
    shared: list[int] = []
    fallback: list[int] = []
    tails: list[list[int]] = []
    for i, ids in enumerate(prompt_ids):
        fulls = joint[i * n_labels : (i + 1) * n_labels]
        if len(ids) >= 2 and all(len(full) > len(ids) and full[: len(ids)] == ids for full in fulls):
            shared.append(i)
            tails.extend(full[len(ids) :] for full in fulls)
        else:
            fallback.append(i)
    log_likelihood = torch.zeros((len(prompts), n_labels), dtype=torch.float64)
    if shared:
        found = _shared_prompt_log_likelihood(
            model, [prompt_ids[i] for i in shared], tails, tokenizer.pad_token_id
        )
        if found is None:  # a model whose cache cannot be reused this way (see _cache_reusable)
            fallback, shared = sorted(fallback + shared), []
        else:
            log_likelihood[shared] = found.view(len(shared), n_labels)
    if fallback:
        completions = _completions(spec)
        losses, _ = completion_loss(
            model,
            tokenizer,
            [prompts[i] for i in fallback for _ in range(n_labels)],
            completions * len(fallback),
            len(fallback) * n_labels,
        )
        log_likelihood[fallback] = -torch.tensor(losses, dtype=torch.float64).view(len(fallback), n_labels)
    probs = torch.softmax(log_likelihood, dim=1)
    best = probs.argmax(dim=1)
    return [spec.labels[int(i)] for i in best], probs.max(dim=1).values.tolist()


def _shared_prompt_log_likelihood(
    model: Any, prompts: list[list[int]], tails: list[list[int]], pad_id: int | None
) -> Any:
    """Summed log-probability of each tail after its prompt: ``tails`` holds ``len(tails) //
    len(prompts)`` candidates per prompt, prompt-major. Returns a float64 tensor, one per tail, or
    None when the model's cache cannot be reused (:func:`_cache_reusable`).

    Pass 1 runs every prompt but its last token once (right-padded, ``use_cache=True``). Pass 2
    repeats that KV cache once per candidate and feeds ``[last prompt token] + tail[:-1]``, whose
    logits predict ``tail``. Position ids continue each prompt's own length and the attention mask
    hides the padding between a short prompt and its tail, so padding never reaches a real token;
    every row of pass 1 has at least one real token (prompts are at least two tokens), so no
    attention row is empty.
    """
    import inspect

    import torch

    n_prompts = len(prompts)
    per_prompt = len(tails) // n_prompts
    pad = 0 if pad_id is None else int(pad_id)
    prefix_width = max(len(ids) for ids in prompts) - 1
    prefix = torch.tensor([ids[:-1] + [pad] * (prefix_width + 1 - len(ids)) for ids in prompts])
    prefix_mask = torch.tensor(
        [[1] * (len(ids) - 1) + [0] * (prefix_width + 1 - len(ids)) for ids in prompts]
    )
    keep_one = (
        {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    )
    cache = model(input_ids=prefix, attention_mask=prefix_mask, use_cache=True, **keep_one).past_key_values
    width = max(len(tail) for tail in tails)
    if not _cache_reusable(cache, prefix_width + width):
        return None
    cache.batch_repeat_interleave(per_prompt)

    lasts = [prompts[row // per_prompt] for row in range(len(tails))]
    inputs = torch.tensor(
        [[ids[-1], *tail[:-1]] + [pad] * (width - len(tail)) for ids, tail in zip(lasts, tails, strict=True)]
    )
    targets = torch.tensor([tail + [0] * (width - len(tail)) for tail in tails])
    tail_mask = torch.tensor([[1] * len(tail) + [0] * (width - len(tail)) for tail in tails])
    starts = torch.tensor([len(ids) - 1 for ids in lasts])
    attention = torch.cat([prefix_mask.repeat_interleave(per_prompt, dim=0), tail_mask], dim=1)
    positions = starts[:, None] + torch.arange(width)[None, :]
    logits = model(
        input_ids=inputs,
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    ).logits.float()
    token_log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    return (token_log_probs * tail_mask).sum(dim=1, dtype=torch.float64)


def _cache_reusable(cache: Any, length: int) -> bool:
    """Whether ``cache`` holds plain attention keys and values over ``length`` positions, which a
    padding mask can hide. A recurrent state (linear attention, state-space layers) has absorbed
    the padding after a short prompt, and a sliding window shorter than ``length`` would count
    that padding as distance: those models are scored by ``completion_loss`` instead."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    if not layers or not hasattr(cache, "batch_repeat_interleave"):
        return False
    for layer in layers:
        if type(layer) is DynamicSlidingWindowLayer and length < layer.sliding_window:
            continue
        if type(layer) is not DynamicLayer:
            return False
    return True


def _classifier_batch(model: Any, tokenizer: Any, texts: list[str]) -> tuple[list[str], list[float]]:
    import torch

    id2label = {int(i): str(name) for i, name in model.config.id2label.items()}
    batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True)
    device = model_device(model)
    logits = model(
        input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
    ).logits.float()
    probs = torch.softmax(logits, dim=-1)
    best = probs.max(dim=-1)
    return [id2label[int(i)] for i in best.indices], best.values.tolist()
