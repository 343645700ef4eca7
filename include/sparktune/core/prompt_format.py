"""The prompt a causal LM is fine-tuned and scored with, decided in one place.

An instruction-tuned model was trained on its own chat template (SmolLM2's ``<|im_start|>user``,
Llama 3's headers, Mistral's ``[INST]``): fine-tuning it on another format throws away what it
learned. So when a run leaves ``prompt_template`` empty and the base model's tokenizer has a chat
template, the prompt is that template rendered around one exchange: a user turn with a task
instruction that lists the allowed labels (:data:`DEFAULT_INSTRUCTION`), and the label as the
assistant's answer.

The rendering is turned into a plain template string with ``{text}`` and ``{label}``
(:func:`chat_prompt_template`), the same kind of string a user may set: Spark formats the
training rows with it, training logs it in the model's config, and evaluation, the smoke test,
batch scoring and the server build their prompts from the logged string
(:func:`sparktune.core.label_scoring.format_example`). One rendering, carried everywhere, so no
path can render it differently. The loss stays on the answer alone: the template's part before
``{label}`` is the prompt, the label and what closes the assistant turn the completion, and the
tokenizer's eos ends it (added by training and scoring, so it is cut from the template's tail).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sparktune.core.params import MISTRAL_INSTRUCT_TEMPLATE

# The user turn of a chat-template prompt. It names no domain (the same words fit tickets, reviews
# and e-mails) and lists the labels the model may answer, which an instruction-tuned model uses
# from the first step. Changing it changes every chat-template prompt, hence the data fingerprint.
DEFAULT_INSTRUCTION = "\n\n".join(
    (
        "Classify the text into exactly one of these labels: {labels}.",
        "Text: {text}",
        "Answer with the label only.",
    )
)
# Stand-ins rendered through the chat template, then replaced by the placeholders: a template may
# escape or trim what it is given, but leaves plain words alone.
_TEXT_MARK = "SPARKTUNEXTEXTMARK"
_LABEL_MARK = "SPARKTUNEXLABELMARK"


class PromptTemplateError(ValueError):
    """A chat template that cannot be turned into a prompt template; the message says the fix."""


def label_list(labels: Iterable[str]) -> list[str]:
    """The labels as a prompt lists them: distinct, sorted (the order materialize gives them)."""
    return sorted({str(label) for label in labels})


def folder_has_chat_template(tokenizer_path: str) -> bool | None:
    """Whether a local tokenizer folder carries a chat template, read from its files without loading
    transformers; None when ``tokenizer_path`` is not a local folder (a hub id: load it to know)."""
    folder = Path(str(tokenizer_path)).expanduser()
    if not folder.is_dir():
        return None
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    config = folder / "tokenizer_config.json"
    try:
        return bool(config.is_file() and json.loads(config.read_text()).get("chat_template"))
    except ValueError:
        return False


def chat_prompt_template(
    tokenizer: Any, labels: Iterable[str], instruction: str = DEFAULT_INSTRUCTION
) -> str:
    """The tokenizer's chat template rendered around one exchange, as a ``{text}``/``{label}`` template.

    The user turn is ``instruction`` with ``{labels}`` (comma-separated, sorted) and ``{text}``
    filled in; the assistant turn is the label. What follows the label is kept up to the eos token,
    which training and scoring append themselves. A BOS the template writes and the tokenizer adds
    anyway is dropped, so a prompt never starts with two.
    """
    user = instruction.replace("{labels}", ", ".join(label_list(labels))).replace("{text}", _TEXT_MARK)
    messages = [{"role": "user", "content": user}, {"role": "assistant", "content": _LABEL_MARK}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as exc:  # a Jinja template raises what it likes (TemplateError, ValueError, ...)
        raise PromptTemplateError(
            f"The base model's chat template failed to render a user and an assistant turn ({exc}): set "
            "the param prompt_template to a template with {text} and {label} in the model's own format."
        ) from exc
    if rendered.count(_TEXT_MARK) != 1 or rendered.count(_LABEL_MARK) != 1:
        raise PromptTemplateError(
            "The base model's chat template does not render the user's message and the assistant's answer "
            "once each, so no prompt can be cut from it: set the param prompt_template to a template with "
            "{text} and {label} in the model's own format."
        )
    before, after = rendered.split(_LABEL_MARK)
    if _TEXT_MARK not in before:
        raise PromptTemplateError(
            "The base model's chat template renders the assistant's answer before the user's message: set "
            "the param prompt_template to a template with {text} before {label}."
        )
    tail = after.rstrip()
    eos = getattr(tokenizer, "eos_token", None)
    if eos and tail.endswith(eos):
        tail = tail[: -len(eos)]
    bos = getattr(tokenizer, "bos_token", None)
    if bos and before.startswith(bos) and _adds_bos(tokenizer):
        before = before[len(bos) :]
    return before.replace(_TEXT_MARK, "{text}") + "{label}" + tail


def _adds_bos(tokenizer: Any) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def effective_prompt_template(prompt_template: str, tokenizer: Any, labels: Iterable[str]) -> str:
    """The template a run's prompts are built with.

    - ``prompt_template`` set: it, with ``{labels}`` (if present) filled with the label list;
    - else, a tokenizer with a chat template: :func:`chat_prompt_template`;
    - else the ``[INST]`` template (:data:`~sparktune.core.params.MISTRAL_INSTRUCT_TEMPLATE`).

    ``tokenizer`` may be None when ``prompt_template`` is set or the caller knows there is no chat
    template.
    """
    if prompt_template:
        return prompt_template.replace("{labels}", ", ".join(label_list(labels)))
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return chat_prompt_template(tokenizer, labels)
    return MISTRAL_INSTRUCT_TEMPLATE
