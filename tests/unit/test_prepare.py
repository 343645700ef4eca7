"""The preparation recipe on local[1] Spark: step counts, quarantine, loading, split, publishing.

Over 600 lines on purpose: the tests share one Spark session per module and one xdist group
(tests/conftest.py); a second module would start a second JVM for the same fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sparktune.core.params import parse_params

pytestmark = pytest.mark.spark

GOOD_BILLING = "I was charged twice for my order last week"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPARKTUNE_LAKE_URI", raising=False)


def n_tokens(tokenizer_path: str, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tokenizer_path)(text)["input_ids"])


def defect_rows() -> list[tuple]:
    # (message, intent_label, quality_score, ticket_id): one defect of each kind
    return [
        (GOOD_BILLING, "billing", 0.9, 1),
        ("  How do I reset my password\tplease help  ", " password ", 0.95, 2),
        ("My order {text} {label} shows {0} weird braces", "shipping", 0.99, 3),
        ("This message has a low quality score", "billing", 0.5, 4),
        ("This message has no quality score at all", "billing", None, 5),
        ("This message has a null label attached", None, 0.9, 6),
        ("This message has a blank label attached", "   ", 0.9, 7),
        ("  hi  ", "greeting", 0.9, 8),
        ("x" * 300, "billing", 0.9, 9),
        ("i WAS charged  twice for MY order last week ", "billing", 0.97, 10),
        ("\U0001f600" * 60, "emoji", 0.9, 11),
    ]


def defect_df(spark, rows=None):
    return spark.createDataFrame(
        rows or defect_rows(), "message string, intent_label string, quality_score double, ticket_id long"
    )


def defect_params(tokenizer_path: str, **overrides):
    good = [
        GOOD_BILLING,
        "How do I reset my password please help",
        "My order {text} {label} shows {0} weird braces",
    ]
    template_overhead = "[INST] Classify the intent of this support message:\n\n [/INST] shipping"
    longest_good = max(n_tokens(tokenizer_path, template_overhead + text) for text in good)
    return parse_params({"max_chars": 200, "max_length": longest_good + 5, **overrides})


@pytest.fixture(scope="module")
def defect_prepared(spark, tokenizer_path, tmp_path_factory):
    """The defect rows prepared once for the tests that read the result (persisted frames)."""
    from sparktune.data.prepare import prepare

    with pytest.MonkeyPatch.context() as patch:  # what _home does for a test
        patch.setenv("SPARKTUNE_HOME", str(tmp_path_factory.mktemp("defects") / "home"))
        patch.delenv("SPARKTUNE_LAKE_URI", raising=False)
        prepared = prepare(defect_df(spark), defect_params(tokenizer_path), tokenizer_path)
    yield prepared
    prepared.unpersist()


def test_every_step_counts_one_defect_of_each_kind(defect_prepared, tokenizer_path):
    params = defect_params(tokenizer_path)
    emoji_tokens = n_tokens(tokenizer_path, "[INST] x [/INST] emoji" + "\U0001f600" * 60)
    assert emoji_tokens > params.max_length  # the emoji row really is over the token limit

    prepared = defect_prepared
    steps = [(s.step, s.rows_in, s.rows_out, s.skipped) for s in prepared.steps]
    assert steps == [
        ("read", 11, 11, False),
        ("min_quality_score", 11, 9, False),
        ("null_label", 9, 7, False),
        ("length", 7, 5, False),
        ("dedupe", 5, 4, False),
        ("label_conflict", 4, 4, False),
        ("format", 4, 4, False),
        ("max_length", 4, 3, False),
        ("split", 3, 3, False),
    ]
    rows = {r["label"]: r.asDict() for r in prepared.rows.collect()}
    assert set(rows) == {"billing", "password", "shipping"}
    assert prepared.rows.columns == [
        "example_id",
        "text",
        "label",
        "prompt",
        "completion",
        "n_tokens",
        "split",
    ]
    types = dict(prepared.rows.dtypes)
    assert types["n_tokens"] == "int" and types["example_id"] == types["split"] == "string"

    password = rows["password"]
    assert password["text"] == "How do I reset my password\tplease help"
    assert password["prompt"] == (
        "[INST] Classify the intent of this support message:\n\n"
        "How do I reset my password\tplease help [/INST]"
    )
    assert password["completion"] == " password"
    assert password["n_tokens"] == n_tokens(tokenizer_path, password["prompt"] + password["completion"])
    import hashlib

    assert password["example_id"] == hashlib.sha256(b"how do i reset my password please help").hexdigest()
    # Braces in the text are data, not format fields.
    assert "{text} {label} shows {0}" in rows["shipping"]["prompt"]
    assert all(r["split"] in ("train", "validation", "test") for r in rows.values())


def test_quarantine_keeps_original_values_and_reasons(defect_prepared):
    quarantine = defect_prepared.quarantine.collect()
    reasons = sorted(r["reject_reason"] for r in quarantine)
    assert reasons == sorted(
        ["min_quality_score"] * 2 + ["null_label"] * 2 + ["length"] * 2 + ["dedupe", "max_length"]
    )
    by_text = {r["text"]: r for r in quarantine}
    assert by_text["  hi  "]["reject_reason"] == "length"  # untrimmed, as it was
    assert "2 chars" in by_text["  hi  "]["reject_detail"]
    assert by_text["This message has a low quality score"]["quality"] == "0.5"
    assert "0.5 < 0.85" in by_text["This message has a low quality score"]["reject_detail"]
    assert "missing" in by_text["This message has no quality score at all"]["reject_detail"]
    assert by_text["This message has a blank label attached"]["label"] == "   "
    assert by_text["This message has a null label attached"]["reject_detail"] == "label is null"
    assert "max_length" in by_text["\U0001f600" * 60]["reject_detail"]
    assert all(r["reject_detail"] for r in quarantine)


def test_dedupe_keeps_the_same_copy_whatever_the_order(spark, tokenizer_path, defect_prepared):
    from sparktune.data.prepare import prepare

    params = defect_params(tokenizer_path)
    forward = defect_prepared
    backward = prepare(defect_df(spark, list(reversed(defect_rows()))).repartition(3), params, tokenizer_path)
    kept = [sorted(p.rows.select("text", "split").collect()) for p in (forward, backward)]
    assert kept[0] == kept[1]
    dropped = [p.quarantine.filter("reject_reason = 'dedupe'").first()["text"] for p in (forward, backward)]
    assert dropped[0] == dropped[1]
    assert dropped[0] in (GOOD_BILLING, "i WAS charged  twice for MY order last week ")
    backward.unpersist()


def test_quality_step_is_skipped_without_a_quality_column(spark, tokenizer_path):
    from sparktune.data.prepare import prepare

    for params in (
        defect_params(tokenizer_path, quality_column=""),
        defect_params(tokenizer_path, quality_column="not_there"),
    ):
        prepared = prepare(defect_df(spark), params, tokenizer_path)
        quality = prepared.steps[1]
        assert (quality.step, quality.rows_in, quality.rows_out, quality.skipped) == (
            "min_quality_score",
            11,
            11,
            True,
        )
        assert prepared.quarantine.filter("reject_reason = 'min_quality_score'").count() == 0
        prepared.unpersist()


def test_custom_template_and_column_names(spark, tokenizer_path):
    from sparktune.core.label_scoring import format_example
    from sparktune.data.prepare import prepare

    df = spark.createDataFrame([("A perfectly normal message text", 3)], "body string, `the label` int")
    params = parse_params(
        {
            "text_column": "body",
            "label_column": "the label",
            "quality_column": "",
            "prompt_template": "Text: {text}\nLabel:\t{label}</s>",
        }
    )
    row = prepare(df, params, tokenizer_path).rows.first()
    assert row["label"] == "3"
    assert (row["prompt"], row["completion"]) == ("Text: A perfectly normal message text\nLabel:", "\t3</s>")
    assert (row["prompt"], row["completion"]) == format_example(params.prompt_template, row["text"], "3")


def test_csv_with_bom_crlf_and_quoted_newlines(spark, tmp_path):
    from sparktune.data.prepare_source import load_source

    path = tmp_path / "export.csv"
    path.write_bytes(
        "\ufeffmessage,intent_label,quality_score\r\n"
        '"Hello, my ""order"" is late\r\nsecond line of it",shipping,0.9\r\n'
        "A plain line without quotes at all,billing,0.95\r\n".encode()
    )
    df = load_source(spark, str(path), "auto")
    assert df.columns == ["message", "intent_label", "quality_score"]
    rows = df.collect()
    assert len(rows) == 2
    assert rows[0]["message"].startswith('Hello, my "order" is late') and "second line" in rows[0]["message"]
    assert [r["intent_label"] for r in rows] == ["shipping", "billing"]
    assert rows[1]["quality_score"] == "0.95"


def test_load_source_formats_and_errors(spark, tmp_path):
    from sparktune.data.prepare_errors import DataPreparationError, MissingColumnsError, SourceNotFoundError
    from sparktune.data.prepare_source import check_columns, load_source, resolve_format

    df = defect_df(spark)
    df.write.parquet(str(tmp_path / "folder"))
    assert resolve_format(spark, str(tmp_path / "folder"), "auto") == "parquet"
    assert load_source(spark, str(tmp_path / "folder"), "auto").count() == 11

    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"message": "one", "intent_label": "a"}\n{"message": "two", "intent_label": "b"}\n')
    assert load_source(spark, str(jsonl), "auto").count() == 2
    array = tmp_path / "array.json"
    array.write_text('[{"message": "one", "intent_label": "a"}, {"message": "two", "intent_label": "b"}]')
    assert sorted(load_source(spark, str(array), "auto").columns) == ["intent_label", "message"]

    df.createOrReplaceTempView("support_tickets")
    assert resolve_format(spark, "support_tickets", "auto") == "table"
    assert load_source(spark, "support_tickets", "auto").count() == 11

    with pytest.raises(SourceNotFoundError, match="nowhere/tickets.parquet"):
        load_source(spark, str(tmp_path / "nowhere/tickets.parquet"), "auto")
    with pytest.raises(SourceNotFoundError, match="no_such_table.*not in the Spark catalog"):
        load_source(spark, "no_such_table", "auto")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "data.bin").write_text("x")
    with pytest.raises(DataPreparationError, match="set source_format"):
        load_source(spark, str(tmp_path / "odd"), "auto")

    params = parse_params({"text_column": "body", "label_column": "intent"})
    with pytest.raises(MissingColumnsError) as err:
        check_columns(df, params)
    message = str(err.value)
    assert "text_column 'body'" in message and "label_column 'intent'" in message
    assert "'message', 'intent_label', 'quality_score', 'ticket_id'" in message


def labelled_rows(n: int, labels: list[str]) -> list[tuple]:
    return [
        (f"support message number {i} about {labels[i % len(labels)]}", labels[i % len(labels)], 0.9)
        for i in range(n)
    ]


def candidate_buckets(seed: int, pattern: str, n: int = 200) -> list[tuple[str, float]]:
    """(text, split bucket) as the recipe computes them, in plain Python."""
    import hashlib

    out = []
    for i in range(n):
        text = pattern.format(i)
        example_id = hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()
        digest = hashlib.sha256(f"{seed}:{example_id}".encode()).hexdigest()
        out.append((text, int(digest[:13], 16) / 16**13))
    return out


def test_split_proportions_and_stability(spark, tokenizer_path):
    from sparktune.data.prepare import prepare

    schema = "message string, intent_label string, quality_score double"
    big = labelled_rows(2000, ["billing", "refund", "account", "shipping"])
    # Ten rows that hashing alone puts all in train: the small-label rule must move two of them.
    rare_texts = [t for t, b in candidate_buckets(42, "a rare kind of request, number {}") if b < 0.8][:10]
    small = [(text, "rare", 0.9) for text in rare_texts]
    params = parse_params({})

    first = prepare(spark.createDataFrame(big[:1500] + small, schema), params, tokenizer_path)
    second = prepare(spark.createDataFrame(big + small, schema).repartition(4), params, tokenizer_path)
    before = dict(first.rows.select("example_id", "split").collect())
    after = dict(second.rows.select("example_id", "split").collect())
    assert len(before) == 1510 and len(after) == 2010
    assert all(after[k] == v for k, v in before.items()), "adding rows moved existing rows between splits"

    counts = {
        (r["label"], r["split"]): r["count"] for r in second.rows.groupBy("label", "split").count().collect()
    }
    for label in ("billing", "refund", "account", "shipping"):
        total = sum(counts.get((label, s), 0) for s in ("train", "validation", "test"))
        assert abs(counts[(label, "train")] / total - 0.8) < 0.05
        assert abs(counts[(label, "validation")] / total - 0.1) < 0.04
        assert abs(counts[(label, "test")] / total - 0.1) < 0.04
    assert counts[("rare", "validation")] == 1 and counts[("rare", "test")] == 1
    rare = {r["text"]: r["split"] for r in second.rows.filter("label = 'rare'").collect()}
    by_bucket = sorted(rare_texts, key=dict(candidate_buckets(42, "a rare kind of request, number {}")).get)
    assert [rare[t] for t in by_bucket[-2:]] == ["validation", "test"]  # the two closest to the boundary

    reseeded = prepare(
        spark.createDataFrame(big, schema), params.model_copy(update=dict(split_seed=7)), tokenizer_path
    )
    moved = sum(1 for k, v in reseeded.rows.select("example_id", "split").collect() if after[k] != v)
    assert moved > 100  # the seed really drives the split
    for p in (first, second, reseeded):
        p.unpersist()


def write_source(tmp_path: Path) -> Path:
    path = tmp_path / "source" / "tickets.jsonl"
    path.parent.mkdir(parents=True)
    rows = labelled_rows(60, ["billing", "refund"]) + [("short", "billing", 0.9), (GOOD_BILLING, None, 0.9)]
    with path.open("w") as out:
        for message, label, quality in rows:
            out.write(
                json.dumps({"message": message, "intent_label": label, "quality_score": quality}) + "\n"
            )
    return path


def snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_run_prepare_publishes_once_and_reuses(spark, tokenizer_path, tmp_path, caplog):
    from sparktune.data.prepare_publish import run_prepare

    source = write_source(tmp_path)
    lake = tmp_path / "lake"
    params = parse_params({"source_uri": str(source)})
    with caplog.at_level("INFO", logger="sparktune.data.prepare_publish"):
        first = run_prepare(spark, params, tokenizer_path, str(lake))
    assert first["reused"] is False
    assert (first["rows_in"], first["rows_out"]) == (62, 60)
    assert [s["step"] for s in first["steps"]][0] == "read" and first["steps"][3]["rows_out"] == 60
    assert first["labels"] == ["billing", "refund"]
    assert first["rows_per_label"] == {"billing": 30, "refund": 30}
    assert sum(first["split_counts"].values()) == 60
    assert first["prepared_uri"] == f"{lake}/prepared/{first['data_fingerprint']}"
    json.dumps(first)  # serializable
    assert any("dedupe" in rec.getMessage() for rec in caplog.records)

    prepared = Path(first["prepared_uri"])
    assert (prepared / "_SUCCESS").exists()
    for split in ("train", "validation", "test"):
        assert list((prepared / f"split={split}").glob("part-*.parquet")), split
    assert (Path(first["quarantine_uri"]) / "_SUCCESS").exists()
    assert not list((lake / "_tmp").iterdir())
    back = spark.read.parquet(str(prepared))
    assert back.count() == 60 and set(back.columns) >= {"example_id", "prompt", "completion", "split"}
    assert spark.read.parquet(first["quarantine_uri"]).count() == 2

    files = snapshot(lake)
    second = run_prepare(spark, params, tokenizer_path, str(lake))
    assert second["reused"] is True
    assert second["data_fingerprint"] == first["data_fingerprint"]
    assert snapshot(lake) == files  # nothing rewritten

    changed = run_prepare(spark, params.model_copy(update=dict(split_seed=1)), tokenizer_path, str(lake))
    assert changed["data_fingerprint"] != first["data_fingerprint"] and changed["reused"] is False


def test_job_rejects_bad_params_before_starting_spark(caplog):
    from sparktune.jobs.prepare_data import main

    assert main(["--params-json", '{"min_chars": -1, "max_length": 1}', "--tokenizer", "x"]) == 2
    errors = " ".join(r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert "min_chars" in errors and "max_length" in errors  # every problem, in one message


@pytest.mark.slow  # a spark-submit job of its own; every e2e DAG run submits it too
def test_job_runs_under_spark_submit(tokenizer_path, tmp_path):
    source = write_source(tmp_path)
    summary_path = tmp_path / "out" / "summary.json"
    root = Path(__file__).resolve().parents[2]
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run(
        [
            str(venv_bin / "spark-submit"),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            str(root / "include/sparktune/jobs/prepare_data.py"),
            "--params-json",
            json.dumps({"source_uri": str(source)}),
            "--tokenizer",
            tokenizer_path,
            "--lake-uri",
            str(tmp_path / "lake"),
            "--summary-path",
            summary_path.as_uri(),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert (summary["rows_in"], summary["rows_out"]) == (62, 60) and summary["reused"] is False
    assert (Path(summary["prepared_uri"]) / "split=train").is_dir()
    # spark-submit merges the Python driver's stderr into its stdout: the step table is there.
    assert "min_quality_score            62           62" in result.stdout

    assert "quality" not in summary  # no --gx-root, no gate


@pytest.fixture
def gx_log_level():
    """The job quiets Great Expectations' logger; put it back for the tests after this one."""
    import logging

    gx_logger = logging.getLogger("great_expectations")
    level = gx_logger.level
    yield
    gx_logger.setLevel(level)


