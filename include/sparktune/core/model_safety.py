"""Loading models safely: no model's own Python code runs unless asked, weights come as safetensors.

Two ways a model folder can run code on the machine that loads it:

- **Remote code.** A ``config.json`` (or ``tokenizer_config.json``) with an ``auto_map`` names
  Python files shipped beside the weights; with ``trust_remote_code=True`` transformers imports
  them. Every load in sparktune passes ``trust_remote_code`` explicitly from one setting, the
  pipeline param ``trust_remote_code`` (default false): never left to transformers' default,
  which asks on a terminal. A folder whose class transformers does not know is refused here
  with a message naming the fix; one whose class transformers knows is loaded with that class
  and the shipped files are ignored.
- **Pickled weights.** ``pytorch_model.bin`` and other ``.bin``/``.pt`` files are Python pickles;
  loading them can execute code. Every model load passes ``use_safetensors=True``, and a folder
  holding only pickled weights is refused with a message saying how to convert it.

MLflow's transformers flavour loads a model whose class is not in transformers with
``trust_remote_code=True`` on its own, so MLflow models are downloaded and checked with
:func:`check_model_tree` before MLflow loads them.

Nothing heavy is imported at module level.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("sparktune.core.model_safety")

# Weight files that are Python pickles (torch.load), TensorFlow or Flax checkpoints: anything
# but safetensors. Matched at the top of a model folder.
PICKLED_WEIGHTS = (
    "pytorch_model*.bin",
    "adapter_model*.bin",
    "model*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "tf_model*.h5",
    "flax_model*.msgpack",
)
CONVERT_FIX = (
    "convert the weights to safetensors once, where you trust the files: load the folder with "
    "transformers (AutoModel...from_pretrained(folder)) or peft (PeftModel.from_pretrained) and "
    "save_pretrained() it again (transformers and peft write model.safetensors / "
    "adapter_model.safetensors), or use the Hugging Face 'convert to safetensors' space for a hub repo"
)
TRUST_FIX = (
    "read that code; if you trust it, set the param trust_remote_code=true (the trigger form's "
    "Training section) and run again. Otherwise use a model whose architecture transformers "
    "supports natively (no auto_map in its config.json)"
)


class UnsafeModelError(ValueError):
    """A model that would run code on load (remote code, pickled weights); the message says the fix."""


def model_kwargs(trust_remote_code: bool) -> dict[str, Any]:
    """``from_pretrained`` arguments of every model load: safetensors only, remote code as set."""
    return {"trust_remote_code": bool(trust_remote_code), "use_safetensors": True}


def code_kwargs(trust_remote_code: bool) -> dict[str, Any]:
    """``from_pretrained`` arguments of configs and tokenizers (they have no weights)."""
    return {"trust_remote_code": bool(trust_remote_code)}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _native_model_type(model_type: Any) -> bool:
    from transformers import CONFIG_MAPPING

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING


def _native_class(name: Any) -> bool:
    import transformers

    if not isinstance(name, str) or not name:
        return False
    return hasattr(transformers, name) or (not name.endswith("Fast") and hasattr(transformers, f"{name}Fast"))


def _custom_code(folder: Path) -> list[str]:
    """What in ``folder`` transformers could only load by importing the folder's own Python files."""
    found = []
    config = _read_json(folder / "config.json")
    auto_map = config.get("auto_map") or {}
    if auto_map and not _native_model_type(config.get("model_type")):
        found.append(f"config.json auto_map {json.dumps(auto_map, sort_keys=True)}")
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    tokenizer_map = tokenizer_config.get("auto_map") or {}
    if tokenizer_map and not _native_class(tokenizer_config.get("tokenizer_class")):
        found.append(f"tokenizer_config.json auto_map {json.dumps(tokenizer_map, sort_keys=True)}")
    return found


def _pickled_weights(folder: Path) -> list[str]:
    return sorted({p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern) if p.is_file()})


def is_local_folder(source: str | Path) -> bool:
    return Path(str(source)).expanduser().is_dir()


def check_model_folder(folder: str | Path, *, trust_remote_code: bool) -> None:
    """Refuse a local model, adapter or tokenizer folder that would run code when loaded.

    - only pickled weights (``pytorch_model.bin``, ``adapter_model.bin``, ``*.pt``, ...) and no
      ``*.safetensors``: refused always;
    - an ``auto_map`` naming a class transformers does not have: refused unless
      ``trust_remote_code``. An ``auto_map`` over a class transformers has is loaded with
      transformers' own class (the folder's code is not imported) and only logged.
    """
    path = Path(str(folder)).expanduser()
    pickled = _pickled_weights(path)
    if pickled and not any(path.glob("*.safetensors")):
        raise UnsafeModelError(
            f"Model folder {str(path)!r} holds its weights only as {', '.join(pickled)}: pickled files that "
            "can run arbitrary code when loaded, so sparktune loads safetensors weights only. Fix: "
            f"{CONVERT_FIX}."
        )
    custom = _custom_code(path)
    if custom and not trust_remote_code:
        files = sorted(p.name for p in path.glob("*.py"))
        raise UnsafeModelError(
            f"Model folder {str(path)!r} needs its own Python code to load ({'; '.join(custom)}"
            + (f"; files {', '.join(files)}" if files else "")
            + "), which transformers would import and run; refused because trust_remote_code is off. "
            f"Fix: {TRUST_FIX}."
        )
    config = _read_json(path / "config.json")
    if config.get("auto_map") and not trust_remote_code:
        logger.info(
            "%s ships code (auto_map) for a class transformers has; loading transformers' own class, "
            "not the folder's code (trust_remote_code is off).",
            path,
        )


