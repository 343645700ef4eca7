"""Batch inference on Spark with the tiny causal LM registered under an alias."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

try:
    from tests.unit import tiny_model
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    import tiny_model

MODEL_NAME = "tiny-intent-inference"
SCORED_AT = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


@pytest.fixture(scope="module")
def registered(root, torch_single_thread):
    """The tiny full fine-tune registered as MODEL_NAME@champion; returns (root, tracking uri)."""
    from mlflow.tracking import MlflowClient
    from sparktune.release.registry import register_run_model

    result = tiny_model.trained(root, "full")
    uri = tiny_model.tracking_uri(root)
    client = MlflowClient(tracking_uri=uri)
    version = register_run_model(client, MODEL_NAME, result.mlflow_run_id, {"data_fingerprint": "fp-tiny"})
    client.set_registered_model_alias(MODEL_NAME, "champion", version)
    return root, uri


@pytest.fixture(scope="module")
def model_ref(registered):
    from sparktune.serve.inference import resolve_model

    root, uri = registered
    return resolve_model(MODEL_NAME, "champion", uri, download_dir=root / "inference-models")


@pytest.fixture(scope="module")
def rows():
    return tiny_model.make_rows(64, 11)


@pytest.fixture(scope="module")
def source(spark, rows):
    data = [(r["example_id"], r["text"], tiny_model.LABELS[r["label"]]) for r in rows]
    return spark.createDataFrame(data, "ticket_id string, body string, truth string").repartition(2)


@pytest.fixture(scope="module")
def scored(source, model_ref):
    from sparktune.serve.inference import score_dataframe

    return score_dataframe(
        source, model_ref, text_column="body", id_column="ticket_id", batch_size=8, scored_at=SCORED_AT
    ).toPandas()


def test_resolve_model_reads_the_alias_tags_and_run(model_ref):
    assert model_ref.version == "1"
    assert model_ref.alias == "champion"
    assert model_ref.data_fingerprint == "fp-tiny"
    assert model_ref.task == "causal_lm"
    assert set(model_ref.labels) == set(tiny_model.LABELS)
    assert "{text}" in model_ref.prompt_template
    assert (Path(model_ref.local_path) / "MLmodel").exists()


def test_resolve_model_reuses_the_download(registered, model_ref):
    from sparktune.serve.inference import resolve_model

    root, uri = registered
    again = resolve_model(MODEL_NAME, "champion", uri, download_dir=root / "inference-models")
    assert again == model_ref


def test_missing_alias_is_a_clear_error(registered):
    from sparktune.serve.inference import InferenceInputError, resolve_model

    root, uri = registered
    with pytest.raises(InferenceInputError) as err:
        resolve_model(MODEL_NAME, "nope", uri, download_dir=root / "inference-models")
    message = str(err.value)
    assert "'nope'" in message and "champion -> v1" in message and "set_registered_model_alias" in message
    with pytest.raises(InferenceInputError, match="No registered model 'absent'"):
        resolve_model("absent", "champion", uri, download_dir=root / "inference-models")


def test_columns_types_and_one_row_per_id(scored, rows):
    from sparktune.serve.inference import OUTPUT_COLUMNS

    assert list(scored.columns) == [*OUTPUT_COLUMNS, "date"]
    assert sorted(scored["id"]) == sorted(r["example_id"] for r in rows)
    assert set(scored["model_name"]) == {MODEL_NAME}
    assert set(scored["model_version"]) == {"1"}
    assert set(scored["model_alias"]) == {"champion"}
    assert set(scored["data_fingerprint"]) == {"fp-tiny"}
    assert scored["score"].between(0.0, 1.0).all()
    assert str(scored["date"].iloc[0]) == "2025-03-04"


def test_predictions_are_labels_and_mostly_right(scored, rows):
    truth = {r["example_id"]: tiny_model.LABELS[r["label"]] for r in rows}
    assert set(scored["prediction"]) <= set(tiny_model.LABELS)
    accuracy = sum(truth[i] == p for i, p in zip(scored["id"], scored["prediction"], strict=True)) / len(rows)
    assert accuracy >= 0.8


def test_scores_match_unsorted_single_row_scoring(scored, rows, model_ref):
    """Length sorting and batching restore row identity: each row scores as it does alone."""
    from sparktune.core.label_scoring import score_texts
    from sparktune.serve.inference import load_cached

    loaded = load_cached(model_ref)
    model, tokenizer = loaded.model, loaded.tokenizer
    texts = [r["text"] for r in rows[:6]]
    alone = [score_texts(model, tokenizer, [t], model_ref, 1) for t in texts]
    by_id = scored.set_index("id")
    for row, (labels, scores) in zip(rows[:6], alone, strict=True):
        assert by_id.loc[row["example_id"], "prediction"] == labels[0]
        assert by_id.loc[row["example_id"], "score"] == pytest.approx(scores[0], abs=1e-4)


def _completion_loss_scores(model, tokenizer, texts, ref):
    """The reference: every prompt x candidate scored by label_scoring.completion_loss, one pass each."""
    import torch
    from sparktune.core.label_scoring import completion_loss, format_example

    prompts = [format_example(ref.prompt_template, text, "")[0] for text in texts]
    completions = [format_example(ref.prompt_template, "", label)[1] for label in ref.labels]
    pairs = [p for p in prompts for _ in completions]
    with torch.inference_mode():
        losses, _ = completion_loss(model, tokenizer, pairs, completions * len(prompts), len(pairs))
    probs = torch.softmax(-torch.tensor(losses, dtype=torch.float64).view(len(texts), -1), dim=1)
    return [ref.labels[int(i)] for i in probs.argmax(dim=1)], probs.max(dim=1).values.tolist()


def _mixed_length_texts(rows):
    by_length = sorted((r["text"] for r in rows), key=len)
    return [
        by_length[-1],
        "invoice",
        by_length[len(by_length) // 2],
        " ".join(by_length[-3:]),  # far longer than the rest: lots of padding in one batch
        by_length[0],
        "where is my parcel",
    ]


def test_a_loaded_model_is_left_out_of_later_garbage_collections(model_ref, monkeypatch):
    """PySpark runs a full collection after every task of a reused Python worker: what loading the
    model left alive (the model, the libraries) is frozen out of those collections."""
    import gc

    from sparktune.serve import inference

    monkeypatch.setattr(inference, "_MODEL_CACHE", {})
    freezes = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (freezes.append(1), freeze()))
    gc.unfreeze()
    loaded = inference.load_cached(model_ref)
    assert gc.get_freeze_count() > 0
    assert inference.load_cached(model_ref) is loaded
    assert len(freezes) == 1  # once per process and model


def test_shared_prompt_scoring_matches_completion_loss(model_ref, rows, monkeypatch):
    """One pass over the prompts + one over the candidates (KV cache reused) = completion_loss."""
    import sparktune.core.label_scoring
    from sparktune.core.label_scoring import score_texts
    from sparktune.serve.inference import load_cached

    loaded = load_cached(model_ref)
    model, tokenizer = loaded.model, loaded.tokenizer
    texts = _mixed_length_texts(rows)
    expected = _completion_loss_scores(model, tokenizer, texts, model_ref)

    def no_fallback(*args, **kwargs):
        raise AssertionError("every prompt here should be scored through its KV cache")

    monkeypatch.setattr(sparktune.core.label_scoring, "completion_loss", no_fallback)
    predictions, scores = score_texts(model, tokenizer, texts, model_ref, batch_size=len(texts))
    assert predictions == expected[0]
    assert scores == pytest.approx(expected[1], abs=1e-4)
    # Batched differently (and one at a time), the same numbers.
    for batch_size in (1, 4):
        again = score_texts(model, tokenizer, texts, model_ref, batch_size=batch_size)
        assert again[0] == predictions
        assert again[1] == pytest.approx(scores, abs=1e-4)


@pytest.mark.parametrize("layout", ["one_row", "one_row_by_length", "one_row_eager", "repeated_rows"])
@pytest.mark.parametrize("start", ["shared_start", "no_shared_start"])
def test_cached_passes_match_one_forward_per_candidate(model_ref, monkeypatch, layout, start):
    """The three cached passes give each tail's log-likelihood as one plain forward over prompt +
    tail does: prompts of different lengths with and without a common start, tails of one to four
    tokens, distinct or sharing their first tokens (a candidate's tokens see only its own and those
    it shares with others), all of a prompt's candidates in one
    row (sdpa's boolean mask, eager attention's additive one) or the cache repeated per candidate
    (attention that takes no custom mask)."""
    import random

    import sparktune.core.label_scoring
    import torch
    from sparktune.core.label_scoring import _shared_prompt_log_likelihood
    from sparktune.serve.inference import load_cached

    loaded = load_cached(model_ref)
    model = loaded.model
    if layout == "repeated_rows":
        monkeypatch.setattr(sparktune.core.label_scoring, "_CUSTOM_MASK_ATTENTION", ())
    if layout == "one_row_by_length":  # free calls: a group per length, each over its copy of the cache
        monkeypatch.setattr(sparktune.core.label_scoring, "_call_cost_in_tokens", lambda model: 0.0)
    rng = random.Random(5)
    vocab = model.config.vocab_size
    common = [rng.randrange(5, vocab) for _ in range(6)] if start == "shared_start" else []
    prompts = [common + [rng.randrange(5, vocab) for _ in range(n)] for n in (1, 9, 4, 17)]
    if start == "no_shared_start":
        prompts = [[5 + i] + ids for i, ids in enumerate(prompts)]  # no two start alike
    token = lambda: rng.randrange(5, vocab)  # noqa: E731
    tails = [[token() for _ in range(n)] for _ in prompts[:2] for n in (1, 3, 2, 4)]
    # Candidates that share tokens: all four start alike (run once, with the prompt), and some go on
    # alike (one slot for both); then a candidate that is all of another's start.
    c, a, b, d, e, f = (token() for _ in range(6))
    tails += [[c, a], [c, b, d], [c, b, e, f], [c, b, e]]
    tails += [[c], [c, a], [c, b, d, e], [c, b, d]]
    if layout == "one_row_eager":
        model.set_attn_implementation("eager")
    try:
        found = _shared_prompt_log_likelihood(model, prompts, tails, loaded.tokenizer.pad_token_id)
    finally:
        model.set_attn_implementation("sdpa")
    expected = []
    with torch.inference_mode():
        for i, tail in enumerate(tails):
            ids = prompts[i // 4]
            logits = model(input_ids=torch.tensor([ids + tail])).logits[0].float()
            log_probs = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)
            expected.append(float(log_probs.gather(1, torch.tensor(tail)[:, None]).sum()))
    assert found.tolist() == pytest.approx(expected, abs=1e-3)


def test_length_groups_trade_padding_against_calls():
    from sparktune.core.label_scoring import _length_groups

    assert _length_groups([3, 3, 3, 20], call_cost=0.0) == [(0, 3), (3, 4)]
    assert _length_groups([3, 3, 3, 20], call_cost=100.0) == [(0, 4)]
    assert _length_groups([5, 6, 7], call_cost=0.0) == [(0, 1), (1, 2), (2, 3)]
    assert _length_groups([4], call_cost=1.0) == [(0, 1)]
    assert _length_groups([2, 2, 9, 9, 9], call_cost=0.0) == [(0, 2), (2, 5)]


def test_a_forward_call_costs_more_tokens_on_a_narrow_model_and_on_a_gpu():
    from types import SimpleNamespace

    import torch
    from sparktune.core.label_scoring import _call_cost_in_tokens

    def model(device: str, hidden: int) -> SimpleNamespace:
        return SimpleNamespace(device=torch.device(device), config=SimpleNamespace(hidden_size=hidden))

    assert _call_cost_in_tokens(model("cpu", 64)) == pytest.approx(61.0, abs=0.1)
    assert _call_cost_in_tokens(model("cpu", 576)) == 16.0
    assert _call_cost_in_tokens(model("cuda", 576)) == 512.0


def test_prompts_whose_tokens_merge_with_the_label_fall_back_to_completion_loss(model_ref, rows, monkeypatch):
    """No space before {label}: some texts' last word merges with the label's first letters, so
    those prompts' tokens are no prefix of prompt + label; they are scored like before, the rest
    through the cache, and the batch comes back in order."""
    import dataclasses

    import sparktune.core.label_scoring
    from sparktune.core.label_scoring import score_texts
    from sparktune.serve.inference import load_cached

    loaded = load_cached(model_ref)
    model, tokenizer = loaded.model, loaded.tokenizer
    ref = dataclasses.replace(model_ref, prompt_template="{text}{label}")
    texts = _mixed_length_texts(rows) + [r["text"] for r in rows[:6]]
    expected = _completion_loss_scores(model, tokenizer, texts, ref)
    calls = []
    original = sparktune.core.label_scoring.completion_loss

    def counting(model, tokenizer, prompts, completions, batch_size):
        calls.append(len(prompts) // len(ref.labels))
        return original(model, tokenizer, prompts, completions, batch_size)

    monkeypatch.setattr(sparktune.core.label_scoring, "completion_loss", counting)
    predictions, scores = score_texts(model, tokenizer, texts, ref, batch_size=len(texts))
    assert 0 < sum(calls) < len(texts)  # both paths in one batch
    assert predictions == expected[0]
    assert scores == pytest.approx(expected[1], abs=1e-4)


def test_the_true_labels_loss_comes_from_the_candidate_scores_on_either_path(model_ref, rows):
    """score_texts_with_loss gives score_texts's answers and each text's true label's loss and
    token count as completion_loss gives them, whether the candidates went through the KV cache
    or (prompts merging with the label, {text}{label}) through completion_loss."""
    import dataclasses

    import torch
    from sparktune.core.label_scoring import (
        completion_loss,
        format_example,
        score_texts,
        score_texts_with_loss,
    )
    from sparktune.serve.inference import load_cached

    loaded = load_cached(model_ref)
    model, tokenizer = loaded.model, loaded.tokenizer
    texts = _mixed_length_texts(rows) + [r["text"] for r in rows[:6]]
    truth = [tiny_model.LABELS[i % len(tiny_model.LABELS)] for i in range(len(texts))]
    for template in (model_ref.prompt_template, "{text}{label}"):
        ref = dataclasses.replace(model_ref, prompt_template=template)
        targets = [format_example(template, text, label) for text, label in zip(texts, truth, strict=True)]
        found = score_texts_with_loss(model, tokenizer, texts, ref, 4, targets)
        assert found[:2] == score_texts(model, tokenizer, texts, ref, 4)
        with torch.inference_mode():
            losses, counts = completion_loss(model, tokenizer, *map(list, zip(*targets, strict=True)), 4)
        assert found[3] == counts
        # Float32 sums: at the untrained template's losses of ~100, 1e-5 is two ulps.
        assert found[2] == pytest.approx(losses, rel=1e-6, abs=1e-5)


def test_a_cache_that_cannot_be_reused_falls_back_to_completion_loss(model_ref, rows, monkeypatch):
    """A model whose cache holds recurrent state (or a short sliding window) is scored as before."""
    import sparktune.serve.inference
    from sparktune.core.label_scoring import score_texts
    from sparktune.serve.inference import load_cached

    loaded = load_cached(model_ref)
    model, tokenizer = loaded.model, loaded.tokenizer
    texts = _mixed_length_texts(rows)
    expected = _completion_loss_scores(model, tokenizer, texts, model_ref)
    monkeypatch.setattr(sparktune.core.label_scoring, "_cache_reusable", lambda cache, length: False)
    predictions, scores = score_texts(model, tokenizer, texts, model_ref, batch_size=4)
    assert predictions == expected[0]
    assert scores == pytest.approx(expected[1], abs=1e-4)


def test_min_score_keeps_rows_at_or_above_it(source, model_ref, scored):
    from sparktune.serve.inference import score_dataframe

    threshold = float(scored["score"].median())
    kept = score_dataframe(
        source,
        model_ref,
        text_column="body",
        id_column="ticket_id",
        batch_size=16,
        min_score=threshold,
        scored_at=SCORED_AT,
    ).toPandas()
    assert sorted(kept["id"]) == sorted(scored.loc[scored["score"] >= threshold - 1e-9, "id"])
    assert (kept["score"] >= threshold).all()


def test_bad_columns_are_listed_together(source, model_ref):
    from sparktune.serve.inference import InferenceInputError, score_dataframe

    with pytest.raises(InferenceInputError) as err:
        score_dataframe(source, model_ref, text_column="x", id_column="y", batch_size=0, scored_at=SCORED_AT)
    assert "'x'" in str(err.value) and "'y'" in str(err.value) and "batch_size" in str(err.value)


def test_write_is_idempotent_per_run_date(spark, tmp_path, source, model_ref):
    from sparktune.serve.inference import score_dataframe, write_predictions

    out = str(tmp_path / "predictions")
    small = source.limit(10)
    first = score_dataframe(small, model_ref, text_column="body", id_column="ticket_id", scored_at=SCORED_AT)
    assert write_predictions(first, out, "2025-03-04") == 10
    assert write_predictions(first, out, "2025-03-05") == 10
    assert write_predictions(first, out, "2025-03-04") == 10  # the rerun replaces its own partition
    written = spark.read.parquet(out)
    assert written.count() == 20
    counts = {str(r["date"]): r["count"] for r in written.groupBy("date").count().collect()}
    assert counts == {"2025-03-04": 10, "2025-03-05": 10}
    assert sorted(p.name for p in Path(out).glob("date=*")) == ["date=2025-03-04", "date=2025-03-05"]


def _last_write_plan(spark) -> str:
    """The physical plan of the session's newest SQL execution (Spark's SQL status store)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    plans = [executions.apply(i).physicalPlanDescription() for i in range(executions.size())]
    return [plan for plan in plans if "InsertIntoHadoopFsRelationCommand" in plan][-1]


