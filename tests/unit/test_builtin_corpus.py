"""The support-ticket messages the built-in base model learns from and the demo data is made of."""

from __future__ import annotations

import hashlib
import time
from datetime import date

import pandas as pd
import pytest
from sparktune.model.builtin_corpus import INTENTS, SCHEMA, demo_corpus, generate_support_tickets


@pytest.fixture(scope="module")
def tickets() -> pd.DataFrame:
    return generate_support_tickets(5000, seed=7).to_pandas()


def test_schema_and_types(tickets):
    table = generate_support_tickets(50, seed=7)
    assert table.schema == SCHEMA
    assert list(tickets.columns) == [
        "message",
        "intent_label",
        "quality_score",
        "message_hash",
        "created_date",
    ]
    assert tickets.quality_score.between(0.0, 1.0).all()
    for message, digest in zip(tickets.message, tickets.message_hash, strict=True):
        assert digest == hashlib.sha256(message.encode("utf-8")).hexdigest()
    dates = tickets.created_date.map(date.fromisoformat)
    assert dates.min() >= date(2024, 1, 1)
    assert tickets.created_date.str.fullmatch(r"\d{4}-\d{2}-\d{2}").all()
    assert set(tickets.intent_label.dropna()) <= set(INTENTS)


def test_every_intent_present_and_balanced(tickets):
    assert len(INTENTS) >= 8
    shares = tickets.intent_label.value_counts(normalize=True)
    assert set(shares.index) == set(INTENTS)
    assert shares.min() > 0.5 / len(INTENTS)


def test_defects_at_documented_rates(tickets):
    trimmed = tickets.message.str.strip().str.len()
    rates = {
        "null_label": tickets.intent_label.isna().mean(),
        "stub": (trimmed < 20).mean(),
        "too_long": (tickets.message.str.len() > 2048).mean(),
        "low_quality": (tickets.quality_score < 0.85).mean(),
        # stubs repeat among themselves by nature: count re-sends among real messages
        "duplicate": tickets[trimmed >= 20].duplicated("message").mean(),
    }
    expected = {"null_label": 0.02, "stub": 0.03, "too_long": 0.01, "low_quality": 0.10, "duplicate": 0.05}
    for name, rate in expected.items():
        assert rate * 0.5 < rates[name] < rate * 1.6, (name, rates[name])
    # duplicates are whole re-sends: same hash and same label
    dups = tickets[tickets.duplicated("message_hash", keep=False) & (trimmed >= 20)]
    # (a rare natural collision of two composed messages may carry a low-quality wrong label)
    assert dups.groupby("message_hash").intent_label.nunique(dropna=False).eq(1).mean() > 0.98
    # whitespace-padded stubs exist, so only a trimmed length check catches them
    assert ((tickets.message.str.len() >= 20) & (trimmed < 20)).any()


def test_good_rows_have_high_quality_and_typical_lengths(tickets):
    good = tickets[tickets.quality_score >= 0.85]
    assert good.quality_score.between(0.85, 1.0).all()
    lengths = tickets.message.str.strip().str.len()
    normal = lengths[(lengths >= 20) & (lengths <= 2048)]
    assert normal.between(40, 400).mean() > 0.95
    assert 80 < normal.median() < 250


def test_intent_is_recoverable_from_text(tickets):
    # a bag-of-words model must reach high accuracy, so a fine-tuned LM can too
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.svm import LinearSVC

    lengths = tickets.message.str.strip().str.len()
    clean = tickets[
        (tickets.quality_score >= 0.85) & tickets.intent_label.notna() & lengths.between(20, 2048)
    ]
    clean = clean.drop_duplicates("message")
    train, test = clean.iloc[:3000], clean.iloc[3000:]
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2)
    model = LinearSVC().fit(vectorizer.fit_transform(train.message), train.intent_label)
    accuracy = (model.predict(vectorizer.transform(test.message)) == test.intent_label).mean()
    assert accuracy > 0.97


def test_deterministic_and_seed_dependent():
    a = generate_support_tickets(1000, seed=3)
    assert a.equals(generate_support_tickets(1000, seed=3))
    assert not a.column("message").equals(generate_support_tickets(1000, seed=4).column("message"))


def test_chunks_concatenate_to_the_whole():
    whole = generate_support_tickets(9000, seed=5)
    # a chunk straddling the internal block boundary at 4096 and 8192
    assert generate_support_tickets(5000, seed=5, start_row=4000).equals(whole.slice(4000, 5000))
    assert generate_support_tickets(0, seed=5).num_rows == 0


def test_demo_corpus_is_clean_and_deterministic():
    corpus = demo_corpus(6000, seed=1)
    assert len(corpus) == 6000 and corpus == demo_corpus(6000, seed=1)
    assert corpus != demo_corpus(6000, seed=2)
    assert all(20 <= len(text.strip()) <= 600 for text in corpus)
    assert len(set(corpus)) > 0.98 * len(corpus)


def test_200k_rows_in_a_few_seconds():
    started = time.perf_counter()
    table = generate_support_tickets(200_000, seed=7)
    elapsed = time.perf_counter() - started
    assert table.num_rows == 200_000
    # about 1.5 s on an idle 2-core machine; the bound leaves room for a busy CI
    assert elapsed < 15, f"200k rows took {elapsed:.1f} s"
