"""The Great Expectations gate on raw input and prepared rows, against a local[1] Spark session.

GX context creation and Spark jobs are the slow parts, so the module shares one session and
one GX project folder, and each scenario is validated once in a module-scoped fixture. Several
scenarios carry more than one defect, so each GX run proves several rules.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from sparktune.core.params import InvalidParamsError, parse_params
from sparktune.data.quality import PreparedDataSchemaError, run_quality_gate, validate_prepared, validate_raw
from sparktune.data.quality_report import QualityReport, format_failures
from sparktune.data.quality_rules import (
    ERROR,
    LABEL_COUNTS,
    RAW_INPUT,
    ROWS,
    WARNING,
    QualityRule,
    quality_rules,
    raw_rule_params,
    raw_rules,
    rule_names,
    warning_rules,
)

pytestmark = pytest.mark.spark

COLUMNS = ["example_id", "text", "label", "prompt", "completion", "n_tokens", "split"]
CLEAN_ROWS = 10_000
PARAMS = parse_params(
    {
        "min_rows_per_label": 5,
        "min_train_rows": 20,
        "max_length": 64,
        "max_chars": 200,
        "min_rows_per_split": 5,
        "max_class_imbalance": 5.0,
    }
)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    # Great Expectations puts each project's gx/plugins folder on sys.path: put it back after a test.
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture(scope="module")
def gx_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gx_project")


def _id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _row(key: str, label: str | None, split: str, *, text: str | None = None, n_tokens: int = 20):
    text = text if text is not None else f"customer message {key} about {label}"
    return (_id(key), text, label, f"[INST] {text} [/INST]", label, n_tokens, split)


def _rule(line: str) -> str:
    return line[1 : line.index("]")]


def _path(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path))


# --- scenarios, each validated once


@pytest.fixture(scope="module")
def gate_report(spark, gx_root, tmp_path_factory) -> QualityReport:
    """The operator's entry point on good data: a raw JSON Lines source and prepared Parquet.

    The one flaw: "refund" has 8x the rows of "billing", above max_class_imbalance (5), which is
    a warning by default, so the run passes with one warning.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Written with pyarrow, not Spark: the fixture measures the gate, not the writer.
    data = tmp_path_factory.mktemp("data")
    # id % 13: 0-7 refund, 8-9 shipping, 10-11 login, 12 billing; independent of the split digit.
    labels = ["refund"] * 8 + ["shipping"] * 2 + ["login"] * 2 + ["billing"]
    ids = range(CLEAN_ROWS)
    texts = [f"customer message number {i}" for i in ids]
    source = data / "source.jsonl"
    source.write_text(
        "".join(
            json.dumps({"message": texts[i], "intent_label": labels[i % 13], "quality_score": i % 10 / 10})
            + "\n"
            for i in range(200)
        )
    )
    splits = {8: "validation", 9: "test"}
    prepared = pa.table(
        {
            "example_id": [_id(str(i)) for i in ids],
            "text": texts,
            "label": [labels[i % 13] for i in ids],
            "prompt": [f"[INST] {t} [/INST]" for t in texts],
            "completion": [labels[i % 13] for i in ids],
            "n_tokens": pa.array([i % 50 + 1 for i in ids], pa.int32()),
            "split": [splits.get(i % 10, "train") for i in ids],
        }
    )
    pq.write_to_dataset(prepared, data / "prepared", partition_cols=["split"])  # as preparation writes it
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", list(sys.path))  # GX's plugins folder on sys.path, as in _home
        report = run_quality_gate(
            spark,
            PARAMS,
            prepared_uri=str(data / "prepared"),
            source_uri=str(source),
            gx_root=gx_root,
            run_id="scheduled__2026-01-01T00:00:00+00:00",
        )
    # The number the brief asks for: how long the gate takes per DAG run on ~10k rows.
    print(f"\nrun_quality_gate on {CLEAN_ROWS} prepared rows: {report.statistics['validation_seconds']} s")
    return report


