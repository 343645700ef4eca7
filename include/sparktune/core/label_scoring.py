"""The one prediction path: a text in, one label of the model's label set and its probability out.

Evaluation (the number that promotes a model), the smoke test, batch inference over Spark, the
logged MLflow pyfunc (:mod:`sparktune.model.label_pyfunc`) and the serving endpoint all call
:func:`score_texts`, so the accuracy the gate sees is the accuracy users get. Evaluation takes the
same predictions from :func:`score_texts_with_loss`, with each true label's loss read from the
same forward passes (a causal LM's candidate scores hold it): a model is evaluated in one pass.

A causal LM (``task=causal_lm``) scores every candidate label (constrained scoring): the prompt is
built with the training run's ``prompt_template`` (:func:`format_example`, the Python reference of
the Spark expression that built the training prompts), each candidate (its completion as training
built it, plus eos) gets the summed log-likelihood :func:`completion_loss` gives it, and the
prediction is the candidate with the highest; ``score`` is its probability after a softmax over
the candidates. It never answers outside the label set, and its score is a real probability, where
greedy generation can produce text that is no label and says nothing of its confidence (see
docs/decisions/0005-one-prediction-path.md). A batch runs the tokens its prompts share (a chat
template's system turn and instructions) through the model once, then the rest of each prompt once,
and reuses that KV cache for every candidate's tokens; prompts that fast path cannot score exactly (a
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
    predictions, scores, _, _ = _score(model, tokenizer, texts, spec, batch_size, None)
    return predictions, scores


def score_texts_with_loss(
    model: Any, tokenizer: Any, texts: list[str], spec: LabelSpec, batch_size: int, targets: list[Any]
) -> tuple[list[str], list[float], list[float], list[int]]:
    """:func:`score_texts`'s (prediction, score) per text, and the loss of each text's target
    from the same forward passes: an evaluation needs both, and scoring a causal LM's candidates
    already computed the true label's log-likelihood, which is its loss.

    Causal LM: ``targets[i]`` is a (prompt, completion) row as training built it; its loss is
    what :func:`completion_loss` gives that pair (summed cross-entropy over the completion's tokens
    and eos, and their count). It is read from the candidates' scores when the prompt is the one
    scored for ``texts[i]`` and the completion is a candidate's, which is what a row of the model's
    own training data is. Any other row (a label the model has no candidate for, a template or a
    text other than the model's) goes through ``completion_loss``, those rows alone.

    Sequence classifier: ``targets[i]`` is a label; its loss is (cross-entropy, 1), or (0.0, 0)
    for a label the head does not have.
    """
    if len(targets) != len(texts):
        raise ValueError(f"one target per text: {len(texts)} texts, {len(targets)} targets")
    return _score(model, tokenizer, texts, spec, batch_size, targets)


def _score(
    model: Any, tokenizer: Any, texts: list[str], spec: LabelSpec, batch_size: int, targets: list[Any] | None
) -> tuple[list[str], list[float], list[float], list[int]]:
    """(prediction, score, target loss, target tokens) per text; no losses without ``targets``."""
    import numpy as np
    import torch

    if not texts:
        return [], [], [], []
    prompt_ids: list[list[int]] = []
    if spec.task == CAUSAL_LM:
        prompts = [format_example(spec.prompt_template, text, "")[0] for text in texts]
        # With special tokens, as completion_loss (and training) tokenizes a prompt: reused below.
        prompt_ids = _token_ids(tokenizer, prompts)
        lengths = [len(ids) for ids in prompt_ids]
    else:
        prompts = texts
        lengths = [len(ids) for ids in tokenizer(texts, truncation=True)["input_ids"]]
    # Per text, which candidate's numbers are its target's loss; None: computed apart (below).
    wanted = _target_candidates(model, spec, prompts, targets) if targets is not None else []
    order = np.argsort(lengths, kind="stable")
    predictions: list[str] = [""] * len(texts)
    scores: list[float] = [0.0] * len(texts)
    losses: list[float] = [0.0] * len(texts) if targets is not None else []
    counts: list[int] = [0] * len(texts) if targets is not None else []
    with torch.inference_mode(), on_model_device(model):
        for begin in range(0, len(order), batch_size):
            rows = [int(i) for i in order[begin : begin + batch_size]]
            batch = [prompts[i] for i in rows]
            if spec.task == CAUSAL_LM:
                labels, probs, log_likelihood, tokens = _causal_lm_batch(
                    model, tokenizer, batch, spec, [prompt_ids[i] for i in rows]
                )
            else:
                labels, probs, log_likelihood = _classifier_batch(model, tokenizer, batch)
                tokens = None
            for k, (i, label, prob) in enumerate(zip(rows, labels, probs, strict=True)):
                predictions[i], scores[i] = label, prob
                j = wanted[i] if targets is not None else None
                if j is not None:
                    losses[i] = -float(log_likelihood[k, j])
                    counts[i] = 1 if tokens is None else tokens[k][j]
        if targets is not None and spec.task == CAUSAL_LM:
            apart = [i for i, j in enumerate(wanted) if j is None]
            if apart:
                found, found_counts = completion_loss(
                    model,
                    tokenizer,
                    [str(targets[i][0]) for i in apart],
                    [str(targets[i][1]) for i in apart],
                    batch_size,
                )
                for i, loss, count in zip(apart, found, found_counts, strict=True):
                    losses[i], counts[i] = loss, count
    return predictions, scores, losses, counts


def _target_candidates(
    model: Any, spec: LabelSpec, prompts: list[str], targets: list[Any]
) -> list[int | None]:
    """Per text, the index of the candidate whose scored numbers are its target's loss, or None.

    A causal LM's candidate is (the prompt scored, a candidate's completion) + eos, tokenized as
    :func:`completion_loss` tokenizes a pair, so a target equal to it as strings has the same
    tokens and the same loss. A target that differs in either string (a label outside the model's
    set, a dataset built with another template, a text changed after its prompt was built) is not
    what was scored: None, and its loss is computed from its own strings. A classifier's candidate
    is its head's label of that name; a label it lacks is None, with no loss (0.0 over 0 tokens).
    """
    if spec.task == CAUSAL_LM:
        candidate = {}
        for j, completion in enumerate(_completions(spec)):
            candidate.setdefault(completion, j)
        return [
            candidate.get(str(completion)) if str(prompt) == scored else None
            for scored, (prompt, completion) in zip(prompts, targets, strict=True)
        ]
    head = {str(name): int(i) for i, name in model.config.id2label.items()}
    return [head.get(str(label)) for label in targets]


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
) -> tuple[list[str], list[float], Any, list[list[int]]]:
    """Each candidate label's log-likelihood after each prompt; softmax over the candidates.
    Returns the predictions, their probabilities, the log-likelihoods (prompts x candidates,
    float64) and how many tokens each sums over (what ``completion_loss`` counts for the pair).

    The numbers are those of :func:`completion_loss` (which tokenizes
    prompt + completion + eos as training did and scores the tokens after the prompt's), computed
    with a forward pass over what the batch's prompts share, one over the rest of each prompt and one
    over the candidates' tokens: see :func:`_shared_prompt_log_likelihood`. A prompt whose tokens
    are not a prefix of every prompt + completion (a tokenizer merging across the boundary) is
    scored by ``completion_loss``.
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
    # completion_loss counts a pair's tokens after its prompt's, here each tail's.
    counts: list[list[int]] = [[] for _ in prompts]
    for i, ids in enumerate(prompt_ids):
        fulls = joint[i * n_labels : (i + 1) * n_labels]
        if ids and all(len(full) > len(ids) and full[: len(ids)] == ids for full in fulls):
            shared.append(i)
            tails.extend(full[len(ids) :] for full in fulls)
            counts[i] = [len(full) - len(ids) for full in fulls]
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
        losses, found_counts = completion_loss(
            model,
            tokenizer,
            [prompts[i] for i in fallback for _ in range(n_labels)],
            completions * len(fallback),
            len(fallback) * n_labels,
        )
        log_likelihood[fallback] = -torch.tensor(losses, dtype=torch.float64).view(len(fallback), n_labels)
        for k, i in enumerate(fallback):
            counts[i] = found_counts[k * n_labels : (k + 1) * n_labels]
    probs = torch.softmax(log_likelihood, dim=1)
    best = probs.argmax(dim=1)
    return [spec.labels[int(i)] for i in best], probs.max(dim=1).values.tolist(), log_likelihood, counts


def _shared_prompt_log_likelihood(
    model: Any, prompts: list[list[int]], tails: list[list[int]], pad_id: int | None
) -> Any:
    """Summed log-probability of each tail after its prompt: ``tails`` holds ``len(tails) //
    len(prompts)`` candidates per prompt, prompt-major. Returns a float64 tensor, one per tail, or
    None when the model's cache cannot be reused (:func:`_cache_reusable`).

    Three forward passes, each over tokens no other pass sees:

    1. the tokens every prompt of the batch starts with (a chat template's system turn and
       instructions, often most of a prompt), once, in one row;
    2. the rest of each prompt and the tokens all of its candidates start with (a chat template's
       newline before the answer), left-padded after that shared start; its last positions' logits
       give those common tokens and every candidate's first token of its own;
    3. the candidates' other tokens as a prefix tree, one row per prompt over the cache of 1 and 2
       (:func:`_tails_in_one_row`): a token that several candidates reach by the same tokens is
       run once.

    Passes 2 and 3 run per group of prompts of similar lengths (:func:`_length_groups`), each
    over its own copy of pass 1's cache, so short prompts do not pay a long one's padding.
    Position ids count each prompt's own tokens and the attention mask hides the padding, so
    padding never reaches a real token. (Without a shared start, a left-padding row of pass 2
    attends to nothing: torch's attention gives it zeros, eager attention a uniform average, and
    no real token attends to it.)
    """
    import torch

    with torch.inference_mode():  # also lets pass 1's cache be copied per group (no autograd graph)
        return _cached_passes(model, prompts, tails, pad_id)


def _cached_passes(model: Any, prompts: list[list[int]], tails: list[list[int]], pad_id: int | None) -> Any:
    import copy

    import torch

    n_prompts = len(prompts)
    per_prompt = len(tails) // n_prompts
    groups = [tails[p * per_prompt : (p + 1) * per_prompt] for p in range(n_prompts)]
    # Every candidate keeps at least one token of its own, read from pass 2's last position.
    common = [min(_common_prefix_length(group), min(len(tail) for tail in group) - 1) for group in groups]
    extended = [ids + group[0][:k] for ids, group, k in zip(prompts, groups, common, strict=True)]
    # Every prompt keeps at least one token of its own for pass 2, whose logits are read.
    shared = min(_common_prefix_length(prompts), min(len(ids) for ids in prompts) - 1)
    longest = max(len(ids) for ids in extended) + max(len(tail) for tail in tails)
    keeps_logits = _keeps_logits(model)
    cache = None
    if shared:
        cache = model(
            input_ids=torch.tensor([prompts[0][:shared]]),
            use_cache=True,
            **({"logits_to_keep": 1} if keeps_logits else {}),
        ).past_key_values
        if not _cache_reusable(cache, longest):
            return None
    order = sorted(range(n_prompts), key=lambda p: len(extended[p]))
    spans = _length_groups([len(extended[p]) - shared for p in order], _call_cost_in_tokens(model))
    found = torch.zeros((n_prompts, per_prompt), dtype=torch.float64)
    for number, (begin, end) in enumerate(spans):
        members = order[begin:end]
        group_cache = cache if cache is None or number == len(spans) - 1 else copy.deepcopy(cache)
        sums = _rest_log_likelihood(
            model,
            group_cache,
            shared,
            [extended[p] for p in members],
            [(groups[p][0][: common[p]], [tail[common[p] :] for tail in groups[p]]) for p in members],
            0 if pad_id is None else int(pad_id),
            keeps_logits,
            longest,
        )
        if sums is None:
            return None
        found[members] = sums.view(len(members), per_prompt)
    return found.view(-1)


def _rest_log_likelihood(
    model: Any,
    cache: Any,
    shared: int,
    prompts: list[list[int]],
    candidates: list[tuple[list[int], list[list[int]]]],
    pad: int,
    keeps_logits: bool,
    longest: int,
) -> Any:
    """Passes 2 and 3 of :func:`_shared_prompt_log_likelihood` for some prompts, after ``cache``
    (pass 1's, over ``shared`` tokens, or None): per prompt, the tokens its candidates all start
    with (already at the end of its ids) and each candidate's tokens after them. Returns a float64
    tensor, one per candidate, prompt-major, or None when the cache cannot be reused."""
    import torch

    n_prompts = len(prompts)
    if cache is not None:
        cache.batch_repeat_interleave(n_prompts)
    per_prompt = len(candidates[0][1])
    tails = [tail for _, own in candidates for tail in own]
    keep = max(len(common) for common, _ in candidates) + 1
    rests = [ids[shared:] for ids in prompts]
    rest_width = max(len(rest) for rest in rests)
    inputs = torch.tensor([[pad] * (rest_width - len(rest)) + rest for rest in rests])
    rest_mask = torch.tensor([[0] * (rest_width - len(rest)) + [1] * len(rest) for rest in rests])
    prompt_mask = torch.cat([torch.ones((n_prompts, shared), dtype=torch.long), rest_mask], dim=1)
    positions = (shared + (rest_mask.cumsum(dim=1) - 1)).clamp(min=shared)
    out = model(
        input_ids=inputs,
        attention_mask=prompt_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        **({"logits_to_keep": keep} if keeps_logits else {}),
    )
    cache = out.past_key_values
    if not shared and not _cache_reusable(cache, longest):
        return None
    log_probs = torch.log_softmax(out.logits[:, -keep:].float(), dim=-1)
    firsts = torch.tensor([tail[0] for tail in tails])
    totals = log_probs[:, -1].repeat_interleave(per_prompt, dim=0).gather(1, firsts[:, None])[:, 0].double()
    if keep > 1:  # the common tokens: position keep - 1 - k + j of the kept ones predicts the j-th
        reads = [
            (p, keep - 1 - len(common) + j, token)
            for p, (common, _) in enumerate(candidates)
            for j, token in enumerate(common)
        ]
        rows, steps, targets = (torch.tensor(x) for x in zip(*reads, strict=True))
        common_sums = torch.zeros(n_prompts, dtype=torch.float64)
        common_sums.index_add_(0, rows, log_probs[rows, steps, targets].double())
        totals += common_sums.repeat_interleave(per_prompt)
    if max(len(tail) for tail in tails) == 1:
        return totals
    lengths = [len(ids) for ids in prompts]
    if getattr(model.config, "_attn_implementation", None) in _CUSTOM_MASK_ATTENTION:
        others = _tails_in_one_row(model, cache, prompt_mask, lengths, tails, per_prompt, pad)
    else:
        others = _tails_in_repeated_rows(model, cache, prompt_mask, lengths, tails, per_prompt, pad)
    return totals + others


def _call_cost_in_tokens(model: Any) -> float:
    """What one more group costs per forward call, in tokens of matrix work. On a CPU: the Python of
    a call (about 0.2 ms a layer) against a token's matrix work in a layer (about 24 x
    hidden_size**2 flops at some 30 GFLOP/s), and never under 16 tokens, which smaller matrices
    cost on SmolLM2 (576 wide: 16 gave its best rows/s; the 64-wide test model: about 60). On a
    GPU, where padding is nearly free until the device is full and every call launches its
    kernels again, 512 (not measured: groups only for very uneven batches)."""
    import torch

    if torch.device(model_device(model)).type != "cpu":
        return 512.0
    hidden = int(getattr(model.config, "hidden_size", 0) or 0)
    return max(16.0, 2.5e5 / hidden**2) if hidden else 16.0


def _length_groups(lengths: list[int], call_cost: float) -> list[tuple[int, int]]:
    """``[begin, end)`` spans of ``lengths`` (ascending) whose left-padded passes cost least: a
    group costs its size times its longest, plus two forward calls (``call_cost`` tokens each).
    Groups end only where the length changes (a cut between equal lengths only adds calls), so
    the search is quadratic in the distinct lengths, not in the batch."""
    n = len(lengths)
    ends = [i + 1 for i in range(n) if i == n - 1 or lengths[i] != lengths[i + 1]]
    best, cut = {0: 0.0}, {}
    for end in ends:
        best[end], cut[end] = min(
            (best[begin] + 2 * call_cost + (end - begin) * lengths[end - 1], begin)
            for begin in [0, *ends]
            if begin < end
        )
    spans = []
    while n:
        spans.append((cut[n], n))
        n = cut[n]
    return spans[::-1]


# Attention implementations that take a custom 4D mask as given (transformers' masking_utils).
_CUSTOM_MASK_ATTENTION = ("sdpa", "eager")


def _tails_in_one_row(
    model: Any,
    cache: Any,
    prompt_mask: Any,
    lengths: list[int],
    tails: list[list[int]],
    per_prompt: int,
    pad: int,
) -> Any:
    """Summed log-probability of ``tail[1:]`` for every tail, all of a prompt's candidates in one
    row after its cache, as a prefix tree: a slot per distinct ``tail[: d + 1]`` (``d`` below the
    tail's last token), holding its token ``tail[d]`` at the position it would have after the
    prompt alone, attending to the prompt and to its own ancestors (a 4D mask). Its logits give
    ``tail[d + 1]`` of every candidate through it. One row per prompt, so the cache is read as it
    is, never copied per candidate."""
    import torch

    n_prompts, past = prompt_mask.shape
    # Per prompt: its slots' tokens, positions and what each slot sees among the slots.
    row_ids: list[list[int]] = []
    row_steps: list[list[int]] = []
    row_sees: list[list[list[int]]] = []
    reads: list[tuple[int, int, int, int]] = []  # (prompt, slot, next token, candidate)
    for p, length in enumerate(lengths):
        slots: dict[tuple[int, ...], int] = {}
        ids: list[int] = []
        steps: list[int] = []
        sees: list[list[int]] = []  # each slot's ancestors and itself
        for c in range(p * per_prompt, (p + 1) * per_prompt):
            tail = tails[c]
            for d in range(len(tail) - 1):
                key = tuple(tail[: d + 1])
                slot = slots.get(key)
                if slot is None:
                    slot = slots[key] = len(ids)
                    ids.append(tail[d])
                    steps.append(length + d)
                    sees.append((sees[slots[key[:-1]]] if d else []) + [slot])
                reads.append((p, slot, tail[d + 1], c))
        row_ids.append(ids)
        row_steps.append(steps)
        row_sees.append(sees)
    width = max(len(ids) for ids in row_ids)
    # Built as lists, then one tensor each: a tensor per slot costs more than the tiny model's pass.
    inputs, positions, own = [], [], []
    for length, ids, steps, sees in zip(lengths, row_ids, row_steps, row_sees, strict=True):
        padding = width - len(ids)
        inputs.append(ids + [pad] * padding)
        positions.append(steps + [length] * padding)
        visible = [[False] * width for _ in range(width)]
        for slot, seen in enumerate(sees):
            for other in seen:
                visible[slot][other] = True
        for slot in range(len(ids), width):  # a padding slot sees itself alone
            visible[slot][slot] = True
        own.append(visible)
    inputs, positions, own = torch.tensor(inputs), torch.tensor(positions), torch.tensor(own)
    seen = torch.cat([prompt_mask.bool()[:, None, :].expand(n_prompts, width, past), own], dim=2)
    mask = seen[:, None]  # sdpa: True attends, in whatever dtype the attention computes
    if model.config._attn_implementation == "eager":  # eager adds the mask to its scores
        mask = torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)
    logits = model(
        input_ids=inputs, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
    ).logits.float()
    prompt_of, slot_of, next_token, candidate = (torch.tensor(x) for x in zip(*reads, strict=True))
    # log p = logit - logsumexp over the vocabulary, without a second (prompts, slots, vocab) tensor.
    token_log_probs = (
        logits[prompt_of, slot_of, next_token] - torch.logsumexp(logits, dim=-1)[prompt_of, slot_of]
    )
    sums = torch.zeros(n_prompts * per_prompt, dtype=torch.float64)
    return sums.index_add_(0, candidate, token_log_probs.double())