def test_the_job_runs_the_quality_gate_after_publishing_on_the_source_it_read(
    spark, tokenizer_path, tmp_path, monkeypatch, caplog, gx_log_level
):
    import logging

    import sparktune.data.prepare_source
    from sparktune.data.quality_rules import quality_rules, raw_rules
    from sparktune.jobs.prepare_data import main

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(sys, "path", list(sys.path))  # GX puts the project's plugins folder on it
    source = write_source(tmp_path)
    summary_path = tmp_path / "summary.json"
    args = ["--params-json", json.dumps({"source_uri": str(source)}), "--tokenizer", tokenizer_path]
    args += ["--lake-uri", str(tmp_path / "lake"), "--summary-path", str(summary_path)]
    read_again = []
    monkeypatch.setattr(sparktune.data.prepare_source, "load_source", lambda *a, **k: read_again.append(a))
    assert main([*args, "--gx-root", str(tmp_path / "gx"), "--quality-run-id", "manual__job"]) == 0
    summary = json.loads(summary_path.read_text())
    quality = summary["quality"]
    assert read_again == []  # the gate validated the DataFrame preparation read
    # Every rule validate_data runs, with its severity, over the rows read and the rows published.
    params = parse_params({"source_uri": str(source)})
    expected = {r.name: r.severity for r in [*raw_rules(params), *quality_rules(params)]}
    assert quality["rules"] == expected and quality["evaluated"] == len(expected)
    assert quality["statistics"]["raw_input"]["rows"] == summary["rows_in"] == 62
    assert quality["statistics"]["prepared"]["rows"] == summary["rows_out"] == 60
    assert quality["source_uri"] == str(source)
    assert set(quality["validation_pages"]) == {"raw_input", "rows", "label_counts"}
    for page in quality["validation_pages"].values():
        assert Path(page.removeprefix("file://")).is_file(), page
    # The task log carries the report, not Great Expectations' bookkeeping (datasources saved...).
    gx = [r for r in caplog.records if r.name.startswith("great_expectations")]
    assert [r.getMessage() for r in gx if r.levelno < logging.WARNING] == []


