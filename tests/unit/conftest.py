"""Fixtures the unit tests of training and evaluation share."""

from __future__ import annotations

from pathlib import Path

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model


@pytest.fixture(scope="module")
def torch_single_thread():
    # Two intra-op threads on a 2-core machine shared with other work made a tiny model's step
    # ~10x slower (thread contention); one thread is the fastest setting for a model this small.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    # One folder per session: test_training.py and test_evaluation.py reuse the same trained models.
    return tiny_model.workspace(tmp_path_factory.getbasetemp() / "tiny-llama-workspace")


def make_tokenizer(folder: Path) -> Path:
    """A tiny byte-level BPE saved as a PreTrainedTokenizerFast folder (no hub needed)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "I was charged twice for my order last week",
        "How do I reset my password please help",
        "Please cancel my subscription today",
        "Classify the intent of this support message",
        "message number about topic billing refund account shipping",
    ] * 5
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1, special_tokens=["<s>", "</s>", "<unk>"])
    bpe._tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bpe.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory) -> str:
    """A tiny tokenizer folder for the Spark preparation tests."""
    return str(make_tokenizer(tmp_path_factory.mktemp("tokenizer")))
