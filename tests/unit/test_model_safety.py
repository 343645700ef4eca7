"""Loading a model never runs its own code unless trust_remote_code is set, and never unpickles weights.

The "remote code" here is a module written into the model folder that creates a marker file when
it is imported: the marker tells whether transformers (or MLflow) ran it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

CUSTOM_MODULE = """
from pathlib import Path

Path({marker!r}).write_text("the model folder's code ran")

from transformers import LlamaConfig, LlamaForCausalLM


class MarkerConfig(LlamaConfig):
    model_type = "sparktune_marker"


class MarkerForCausalLM(LlamaForCausalLM):
    config_class = MarkerConfig
"""


def _drop_dynamic_modules() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] == "transformers_modules"]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tiny_model.build_model(tmp_path_factory.mktemp("safety") / "tiny")


@pytest.fixture(autouse=True)
def modules_cache(tmp_path, monkeypatch):
    """transformers copies a folder's code under HF_MODULES_CACHE before importing it: keep it here."""
    from transformers import dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    _drop_dynamic_modules()
    yield
    _drop_dynamic_modules()


def _remote_code_model(base: Path, folder: Path, *, native: bool = False) -> tuple[Path, Path]:
    """A copy of ``base`` whose config.json maps the auto classes to code in the folder itself.

    ``native``: the config keeps model_type llama, which transformers knows (the folder's code is
    optional); otherwise model_type is one only the folder's code defines.
    """
    shutil.copytree(base, folder)
    marker = folder.parent / f"{folder.name}.ran"
    (folder / "modeling_marker.py").write_text(CUSTOM_MODULE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "modeling_marker.MarkerConfig",
        "AutoModelForCausalLM": "modeling_marker.MarkerForCausalLM",
    }
    if not native:
        config["model_type"] = "sparktune_marker"
        config["architectures"] = ["MarkerForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def _bin_only_model(base: Path, folder: Path) -> Path:
    """``base`` with its weights as a pickled pytorch_model.bin instead of model.safetensors."""
    import torch
    from safetensors.torch import load_file

    shutil.copytree(base, folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


# --------------------------------------------------------------------------------------------
# Pickled weights


def _load_via_training(folder: Path) -> None:
    from sparktune.model.train_inputs import load_train_tokenizer
    from sparktune.model.training_setup import load_base_model

    load_base_model(str(folder), load_train_tokenizer(str(folder)))


def _load_via_evaluation(folder: Path) -> None:
    from sparktune.release.eval_inputs import load_components

    load_components(str(folder))


def _resolve_base_model(folder: Path) -> None:
    from sparktune.model.base_model import ensure_base_model

    ensure_base_model(str(folder))


@pytest.mark.parametrize("load", [_load_via_training, _load_via_evaluation, _resolve_base_model])
def test_a_model_folder_with_only_pytorch_model_bin_is_refused_naming_the_cause_and_the_fix(
    base, tmp_path, load
):
    from sparktune.core.model_safety import UnsafeModelError

    folder = _bin_only_model(base, tmp_path / "bin-only")
    with pytest.raises(UnsafeModelError) as caught:
        load(folder)
    message = str(caught.value)
    assert "pytorch_model.bin" in message and "pickled" in message  # the cause
    assert "convert the weights to safetensors" in message and "save_pretrained" in message  # the fix


def test_every_model_load_asks_transformers_for_safetensors_and_an_explicit_trust_setting():
    from sparktune.core.model_safety import code_kwargs, model_kwargs

    assert model_kwargs(False) == {"trust_remote_code": False, "use_safetensors": True}
    assert model_kwargs(True) == {"trust_remote_code": True, "use_safetensors": True}
    assert code_kwargs(False) == {"trust_remote_code": False}


def test_an_adapter_with_only_adapter_model_bin_is_refused_by_the_served_pyfunc(base, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from sparktune.core import label_scoring
    from sparktune.core.model_safety import UnsafeModelError, load_adapter
    from sparktune.model import label_pyfunc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = tmp_path / "adapter"
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(base)), LoraConfig(r=4, target_modules=["q_proj"])
    )
    model.save_pretrained(str(adapter))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(adapter))
    torch.save(load_file(adapter / "adapter_model.safetensors"), adapter / "adapter_model.bin")
    (adapter / "adapter_model.safetensors").unlink()

    context = SimpleNamespace(
        model_config={
            "base_model": str(base),
            "task": "causal_lm",
            "labels": ["a", "b"],
            "prompt_template": "{text} {label}",
        },
        artifacts={"adapter": str(adapter), "scoring_code": label_scoring.__file__},
    )
    with pytest.raises(ValueError, match="adapter_model.safetensors"):
        label_pyfunc.LabelModel().load_context(context)
    with pytest.raises(UnsafeModelError, match=r"adapter_model\.bin.*convert the weights to safetensors"):
        load_adapter(AutoModelForCausalLM.from_pretrained(str(base)), adapter)