def _tails_in_repeated_rows(
    model: Any,
    cache: Any,
    prompt_mask: Any,
    lengths: list[int],
    tails: list[list[int]],
    per_prompt: int,
    pad: int,
) -> Any:
    """What :func:`_tails_in_one_row` gives, for attention implementations that take no custom
    mask: the cache repeated once per candidate, one right-padded row per candidate."""
    import torch

    width = max(len(tail) for tail in tails) - 1
    cache.batch_repeat_interleave(per_prompt)
    starts = [length for length in lengths for _ in range(per_prompt)]
    inputs = torch.tensor([tail[:-1] + [pad] * (width + 1 - len(tail)) for tail in tails])
    targets = torch.tensor([tail[1:] + [0] * (width + 1 - len(tail)) for tail in tails])
    tail_mask = torch.tensor([[1] * (len(tail) - 1) + [0] * (width + 1 - len(tail)) for tail in tails])
    attention = torch.cat([prompt_mask.repeat_interleave(per_prompt, dim=0), tail_mask], dim=1)
    positions = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
    token_log_probs = _target_log_probs(model, targets, inputs, attention, positions, cache)
    return (token_log_probs * tail_mask).sum(dim=1, dtype=torch.float64)


def _target_log_probs(model: Any, targets: Any, inputs: Any, mask: Any, positions: Any, cache: Any) -> Any:
    """log p(``targets``) at every position of ``inputs`` run after ``cache``."""
    import torch

    logits = model(
        input_ids=inputs, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
    ).logits.float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]


def _common_prefix_length(rows: list[list[int]]) -> int:
    """How many leading token ids every row shares."""
    first, *others = rows
    length = min(len(row) for row in rows)
    for other in others:
        length = next((i for i in range(length) if other[i] != first[i]), length)
        if not length:
            break
    return length


def _keeps_logits(model: Any) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (the last position's logits only)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


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


def _classifier_batch(model: Any, tokenizer: Any, texts: list[str]) -> tuple[list[str], list[float], Any]:
    """Predictions, their probabilities and the log-probabilities of every label of the head
    (texts x ``config.id2label`` ids: minus each its cross-entropy)."""
    import torch

    id2label = {int(i): str(name) for i, name in model.config.id2label.items()}
    batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True)
    device = model_device(model)
    logits = model(
        input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
    ).logits.float()
    probs = torch.softmax(logits, dim=-1)
    best = probs.max(dim=-1)
    return [id2label[int(i)] for i in best.indices], best.values.tolist(), torch.log_softmax(logits, dim=-1)
