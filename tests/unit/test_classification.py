"""task=sequence_classification end to end: a head on the tiny LLaMA, logged, reloaded, evaluated, resumed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")

# Measured here (seed 7, batch 16, float32): full reaches 0.96 test accuracy at 120 steps; LoRA on
# q/v plus the head 0.71 at 100 steps (a random 2-layer base gives adapters little to work with).
# Chance is 0.25. float32 on every CPU: precision=auto trains a CPU with native bf16 under autocast,
# whose validation loss is not evaluation's float32 loss to 1e-4 (test_precision.py covers bf16).
CONFIGS = {
    "cls-lora": {"peft_method": "lora", "learning_rate": 5e-3, "max_steps": 100, "precision": "float32"},
    "cls-full": {"peft_method": "full", "learning_rate": 5e-3, "max_steps": 120, "precision": "float32"},
}


def _request(root: Path, name: str, **overrides):
    params = {"task": "sequence_classification", **CONFIGS.get(name, CONFIGS["cls-lora"]), **overrides}
    base = "full" if params["peft_method"] == "full" else "lora"
    request = tiny_model.train_request(root, base, **params)
    return replace(request, output_dir=str(root / "out" / name), train_key=f"tiny-{name}", run_name=name)


@pytest.fixture(scope="module")
def lora_run(root):
    from sparktune.model.training import train

    # lora_modules_to_save=lm_head comes from the causal config: the classifier has no lm_head,
    # so it is dropped with a warning and peft trains the head (score) in full by itself.
    return train(_request(root, "cls-lora"))


@pytest.fixture(scope="module")
def full_run(root):
    from sparktune.model.training import train

    return train(_request(root, "cls-full"))


@pytest.fixture(scope="module")
def client(root):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tiny_model.tracking_uri(root))


def _load(root: Path, model_uri: str):
    """The logged model as users load it (``mlflow.pyfunc.load_model``)."""
    import mlflow
    from sparktune.model.process_setup import using_tracking_uri

    with using_tracking_uri(tiny_model.tracking_uri(root)):
        return mlflow.pyfunc.load_model(model_uri)


def test_packing_is_rejected_for_sequence_classification():
    from sparktune.core.params import InvalidParamsError, parse_params

    with pytest.raises(InvalidParamsError, match="packing: task=sequence_classification") as err:
        parse_params({"task": "sequence_classification", "packing": True})
    assert "set packing=false" in str(err.value)
    assert parse_params({"task": "sequence_classification"}).packing is False
    assert parse_params({"task": "causal_lm", "packing": True}).packing is True


def test_loss_goes_down_and_lora_trains_the_head_and_adapters_only(lora_run, full_run):
    for result in (lora_run, full_run):
        assert result.train_loss < result.initial_loss
        # ln 4 = 1.386 is a uniform guess over the four labels.
        assert result.val_loss < result.initial_loss < 1.45
    assert full_run.val_loss < 0.3
    assert full_run.trainable_percent == pytest.approx(100.0)
    assert lora_run.trainable_params * 5 < full_run.trainable_params


def test_run_records_throughput_padding_and_validation_accuracy(lora_run, client):
    run = client.get_run(lora_run.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["task"] == "sequence_classification"
    metrics = run.data.metrics
    assert (
        metrics["tokens_per_second"] == pytest.approx(lora_run.tokens_per_second)
        and metrics["train_tokens"] > 0
    )
    # Length-grouped dynamic padding: most of every batch is real tokens.
    assert 0.5 < metrics["padding_efficiency"] <= 1.0
    assert metrics["val_loss"] == pytest.approx(lora_run.val_loss)
    assert 0.25 < metrics["val_accuracy"] <= 1.0
    assert metrics["logged_model_max_logit_diff"] < 1e-4
    curve = client.get_metric_history(lora_run.mlflow_run_id, "train_loss")
    assert sorted(m.step for m in curve)[-1] == lora_run.global_steps == 100
    artifacts = {a.path for a in client.list_artifacts(lora_run.mlflow_run_id, "adapter")}
    assert "adapter/adapter_config.json" in artifacts


def test_logged_model_is_a_text_classifier_that_reproduces_the_logits(root, lora_run, full_run):
    import json

    import mlflow
    import torch
    from sparktune.model.logged_model import verify_logged_model
    from sparktune.model.process_setup import using_tracking_uri
    from transformers import AutoModelForCausalLM

    with using_tracking_uri(tiny_model.tracking_uri(root)):
        info = mlflow.models.get_model_info(lora_run.model_uri)
    assert info.flavors["python_function"]["config"]["task"] == "sequence_classification"

    loaded = _load(root, lora_run.model_uri).unwrap_python_model()
    model, tokenizer = loaded.model, loaded.tokenizer
    assert type(model).__name__ == "LlamaForSequenceClassification"
    assert model.config.id2label == dict(enumerate(tiny_model.LABELS))
    assert tokenizer.model_max_length == 128  # training's max_length, so evaluation truncates alike
    texts = [row["text"] for row in tiny_model.make_rows(6, 5)]
    with using_tracking_uri(tiny_model.tracking_uri(root)):
        assert verify_logged_model(lora_run.model_uri, model, tokenizer, texts) < 1e-4

    # Merged, not a PeftModel: untouched base weights are the base's, the adapted and the head trained.
    weights = model.state_dict()
    assert not any("lora" in name for name in weights)
    base = AutoModelForCausalLM.from_pretrained(str(root / "model")).state_dict()
    assert torch.equal(weights["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert not torch.allclose(
        weights["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    adapter_config = json.loads(
        Path(root / "out" / "cls-lora" / "adapter" / "adapter_config.json").read_text()
    )
    assert adapter_config["task_type"] == "SEQ_CLS"
    assert "score" in (adapter_config["modules_to_save"] or [])

    # The serving side: the pyfunc answers with label names and their probabilities.
    rows = tiny_model.make_rows(8, 9)
    answers = _load(root, full_run.model_uri).predict([row["text"] for row in rows])
    assert set(answers["prediction"]) <= set(tiny_model.LABELS)
    assert answers["score"].between(0.25, 1.0).all()  # the arg max of four: at least a quarter
    truth = [tiny_model.LABELS[row["label"]] for row in rows]
    assert sum(a == t for a, t in zip(answers["prediction"], truth, strict=True)) >= 6


def test_verification_compares_classification_logits(root, full_run):
    import torch
    from sparktune.model.logged_model import ModelVerificationError, verify_logged_model
    from sparktune.model.process_setup import using_tracking_uri

    loaded = _load(root, full_run.model_uri).unwrap_python_model()
    model, tokenizer = loaded.model, loaded.tokenizer
    texts = [row["text"] for row in tiny_model.make_rows(3, 5)]
    with torch.no_grad():
        model.score.weight.add_(0.05)
    with (
        using_tracking_uri(tiny_model.tracking_uri(root)),
        pytest.raises(ModelVerificationError, match="does not reproduce the trained model"),
    ):
        verify_logged_model(full_run.model_uri, model, tokenizer, texts)


def test_evaluate_model_scores_the_classifier(root, lora_run, full_run, tmp_path):
    from sparktune.release.evaluation import evaluate_model

    uri = tiny_model.tracking_uri(root)
    full = evaluate_model(full_run.model_uri, str(root / "data"), tracking_uri=uri, batch_size=16)
    assert full.n_examples == 48 and full.n_invalid == 0
    assert full.eval_accuracy >= 0.8  # chance: 0.25
    assert full.eval_macro_f1 >= 0.7
    assert set(full.per_class_f1) == set(tiny_model.LABELS)
    assert sum(sum(row.values()) for row in full.confusion.values()) == 48
    assert {f"eval_f1_{label}" for label in tiny_model.LABELS} <= set(full.metrics())
    lora = evaluate_model(lora_run.model_uri, str(root / "data"), tracking_uri=uri, batch_size=16)
    assert lora.eval_accuracy >= 0.5

    # The loss is the cross-entropy of the true label: on validation, what the trainer reported.
    val = evaluate_model(
        full_run.model_uri, str(root / "data"), split="validation", tracking_uri=uri, batch_size=7
    )
    assert val.eval_loss == pytest.approx(full_run.val_loss, abs=1e-4)

    # A save_pretrained folder of a classifier is told apart by its config, too.
    loaded = _load(root, full_run.model_uri).unwrap_python_model()
    folder = tmp_path / "classifier"
    loaded.model.save_pretrained(str(folder))
    loaded.tokenizer.save_pretrained(str(folder))
    local = evaluate_model(str(folder), str(root / "data"), batch_size=16)
    assert local.confusion == full.confusion


def test_a_crashed_classification_run_resumes_from_its_checkpoint(root, lora_run, client, monkeypatch):
    from sparktune.model.train_runs import RESUMED_FROM_TAG
    from sparktune.model.training import train
    from sparktune.model.training_setup import TokenCountingMixin

    # 256 rows / batch 16: an epoch is 16 steps. Checkpoints every 16 steps put the one resumed from
    # on an epoch boundary, where resuming is bit-exact; mid-epoch the length-grouped sampler redraws
    # the rest of the epoch's order from the restored RNG, so the run continues on other batches.
    request = _request(root, "cls-crash", checkpoint_steps=16)
    real_step = TokenCountingMixin.training_step
    calls = {"n": 0}

    def crashing_step(self, model, inputs, num_items_in_batch=None):
        calls["n"] += 1
        if calls["n"] == 40:  # after the checkpoint of step 32
            raise RuntimeError("simulated crash")
        return real_step(self, model, inputs, num_items_in_batch)

    monkeypatch.setattr(TokenCountingMixin, "training_step", crashing_step)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(request)
    monkeypatch.setattr(TokenCountingMixin, "training_step", real_step)
    experiment = client.get_experiment_by_name(request.experiment_name)
    [crashed] = client.search_runs(
        [experiment.experiment_id], "tags.`sparktune.train_key` = 'tiny-cls-crash'"
    )
    assert crashed.info.status == "FAILED"

    result = train(request)

    assert result.mlflow_run_id == crashed.info.run_id  # the same run, continued
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[RESUMED_FROM_TAG] == "32"
    assert result.global_steps == 100 and run.data.metrics["steps_this_attempt"] == 68
    curve = client.get_metric_history(result.mlflow_run_id, "train_loss")
    assert min(m.step for m in curve) == 1 and max(m.step for m in curve) == 100
    assert result.initial_loss == pytest.approx(lora_run.initial_loss)
    # Adapters, head, optimizer, scheduler and RNG came back from the checkpoint: the run ends
    # exactly where the uninterrupted run with the same seed (lora_run) ended.
    assert result.train_loss == pytest.approx(lora_run.train_loss, rel=1e-5)
    assert result.val_loss == pytest.approx(lora_run.val_loss, rel=1e-5)
    assert run.data.metrics["logged_model_max_logit_diff"] < 1e-4


# Trains a second tiny classifier (16 s). Left to make test.
@pytest.mark.slow
def test_streaming_mode_takes_the_labels_from_the_parquet(root, tmp_path):
    from sparktune.release.evaluation import evaluate_model

    prepared = tiny_model.build_prepared_parquet(tmp_path / "prepared")  # labels as strings
    request = replace(
        _request(root, "cls-streaming", dataset_mode="streaming", max_steps=0, num_train_epochs=1),
        dataset_path=str(prepared),
    )
    result = tiny_model.train_in_a_fresh_process(request)
    assert result.global_steps == 16  # 256 rows / batch 16, from the footers
    assert result.train_loss < result.initial_loss
    model = _load(root, result.model_uri).unwrap_python_model().model
    # The sorted distinct labels: the order prepare_data reports and materialize types as ClassLabel.
    assert list(model.config.id2label.values()) == sorted(tiny_model.LABELS)
    evaluated = evaluate_model(result.model_uri, str(prepared), tracking_uri=tiny_model.tracking_uri(root))
    assert evaluated.n_examples == 48 and evaluated.n_invalid == 0


def test_the_classification_adapter_serves_label_names_as_a_pyfunc(root, lora_run, full_run):
    import mlflow
    from sparktune.model.process_setup import using_tracking_uri

    assert full_run.adapter_model_uri == ""
    with using_tracking_uri(tiny_model.tracking_uri(root)):
        served = mlflow.pyfunc.load_model(lora_run.adapter_model_uri)
        rows = tiny_model.make_rows(8, 9)
        answers = served.predict([row["text"] for row in rows])
    merged = _load(root, lora_run.model_uri).predict([row["text"] for row in rows])
    assert set(answers["prediction"]) <= set(tiny_model.LABELS)
    # The adapter over its base and the merged model are the same weights: the same answers.
    assert answers["prediction"].tolist() == merged["prediction"].tolist()
    assert answers["score"].tolist() == pytest.approx(merged["score"].tolist(), abs=1e-4)