# Every defect at once; "rare" has too few train rows, "ghost" only occurs in validation, "leak"
# is in train and in test, test has 2 rows and validation 2, "refund" has 9x the train rows of "rare".
# The imbalance is an error here (not in quality_warning_rules); text_length is made a warning.
DEFECT_ROWS = (
    [_row(f"ok{i}", ("refund", "shipping")[i % 2], "train") for i in range(12)]
    + [_row("v1", "refund", "validation"), _row("t1", "shipping", "test")]
    + [
        _row("null-label", None, "train"),
        _row("dup", "refund", "train"),
        _row("dup", "shipping", "train"),
        _row("long", "refund", "train", text="x" * 500),
        _row("tokens", "shipping", "train", n_tokens=9999),
        _row("holdout", "refund", "holdout"),
        _row("rare1", "rare", "train"),
        _row("ghost1", "ghost", "validation"),
        _row("leak", "refund", "train"),
        _row("leak", "refund", "test"),
    ]
)
DEFECT_PARAMS = parse_params({**PARAMS.to_dict(), "quality_warning_rules": "text_length"})


@pytest.fixture(scope="module")
def defect_report(spark, gx_root, gate_report) -> QualityReport:
    # Depends on gate_report so this run reuses the GX project the first run created.
    df = spark.createDataFrame(DEFECT_ROWS, COLUMNS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", list(sys.path))
        return validate_prepared(
            df, DEFECT_PARAMS, gx_root=gx_root, run_id="manual__2026-01-02T00:00:00+00:00"
        )


# 30% null labels, text as numbers, a boolean quality score, a missing id column, 10 rows.
RAW_DEFECTS = [(i, None if i < 3 else f"label{i % 2}", True) for i in range(10)]
RAW_PARAMS = parse_params({"text_column": "message", "id_column": "ticket_id", "max_null_rate": 0.2})


@pytest.fixture(scope="module")
def raw_defect_report(spark, gx_root, gate_report) -> QualityReport:
    df = spark.createDataFrame(RAW_DEFECTS, "MESSAGE bigint, intent_label string, quality_score boolean")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", list(sys.path))
        return validate_raw(df, RAW_PARAMS, gx_root=gx_root, run_id="raw-defects")


# --- rules as data


def test_rules_are_data_derived_from_params():
    rules = quality_rules(PARAMS)
    by_name = {rule.name: rule for rule in rules}

    assert len(by_name) == len(rules), "rule names must be unique: failures map back by name"
    assert {
        "row_count",
        "example_id_not_null",
        "example_id_unique",
        "text_not_null",
        "text_length",
        "label_not_null",
        "prompt_not_null",
        "n_tokens_range",
        "split_known",
        "split_leakage",
        "train_rows_min",
        "validation_rows_min",
        "test_rows_min",
        "label_train_rows_min",
        "distinct_labels_min",
        "eval_labels_in_train",
        "max_class_imbalance",
    } <= set(by_name)
    assert by_name["text_length"].kwargs == {"column": "text", "min_value": 20, "max_value": 200}
    assert by_name["n_tokens_range"].kwargs == {"column": "n_tokens", "min_value": 1, "max_value": 64}
    assert by_name["split_known"].kwargs["value_set"] == ["train", "validation", "test"]
    assert by_name["train_rows_min"].kwargs["min_value"] == 20
    assert by_name["label_train_rows_min"].kwargs["min_value"] == 5
    assert by_name["test_rows_min"].kwargs == {"column": "test_rows", "min_value": 5}
    assert by_name["max_class_imbalance"].kwargs == {"column": "train_imbalance", "max_value": 5.0}
    assert {r.batch for r in rules if r.name.startswith(("train_", "label_train", "distinct", "eval_"))} == {
        LABEL_COUNTS
    }
    assert "label_known" not in by_name
    # The thresholded rules name their param; the default warning list holds the imbalance rule.
    assert by_name["test_rows_min"].param == "min_rows_per_split"
    assert by_name["split_leakage"].param is None
    assert {r.name for r in rules if r.severity == WARNING} == {"max_class_imbalance"}

    # Each rule is a valid GX expectation that carries its rule name and severity into its results.
    for rule in rules:
        expectation = rule.to_expectation()
        assert expectation.expectation_type == rule.expectation_type
        assert expectation.meta["rule"] == rule.name
        assert expectation.description == rule.description
        assert expectation.severity == ("warning" if rule.severity == WARNING else "critical")
        json.dumps(rule.to_configuration().to_json_dict())


def test_raw_rules_cover_configured_columns():
    params = parse_params(
        {"id_column": "ticket_id", "timestamp_column": "created_at", "min_rows": 7, "max_null_rate": 0.25}
    )
    by_name = {rule.name: rule for rule in raw_rules(params)}
    assert set(by_name) == {
        "raw_rows_min",
        "raw_text_column",
        "raw_label_column",
        "raw_quality_column",
        "raw_id_column",
        "raw_timestamp_column",
        "raw_text_null_rate",
        "raw_label_null_rate",
    }
    assert {rule.batch for rule in by_name.values()} == {RAW_INPUT}
    assert by_name["raw_rows_min"].kwargs == {"min_value": 7}
    assert by_name["raw_label_null_rate"].kwargs == {"column": "intent_label", "mostly": 0.75}
    assert by_name["raw_id_column"].param == "id_column"
    assert "StringType" in by_name["raw_text_column"].kwargs["type_list"]
    # Optional columns left empty have no rule.
    assert "raw_id_column" not in {r.name for r in raw_rules(parse_params({}))}
    assert set(rule_names()) >= set(by_name) | {r.name for r in quality_rules(PARAMS, labels=["a"])}
    # A report over a raw source alone asks for exactly the params these rules read, and the source's.
    assert raw_rule_params() == (
        "source_uri",
        "source_format",
        "text_column",
        "label_column",
        "quality_column",
        "id_column",
        "timestamp_column",
        "min_rows",
        "max_null_rate",
        "quality_warning_rules",
    )


def test_known_labels_add_a_closed_set_rule():
    rules = {r.name: r for r in quality_rules(PARAMS, labels=["b", "a", "a"])}
    assert rules["label_known"] == QualityRule(
        "label_known",
        ROWS,
        "expect_column_values_to_be_in_set",
        {"column": "label", "value_set": ["a", "b"]},
        "label is one of the expected labels.",
    )


def test_unknown_warning_rule_names_are_rejected_before_any_work(spark, tmp_path):
    params = parse_params({"quality_warning_rules": "max_class_imbalance, no_such_rule,typo_rule"})
    with pytest.raises(InvalidParamsError) as error:
        warning_rules(params)
    message = str(error.value)
    assert "quality_warning_rules: unknown rule name(s) 'no_such_rule', 'typo_rule'" in message
    assert "valid names: " in message and "split_leakage" in message and "raw_label_null_rate" in message
    assert isinstance(error.value, ValueError)
    with pytest.raises(InvalidParamsError):
        quality_rules(params)
    # The entry point fails on the params before it reads a (here missing) source or starts GX.
    with pytest.raises(InvalidParamsError):
        run_quality_gate(
            spark,
            params,
            prepared_uri=str(tmp_path / "nope"),
            source_uri=str(tmp_path / "nope.jsonl"),
            gx_root=tmp_path / "gx",
        )
    assert not (tmp_path / "gx").exists()
    assert warning_rules(parse_params({"quality_warning_rules": " split_leakage , "})) == {"split_leakage"}
    assert warning_rules(parse_params({"quality_warning_rules": ""})) == frozenset()


# --- the entry point on clean data


def test_good_run_passes_with_a_warning_in_one_combined_report(gate_report, gx_root):
    report = gate_report
    assert report.success, format_failures(report)
    assert report.failures == []
    # Imbalance above the bound is a warning (the default warning rule): recorded, not blocking.
    (warning,) = report.warnings
    assert warning.startswith("[max_class_imbalance] The largest train class has at most 5 times")
    assert "1 of 4 labels unexpected, e.g. (label='refund', train_imbalance=7.99" in warning
    assert "largest 'refund' 4923 / smallest 'billing' 616 train rows = 7.992" in warning
    assert warning.endswith("(param max_class_imbalance)")
    assert [(i.rule, i.severity, i.param) for i in report.issues] == [
        ("max_class_imbalance", WARNING, "max_class_imbalance")
    ]
    message = format_failures(report)
    assert message.startswith("Data quality gate passed")
    assert f"1 warning(s), recorded, not blocking:\n- {warning}\n" in message
    assert report.evaluated == len(quality_rules(PARAMS)) + len(raw_rules(PARAMS))
    stats = report.statistics
    assert stats["prepared"]["rows"] == CLEAN_ROWS
    assert stats["prepared"]["rows_per_split"] == {"train": 8_000, "validation": 1_000, "test": 1_000}
    assert stats["prepared"]["labels"] == 4
    assert stats["prepared"]["class_imbalance"] == pytest.approx(4923 / 616, abs=1e-5)
    assert stats["prepared"]["leaked_ids"] == 0
    assert stats[RAW_INPUT]["rows"] == 200
    assert stats[RAW_INPUT]["null_rates"] == {"message": 0.0, "intent_label": 0.0}
    assert stats[RAW_INPUT]["column_types"]["quality_score"] == "double"
    assert stats["evaluated_expectations"] == report.evaluated and stats["failed_expectations"] == 0
    assert stats["warned_expectations"] == 1
    assert report.rule_severities["max_class_imbalance"] == WARNING
    assert report.rule_severities["raw_rows_min"] == ERROR

    # Three pages for this run, all inside the Data Docs folder the caller copies as artifacts.
    site = gx_root / "gx" / "uncommitted" / "data_docs" / "local_site"
    assert Path(report.data_docs_dir) == site
    assert set(report.validation_pages) == {RAW_INPUT, ROWS, LABEL_COUNTS}
    assert report.data_docs_uri == report.validation_pages[ROWS]
    for batch, uri in report.validation_pages.items():
        page = _path(uri)
        assert page.is_file() and site in page.parents, batch
        assert "scheduled__2026-01-01T00_00_00_00_00" in uri  # Airflow run ids made path-safe
    assert "raw_input" in _path(report.validation_pages[RAW_INPUT]).read_text()
    index = (site / "index.html").read_text()
    assert "raw_input" in index and "prepared_training_data_label_counts" in index

    # The JSON summary is written beside GX's results and equals the report's summary.
    summary_path = Path(report.summary_path)
    assert summary_path.is_file()
    assert gx_root / "gx" / "uncommitted" / "quality_summaries" in summary_path.parents
    summary = json.loads(summary_path.read_text())
    assert summary == json.loads(json.dumps(report.to_summary()))
    assert summary["success"] is True and summary["failed"] == 0 and summary["warned"] == 1
    assert summary["issues"][0]["severity"] == WARNING


# --- failures


def test_every_prepared_defect_is_reported_at_once(defect_report, gx_root):
    assert not defect_report.success
    by_rule = {_rule(line): line for line in defect_report.failures}
    assert set(by_rule) == {
        "label_not_null",
        "completion_not_null",  # the null label's completion is null too
        "example_id_unique",
        "n_tokens_range",
        "split_known",
        "split_leakage",
        "validation_rows_min",
        "test_rows_min",
        "label_train_rows_min",
        "eval_labels_in_train",
        "train_rows_min",
        # the default warning rule, made an error by leaving it out of quality_warning_rules
        "max_class_imbalance",
    }
    # Each line names the column, what was observed, the offending values and the param.
    assert "column 'label': 1 of 24 rows unexpected" in by_rule["label_not_null"]
    assert by_rule["label_not_null"].count(_id("null-label")) == 1
    assert (
        "4 of 24 rows unexpected" in by_rule["example_id_unique"]
        and _id("dup") in by_rule["example_id_unique"]
    )
    assert "n_tokens=9999" in by_rule["n_tokens_range"] and by_rule["n_tokens_range"].endswith(
        "(param max_length)"
    )
    assert "split='holdout'" in by_rule["split_known"]
    assert "label='rare', train_rows=1" in by_rule["label_train_rows_min"]
    assert "label='ghost', train_rows=0" in by_rule["label_train_rows_min"]
    assert "label='ghost'" in by_rule["eval_labels_in_train"]
    assert "rare" not in by_rule["eval_labels_in_train"]
    assert (
        "observed 18" in by_rule["train_rows_min"] and "(param min_train_rows)" in by_rule["train_rows_min"]
    )
    # Too few rows in an evaluation split names the split, the count and the param.
    assert "The test split has at least 5 rows" in by_rule["test_rows_min"]
    assert "observed 2" in by_rule["test_rows_min"] and by_rule["test_rows_min"].endswith(
        "(param min_rows_per_split)"
    )
    assert "observed 2" in by_rule["validation_rows_min"]
    # Leakage names the shared id, the splits it is in and how many ids leak.
    leak = by_rule["split_leakage"]
    assert "leak" in leak and "2 of 24 rows unexpected" in leak
    assert f"(example_id='{_id('leak')}', split='train'" in leak and "split='test'" in leak
    assert "1 example_id(s) in more than one split" in leak
    assert leak.endswith("(fixed rule; param quality_warning_rules can make it a warning)")

    imbalance = by_rule["max_class_imbalance"]
    assert "largest 'refund' 9 / smallest 'rare' 1 train rows = 9" in imbalance
    assert "(label='refund', train_imbalance=9.0)" in imbalance
    assert imbalance.endswith("(param max_class_imbalance)")
    # A rule listed in quality_warning_rules is a warning even in a failed run, listed apart.
    (warning,) = defect_report.warnings
    assert _rule(warning) == "text_length"
    assert _id("long") in warning and "(500 chars)" in warning
    assert warning.endswith("(params min_chars, max_chars)")
    assert {(i.rule, i.severity) for i in defect_report.issues} == {(r, ERROR) for r in by_rule} | {
        ("text_length", WARNING)
    }
    assert defect_report.rule_severities["max_class_imbalance"] == ERROR
    assert defect_report.evaluated == len(quality_rules(DEFECT_PARAMS))
    assert defect_report.statistics["leaked_ids"] == 1

    # The failing run's page is the detailed rerun, showing the unexpected values, and its stored
    # result names the offending rows.
    assert "holdout" in _path(defect_report.data_docs_uri).read_text()
    (stored,) = (gx_root / "gx" / "uncommitted" / "validations" / "prepared_training_data").glob(
        "manual__2026-01-02T00_00_00_00_00/*/*.json"
    )
    assert _id("null-label") in stored.read_text()

    message = format_failures(defect_report)
    assert message.startswith(
        f"Data quality gate failed: 12 of {defect_report.evaluated} expectations not met."
    )
    assert all(line in message for line in defect_report.failures)
    assert "1 warning(s), recorded, not blocking:\n- [text_length]" in message
    assert f"see Data Docs at {defect_report.data_docs_uri}" in message.replace("See", "see")
    summary = defect_report.to_summary()
    assert summary["failed"] == 12 and summary["warned"] == 1
    assert {"rule": "test_rows_min", "severity": ERROR, "param": "min_rows_per_split"}.items() <= next(
        i for i in summary["issues"] if i["rule"] == "test_rows_min"
    ).items()


def _sorted_examples(lines: list[str]) -> list[str]:
    """Each report line with its examples ("e.g. (...); (...)") in sorted order."""
    result = []
    for line in lines:
        head, sep, tail = line.partition(", e.g. (")
        if sep:
            examples, close, rest = tail.partition(")")
            while rest.startswith("; ("):
                more, close, rest = rest[3:].partition(")")
                examples += f"\0{more}"
            line = head + sep + ") (".join(sorted(examples.split("\0"))) + close + rest
        result.append(line)
    return result


def test_a_table_above_the_local_limit_is_validated_on_spark_with_the_same_report(
    spark, gx_root, defect_report
):
    # Up to LOCAL_VALIDATION_MAX_ROWS the prepared rows are validated by pandas in the driver;
    # above it they stay in Spark, and the report must read the same. A row without an id and
    # one without a token count besides the defects: nulls where pandas and Spark differ most.
    from sparktune.data import quality

    rows = [*DEFECT_ROWS, (None, "a message without an id", "refund", "p", "refund", 20, "train")]
    rows.append((_id("no-count"), "a message without a count", "refund", "p", "refund", None, "train"))
    reports = {}
    for limit in (quality.LOCAL_VALIDATION_MAX_ROWS, 0):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "path", list(sys.path))
            patch.setattr(quality, "LOCAL_VALIDATION_MAX_ROWS", limit)
            reports[limit] = validate_prepared(
                spark.createDataFrame(
                    rows,
                    "example_id string, text string, label string, prompt string, "
                    "completion string, n_tokens int, split string",
                ),
                DEFECT_PARAMS,
                gx_root=gx_root,
                run_id=f"limit-{limit}",
            )
    local, on_spark = reports[quality.LOCAL_VALIDATION_MAX_ROWS], reports[0]
    assert "sparktune_pandas-prepared_training_data.html" in local.validation_pages[ROWS]
    assert "sparktune_spark-prepared_training_data.html" in on_spark.validation_pages[ROWS]
    assert {_rule(line) for line in local.failures} >= {"example_id_not_null", "n_tokens_not_null"}
    assert "n_tokens=9999)" in next(line for line in local.failures if line.startswith("[n_tokens_range"))
    # The same lines; each engine lists a rule's example rows in an order of its own.
    assert _sorted_examples(local.failures) == _sorted_examples(on_spark.failures)
    assert _sorted_examples(local.warnings) == _sorted_examples(on_spark.warnings)
    timing = "validation_seconds"
    assert {k: v for k, v in local.statistics.items() if k != timing} == {
        k: v for k, v in on_spark.statistics.items() if k != timing
    }


