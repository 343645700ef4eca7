from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from sparktune.core.config import TINY_BASE_MODEL
from sparktune.model import base_model
from sparktune.model.base_model import (
    RECORD_FILE,
    ROUND_TRIP_PROBE,
    BaseModelError,
    build_tiny_base_model,
    ensure_base_model,
    read_build_record,
)
from sparktune.model.builtin_corpus import demo_corpus

# Deliberately small: a few seconds on CPU, yet the same code path as the default build.
SMALL = dict(
    vocab_size=320, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128, pretrain_steps=80
)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return demo_corpus(400, seed=3)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory, corpus) -> Path:
    return build_tiny_base_model(tmp_path_factory.mktemp("models") / "small", corpus, seed=0, **SMALL)


def test_small_model_reloads_with_matching_tokenizer(small_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_model)
    tokenizer = AutoTokenizer.from_pretrained(small_model)
    assert isinstance(model, LlamaForCausalLM)
    assert (small_model / "model.safetensors").stat().st_mode & 0o777 == 0o644  # readable by other users
    config = model.config
    assert config.vocab_size == len(tokenizer) <= SMALL["vocab_size"]
    assert config.max_position_embeddings == 1024 and tokenizer.model_max_length == 1024
    assert config.tie_word_embeddings is False
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token, tokenizer.pad_token) == (
        "<s>",
        "</s>",
        "<unk>",
        "<pad>",
    )
    assert tokenizer.pad_token_id not in (tokenizer.eos_token_id, tokenizer.unk_token_id)
    assert tokenizer.padding_side == "right"
    # no temp or old folders left next to it
    assert [p.name for p in small_model.parent.iterdir()] == ["small"]