def test_a_dated_write_plans_no_sort_and_leaves_the_session_conf_as_it_was(spark, tmp_path):
    # Without concurrent writers Spark sorts every task's rows by date before writing them: at 5M
    # predictions that held the JVM at its heap. Many dates (more than the open-writer limit)
    # still land in their own partitions, through Spark's fallback to the sort.
    from pyspark.sql import functions as F
    from sparktune.serve.inference import _CONCURRENT_WRITERS, _CONCURRENT_WRITERS_CONF, write_dated_partition

    spark._jsparkSession.sharedState().statusStore()  # listening from here on
    before = spark.conf.get(_CONCURRENT_WRITERS_CONF, None)
    one_day = spark.range(1000).select(F.col("id"), F.lit("2025-03-04").cast("date").alias("date"))
    assert write_dated_partition(one_day, str(tmp_path / "one")) == 1000
    plan = _last_write_plan(spark)
    assert not re.search(r"\bSort\b", plan), plan
    assert spark.conf.get(_CONCURRENT_WRITERS_CONF, None) == before

    days = _CONCURRENT_WRITERS * 3
    day = F.date_add(F.lit("2025-03-01").cast("date"), (F.col("id") % days).cast("int"))
    many = spark.range(3000).select(F.col("id"), day.alias("date")).repartition(1)
    assert write_dated_partition(many, str(tmp_path / "many")) == 3000
    counts = spark.read.parquet(str(tmp_path / "many")).groupBy("date").count().collect()
    assert len(counts) == days and {r["count"] for r in counts} == {3000 // days}
    assert len(list((tmp_path / "many").glob("date=*"))) == days


def test_job_writes_a_summary_and_exits_2_on_a_missing_alias(spark, tmp_path, registered, source):
    import json

    from sparktune.jobs import batch_inference

    root, uri = registered
    data = tmp_path / "texts.parquet"
    source.limit(8).write.parquet(str(data))
    common = [
        "--source", str(data), "--text-column", "body", "--id-column", "ticket_id",
        "--output-uri", str(tmp_path / "out"), "--model-name", MODEL_NAME, "--tracking-uri", uri,
        "--download-dir", str(root / "inference-models"), "--run-date", "2025-03-04",
    ]  # fmt: skip
    summary = tmp_path / "summary.json"
    assert batch_inference.main([*common, "--summary-path", str(summary)]) == 0
    done = json.loads(summary.read_text())
    assert done["rows_written"] == 8 and done["model"]["version"] == "1"
    assert done["partition"] == "date=2025-03-04"

    bad = tmp_path / "bad.json"
    assert batch_inference.main([*common, "--model-alias", "nope", "--summary-path", str(bad)]) == 2
    assert json.loads(bad.read_text())["kind"] == "InferenceInputError"
