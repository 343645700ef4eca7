"""A GGUF file (llama.cpp's format) turned into a model folder the whole pipeline loads.

Users keep models as ``.gguf`` files; every stage here loads ``from_pretrained(folder)`` with
safetensors weights. transformers reads a GGUF file itself (``from_pretrained(dir, gguf_file=...)``,
with the ``gguf`` package) and dequantizes its tensors, but refuses to ``save_pretrained`` the
object it built ("quantized with gguf and is not serializable"). So the conversion builds a plain
model of the same class from the GGUF config (without its ``quantization_config``), gives it the
dequantized weights, and saves that with the tokenizer (chat template included) read from the
same file, in float32 (:func:`storage_dtype`). The result loads like any checkpoint and is checked
by loading it back before it lands.

The checks before any tensor is read (a file that is not GGUF, an architecture transformers'
GGUF loader does not know, a model that is not a causal LM) raise :class:`GGUFConversionError`
with the cause and the fix.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# Written beside the weights of a converted checkpoint: where it came from.
SOURCE_RECORD = "sparktune_source.json"
# A text with the characters prompts carry (accents, an emoji, a newline, a brace), encoded by the
# converted tokenizer and by the GGUF one: the two must agree before the folder lands.
_TOKENIZER_PROBE = "Refund my order #4521, s'il vous plaît: the café charged twice 😡\n{ok}"


class GGUFConversionError(ValueError):
    """A ``.gguf`` file that cannot become a model folder, with the reason and the fix."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_gguf_magic(path: Path) -> None:
    """Raise :class:`GGUFConversionError` unless ``path`` starts as a GGUF file does."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFConversionError(
            f"base_model {str(path)!r} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}): "
            "point base_model at a .gguf file written by llama.cpp's convert tools, or at a model "
            "folder written by save_pretrained."
        )


def storage_dtype(weight_types: set[str]) -> str:
    """The dtype a converted checkpoint is saved in: float32, the values the GGUF file decodes to.

    Stored in a 16-bit dtype, the model would be loaded and scored in it (evaluation, the smoke test,
    batch scoring and the server load it as stored), and 16-bit scores of one text move with the
    batch it is padded into (0.445 alone vs 0.466 in a batch on SmolLM2): the smoke test's
    alone-versus-batch check and the row-by-row parity between the prediction paths need float32.
    ``weight_types`` (the GGUF matrices' types) is kept for when scoring is batch-invariant in 16 bits.
    """
    return "float32"


def gguf_architecture(path: Path) -> str:
    """The ``general.architecture`` of a GGUF file; raises :class:`GGUFConversionError` for a file
    that is not GGUF or whose architecture transformers cannot load as a causal LM."""
    return _inspect(Path(path))[0]


def _inspect(path: Path) -> tuple[str, str]:
    """(architecture, storage dtype) of a GGUF file, checked as :func:`gguf_architecture` says."""
    import struct

    check_gguf_magic(path)
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        architecture, matrices = read_gguf_header(path)
    except (KeyError, ValueError, IndexError, OSError, struct.error) as exc:
        raise GGUFConversionError(
            f"base_model {str(path)!r} starts like a GGUF file but cannot be read ({exc}): the file is "
            "truncated or damaged; copy or download it again."
        ) from exc
    # Encoder-decoder and encoder-only families load through other classes than a causal LM's.
    causal = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer", "t5", "umt5")]
    if architecture not in causal:
        raise GGUFConversionError(
            f"base_model {str(path)!r} is a GGUF file of architecture {architecture!r}, which transformers' "
            f"GGUF loader cannot dequantize into a causal LM (it knows {', '.join(sorted(causal))}): use a "
            "GGUF file of one of those architectures, or the original checkpoint as a safetensors folder."
        )
    return architecture, storage_dtype(matrices)


# GGUF metadata value types (gguf.constants.GGUFValueType) as struct formats; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_header(path: Path) -> tuple[str, set[str]]:
    """(``general.architecture``, the types of the tensors of 2 or more dimensions) of a GGUF file,
    read from its header; raises ``KeyError``, ``ValueError`` or ``struct.error`` for a damaged file,
    including one whose tensor data ends early.

    gguf's ``GGUFReader`` gives the same, but builds a numpy view per metadata element (SmolLM2's
    file holds 49k vocabulary strings and as many merges): 3.3 s of the conversion for two values,
    against 0.1 s here.
    """
    import mmap
    import struct

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        order = "<"
        (version,) = struct.unpack_from(order + "I", data, 4)
        if version & 0xFFFF == 0:  # written for a big-endian machine (as GGUFReader tells them apart)
            order = ">"
            (version,) = struct.unpack_from(order + "I", data, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not one transformers reads (2 or 3)")
        n_tensors, n_kv = struct.unpack_from(order + "QQ", data, 8)
        offset = 24

        def unpack(fmt: str) -> tuple:
            nonlocal offset
            values = struct.unpack_from(order + fmt, data, offset)
            offset += struct.calcsize(order + fmt)
            return values

        def string() -> bytes:
            nonlocal offset
            (length,) = unpack("Q")
            if offset + length > len(data):
                raise ValueError("a string runs past the end of the file")
            offset += length
            return data[offset - length : offset]

        def skip(kind: int) -> None:
            nonlocal offset
            if kind == _GGUF_STRING:
                string()
            elif kind == _GGUF_ARRAY:
                item, count = unpack("IQ")
                if item in _GGUF_SCALARS:
                    offset += count * struct.calcsize(_GGUF_SCALARS[item])
                elif item == _GGUF_STRING:
                    for _ in range(count):
                        string()
                else:
                    for _ in range(count):
                        skip(item)
            else:
                unpack(_GGUF_SCALARS[kind])

        architecture, alignment = None, 32
        for _ in range(n_kv):
            key = string()
            (kind,) = unpack("I")
            if key == b"general.architecture" and kind == _GGUF_STRING:
                architecture = string().decode("utf-8")
            elif key == b"general.alignment" and kind == 4:
                (alignment,) = unpack("I")
            else:
                skip(kind)
            if offset > len(data):
                raise ValueError("the metadata runs past the end of the file")
        if architecture is None:
            raise KeyError("general.architecture")
        tensors = []
        for _ in range(n_tensors):
            string()
            (n_dims,) = unpack("I")
            dims = unpack(f"{n_dims}Q")
            kind, start = unpack("IQ")
            tensors.append((dims, GGMLQuantizationType(kind), start))
        data_start = -(-offset // alignment) * alignment
        for dims, kind, start in tensors:
            block, size = GGML_QUANT_SIZES[kind]
            elements = 1
            for dim in dims:
                elements *= dim
            if data_start + start + elements * size // block > len(data):
                raise ValueError("the tensor data ends before the file says it does")
        return architecture, {kind.name for dims, kind, _ in tensors if len(dims) >= 2}


def replace_dir(tmp: Path, target: Path) -> None:
    """Put a finished folder in place with renames: readers see the old or the new one, whole."""
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)


def convert_gguf(gguf_path: Path, target: Path, *, record: dict | None = None) -> Path:
    """Dequantize ``gguf_path`` into ``target``: ``config.json``, ``model.safetensors`` (in
    :func:`storage_dtype`), the tokenizer with its chat template, and
    ``sparktune_source.json`` (the file's name, size and sha256, plus ``record``). An existing
    ``target`` is replaced."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.initialization import no_init_weights

    gguf_path = Path(gguf_path).expanduser().resolve()
    architecture, dtype_name = _inspect(gguf_path)
    dtype = getattr(torch, dtype_name)
    target = Path(target).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log.info("converting GGUF %s (%s) into %s", gguf_path, architecture, target)
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (NotImplementedError, KeyError, ValueError) as exc:
        raise GGUFConversionError(
            f"transformers could not dequantize {str(gguf_path)!r} ({architecture}): {exc}. Use a GGUF "
            "file with a quantization type the gguf package dequantizes (Q4_0, Q4_1, Q5_*, Q6_K, Q8_0, "
            "F16, ...), or the original checkpoint as a safetensors folder."
        ) from exc
    # The config the model was built from: AutoConfig would parse the whole file a third time (4 s).
    config = copy.deepcopy(quantized.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain tensors
    config.dtype = dtype
    # Random initialisation (3 s) is skipped: every weight is replaced below, and a missing one
    # fails the check after.
    with no_init_weights():
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    plain.tie_weights()
    missing = [key for key in missing if not (key == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise GGUFConversionError(
            f"The GGUF weights of {str(gguf_path)!r} do not fit transformers' {type(plain).__name__} "
            f"(no weights for {missing[:5]}, unexpected {unexpected[:5]}): the file is of a variant "
            "transformers does not support; use the original checkpoint as a safetensors folder."
        )
    plain.eval()
    # The weights as they will be stored; the check below reloads them against these logits.
    with torch.no_grad():
        for parameter in plain.parameters():
            parameter.data = parameter.data.to(dtype)
    probe = tokenizer(_TOKENIZER_PROBE, return_tensors="pt")["input_ids"][:, :16]
    with torch.inference_mode():
        expected_logits = plain.float()(input_ids=probe).logits
    for parameter in plain.parameters():  # .float() above cast them back: store the 16-bit values
        parameter.data = parameter.data.to(dtype)

    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for path in tmp.iterdir():  # safetensors writes 0600: other users (an Airflow worker) must read it
            path.chmod(0o644)
        _check_round_trip(tmp, tokenizer, probe, expected_logits)
        source = {
            "converted_by": "sparktune.model.gguf_checkpoint.convert_gguf",
            "source_file": name,
            "source_bytes": gguf_path.stat().st_size,
            "source_sha256": file_sha256(gguf_path),
            "architecture": architecture,
            "dtype": dtype_name,
            "parameters": sum(p.numel() for p in plain.parameters()),
            "convert_seconds": round(time.perf_counter() - started, 1),
            **(record or {}),
        }
        (tmp / SOURCE_RECORD).write_text(json.dumps(source, indent=2) + "\n")
        replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("GGUF %s converted in %.1f s", name, time.perf_counter() - started)
    return target


def _check_round_trip(folder: Path, tokenizer, probe, expected_logits) -> None:
    """The saved folder must give the tokens the GGUF tokenizer gives, and the logits of the
    converted weights (computed in float32 from the stored values)."""
    import torch
    from sparktune.core.model_safety import load_model, load_tokenizer
    from transformers import AutoModelForCausalLM

    reloaded_tokenizer = load_tokenizer(folder, trust_remote_code=False)
    expected = tokenizer(_TOKENIZER_PROBE)["input_ids"]
    got = reloaded_tokenizer(_TOKENIZER_PROBE)["input_ids"]
    template_kept = reloaded_tokenizer.chat_template == tokenizer.chat_template
    if got != expected or not template_kept:
        raise GGUFConversionError(
            f"The tokenizer saved from the GGUF file does not reload the same (ids {expected[:12]} vs "
            f"{got[:12]}, chat template kept: {template_kept}): "
            "this GGUF tokenizer is not supported; use the original checkpoint as a safetensors folder."
        )
    reloaded = load_model(AutoModelForCausalLM, folder, trust_remote_code=False, dtype=torch.float32)
    with torch.inference_mode():
        gap = float((reloaded(input_ids=probe).logits - expected_logits).abs().max())
    if not gap <= 1e-4:
        raise GGUFConversionError(f"The converted model does not reload the same (max logit gap {gap:.3g}).")