def check_model_tree(root: str | Path, *, trust_remote_code: bool) -> None:
    """:func:`check_model_folder` on every model, adapter or tokenizer folder under ``root``
    (an MLflow model: ``model/``, ``components/tokenizer/``, ``artifacts/adapter/``, ...), and the
    class names MLflow's transformers flavour would load."""
    base = Path(str(root)).expanduser()
    markers = ("config.json", "adapter_config.json", "tokenizer_config.json")
    folders = {p.parent for name in markers for p in base.rglob(name)}
    for folder in sorted(folders):
        check_model_folder(folder, trust_remote_code=trust_remote_code)
    mlmodel = base / "MLmodel"
    if not mlmodel.is_file():
        return
    import yaml

    flavors = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors", {})
    # The label pyfunc (sparktune/model/label_pyfunc.py) of an adapter loads its base from model_config,
    # which MLmodel stores under "config".
    base_model = ((flavors.get("python_function") or {}).get("config") or {}).get("base_model")
    if base_model and is_local_folder(base_model):
        check_model_folder(base_model, trust_remote_code=trust_remote_code)
    if not trust_remote_code:
        flavor = flavors.get("transformers") or {}
        classes = [flavor.get("instance_type")] + [
            flavor.get(f"{name}_type") for name in flavor.get("components", []) or []
        ]
        custom = [c for c in classes if c and not _native_class(c)]
        if custom:
            raise UnsafeModelError(
                f"MLflow model {str(base)!r} is of class(es) {', '.join(custom)} that transformers does not "
                "have: MLflow would load them by running the code saved with the model "
                f"(trust_remote_code=True); refused because trust_remote_code is off. Fix: {TRUST_FIX}."
            )


def _explain_missing_safetensors(source: str, exc: OSError) -> None:
    message = str(exc)
    if "safetensors" in message or "pytorch_model.bin" in message:
        raise UnsafeModelError(
            f"Model {source!r} has no safetensors weights ({message.strip()}); sparktune does not load "
            f"pickled weights (pytorch_model.bin), which can run arbitrary code. Fix: {CONVERT_FIX}."
        ) from exc


def load_model(auto_class: Any, source: str | Path, *, trust_remote_code: bool, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(source)``, safetensors only, remote code only when trusted."""
    if is_local_folder(source):
        check_model_folder(source, trust_remote_code=trust_remote_code)
    try:
        return auto_class.from_pretrained(str(source), **model_kwargs(trust_remote_code), **kwargs)
    except OSError as exc:
        _explain_missing_safetensors(str(source), exc)
        raise


def load_tokenizer(source: str | Path, *, trust_remote_code: bool, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    if is_local_folder(source):
        check_model_folder(source, trust_remote_code=trust_remote_code)
    return AutoTokenizer.from_pretrained(str(source), **code_kwargs(trust_remote_code), **kwargs)


def load_config(source: str | Path, *, trust_remote_code: bool, **kwargs: Any) -> Any:
    from transformers import AutoConfig

    if is_local_folder(source):
        check_model_folder(source, trust_remote_code=trust_remote_code)
    return AutoConfig.from_pretrained(str(source), **code_kwargs(trust_remote_code), **kwargs)


def load_adapter(base: Any, adapter_dir: str | Path, **kwargs: Any) -> Any:
    """``PeftModel.from_pretrained(base, adapter_dir)`` from ``adapter_model.safetensors`` only
    (peft falls back to a pickled ``adapter_model.bin`` on its own)."""
    from peft import PeftModel

    folder = Path(str(adapter_dir)).expanduser()
    if not (folder / "adapter_model.safetensors").is_file():
        found = ", ".join(_pickled_weights(folder)) or "no weights"
        raise UnsafeModelError(
            f"Adapter folder {str(folder)!r} has no adapter_model.safetensors ({found}); sparktune loads "
            f"safetensors weights only. Fix: {CONVERT_FIX}."
        )
    return PeftModel.from_pretrained(base, str(folder), **kwargs)


def local_model_dir(model_uri: str) -> Path:
    """An MLflow model URI (``models:/``, ``runs:/``, ...) or a local folder, as a local folder."""
    local = Path(model_uri).expanduser()
    if local.is_dir():
        return local
    import mlflow

    return Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri))