def test_raw_input_defects_are_reported_as_clear_lines(raw_defect_report, gx_root):
    report = raw_defect_report
    assert not report.success
    by_rule = {_rule(line): line for line in report.failures}
    assert set(by_rule) == {
        "raw_rows_min",
        "raw_text_column",
        "raw_quality_column",
        "raw_id_column",
        "raw_label_null_rate",
    }
    # 30% null labels against max_null_rate 0.2: the observed rate and the param.
    null_line = by_rule["raw_label_null_rate"]
    assert "column 'intent_label': 3 of 10 rows unexpected (30.0%, allowed 20.0%)" in null_line
    assert null_line.endswith("(param max_null_rate)")
    # A missing column is a report line naming the columns there are, not a GX exception.
    assert (
        "column 'ticket_id' is missing; the input has columns: MESSAGE, intent_label, quality_score"
        in by_rule["raw_id_column"]
    )
    assert by_rule["raw_id_column"].endswith("(param id_column)")
    # Wrong types name the observed Spark type; the text column is found case-insensitively.
    assert "column 'MESSAGE': observed 'LongType'" in by_rule["raw_text_column"]
    assert by_rule["raw_text_column"].endswith("(param text_column)")
    assert "observed 'BooleanType'" in by_rule["raw_quality_column"]
    assert "observed 10" in by_rule["raw_rows_min"] and by_rule["raw_rows_min"].endswith("(param min_rows)")
    assert "Could not be evaluated" not in format_failures(report)
    assert report.statistics["null_rates"] == {"MESSAGE": 0.0, "intent_label": 0.3}
    assert report.statistics["missing_columns"] == ["ticket_id"]
    assert report.evaluated == len(raw_rules(RAW_PARAMS))
    assert report.data_docs_uri == report.validation_pages[RAW_INPUT]
    assert _path(report.data_docs_uri).is_file()


