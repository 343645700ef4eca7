"""Recipes resolved from the base model: which recipe a model gets, and the run's own values win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sparktune.core.params import RECIPE_FIELDS, parse_params
from sparktune.model.recipes import (
    BUILT_HERE_RECORD,
    LARGE_MODEL_PARAMETERS,
    describe_base_model,
    estimate_parameters,
    format_recipe,
    resolve,
)

# The sizes of two published checkpoints' config.json (no hub here: written out by hand).
LLAMA_2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
    "hidden_act": "silu",
}
GPT2_SMALL = {
    "model_type": "gpt2",
    "n_embd": 768,
    "n_layer": 12,
    "vocab_size": 50257,
    "activation_function": "gelu_new",
}

# The two real checkpoints make bench-quality measures the recipes on (their config.json sizes).
SMOLLM2_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "hidden_act": "silu",
}
MINILM_L6 = {
    "model_type": "bert",
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_hidden_layers": 6,
    "vocab_size": 30522,
    "hidden_act": "gelu",
}


def _folder(tmp_path: Path, name: str, config: dict, *, built_here: bool = False) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if built_here:
        (folder / BUILT_HERE_RECORD).write_text("{}")
    return str(folder)


def test_parameter_estimates_are_close_to_the_published_sizes():
    assert estimate_parameters(LLAMA_2_7B) == pytest.approx(6.74e9, rel=0.03)
    assert estimate_parameters(GPT2_SMALL) == pytest.approx(124e6, rel=0.05)


@pytest.mark.parametrize(
    ("config", "built_here", "task", "method", "recipe", "learning_rate"),
    [
        (LLAMA_2_7B, True, "causal_lm", "lora", "built-in-causal-lm", 3e-3),
        (LLAMA_2_7B, True, "sequence_classification", "lora", "built-in-classifier", 2e-3),
        (LLAMA_2_7B, False, "causal_lm", "lora", "large-causal-lm", 2e-4),
        (LLAMA_2_7B, False, "causal_lm", "full", "large-causal-lm", 1e-5),
        (GPT2_SMALL, False, "causal_lm", "qlora", "small-causal-lm", 5e-4),
        (GPT2_SMALL, False, "sequence_classification", "full", "pretrained-classifier", 2e-5),
    ],
)
def test_each_kind_of_base_model_gets_its_recipe(
    tmp_path, config, built_here, task, method, recipe, learning_rate
):
    facts = describe_base_model(_folder(tmp_path, "model", config, built_here=built_here))
    assert facts.built_here is built_here
    assert (facts.parameters >= LARGE_MODEL_PARAMETERS) is (config is LLAMA_2_7B)
    resolved = resolve(parse_params({"task": task, "peft_method": method}), facts)
    assert resolved.recipe.name == recipe
    assert resolved.params.learning_rate == learning_rate
    assert set(resolved.from_recipe) == set(RECIPE_FIELDS) and resolved.set_by_user == {}
    assert all(getattr(resolved.params, name) not in (None, "auto") for name in RECIPE_FIELDS)


def test_the_built_in_recipe_is_the_one_measured_on_the_demo_data(tmp_path):
    facts = describe_base_model(_folder(tmp_path, "tiny", LLAMA_2_7B, built_here=True))
    params = resolve(parse_params({}), facts).params
    assert (params.lora_target_modules, params.lora_modules_to_save) == ("all-linear", "lm_head")
    assert (
        params.num_train_epochs,
        params.per_device_train_batch_size,
        params.gradient_accumulation_steps,
    ) == (
        3.0,
        16,
        2,
    )


@pytest.mark.parametrize(
    ("config", "task", "recipe", "values"),
    [
        # lr, epochs, batch, accumulation: make bench-quality's choices (recipes.py says why)
        (SMOLLM2_135M, "causal_lm", "small-causal-lm", (5e-4, 1.0, 16, 1)),
        (MINILM_L6, "sequence_classification", "pretrained-classifier", (2e-3, 3.0, 16, 2)),
    ],
)
def test_the_real_model_recipes_are_the_ones_measured_on_them(tmp_path, config, task, recipe, values):
    facts = describe_base_model(_folder(tmp_path, "model", config))
    resolved = resolve(parse_params({"task": task}), facts)
    params = resolved.params
    assert resolved.recipe.name == recipe
    assert (params.lora_target_modules, params.lora_modules_to_save) == ("all-linear", "")
    assert (
        params.learning_rate,
        params.num_train_epochs,
        params.per_device_train_batch_size,
        params.gradient_accumulation_steps,
    ) == values


def test_a_value_the_run_sets_always_wins(tmp_path):
    facts = describe_base_model(_folder(tmp_path, "tiny", LLAMA_2_7B, built_here=True))
    # "" for modules_to_save is a choice (none), not "unset"; 0.0 is a learning rate, not "unset".
    raw = {"learning_rate": 0.0, "lora_modules_to_save": "", "lora_target_modules": "q_proj,v_proj"}
    resolved = resolve(parse_params(raw), facts)
    assert resolved.params.learning_rate == 0.0
    assert resolved.params.lora_modules_to_save == ""
    assert resolved.params.lora_target_modules == "q_proj,v_proj"
    assert resolved.params.num_train_epochs == 3.0  # unset: from the recipe
    assert resolved.set_by_user == raw
    lines = format_recipe(resolved.summary())
    assert lines[0].startswith("Training recipe:   built-in-causal-lm")
    assert "num_train_epochs=3" in lines[1] and "learning_rate=0" in lines[2]


def test_the_built_in_base_model_is_recognised_by_its_build_record(tmp_path):
    from sparktune.model.base_model import RECORD_FILE

    assert RECORD_FILE == BUILT_HERE_RECORD  # the builder's record is what marks a model built here


def test_a_trainer_is_not_built_from_an_unresolved_recipe(tmp_path):
    from sparktune.model.training_setup import TrainingInputError, lora_config_from_params, trainer_arguments

    params = parse_params({})
    unset = r"recipe fields \['lora_target_modules'.*resolve_recipe"
    for build in (lambda: lora_config_from_params(params), lambda: trainer_arguments(params, tmp_path, 100)):
        with pytest.raises(TrainingInputError, match=unset):
            build()
    facts = describe_base_model(_folder(tmp_path, "tiny", LLAMA_2_7B, built_here=True))
    resolved = resolve(params, facts).params
    assert lora_config_from_params(resolved).target_modules == "all-linear"
