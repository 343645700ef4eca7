"""Checkpoints and resume after a crash, packing, and the methods that cannot run on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _request(root: Path, name: str, **overrides):
    request = tiny_model.train_request(root, "lora", **overrides)
    return replace(request, output_dir=str(root / "out" / name), train_key=f"tiny-{name}", run_name=name)


def _run_cli(request, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "request.json"
    path.write_text(request.to_json())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sparktune.jobs.train", "--request", str(path), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def _no_run_and_no_checkpoint(request) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=request.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(request.experiment_name)
    if experiment is not None:
        runs = client.search_runs(
            [experiment.experiment_id], f"tags.`sparktune.train_key` = '{request.train_key}'"
        )
        assert runs == []
    assert not (Path(request.output_dir) / "checkpoints").exists()


def test_qlora_on_cpu_is_refused_before_any_run_or_checkpoint(root):
    from sparktune.model.training import train
    from sparktune.model.training_setup import TrainingInputError

    request = _request(root, "qlora-here", peft_method="qlora")
    with pytest.raises(TrainingInputError) as err:
        train(request)
    assert "needs a CUDA GPU" in str(err.value) and "peft_method=lora on CPU" in str(err.value)
    _no_run_and_no_checkpoint(request)


@pytest.mark.slow  # a training process of its own (5-15 s): the refusal itself is proven just above
def test_qlora_on_cpu_fails_at_once_with_the_reason_and_the_fix(root, tmp_path):
    request = _request(root, "qlora", peft_method="qlora")
    done = _run_cli(request, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs a CUDA GPU" in done.stdout and "peft_method=lora on CPU" in done.stdout
    _no_run_and_no_checkpoint(request)  # nothing started


def test_deepspeed_stage_is_validated_and_passed_through():
    import importlib.util

    from sparktune.core.params import parse_params
    from sparktune.model.train_inputs import check_hardware
    from sparktune.model.training_setup import TrainingInputError, deepspeed_config

    assert deepspeed_config(0) is None
    config = deepspeed_config(3)
    assert config["zero_optimization"]["stage"] == 3
    assert config["train_micro_batch_size_per_gpu"] == "auto"
    assert deepspeed_config(2)["zero_optimization"]["stage"] == 2
    with pytest.raises(TrainingInputError, match="must be 0, 1, 2 or 3"):
        deepspeed_config(4)
    if importlib.util.find_spec("deepspeed") is None:
        with pytest.raises(TrainingInputError, match="pip install deepspeed"):
            check_hardware(parse_params({"deepspeed_stage": 2}))
    check_hardware(parse_params({}))  # the defaults run anywhere


def test_packing_keeps_attention_inside_each_example(root):
    import torch
    from sparktune.model.sft_trainer import check_packing_isolation
    from sparktune.model.training_setup import TrainingInputError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(root / "model"))
    model = AutoModelForCausalLM.from_pretrained(str(root / "model"))
    assert check_packing_isolation(model, tokenizer) < 1e-3

    class LeakyModel(torch.nn.Module):
        """Attends over the whole row whatever the position ids say (what "wrapped" packing gives)."""

        config = type("Config", (), {"_attn_implementation": "leaky"})()

        def forward(self, input_ids, position_ids=None, use_cache=None):
            embedded = torch.nn.functional.one_hot(input_ids, 512).float()
            return type("Out", (), {"logits": embedded.cumsum(dim=1)})()

    with pytest.raises(TrainingInputError, match="packing=true would let packed examples attend"):
        check_packing_isolation(LeakyModel(), tokenizer)


def test_packed_training_has_no_padding_and_learns(root):
    from sparktune.model.training import train

    # 10 steps take the mean training loss from 6.2 to 2.0; 30 cost 3.5 s more CPU to show the same.
    result = train(_request(root, "packed", packing=True, max_steps=10, checkpoint_steps=1000))
    assert result.padding_efficiency == 1.0
    assert result.train_loss < result.initial_loss


def _wait_for_checkpoint(folder: Path, min_step: int, proc: subprocess.Popen, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "training ended before it could be killed"
        for state in folder.glob("checkpoint-*/trainer_state.json"):
            step = int(state.parent.name.split("-")[1])
            if step >= min_step:
                return step
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint at step >= {min_step} within {timeout} s")


def test_a_checkpoint_whose_save_a_crash_cut_is_passed_over(tmp_path, caplog):
    from sparktune.model.train_runs import last_checkpoint
    from sparktune.model.training_setup import CHECKPOINTS

    folder = tmp_path / CHECKPOINTS
    for step, state in ((10, '{"global_step": 10}'), (20, '{"global_step": 20}'), (30, "")):
        (folder / f"checkpoint-{step}").mkdir(parents=True)
        (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (folder / "checkpoint-40").mkdir()  # killed before it wrote its state at all
    (folder / "checkpoint-last").mkdir()  # not the Trainer's
    assert last_checkpoint(tmp_path) == (folder / "checkpoint-20", 20)
    assert "checkpoint-40 is incomplete" in caplog.text and "checkpoint-30 is incomplete" in caplog.text
    assert last_checkpoint(tmp_path / "nothing") is None


@pytest.mark.slow  # starts a training process and kills it
def test_killed_training_resumes_from_its_checkpoint_into_the_same_mlflow_run(root, tmp_path):
    from mlflow import MlflowClient
    from sparktune.model.train_runs import RESUMED_FROM_TAG
    from sparktune.model.training import train

    request = _request(root, "crash", max_steps=120, checkpoint_steps=10)
    path = tmp_path / "request.json"
    path.write_text(request.to_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparktune.jobs.train", "--request", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        _wait_for_checkpoint(Path(request.output_dir) / "checkpoints", 20, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # a crash: no cleanup, the MLflow run stays RUNNING
        proc.wait()

    client = MlflowClient(tracking_uri=request.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(request.experiment_name)
    [crashed] = client.search_runs([experiment.experiment_id], "tags.`sparktune.train_key` = 'tiny-crash'")
    assert crashed.info.status == "RUNNING"
    # The kill may cut a save: the resume starts from the newest checkpoint whose state was written.
    steps = []
    for state in Path(request.output_dir).glob("checkpoints/checkpoint-*/trainer_state.json"):
        with contextlib.suppress(ValueError):  # empty or cut short
            steps.append(json.loads(state.read_text())["global_step"])
    resumed_from = max(steps)

    result = train(request)

    assert result.mlflow_run_id == crashed.info.run_id  # the same run, continued
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[RESUMED_FROM_TAG] == str(resumed_from)
    assert result.global_steps == 120
    # Only the steps after the checkpoint ran again.
    assert run.data.metrics["steps_this_attempt"] == 120 - resumed_from
    curve = client.get_metric_history(result.mlflow_run_id, "train_loss")
    steps = sorted({m.step for m in curve})
    assert steps[0] == 1 and steps[-1] == 120  # one curve from the first attempt's start to the end
    assert result.initial_loss == pytest.approx(min(curve, key=lambda m: m.step).value)
    assert result.train_loss < result.initial_loss
    runs = client.search_runs([experiment.experiment_id], "tags.`sparktune.train_key` = 'tiny-crash'")
    assert len(runs) == 1


def test_the_merged_model_takes_the_dtype_its_base_is_stored_in(tmp_path):
    import torch
    from sparktune.model.logged_model import to_stored_dtype
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)  # trained in float32, as training loads a base
    # a hub LLM ships its weights in 16 bits
    LlamaConfig(**{**config.to_dict(), "dtype": "bfloat16"}).save_pretrained(tmp_path / "bf16")
    merged = to_stored_dtype(model, str(tmp_path / "bf16"))
    assert merged.dtype == torch.bfloat16
    # saved and loaded as users load it (dtype "auto": the saved config's), it gives the very logits
    # the verification compares: the config says bf16, and RoPE's buffers stay float32 on both sides
    merged.save_pretrained(tmp_path / "merged")
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "merged", dtype="auto")
    assert reloaded.dtype == torch.bfloat16
    ids = torch.tensor([list(range(1, 40))])
    with torch.inference_mode():
        assert torch.equal(reloaded(input_ids=ids).logits, merged(input_ids=ids).logits)
    fp32 = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "dtype": "float32"}))
    fp32.config.save_pretrained(tmp_path / "fp32")
    assert to_stored_dtype(fp32, str(tmp_path / "fp32")).dtype == torch.float32
    assert to_stored_dtype(fp32, str(tmp_path / "missing")) is fp32  # no config: left as it is