def test_single_class_fails_on_the_two_class_rule(spark, gx_root, defect_report):
    gx_dir = gx_root / "gx"
    checkpoints = sorted(p.name for p in (gx_dir / "checkpoints").iterdir())
    # Another run in this project with other params and a closed label set, so the stored
    # suites change. "b" is expected but absent: it has no train rows and does not count as a
    # present label, but with no validation/test rows it does not trip the train-coverage rule.
    rows = (
        [_row(f"a{i}", "a", "train") for i in range(6)]
        + [_row("a-test", "a", "test")]
        + [_row("a-val", "a", "validation")]
    )
    report = validate_prepared(
        spark.createDataFrame(rows, COLUMNS),
        parse_params({"min_rows_per_label": 5, "min_train_rows": 5, "min_rows_per_split": 1}),
        gx_root=gx_root,
        run_id="rerun",
        labels=["a", "b"],
    )

    assert {_rule(line) for line in report.failures} == {"distinct_labels_min", "label_train_rows_min"}
    two_classes = next(f for f in report.failures if f.startswith("[distinct_labels_min"))
    assert "at least 2 distinct labels" in two_classes and "observed 1" in two_classes
    assert "label='b', train_rows=0" in next(f for f in report.failures if f.startswith("[label_train"))
    assert report.warnings == []  # one class: imbalance 1
    assert report.evaluated == len(quality_rules(PARAMS, labels=["a", "b"]))
    assert "/rerun/" in report.data_docs_uri and _path(report.data_docs_uri).is_file()
    # Suites, validation definitions and checkpoints are updated in place: nothing duplicated.
    assert sorted(p.name for p in (gx_dir / "checkpoints").iterdir()) == checkpoints
    assert sorted(p.name for p in (gx_dir / "expectations").glob("*.json")) == [
        "prepared_training_data.json",
        "prepared_training_data_label_counts.json",
        "raw_input.json",
    ]
    assert "label_known" in (gx_dir / "expectations" / "prepared_training_data.json").read_text()
    assert (gx_dir / "great_expectations.yml").read_text().count("type: spark") == 1


