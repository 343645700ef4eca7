"""The param ``precision``: bf16 autocast where the device computes bf16 natively, float32 elsewhere,
either one when the run says so; and the loss computed at the label positions alone under it."""

from __future__ import annotations

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _cpu_with(monkeypatch, **features: bool) -> None:
    """This process sees no GPU, and a CPU whose ``torch.cpu.get_capabilities()`` has ``features``."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"architecture": "x86_64", **features})


@pytest.mark.parametrize(
    ("features", "native"),
    [
        ({"avx512_bf16": True, "amx_bf16": False}, True),
        ({"avx512_bf16": False, "amx_bf16": True}, True),
        ({"bf16": True}, True),  # Arm
        ({"avx512_f": True, "avx512_bf16": False, "amx_bf16": False}, False),  # AVX-512 alone emulates bf16
        ({}, False),
    ],
)
def test_auto_is_bf16_exactly_where_the_cpu_computes_it(monkeypatch, features, native):
    from sparktune.model.training_setup import bf16_supported, resolve_precision

    _cpu_with(monkeypatch, **features)
    assert bf16_supported() is native
    assert resolve_precision("auto") == ("bf16" if native else "float32")
    # A setting other than auto is what the run gets, whatever the CPU.
    assert resolve_precision("bf16") == "bf16"
    assert resolve_precision("float32") == "float32"


def test_a_gpu_decides_by_its_own_bf16_support(monkeypatch):
    import torch
    from sparktune.model.training_setup import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True})
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_precision("auto") == "float32"  # the GPU trains, not the CPU


def test_a_torch_that_cannot_tell_trains_in_float32(monkeypatch):
    import torch
    from sparktune.model.training_setup import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    assert resolve_precision("auto") == "float32"


def test_the_param_is_an_enum_that_changes_the_config_hash_but_not_the_data():
    from sparktune.core.params import InvalidParamsError, PipelineParams, config_hash, parse_params
    from sparktune.data.fingerprint import preparation_params
    from sparktune_airflow.core.params import form_params

    field = PipelineParams.model_fields["precision"]
    assert field.default == "auto" and field.json_schema_extra["section"] == "Training"
    assert form_params(names=["precision"])["precision"].schema["enum"] == ["auto", "bf16", "float32"]
    assert parse_params({}).precision == "auto"
    with pytest.raises(InvalidParamsError, match="precision: Input should be 'auto', 'bf16' or 'float32'"):
        parse_params({"precision": "fp16"})
    with pytest.raises(InvalidParamsError, match="qlora computes in bf16"):
        parse_params({"precision": "float32", "peft_method": "qlora"})
    auto, float32 = parse_params({}), parse_params({"precision": "float32"})
    # A float32 model and a bf16 one are different models: a different training key ...
    assert config_hash(auto) != config_hash(float32)
    # ... from the same data.
    assert preparation_params(auto) == preparation_params(float32)


@pytest.mark.parametrize(("precision", "bf16"), [("bf16", True), ("float32", False)])
def test_training_arguments_carry_the_resolved_precision(tmp_path, monkeypatch, precision, bf16):
    from sparktune.core.params import parse_params
    from sparktune.model.classification import build_trainer
    from sparktune.model.sft_trainer import sft_config

    _cpu_with(monkeypatch, avx512_bf16=False)  # auto would be float32: the param decides
    params = _params(precision=precision)
    assert sft_config(params, tmp_path, n_train=64).bf16 is bf16
    auto = sft_config(_params(), tmp_path, n_train=64)
    assert auto.bf16 is False and auto.use_cpu is True
    assert parse_params({"precision": precision}).precision == precision

    # The classifier's Trainer gets the same flag.
    model, tokenizer = _tiny_classifier(tmp_path)
    rows = [
        {"text": "invoice charged twice", "label": "billing"},
        {"text": "parcel late", "label": "shipping"},
    ]
    from datasets import Dataset

    trainer = build_trainer(
        model, tokenizer, params, tmp_path / "cls", Dataset.from_list(rows), Dataset.from_list(rows), 2
    )
    assert trainer.args.bf16 is bf16


def test_a_bf16_step_on_the_cpu_autocasts_and_scores_only_the_label_positions(root, tmp_path):
    """One optimizer step and the validation loss under precision=bf16 (emulated where the CPU has no
    bf16: it runs either way). The matmuls run in bf16, the weights stay float32, and neither the
    training loss nor the validation loss asks the LM head for the prompt positions' logits."""
    import torch
    from datasets import load_from_disk
    from sparktune.model.sft_trainer import make_trainer_classes, sft_config
    from sparktune.model.train_inputs import load_train_tokenizer
    from sparktune.model.training_setup import load_base_model, lora_config_from_params

    params = _params(precision="bf16", max_steps=1)
    tokenizer = load_train_tokenizer(str(root / "model"))
    model = load_base_model(str(root / "model"), tokenizer)
    data = load_from_disk(str(root / "data"))
    train = data["train"].select(range(16)).select_columns(["prompt", "completion"])
    validation = data["validation"].select(range(8)).select_columns(["prompt", "completion"])
    trainer_cls, _ = make_trainer_classes()
    trainer = trainer_cls(
        model=model,
        args=sft_config(params, tmp_path, n_train=len(train)),
        train_dataset=train,
        eval_dataset=validation,
        processing_class=tokenizer,
        peft_config=lora_config_from_params(params),
    )
    assert trainer.args.bf16 is True

    # Per forward: the sequence length the model embeds, then the positions and dtype of the LM head.
    lengths: list[int] = []
    seen: list[tuple[int, int, torch.dtype, bool]] = []
    base = trainer.model.get_base_model()
    hooks = [
        base.get_input_embeddings().register_forward_hook(
            lambda module, args, output: lengths.append(args[0].shape[1])
        ),
        base.get_output_embeddings().register_forward_hook(
            lambda module, args, output: seen.append(
                (lengths[-1], args[0].shape[1], output.dtype, module.training)
            )
        ),
    ]
    try:
        output = trainer.train()
        metrics = trainer.evaluate()
    finally:
        for hook in hooks:
            hook.remove()

    assert output.global_step == 1 and torch.isfinite(torch.tensor(output.training_loss))
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
    assert trainer.real_tokens > 0
    assert any(training for *_, training in seen) and any(not training for *_, training in seen)
    # Autocast: the LM head's matmul ran in bf16, in training and validation alike.
    assert {dtype for _, _, dtype, _ in seen} == {torch.bfloat16}
    # Only the positions that predict a label token (shared by the batch), never every position.
    assert all(kept < length for length, kept, _, _ in seen), seen
    # The weights and the adapters stay float32 (autocast casts per operation).
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}

    # The validation loss is the mean cross-entropy of the label tokens, as the full logits give it.
    batch = trainer.data_collator([trainer.eval_dataset[i] for i in range(len(trainer.eval_dataset))])
    trainer.model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.size(-1)),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
    )
    assert metrics["eval_loss"] == pytest.approx(float(expected), rel=2e-2)


def _params(**overrides):
    from sparktune.core.params import default_params, parse_params

    raw = default_params()
    raw.update(
        lora_target_modules="q_proj,v_proj",
        lora_modules_to_save="",
        learning_rate=1e-3,
        num_train_epochs=1.0,
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        warmup_ratio=0.0,
        max_length=128,
        max_steps=2,
    )
    raw.update(overrides)
    return parse_params(raw)


def _tiny_classifier(folder):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tokenizer = tiny_model.build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=2,
        id2label={0: "billing", 1: "shipping"},
        label2id={"billing": 0, "shipping": 1},
    )
    return LlamaForSequenceClassification(config), tokenizer
