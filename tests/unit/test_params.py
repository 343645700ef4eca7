from __future__ import annotations

import pytest
from annotated_types import Ge, Le
from sparktune.core.params import (
    FINGERPRINT_PARAMS,
    RECIPE_FIELDS,
    RUN_SWITCHES,
    SECTIONS,
    InvalidParamsError,
    PipelineParams,
    PromotionRules,
    TrainingRecipe,
    default_params,
    parse_params,
    validated,
)


def test_defaults_are_valid_and_leave_the_recipe_to_the_base_model():
    params = parse_params({})
    assert params.min_quality_score == 0.85
    assert (params.min_chars, params.max_chars, params.max_length, params.split_seed) == (20, 2048, 512, 42)
    assert (params.lora_r, params.lora_alpha, params.lora_dropout) == (16, 32, 0.05)
    assert params.prompt_template == ""  # the base model's chat template, else the [INST] one
    # Unset until training reads the base model (sparktune.model.recipes); a value the run sets is kept.
    assert (params.lora_target_modules, params.lora_modules_to_save) == ("auto", "auto")
    assert params.learning_rate is None and params.num_train_epochs is None
    assert parse_params({"learning_rate": None}).learning_rate is None
    assert parse_params({"learning_rate": 1e-3}).learning_rate == 1e-3
    with pytest.raises(InvalidParamsError, match="min_accuracy: Input should be a valid number"):
        parse_params({"min_accuracy": None})  # only the recipe fields may be left unset


def test_every_param_has_description_and_bounds():
    for name, field in PipelineParams.model_fields.items():
        assert field.description, name
        if field.annotation in (int, float, int | None, float | None) or "int" in str(field.annotation):
            (low,) = [m.ge for m in field.metadata if isinstance(m, Ge)]
            (high,) = [m.le for m in field.metadata if isinstance(m, Le)]
            if field.default is not None:  # None: a recipe field (sparktune.model.recipes)
                assert low <= field.default <= high, name


def test_each_param_belongs_to_one_section_and_the_whole_set_is_the_sections():
    names = [name for group in SECTIONS.values() for name in group.model_fields]
    assert len(names) == len(set(names)) == len(PipelineParams.model_fields)
    assert names == list(PipelineParams.model_fields)  # the form shows the sections in order
    params = parse_params({"gate_mode": "dry_run", "lora_r": 8})
    assert params.group(PromotionRules).gate_mode == "dry_run"
    assert params.group(TrainingRecipe).lora_r == 8


def test_the_groups_of_params_come_from_each_params_declaration():
    assert RECIPE_FIELDS == (
        "lora_target_modules",
        "lora_modules_to_save",
        "learning_rate",
        "num_train_epochs",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
    )
    assert {"force_retrain", "merge_feedback", "approval", "trust_remote_code"} <= RUN_SWITCHES
    assert "min_chars" in FINGERPRINT_PARAMS and "source_uri" not in FINGERPRINT_PARAMS
    assert not RUN_SWITCHES & set(FINGERPRINT_PARAMS)


def test_a_section_is_validated_on_its_own_and_refuses_names_it_does_not_have():
    rules = validated(PromotionRules, {"min_accuracy": 0.8})
    assert (rules.min_accuracy, rules.gate_mode) == (0.8, "enabled")  # the rest: defaults
    with pytest.raises(InvalidParamsError) as info:
        validated(PromotionRules, {"min_acuracy": 0.8, "gate_mode": "sometimes"})
    assert info.value.problems[0].startswith("gate_mode: Input should be 'enabled'")
    assert info.value.problems[1] == "min_acuracy: not a parameter of this task (a typo?)"
    with pytest.raises(InvalidParamsError, match="lora_target_modules: name at least one module"):
        validated(TrainingRecipe, {"lora_target_modules": " "})  # the section's own cross-field rule


def test_every_problem_is_reported_at_once():
    raw = {
        **default_params(),
        "min_chars": "ten",
        "max_length": 1,
        "gate_mode": "sometimes",
        "prompt_template": "{label} first {text}",
        "min_quality_score": 1.5,
    }
    with pytest.raises(InvalidParamsError) as info:
        parse_params(raw)
    message = str(info.value)
    for name in ("min_chars", "max_length", "gate_mode", "min_quality_score"):
        assert name in message
    assert len(info.value.problems) == 4  # cross-field checks wait until the types are right


def test_cross_field_rules():
    with pytest.raises(InvalidParamsError, match="min_chars .* above max_chars"):
        parse_params({"min_chars": 100, "max_chars": 50})
    with pytest.raises(InvalidParamsError, match=r"\{label\} must come after \{text\}"):
        parse_params({"prompt_template": "{label}: {text}"})
    with pytest.raises(InvalidParamsError, match="needs both"):
        parse_params({"prompt_template": "no placeholders"})


def test_integers_accept_integral_floats_but_not_bools():
    assert parse_params({"lora_r": 8.0}).lora_r == 8
    with pytest.raises(InvalidParamsError, match="lora_r"):
        parse_params({"lora_r": True})
    with pytest.raises(InvalidParamsError, match="lora_r"):
        parse_params({"lora_r": 8.5})


def test_an_emptied_optional_string_is_empty_and_a_required_one_is_refused():
    # The trigger form sends an emptied optional field as null.
    params = parse_params({"source_uri": None, "id_column": None, "lora_modules_to_save": None})
    assert (params.source_uri, params.id_column, params.lora_modules_to_save) == ("", "", "")
    with pytest.raises(InvalidParamsError) as info:
        parse_params({"text_column": None, "model_name": " ", "base_model": ""})
    assert info.value.problems == [
        f"{name}: must not be empty" for name in ("base_model", "model_name", "text_column")
    ]