def test_missing_and_mistyped_prepared_columns_raise_one_error(spark, gx_root):
    df = spark.createDataFrame(
        [("id", "a text", "lbl", "twenty")], ["example_id", "text", "label", "n_tokens"]
    )
    with pytest.raises(PreparedDataSchemaError) as error:
        validate_prepared(df, PARAMS, gx_root=gx_root / "unused")
    message = str(error.value)
    for problem in ("'prompt'", "'completion'", "'split'", "column 'n_tokens' is string"):
        assert problem in message
    assert "Pass the output of the preparation step" in message
    # Misuse is caught before any GX project is created.
    assert not (gx_root / "unused").exists()


def test_raw_only_run_reports_any_table_under_its_own_suite(spark, tmp_path):
    """No prepared data: the raw rules alone, under a suite name of the caller's (the nightly report)."""
    source = tmp_path / "reviews.jsonl"
    # 12 of 40 labels null (30%, allowed 20%); texts and row count are fine.
    source.write_text(
        "".join(
            json.dumps({"body": f"review number {i} of the product", "stars": None if i % 10 < 3 else "5"})
            + "\n"
            for i in range(40)
        )
    )
    params = parse_params({"text_column": "body", "label_column": "stars", "min_rows": 30})
    gx_root = tmp_path / "gx_project"
    report = run_quality_gate(
        spark,
        params,
        source_uri=str(source),
        gx_root=gx_root,
        run_id="nightly",
        raw_suite_name="reviews_report",
    )

    assert not report.success
    assert [_rule(line) for line in report.failures] == ["raw_label_null_rate"]
    assert "column 'stars': 12 of 40 rows unexpected (30.0%, allowed 20.0%)" in report.failures[0]
    assert report.evaluated == len(raw_rules(params)) - 1  # no quality_score column: its rule is skipped
    assert set(report.validation_pages) == {RAW_INPUT}
    assert report.data_docs_uri == report.validation_pages[RAW_INPUT]
    assert set(report.statistics) >= {RAW_INPUT, "evaluated_expectations", "validation_seconds"}
    assert "prepared" not in report.statistics
    assert report.statistics[RAW_INPUT]["rows"] == 40
    # Only the raw suite was stored, under the caller's name, and the site index lists it.
    gx_dir = gx_root / "gx"
    assert sorted(p.name for p in (gx_dir / "expectations").glob("*.json")) == ["reviews_report.json"]
    index = _path(report.data_docs_index_uri)
    assert index == gx_dir / "uncommitted" / "data_docs" / "local_site" / "index.html"
    assert "reviews_report" in index.read_text()
    summary = json.loads(Path(report.summary_path).read_text())
    assert summary["failed"] == 1 and summary["data_docs_index_uri"] == report.data_docs_index_uri


def test_the_rules_key_changes_with_what_the_gate_checks_and_nothing_else():
    from sparktune.data.quality_rules import rules_key

    base = rules_key(parse_params({}))
    assert base == rules_key(parse_params({"learning_rate": 1e-5, "model_name": "other"}))
    assert base != rules_key(parse_params({"min_train_rows": 5000}))
    assert base != rules_key(parse_params({"max_null_rate": 0.5}))
    assert base != rules_key(parse_params({"quality_warning_rules": ""}))  # a severity
    assert base != rules_key(parse_params({"quality_column": ""}))  # a rule less