def test_tokenizer_round_trips_the_prompt(small_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(small_model)
    ids = tokenizer(ROUND_TRIP_PROBE)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id  # LLaMA style: <s> first, no </s> appended
    assert ids[-1] != tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == ROUND_TRIP_PROBE
    bare = tokenizer(ROUND_TRIP_PROBE, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(bare) == ROUND_TRIP_PROBE
    assert ROUND_TRIP_PROBE == (
        "[INST] Classify the intent of this support message:\n\n"
        "my card was charged twice [/INST] billing_refund"
    )
    for text in ("Zoë paid 12.50 € in Kraków  \t twice\n", "emoji 🙂 and 中文"):
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_pretraining_loss_went_down_and_record_is_complete(small_model, corpus):
    record = read_build_record(small_model)
    assert record["pretrain_steps"] == SMALL["pretrain_steps"]
    assert record["corpus_texts"] == len(corpus)
    assert record["seed"] == 0
    assert record["final_loss"] < record["initial_loss"] - 1.0
    losses = [point["loss"] for point in record["loss_curve"]]
    assert losses == sorted(losses, reverse=True)
    steps = [point["step"] for point in record["loss_curve"]]
    assert steps[0] == 1 and steps[-1] == SMALL["pretrain_steps"] and steps == sorted(steps)
    assert len(record["fingerprint"]) == 64
    assert record["architecture"]["hidden_size"] == SMALL["hidden_size"]


def test_pretrained_model_prefers_domain_text(small_model):
    # a base model that learned the language scores real messages above shuffled words
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(small_model)
    tokenizer = AutoTokenizer.from_pretrained(small_model)
    real = "Hi, my order has not arrived yet. Where is my package?"
    shuffled = "package yet. my Where order arrived Hi, is has not my"

    def loss(text: str) -> float:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            return model(input_ids=ids, labels=ids).loss.item()

    assert loss(real) + 0.1 < loss(shuffled)


def test_build_is_deterministic_given_the_seed(tmp_path, corpus, small_model):
    import torch

    before, threads = torch.get_rng_state(), torch.get_num_threads()
    again = build_tiny_base_model(tmp_path / "again", corpus, seed=0, **SMALL)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is untouched
    assert torch.get_num_threads() == threads  # and so are its threads
    first = read_build_record(small_model)["fingerprint"]
    assert read_build_record(again)["fingerprint"] == first
    # another seed gives other weights; rebuilding over an existing folder replaces it whole
    other = build_tiny_base_model(again, corpus, seed=1, **SMALL)
    assert other == again
    assert read_build_record(other)["fingerprint"] != first
    assert read_build_record(other)["seed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["again"]


def test_build_rejects_empty_input(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        build_tiny_base_model(tmp_path / "m", [], **SMALL)
    assert not (tmp_path / "m").exists()


# --- ensure_base_model -------------------------------------------------------------------------


def _small_builds(monkeypatch) -> list[Path]:
    """Make the built-in model small and count how often it is built."""
    built: list[Path] = []
    real_build = base_model.build_tiny_base_model

    def small_build(output_dir, corpus, *, seed=0, **_ignored):
        built.append(Path(output_dir))
        return real_build(output_dir, corpus, seed=seed, **SMALL)

    monkeypatch.setattr(base_model, "build_tiny_base_model", small_build)
    monkeypatch.setattr(base_model, "TINY_CORPUS_TEXTS", 300)
    return built


def test_ensure_builds_the_tiny_model_once(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    built = _small_builds(monkeypatch)
    path = ensure_base_model(TINY_BASE_MODEL)
    expected = tmp_path / "home" / "models" / "base" / TINY_BASE_MODEL
    assert path == str(expected)
    assert (expected / RECORD_FILE).is_file()
    assert read_build_record(expected)["corpus_texts"] == 300
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "llama"
    assert ensure_base_model(TINY_BASE_MODEL) == path
    assert built == [expected]

    elsewhere = ensure_base_model(TINY_BASE_MODEL, models_dir=tmp_path / "other")
    assert elsewhere == str(tmp_path / "other" / "base" / TINY_BASE_MODEL)
    assert len(built) == 2


def test_a_built_model_leaves_its_token_counter_for_the_preparation_jobs(tmp_path, monkeypatch):
    """The build caches what a prepare job's driver would import transformers to build: the job
    then reads the entry back (no second one is written) and counts the tokens transformers does."""
    import pandas as pd
    from sparktune.data.prepare_tokens import _backend_from_json, backend_spec, count_tokens
    from transformers import AutoTokenizer

    _small_builds(monkeypatch)
    path = ensure_base_model(TINY_BASE_MODEL)
    cache = tmp_path / "home" / "cache" / "tokenizers"
    [entry] = cache.glob("*.json")
    spec = backend_spec(path)
    assert list(cache.glob("*.json")) == [entry]
    texts = pd.Series([ROUND_TRIP_PROBE, "my card was charged twice"])
    want = [len(AutoTokenizer.from_pretrained(path)(text)["input_ids"]) for text in texts]
    assert [int(n) for n in count_tokens(_backend_from_json(spec), texts)] == want


# One builder of the built-in model in a process of its own: its build writes ``building-<pid>`` into
# the gate folder, then waits there until the test creates ``release``. filelock's DEBUG log on
# stderr says when the lock it wants is held by someone else ("... not acquired on ..., waiting").
_GATED_BUILDER = """
import logging, os, sys, time
from pathlib import Path
from sparktune.model import base_model

models, gate = Path(sys.argv[1]), Path(sys.argv[2])
logging.basicConfig(stream=sys.stderr, format="%(name)s %(message)s")
logging.getLogger("filelock").setLevel(logging.DEBUG)

def gated_build(output_dir, corpus, **kwargs):
    (gate / f"building-{os.getpid()}").touch()
    while not (gate / "release").exists():
        time.sleep(0.02)
    output_dir.mkdir(parents=True)
    (output_dir / "config.json").write_text("{}")
    return output_dir

base_model.build_tiny_base_model = gated_build
base_model.TINY_CORPUS_TEXTS = 10
print(base_model.ensure_base_model(base_model.TINY_BASE_MODEL, models))
"""


def _wait_for(condition, what: str, *processes: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        ended = [f"pid {p.pid} exit code {p.returncode}" for p in processes if p.poll() is not None]
        assert not ended, f"waiting for {what}, a builder exited first: {ended}"
        assert time.monotonic() < deadline, f"waiting for {what}: timed out after {timeout:.0f} s"
        time.sleep(0.02)


def test_a_second_process_waits_on_the_lock_while_the_first_builds_and_then_reuses_its_model(tmp_path):
    """Two processes ask for the built-in model at once. The first holds the lock inside its build
    until the test lets it finish; the second is started meanwhile and seen waiting on that lock.
    Released, the first finishes the model, and the second finds it: one build, one folder."""
    models, gate = tmp_path / "models", tmp_path / "gate"
    gate.mkdir()
    target = models / "base" / TINY_BASE_MODEL

    def builder(name: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", _GATED_BUILDER, str(models), str(gate)],
            stdout=subprocess.PIPE,
            stderr=(tmp_path / f"{name}.log").open("w"),
            text=True,
        )

    def builds() -> list[str]:
        return sorted(p.name for p in gate.glob("building-*"))

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text()

    first = builder("first")
    second = None
    try:
        _wait_for(lambda: builds(), "the first builder to start building", first)
        assert builds() == [f"building-{first.pid}"]
        second = builder("second")
        _wait_for(
            lambda: "not acquired on" in log("second") or len(builds()) > 1,
            "the second builder to wait on the lock",
            first,
            second,
        )
        assert builds() == [f"building-{first.pid}"], "the second builder built while the first held the lock"
        assert second.poll() is None and "not acquired on" in log("second"), log("second")
        assert not (target / "config.json").exists()
        (gate / "release").touch()
        outputs = [p.communicate(timeout=60)[0].strip() for p in (first, second)]
    finally:
        (gate / "release").touch()
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert [first.returncode, second.returncode] == [0, 0], log("first") + log("second")
    assert outputs == [str(target)] * 2
    assert builds() == [f"building-{first.pid}"]  # the second never built: it found the model
    assert "acquired on" in log("second").rsplit("not acquired on", 1)[1]  # ...once the first let go
    assert (target / "config.json").read_text() == "{}"


def test_ensure_accepts_local_model_folders(tmp_path, monkeypatch, small_model):
    assert ensure_base_model(str(small_model)) == str(small_model)
    monkeypatch.chdir(small_model.parent)
    assert ensure_base_model("small") == str(small_model)
    assert ensure_base_model("./small/") == str(small_model)

    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(BaseModelError, match="config.json"):
        ensure_base_model(str(empty))
    with pytest.raises(BaseModelError, match="no such file or folder"):
        ensure_base_model(str(tmp_path / "missing"))
    with pytest.raises(BaseModelError, match="is a file but neither a GGUF file nor a model folder"):
        ensure_base_model(str(small_model / "config.json"))  # not GGUF, not a folder


def test_ensure_returns_hub_ids_unchanged_and_rejects_bad_names(monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("nothing may be built or downloaded for a hub id")

    monkeypatch.setattr(base_model, "build_tiny_base_model", no_build)
    for hub_id in ("mistralai/Mistral-7B-Instruct-v0.3", "meta-llama/Llama-3.2-1B", "org/name_1.0"):
        assert ensure_base_model(hub_id) == hub_id
    assert ensure_base_model("  org/name ") == "org/name"
    for bad in ("not a model", "a/b/c", "org/-name", "gpt2", "", "  "):
        with pytest.raises(BaseModelError, match="hub id") as info:
            ensure_base_model(bad)
        assert TINY_BASE_MODEL in str(info.value)


def test_cli_prints_the_path(tmp_path, capsys, small_model):
    assert base_model.main(["--name", str(small_model)]) == 0
    assert capsys.readouterr().out.strip() == str(small_model)
    with pytest.raises(SystemExit):
        base_model.main(["--name", "bad name"])
    assert "hub id" in capsys.readouterr().err
