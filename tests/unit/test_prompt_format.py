"""The prompt each model was made for: a base model's chat template rendered once into the template
string every path formats prompts with (preparation, training's logged config, scoring)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sparktune.core.label_scoring import completion_token_ids, format_example
from sparktune.core.params import MISTRAL_INSTRUCT_TEMPLATE, parse_params
from sparktune.core.prompt_format import (
    PromptTemplateError,
    chat_prompt_template,
    effective_prompt_template,
    folder_has_chat_template,
)

from tests.unit.conftest import make_tokenizer

# ChatML, as SmolLM2 and Qwen write it, with a BOS the tokenizer also adds itself.
CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer_path(tmp_path_factory) -> Path:
    """The unit tests' small BPE (it adds <s> itself) with ChatML markers and a chat template."""
    from transformers import AutoTokenizer

    folder = make_tokenizer(tmp_path_factory.mktemp("chat-tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    return folder


def test_chat_template_becomes_one_template_string(chat_tokenizer_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_tokenizer_path)
    template = chat_prompt_template(tokenizer, ["shipping", "billing", "billing"])
    # the BOS the template writes is dropped (the tokenizer adds one), the eos closing the answer
    # too (training and scoring append it): one <s>, one <|im_end|> after the label
    assert template == (
        "<|im_start|>user\nClassify the text into exactly one of these labels: billing, shipping.\n\n"
        "Text: {text}\n\nAnswer with the label only.<|im_end|>\n<|im_start|>assistant\n{label}"
    )
    prompt, completion = format_example(template, "my parcel is late", "shipping")
    assert prompt.endswith("<|im_start|>assistant") and completion == "\nshipping"
    ids, start = completion_token_ids(tokenizer, prompt, completion)
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[start:]) == "\nshipping<|im_end|>"  # the loss covers the answer alone


def test_effective_template_precedence(chat_tokenizer_path, tokenizer_path):
    from transformers import AutoTokenizer

    chat = AutoTokenizer.from_pretrained(chat_tokenizer_path)
    plain = AutoTokenizer.from_pretrained(tokenizer_path)
    labels = ["b", "a"]
    assert effective_prompt_template("", chat, labels) == chat_prompt_template(chat, labels)
    assert effective_prompt_template("", plain, labels) == MISTRAL_INSTRUCT_TEMPLATE
    assert effective_prompt_template("{text} -> {label}", chat, labels) == "{text} -> {label}"
    assert effective_prompt_template("One of {labels}: {text} => {label}", None, labels) == (
        "One of a, b: {text} => {label}"
    )
    assert folder_has_chat_template(str(chat_tokenizer_path)) is True
    assert folder_has_chat_template(tokenizer_path) is False
    assert folder_has_chat_template("org/hub-model") is None
    # an empty prompt_template is valid (the model's own format); a set one still needs both placeholders
    assert parse_params({"prompt_template": ""}).prompt_template == ""


def test_a_chat_template_that_cannot_carry_an_answer_is_refused(chat_tokenizer_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_tokenizer_path)
    tokenizer.chat_template = "{% for m in messages if m['role'] == 'user' %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(PromptTemplateError, match="set the param prompt_template"):
        chat_prompt_template(tokenizer, ["a", "b"])
    tokenizer.chat_template = "{{ raise_exception('system turns only') }}"
    with pytest.raises(PromptTemplateError, match="system turns only"):
        chat_prompt_template(tokenizer, ["a", "b"])


def test_prepare_formats_rows_with_the_chat_template_and_kept_labels(spark, chat_tokenizer_path):
    from sparktune.data.prepare import prepare
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_tokenizer_path)
    rows = [(f"message {i} about my billing question", "billing") for i in range(6)]
    rows += [(f"message {i} about a late shipping box", "shipping") for i in range(6)]
    rows += [("x" * 400, "account")]  # its only row is too long: the prompts never list it
    df = spark.createDataFrame(rows, "message string, intent_label string")
    params = parse_params({"quality_column": "", "max_length": 120, "max_chars": 1000})
    prepared = prepare(df, params, str(chat_tokenizer_path))
    try:
        kept = prepared.rows.collect()
        assert {r["label"] for r in kept} == {"billing", "shipping"}
        assert prepared.prompt_template == chat_prompt_template(tokenizer, ["billing", "shipping"])
        for row in kept:
            assert (row["prompt"], row["completion"]) == format_example(
                prepared.prompt_template, row["text"], row["label"]
            )
        # counted with the labels that passed the early checks (account among them): never under
        counted_with = chat_prompt_template(tokenizer, ["account", "billing", "shipping"])
        row = kept[0]
        prompt, completion = format_example(counted_with, row["text"], row["label"])
        assert row["n_tokens"] == len(tokenizer(prompt + completion)["input_ids"])
    finally:
        prepared.unpersist()


@pytest.mark.slow
def test_smollm2_prompt_is_its_chatml_with_the_label_answer(real_base_model):
    from sparktune.core.model_safety import load_tokenizer

    folder = real_base_model("smollm2-135m-instruct")
    tokenizer = load_tokenizer(folder, trust_remote_code=False)
    template = effective_prompt_template("", tokenizer, ["refund", "login"])
    assert template.startswith("<|im_start|>system\n")  # its own default system turn, kept
    assert "<|im_start|>user\nClassify the text into exactly one of these labels: login, refund." in template
    assert template.endswith("<|im_end|>\n<|im_start|>assistant\n{label}")
    prompt, completion = format_example(template, "I cannot sign in", "login")
    ids, start = completion_token_ids(tokenizer, prompt, completion)
    assert tokenizer.convert_ids_to_tokens(ids[start:]) == ["Ċ", "login", "<|im_end|>"]


def test_folder_without_chat_template_costs_no_tokenizer_load(tokenizer_path, tmp_path, monkeypatch):
    from sparktune.data import prepare as prepare_module

    copy = tmp_path / "tok"
    shutil.copytree(tokenizer_path, copy)

    def no_load(*args, **kwargs):
        raise AssertionError("a tokenizer without a chat template needs no transformers load on the driver")

    monkeypatch.setattr(prepare_module, "load_tokenizer", no_load)
    fmt = prepare_module._PromptFormat("", str(copy), False)
    assert fmt.template(lambda: ["a", "b"]) == MISTRAL_INSTRUCT_TEMPLATE
