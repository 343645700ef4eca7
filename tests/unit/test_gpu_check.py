"""make gpu-check's dry run (benchmarks/gpu_check.py --dry-run): the same cases as on a GPU, on tiny
models for two steps, through the project's own trainer, merge, reload and label scoring. Here, without
CUDA, QLoRA is recorded as skipped with the reason check_hardware gives; on a GPU it must run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

pytestmark = pytest.mark.slow  # a training process of its own: about 40 s on two idle cores


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu_check") / "nested" / "gpu_check.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text()), done.stdout


def test_every_model_and_method_is_reported(dry_run: tuple[dict, str]) -> None:
    report, stdout = dry_run
    assert report["dry_run"] is True and report["completed"] is True
    assert report["cases_failed"] == 0
    pairs = [(case["model"], case["method"]) for case in report["cases"]]
    assert pairs == [(m, k) for m in ("smollm2-135m", "llama-1.1b") for k in ("lora", "qlora", "full")]
    assert report["environment"]["cuda_available"] is torch.cuda.is_available()
    assert report["environment"]["packages"]["trl"]
    # SmolLM2's shape keeps its tied embeddings and grouped KV heads in the tiny version.
    assert report["models"]["smollm2-135m"]["config"]["tie_word_embeddings"] is True
    assert report["models"]["llama-1.1b"]["config"]["num_key_value_heads"] == 2
    # The table closes the output: one row per case.
    table = stdout[stdout.index("model | method") :]
    assert sum(line.startswith(("smollm2-135m |", "llama-1.1b |")) for line in table.splitlines()) == 6


def test_trained_cases_train_merge_reload_and_score(dry_run: tuple[dict, str]) -> None:
    report, _ = dry_run
    trained = [case for case in report["cases"] if case["status"] == "ok"]
    assert len(trained) == (6 if torch.cuda.is_available() else 4)
    for case in trained:
        name = f"{case['model']}/{case['method']}"
        assert case["steps"] == report["sizes"]["steps"] == 2, name
        assert case["real_tokens"] > 0 and 0 < case["padding_efficiency"] <= 1, name
        assert case["tokens_per_s"] > 0 and case["steady_tokens_per_s"] > 0, name
        assert case["attn_implementation"] == "sdpa", name
        assert case["recipe"] == "small-causal-lm", name
        # Stored in bf16 like the real checkpoints: the merged model is cast back to it.
        assert case["merged_dtype"] == "bfloat16", name
        assert case["reloads"] is True and case["reload_max_logit_diff"] <= case["reload_tolerance"], name
        assert case["reloaded_same_predictions"] == case["score_rows"] == report["data"]["score_rows"], name
        assert case["score_rows_per_s"] > 0 and 0 <= case["score_accuracy"] <= 1, name
        assert case["score_labels"] == report["data"]["labels"] >= 2, name
        if case["method"] == "full":
            assert case["merges"] is None and case["trainable_params"] == case["total_params"], name
        else:
            assert case["merges"] is True and case["adapter_reloads"] is True, name
            assert case["merge_max_logit_diff"] <= case["merge_tolerance"], name
            assert 0 < case["trainable_params"] < case["total_params"], name
        if torch.cuda.is_available():
            assert case["peak_gpu_mb_train"] > 0 and case["peak_gpu_mb_scoring"] > 0, name
        else:
            assert case["device"] == "cpu" and case["peak_gpu_mb_train"] is None, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="QLoRA runs where there is CUDA")
def test_qlora_is_skipped_without_cuda(dry_run: tuple[dict, str]) -> None:
    report, _ = dry_run
    qlora = [case for case in report["cases"] if case["method"] == "qlora"]
    assert len(qlora) == 2
    for case in qlora:
        assert case["status"] == "skipped"
        assert case["reason"].startswith("skipped: needs CUDA") and "bitsandbytes" in case["reason"]
