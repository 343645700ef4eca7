"""A tiny LLaMA, its tokenizer and a trivially learnable intent dataset, built locally for tests.

Nothing here touches the Hugging Face hub: the tokenizer is trained on the test corpus with
``tokenizers`` and the model is randomly initialised from a ``LlamaConfig``.
"""

from __future__ import annotations

import random
from pathlib import Path

# Each label has keywords that appear only in its texts, so the rule is learnable in a few
# dozen steps; the filler words give the texts different lengths (20-60 tokens).
KEYWORDS: dict[str, tuple[str, ...]] = {
    "billing": ("invoice", "charged", "payment"),
    "shipping": ("parcel", "delivery", "courier"),
    "login": ("password", "locked", "signin"),
    "refund": ("money back", "return", "reimburse"),
}
LABELS: tuple[str, ...] = tuple(KEYWORDS)
_FILLER_TEXT = (
    "hello please help me today with this issue it is urgent thanks again for the quick answer "
    "my account was fine yesterday but now something is wrong and i would like to know what happened"
)
FILLER = tuple(_FILLER_TEXT.split())
PROMPT = "[INST] Classify the intent of this support message:\n\n{text} [/INST]"


def make_text(rng: random.Random, label: str) -> str:
    words = rng.sample(FILLER, rng.randint(3, 18))
    words.insert(rng.randint(0, len(words)), rng.choice(KEYWORDS[label]))
    return " ".join(words)


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = LABELS[i % len(LABELS)]
        text = make_text(rng, label)
        rows.append(
            {
                "example_id": f"{seed}-{i}",
                "text": text,
                "label": LABELS.index(label),
                "prompt": PROMPT.format(text=text),
                "completion": f" {label}",
                "n_tokens": len(text.split()) + 12,
            }
        )
    return rows


def build_dataset(path: Path, n_train: int = 256, n_eval: int = 48) -> Path:
    """Save a DatasetDict with the materialize step's columns and splits."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features(
        {
            "example_id": Value("string"),
            "text": Value("string"),
            "label": ClassLabel(names=list(LABELS)),
            "prompt": Value("string"),
            "completion": Value("string"),
            "n_tokens": Value("int64"),
        }
    )
    splits = {
        "train": make_rows(n_train, 1),
        "validation": make_rows(n_eval, 2),
        "test": make_rows(n_eval, 3),
    }
    DatasetDict(
        {name: Dataset.from_list(rows, features=features) for name, rows in splits.items()}
    ).save_to_disk(str(path))
    return path


def build_prepared_parquet(folder: Path, n_train: int = 256, n_eval: int = 48) -> Path:
    """The tiny rows in prepare_data's layout: Parquet under split=..., labels as strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split, n, seed in (("train", n_train, 1), ("validation", n_eval, 2), ("test", n_eval, 3)):
        rows = make_rows(n, seed)
        for row in rows:
            row["label"] = LABELS[row["label"]]
        (folder / f"split={split}").mkdir(parents=True)
        half = len(rows) // 2
        for part, chunk in enumerate((rows[:half], rows[half:])):
            pq.write_table(
                pa.Table.from_pylist(chunk), folder / f"split={split}" / f"part-{part:05d}.parquet"
            )
    return folder


def build_tokenizer():
    """A byte-level BPE tokenizer trained on the test corpus, with <pad>, <s>, </s>, <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [row["prompt"] + row["completion"] for row in make_rows(400, 0)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    # Prepend <s> like LLaMA tokenizers do, so the tests exercise the BOS handling too.
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def build_model(path: Path, seed: int = 0) -> Path:
    """Save a randomly initialised 2-layer LLaMA (hidden 64) and its tokenizer to ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


# --------------------------------------------------------------------------------------------
# Shared, memoised training runs: the training and evaluation tests use the same trained models,
# so a session trains each configuration once.

TRAIN_CONFIGS: dict[str, dict] = {
    # LoRA on q/v alone barely moves a randomly initialised model (its lm_head caps the logits),
    # so the adapter run also trains lm_head in full, as the built-in recipe does for tiny bases.
    "lora": {
        "peft_method": "lora",
        "lora_target_modules": "q_proj,v_proj",
        "lora_modules_to_save": "lm_head",
        "learning_rate": 1e-2,
        "max_steps": 60,
    },
    "full": {"peft_method": "full", "learning_rate": 3e-3, "max_steps": 120},
}
_RUNS: dict[tuple[str, str], object] = {}


def workspace(root: Path) -> Path:
    """``root`` with ``model/``, ``data/`` and an MLflow SQLite store, built once."""
    try:
        from tests.mlflow_store import new_store
    except ImportError:  # tests/ is not a package: pytest put tests/ on sys.path
        from mlflow_store import new_store

    root.mkdir(parents=True, exist_ok=True)
    if not (root / "mlflow.db").exists():
        new_store(root / "mlflow.db")
    if not (root / "model" / "config.json").exists():
        build_model(root / "model")
    if not (root / "data" / "dataset_dict.json").exists():
        build_dataset(root / "data")
    return root


def tracking_uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def train_request(root: Path, name: str, **overrides):
    from sparktune.core.params import default_params
    from sparktune.model.train_request import TrainRequest

    params = default_params()
    params.update(
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        warmup_ratio=0.0,
        max_length=128,
        seed=7,
        **TRAIN_CONFIGS[name],
    )
    params.update(overrides)
    return TrainRequest(
        dataset_path=str(root / "data"),
        base_model=str(root / "model"),
        output_dir=str(root / "out" / name),
        params=params,
        mlflow_tracking_uri=tracking_uri(root),
        experiment_name="tiny-intent",
        train_key=f"tiny-{name}",
        tags={"data_fingerprint": "fp-tiny", "airflow.dag_id": "tests"},
        run_name=f"tiny-{name}",
    )


def trained(root: Path, name: str):
    """The TrainResult of configuration ``name`` in ``root``, training it on first use."""
    from sparktune.model.training import train

    key = (str(root), name)
    if key not in _RUNS:
        _RUNS[key] = train(train_request(root, name))
    return _RUNS[key]


def _call_with_fork_as_the_start_method(fn, args):
    import multiprocessing

    # A spawned child inherits the parent's start method; python -m sparktune.jobs.train has
    # Linux's default, fork, which the DataLoader's stream readers need (the stream is not picklable).
    multiprocessing.set_start_method("fork", force=True)
    return fn(*args)


def in_a_fresh_process(fn, *args):
    """``fn(*args)`` in a spawned process, as the training entry point always runs: for code that
    forks DataLoader workers. A fork of a pytest worker copies the Py4J sockets of the SparkSession
    an earlier test left there, and a finalizer in the fork waits on them forever (make test hung
    30 min that way). ``fn`` must be importable (a module-level function)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_call_with_fork_as_the_start_method, fn, args).result(timeout=900)


def train_in_a_fresh_process(request):
    """``sparktune.model.training.train(request)`` in a fresh process (see :func:`in_a_fresh_process`)."""
    from sparktune.model.training import train

    return in_a_fresh_process(train, request)
