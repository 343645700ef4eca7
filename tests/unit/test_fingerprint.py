"""Data and tokenizer fingerprints: content-based, order-independent, sensitive to every change."""

from __future__ import annotations

import pytest
from sparktune.core.params import parse_params
from sparktune.data.fingerprint import data_fingerprint, preparation_params, tokenizer_fingerprint

SCHEMA = (
    "example_id string, text string, label string, prompt string, "
    "completion string, n_tokens int, split string"
)


def make_rows(n: int = 40) -> list[tuple]:
    labels = ["billing", "refund", "account"]
    splits = ["train"] * 8 + ["validation", "test"]
    return [
        (
            f"{i:064x}",
            f"text {i}",
            labels[i % 3],
            f"[INST] text {i} [/INST]",
            f" {labels[i % 3]}",
            10 + i % 7,
            splits[i % 10],
        )
        for i in range(n)
    ]


@pytest.fixture()
def params():
    return parse_params({})


@pytest.mark.spark
def test_same_rows_in_any_order_or_partitioning_give_the_same_fingerprint(spark, params):
    rows = make_rows()
    base = data_fingerprint(spark.createDataFrame(rows, SCHEMA), params, "tok")
    shuffled = spark.createDataFrame(list(reversed(rows)), SCHEMA).repartition(5)
    reordered_columns = spark.createDataFrame(rows, SCHEMA).select(
        "split", "n_tokens", "label", "prompt", "completion", "text", "example_id"
    )
    assert data_fingerprint(shuffled, params, "tok") == base
    assert data_fingerprint(reordered_columns, params, "tok") == base
    assert len(base) == 20 and int(base, 16) >= 0


@pytest.mark.spark
def test_any_changed_row_param_or_tokenizer_changes_the_fingerprint(spark, params):
    rows = make_rows()
    base = data_fingerprint(spark.createDataFrame(rows, SCHEMA), params, "tok")

    def variant(changed_rows):
        return data_fingerprint(spark.createDataFrame(changed_rows, SCHEMA), params, "tok")

    one_split = rows[:5] + [rows[5][:6] + ("test",)] + rows[6:]
    one_token = rows[:7] + [rows[7][:5] + (rows[7][5] + 1, rows[7][6])] + rows[8:]
    swapped = rows[:2] + [rows[2][:2] + ("refund",) + rows[2][3:]] + rows[3:]
    fingerprints = {
        "base": base,
        "split": variant(one_split),
        "n_tokens": variant(one_token),
        "label": variant(swapped),
        "removed": variant(rows[1:]),
        "duplicated": variant(rows + rows[:1]),
        "empty": variant([]),
        "min_chars": data_fingerprint(
            spark.createDataFrame(rows, SCHEMA), params.model_copy(update=dict(min_chars=21)), "tok"
        ),
        "template": data_fingerprint(
            spark.createDataFrame(rows, SCHEMA),
            params.model_copy(update=dict(prompt_template="{text} => {label}")),
            "tok",
        ),
        "tokenizer": data_fingerprint(spark.createDataFrame(rows, SCHEMA), params, "other"),
        "id_column": data_fingerprint(
            spark.createDataFrame(rows, SCHEMA), params.model_copy(update=dict(id_column="ticket_id")), "tok"
        ),
        "timestamp_column": data_fingerprint(
            spark.createDataFrame(rows, SCHEMA),
            params.model_copy(update=dict(timestamp_column="created")),
            "tok",
        ),
    }
    assert len(set(fingerprints.values())) == len(fingerprints), fingerprints

    # Training params do not name a new data version.
    training_only = params.model_copy(
        update=dict(learning_rate=1e-3, lora_r=8, base_model="/elsewhere", source_uri="/moved")
    )
    assert data_fingerprint(spark.createDataFrame(rows, SCHEMA), training_only, "tok") == base


@pytest.mark.spark
def test_fingerprint_follows_the_files_not_the_plan(spark, params, tmp_path):
    path = str(tmp_path / "rows.parquet")
    rows = make_rows(12)
    spark.createDataFrame(rows, SCHEMA).write.parquet(path)
    first = spark.read.parquet(path)
    before = data_fingerprint(first, params, "tok")
    spark.createDataFrame(rows[:-1] + [rows[-1][:1] + ("edited",) + rows[-1][2:]], SCHEMA).write.mode(
        "overwrite"
    ).parquet(path)
    again = spark.read.parquet(path)
    assert again.semanticHash() == first.semanticHash()  # same plan ...
    assert data_fingerprint(again, params, "tok") != before  # ... different data


def test_preparation_params_are_only_those_that_shape_the_data(params):
    assert set(preparation_params(params)) == {
        "source_format",
        "text_column",
        "label_column",
        "quality_column",
        "id_column",
        "timestamp_column",
        "label_conflicts",
        "min_quality_score",
        "min_chars",
        "max_chars",
        "max_length",
        "split_seed",
        "prompt_template",
    }


def test_tokenizer_fingerprint_hashes_the_tokenizer_files(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>"}')
    first = tokenizer_fingerprint(str(folder))
    assert len(first) == 16 and first == tokenizer_fingerprint(str(folder))

    (folder / "model.safetensors").write_bytes(b"weights do not change the tokenizer")
    assert tokenizer_fingerprint(str(folder)) == first
    (folder / "special_tokens_map.json").write_text('{"eos_token": "</s>"}')
    with_map = tokenizer_fingerprint(str(folder))
    assert with_map != first
    (folder / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0, "b": 1}}}')
    assert tokenizer_fingerprint(str(folder)) not in (first, with_map)

    # The content counts, not where the folder is.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (copy / name).write_bytes((folder / name).read_bytes())
    assert tokenizer_fingerprint(str(copy)) == tokenizer_fingerprint(str(folder))


def test_tokenizer_fingerprint_of_a_hub_id_hashes_the_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no local folder of that name
    a = tokenizer_fingerprint("mistralai/Mistral-7B-Instruct-v0.3")
    assert a == tokenizer_fingerprint("mistralai/Mistral-7B-Instruct-v0.3")
    assert a != tokenizer_fingerprint("meta-llama/Llama-3.2-1B")