# --------------------------------------------------------------------------------------------
# Remote code


@pytest.mark.parametrize("load", [_load_via_training, _load_via_evaluation, _resolve_base_model])
def test_a_model_that_needs_its_own_code_is_refused_and_the_code_never_runs(base, tmp_path, load):
    from sparktune.core.model_safety import UnsafeModelError

    folder, marker = _remote_code_model(base, tmp_path / "custom")
    with pytest.raises(UnsafeModelError) as caught:
        load(folder)
    message = str(caught.value)
    assert "auto_map" in message and "modeling_marker.py" in message  # the cause
    assert "trust_remote_code is off" in message and "trust_remote_code=true" in message  # the fix
    assert not marker.exists()


def test_a_model_of_a_class_transformers_has_loads_that_class_not_the_code_it_ships(base, tmp_path):
    from sparktune.model.train_inputs import load_train_tokenizer
    from sparktune.model.training_setup import load_base_model

    folder, marker = _remote_code_model(base, tmp_path / "native", native=True)
    model = load_base_model(str(folder), load_train_tokenizer(str(folder)))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not marker.exists()


def test_with_trust_remote_code_the_models_own_code_loads_it(base, tmp_path):
    from sparktune.model.train_inputs import load_train_tokenizer
    from sparktune.model.training_setup import load_base_model

    folder, marker = _remote_code_model(base, tmp_path / "trusted")
    tokenizer = load_train_tokenizer(str(folder), trust_remote_code=True)
    model = load_base_model(str(folder), tokenizer, trust_remote_code=True)
    assert type(model).__name__ == "MarkerForCausalLM"
    assert marker.exists()


def test_an_mlflow_model_of_a_custom_class_is_refused_before_mlflow_runs_its_code(base, tmp_path):
    """MLflow's transformers flavour loads a class transformers lacks with trust_remote_code=True."""
    import mlflow
    from sparktune.core.model_safety import UnsafeModelError
    from sparktune.release.eval_inputs import load_components
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, marker = _remote_code_model(base, tmp_path / "custom")
    model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True)
    saved = tmp_path / "mlflow-model"
    mlflow.transformers.save_model(
        transformers_model={"model": model, "tokenizer": AutoTokenizer.from_pretrained(str(folder))},
        path=str(saved),
        task="text-generation",
        pip_requirements=[],
    )
    marker.unlink()
    _drop_dynamic_modules()

    with pytest.raises(UnsafeModelError, match="trust_remote_code is off"):
        load_components(str(saved))
    assert not marker.exists()

    loaded, _ = load_components(str(saved), trust_remote_code=True)
    assert type(loaded).__name__ == "MarkerForCausalLM"
    assert marker.exists()


def test_an_mlflow_model_saved_by_the_project_holds_safetensors_only(base, tmp_path):
    import mlflow
    from sparktune.core.model_safety import check_model_tree
    from sparktune.model.logged_model import label_model_kwargs
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged = tmp_path / "merged"
    AutoModelForCausalLM.from_pretrained(str(base)).save_pretrained(str(merged), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(merged))
    saved = tmp_path / "mlflow-model"
    config = {"task": "causal_lm", "labels": ["a", "b"], "prompt_template": "{text} {label}"}
    mlflow.pyfunc.save_model(path=str(saved), **label_model_kwargs({"model": merged}, config))
    weights = {p.name for p in (saved / "artifacts" / "merged").iterdir()}
    assert "model.safetensors" in weights and not any(n.endswith((".bin", ".pt", ".pth")) for n in weights)
    check_model_tree(saved, trust_remote_code=False)