def test_a_quality_gate_that_cannot_run_in_the_job_is_recorded_not_raised(
    spark, tokenizer_path, tmp_path, monkeypatch
):
    from sparktune.jobs.prepare_data import main

    source = write_source(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    not_a_folder = tmp_path / "gx"
    not_a_folder.write_text("a file where the GX project should be")
    summary_path = tmp_path / "summary.json"
    args = ["--params-json", json.dumps({"source_uri": str(source)}), "--tokenizer", tokenizer_path]
    args += ["--lake-uri", str(tmp_path / "lake"), "--summary-path", str(summary_path)]
    assert main([*args, "--gx-root", str(not_a_folder), "--quality-run-id", "r"]) == 0
    summary = json.loads(summary_path.read_text())
    # Published all the same; validate_data then runs the gate in a Spark application of its own.
    assert "quality" not in summary and summary["quality_error"]
    assert (Path(summary["prepared_uri"]) / "_SUCCESS").exists()


def test_publish_replaces_a_half_written_folder_and_skips_a_complete_one(spark, tmp_path):
    from sparktune.data.prepare_publish import publish

    lake = str(tmp_path / "lake")
    final = tmp_path / "lake" / "prepared" / "abc"
    final.mkdir(parents=True)
    (final / "part-0-leftover.parquet").write_text("a crashed writer left this")
    writes: list[str] = []

    def write(tmp: str) -> None:
        writes.append(tmp)
        spark.range(3).write.parquet(tmp)

    assert publish(spark, write, lake, str(final)) is True
    assert not (final / "part-0-leftover.parquet").exists() and (final / "_SUCCESS").exists()
    assert spark.read.parquet(str(final)).count() == 3
    assert publish(spark, write, lake, str(final)) is False
    assert len(writes) == 1  # the complete folder was not written again


def test_run_prepare_fails_clearly_when_no_row_survives(spark, tokenizer_path, tmp_path):
    from sparktune.data.prepare_errors import DataPreparationError
    from sparktune.data.prepare_publish import run_prepare

    source = tmp_path / "stubs.jsonl"
    source.write_text('{"message": "hi", "intent_label": "a", "quality_score": 0.9}\n')
    params = parse_params({"source_uri": str(source)})
    with pytest.raises(DataPreparationError, match=r"No rows left(.|\n)*length\s+1\s+0(.|\n)*Fix:"):
        run_prepare(spark, params, tokenizer_path, str(tmp_path / "lake"))
    assert list((tmp_path / "lake" / "quarantine").iterdir())  # the rejected rows can be inspected
    assert not (tmp_path / "lake" / "prepared").exists()


ID_SCHEMA = "message string, intent_label string, ticket_id string, created string"


def id_rows() -> list[tuple]:
    return [
        ("First message text about a double charge", "billing", "T-1", "2024-01-01"),
        ("A different text that the same ticket got later", "billing", "T-1", "2024-03-01 10:00:00"),
        ("An older copy of ticket one, with a wrong label", "refund", "T-1", "2023-12-31"),
        ("Another message about a missing refund", "refund", " T-2 ", None),
        ("A blank id falls back to the text hash", "refund", "  ", "2024-01-01"),
        ("A null id falls back to the text hash", "refund", None, "2024-01-01"),
        ("a NULL id falls back to   the text hash", "refund", None, "2024-01-05"),
    ]


def sha_of_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()


def test_id_column_is_the_dedupe_key_and_the_example_id(spark, tokenizer_path):
    from sparktune.data.prepare import prepare

    params = parse_params({"id_column": "ticket_id", "quality_column": ""})
    results = []
    for rows in (id_rows(), list(reversed(id_rows()))):
        prepared = prepare(spark.createDataFrame(rows, ID_SCHEMA).repartition(3), params, tokenizer_path)
        kept = {r["example_id"]: r["text"] for r in prepared.rows.collect()}
        dedupe = [s for s in prepared.steps if s.step == "dedupe"][0]
        assert (dedupe.rows_in, dedupe.rows_out) == (7, 4)
        results.append(kept)
        prepared.unpersist()
    kept = results[0]
    assert results[1] == kept  # the same copies whatever the order
    assert set(kept) == {
        "T-1",
        "T-2",  # trimmed
        sha_of_text("A blank id falls back to the text hash"),
        sha_of_text("A null id falls back to the text hash"),  # and dedupes by text with its twin
    }


def test_numeric_ids_become_strings(spark, tokenizer_path):
    from sparktune.data.prepare import prepare

    df = spark.createDataFrame(
        [(GOOD_BILLING, "billing", 17)], "message string, intent_label string, id long"
    )
    prepared = prepare(df, parse_params({"id_column": "id", "quality_column": ""}), tokenizer_path)
    assert prepared.rows.first()["example_id"] == "17"
    prepared.unpersist()


def test_timestamp_column_keeps_the_most_recent_duplicate(spark, tokenizer_path, caplog):
    from sparktune.data.prepare import prepare

    params = parse_params({"id_column": "ticket_id", "timestamp_column": "created", "quality_column": ""})
    rows = [*id_rows(), ("A copy of ticket two whose date is not a date", "refund", "T-2", "yesterday")]
    for ordered in (rows, list(reversed(rows))):
        with caplog.at_level("WARNING", logger="sparktune.data.prepare"):
            prepared = prepare(
                spark.createDataFrame(ordered, ID_SCHEMA).repartition(2), params, tokenizer_path
            )
        kept = {r["example_id"]: r["text"] for r in prepared.rows.collect()}
        assert kept["T-1"] == "A different text that the same ticket got later"  # 2024-03-01, the newest
        # Neither T-2 copy has a usable timestamp: the usual deterministic choice decides.
        assert kept["T-2"] in (
            "Another message about a missing refund",
            "A copy of ticket two whose date is not a date",
        )
        assert (
            kept[sha_of_text("A null id falls back to the text hash")]
            == "a NULL id falls back to   the text hash"
        )
        details = {r["text"]: r["reject_detail"] for r in prepared.quarantine.collect()}
        assert details["First message text about a double charge"] == (
            "duplicate of example_id T-1; kept the copy with created 2024-03-01 10:00:00"
        )
        assert (
            "with a different label (kept billing)"
            in details["An older copy of ticket one, with a wrong label"]
        )
        prepared.unpersist()
    assert any(
        "1 row(s) have a created value that is not a timestamp" in r.getMessage() for r in caplog.records
    )

    # Native timestamps and epoch numbers order the same way.
    for created_type, created in (("timestamp", _datetime), ("long", _epoch)):
        schema = f"message string, intent_label string, ticket_id string, created {created_type}"
        typed = [(m, label, i, created(c)) for m, label, i, c in id_rows()[:3]]
        prepared = prepare(spark.createDataFrame(typed, schema), params, tokenizer_path)
        assert [r["text"] for r in prepared.rows.collect()] == [
            "A different text that the same ticket got later"
        ]
        prepared.unpersist()


CONFLICT_SCHEMA = "message string, intent_label string, ticket_id string, created string"
CHARGED = "My card was charged twice for the same order"


def conflict_rows() -> list[tuple]:
    return [
        (CHARGED, "billing", "T-1", "2024-01-01"),
        ("my card was CHARGED twice for the same order ", "refund", "T-2", "2024-03-01"),  # the newest
        ("my card was charged  twice for the same order", "billing", "T-3", "2024-02-01"),
        ("How do I reset my password please help", "password", "T-4", "2024-01-05"),
        ("How do I reset my password please help", "password", "T-5", "2024-01-06"),  # a plain duplicate
        # One ticket relabelled later: an update of the same id, not a conflict.
        ("The parcel for my order has not arrived yet", "shipping", "T-6", "2024-01-01"),
        ("The parcel for my order has not arrived yet", "delivery", "T-6", "2024-04-01"),
    ]


@pytest.mark.parametrize("id_column", ["", "ticket_id"])
def test_label_conflicts_are_counted_quarantined_and_decided_by_the_policy(spark, tokenizer_path, id_column):
    from sparktune.data.prepare import prepare

    df = spark.createDataFrame(conflict_rows(), CONFLICT_SCHEMA).repartition(2)
    base = {"quality_column": "", "timestamp_column": "created", "id_column": id_column}
    parcel = "The parcel for my order has not arrived yet"
    password = "How do I reset my password please help"
    # Without ids the relabelled ticket is two copies of one text that disagree: a conflict too.
    # With ids its older version is a duplicate of its id, and the password rows are two tickets.
    conflicts, duplicates = (2, 1) if id_column else (3, 1)

    newest = prepare(df, parse_params({**base, "label_conflicts": "keep_newest"}), tokenizer_path)
    kept = {r["text"]: r["label"] for r in newest.rows.collect()}
    steps = {s.step: s.dropped for s in newest.steps}
    assert kept == {
        "my card was CHARGED twice for the same order": "refund",
        parcel: "delivery",
        password: "password",
    }
    assert (steps["label_conflict"], steps["dedupe"]) == (conflicts, duplicates)
    conflicting = sorted(
        r["text"] for r in newest.quarantine.where("reject_reason = 'label_conflict'").collect()
    )
    assert conflicting == sorted(
        [CHARGED, "my card was charged  twice for the same order"] + ([] if id_column else [parcel])
    )
    report = newest.label_conflicts
    assert (report["policy"], report["texts"], report["rows"]) == ("keep_newest", conflicts - 1, conflicts)
    assert {"text": CHARGED, "labels": ["billing", "refund"]} in report["examples"]
    detail = newest.quarantine.where(f"text = '{CHARGED}'").first()["reject_detail"]
    assert detail == (
        "label conflict: the copy of this text kept (the copy with created 2024-03-01) is labelled refund "
        "(label_conflicts=keep_newest)"
    )
    newest.unpersist()

    quarantined = prepare(df, parse_params({**base, "label_conflicts": "quarantine"}), tokenizer_path)
    kept = {r["text"]: r["label"] for r in quarantined.rows.collect()}
    assert kept == ({password: "password", parcel: "delivery"} if id_column else {password: "password"})
    assert quarantined.label_conflicts["rows"] == (3 if id_column else 5)
    assert {"text": CHARGED, "labels": ["billing", "refund"]} in quarantined.label_conflicts["examples"]
    assert {s.step: s.dropped for s in quarantined.steps}["label_conflict"] == (3 if id_column else 5)
    quarantined.unpersist()


def test_no_label_conflict_no_report(spark, tokenizer_path):
    from sparktune.data.prepare import prepare

    prepared = prepare(defect_df(spark), defect_params(tokenizer_path), tokenizer_path)
    assert prepared.label_conflicts == {"policy": "keep_newest", "texts": 0, "rows": 0, "examples": []}
    prepared.unpersist()


def _datetime(value: str):
    from datetime import datetime

    return datetime.fromisoformat(value)


def _epoch(value: str) -> int:
    return int(_datetime(value).timestamp())


def test_missing_id_or_timestamp_column_is_a_missing_column(spark):
    from sparktune.data.prepare_errors import MissingColumnsError
    from sparktune.data.prepare_source import check_columns

    df = spark.createDataFrame([(GOOD_BILLING, "billing")], "message string, intent_label string")
    params = parse_params({"id_column": "ticket_id", "timestamp_column": "created_at"})
    with pytest.raises(MissingColumnsError) as err:
        check_columns(df, params, "/data/tickets.csv")
    message = str(err.value)
    assert "Source '/data/tickets.csv' is missing column(s): id_column 'ticket_id', " in message
    assert "timestamp_column 'created_at'. Columns found" in message
    assert "Columns found: 'message', 'intent_label'." in message
    check_columns(df, parse_params({"id_column": "", "timestamp_column": ""}))  # unset: not required


def test_resolve_source_uri_tells_tables_from_files(tmp_path, monkeypatch):
    from sparktune.data.prepare_source import resolve_source_uri

    monkeypatch.chdir(tmp_path)
    (tmp_path / "export.xlsx").write_bytes(b"PK")
    assert resolve_source_uri(parse_params({"source_uri": "sales.tickets"})) == "sales.tickets"
    assert resolve_source_uri(parse_params({"source_uri": "tickets"})) == "tickets"
    assert resolve_source_uri(parse_params({"source_uri": "export.xlsx"})) == str(tmp_path / "export.xlsx")
    assert resolve_source_uri(parse_params({"source_uri": "data/t.csv"})) == str(tmp_path / "data/t.csv")
    assert resolve_source_uri(parse_params({"source_uri": "s3a://bucket/t.csv"})) == "s3a://bucket/t.csv"


def test_workers_count_tokens_exactly_as_transformers_does(tokenizer_path):
    import pandas as pd
    from sparktune.core.label_scoring import fast_backend
    from sparktune.data.prepare_tokens import _backend_from_json, count_tokens, load_tokenizer
    from transformers import AutoTokenizer

    texts = pd.Series(
        [GOOD_BILLING, None, "braces {text} and émojis \U0001f600 " * 20, "  spaced\tout  ", ""]
    )
    expected = AutoTokenizer.from_pretrained(tokenizer_path)
    want = [None if t is None else len(expected(t)["input_ids"]) for t in texts]
    shipped = _backend_from_json(fast_backend(load_tokenizer(tokenizer_path)).to_str())  # what workers get
    for tokenizer in (shipped, expected):
        counts = count_tokens(tokenizer, texts)
        assert [None if pd.isna(c) else int(c) for c in counts] == want
        assert str(counts.dtype) == "Int32"


def test_a_backend_left_padding_or_truncating_is_not_used_for_counts(tokenizer_path):
    # transformers switches padding and truncation off for its own call; a direct backend call
    # would count the pad tokens (or stop at the truncation length).
    import pandas as pd
    from sparktune.data.prepare_tokens import count_tokens
    from transformers import AutoTokenizer

    texts = pd.Series([GOOD_BILLING, "short", "braces {text} and émojis " * 30])
    want = [len(AutoTokenizer.from_pretrained(tokenizer_path)(t)["input_ids"]) for t in texts]
    for configure in (lambda b: b.enable_padding(length=300), lambda b: b.enable_truncation(max_length=4)):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        configure(tokenizer.backend_tokenizer)
        assert [int(c) for c in count_tokens(tokenizer, texts)] == want


def test_a_cached_backend_is_what_transformers_built_and_loads_without_transformers(tokenizer_path, tmp_path):
    import shutil
    import subprocess
    import sys

    import pandas as pd
    from sparktune.data.prepare_tokens import _backend_from_json, backend_spec, count_tokens
    from transformers import AutoTokenizer

    folder = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_path, folder)
    cache = tmp_path / "cache"
    built = backend_spec(str(folder), cache_dir=cache)
    assert built == AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer.to_str()
    [entry] = cache.glob("*.json")

    # A new process reads the entry back and counts the same tokens without importing transformers.
    probe = (
        "import sys; from pathlib import Path; from sparktune.data.prepare_tokens import backend_spec; "
        f"spec = backend_spec({str(folder)!r}, cache_dir=Path({str(cache)!r})); "
        "print(len(spec), 'transformers' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(len(built)), "False", "False"]
    texts = pd.Series([GOOD_BILLING, "braces {text} and émojis \U0001f600 " * 20])
    want = [len(AutoTokenizer.from_pretrained(str(folder))(t)["input_ids"]) for t in texts]
    assert [int(c) for c in count_tokens(_backend_from_json(built), texts)] == want

    # Any change to what transformers builds from (here the tokenizer's config) is a new entry.
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"<s>"', '"<s>" ', 1))
    backend_spec(str(folder), cache_dir=cache)
    assert len(list(cache.glob("*.json"))) == 2


def test_the_backend_cache_still_refuses_an_unsafe_folder(tokenizer_path, tmp_path):
    import json
    import shutil

    from sparktune.core.model_safety import UnsafeModelError
    from sparktune.data.prepare_tokens import backend_spec

    folder = tmp_path / "tokenizer"
    shutil.copytree(tokenizer_path, folder)
    cache = tmp_path / "cache"
    backend_spec(str(folder), cache_dir=cache)  # cached while the folder was safe
    (folder / "config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": "custom.Tok"}}))
    (folder / "custom.py").write_text("raise SystemExit('ran')\n")
    with pytest.raises(UnsafeModelError, match="trust_remote_code"):
        backend_spec(str(folder), cache_dir=cache)
