"""A corpus of bad inputs: each one ends in one clear DataPreparationError, never in a quiet run.

Every case goes through ``run_prepare`` (as the spark-submit job runs it) and checks that the
message names the path or column, says what was found instead and says how to fix it. A few go
through the job's ``main()`` as well: exit code 2 and the ``{"error": ...}`` record that the
Airflow operator turns into an immediate failure.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sparktune.core.params import parse_params

pytestmark = pytest.mark.spark

GOOD = "I was charged twice for my order last week"
OTHER = "How do I reset my password please help"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPARKTUNE_LAKE_URI", raising=False)


def write_jsonl(path: Path, rows: list[dict], encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_bytes(text.encode(encoding))
    return path


def write_parquet(path: Path, columns: dict[str, pa.Array]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def run(spark, tokenizer_path: str, tmp_path: Path, source: Path | str, **params):
    from sparktune.data.prepare_publish import run_prepare

    conf = {"source_uri": str(source), "quality_column": "", **params}
    return run_prepare(spark, parse_params(conf), tokenizer_path, str(tmp_path / "lake"))


def run_job(tokenizer_path: str, tmp_path: Path, source: Path | str, **params) -> tuple[int, dict]:
    """The spark-submit application's main(), in this process (it reuses the test's session)."""
    from sparktune.jobs.prepare_data import main

    summary = tmp_path / "summary.json"
    code = main(
        [
            "--params-json",
            json.dumps({"source_uri": str(source), "quality_column": "", **params}),
            "--tokenizer",
            tokenizer_path,
            "--lake-uri",
            str(tmp_path / "lake"),
            "--summary-path",
            str(summary),
        ]
    )
    return code, json.loads(summary.read_text())


def assert_no_prepared_data(tmp_path: Path) -> None:
    assert not (tmp_path / "lake" / "prepared").exists()


# --------------------------------------------------------------------------- empty input


def header_only_csv(spark, tmp_path: Path) -> str:
    path = tmp_path / "export.csv"
    path.write_text("message,intent_label\r\n")
    return str(path)


def empty_folder(spark, tmp_path: Path) -> str:
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / "_SUCCESS").write_text("")  # what a job that wrote nothing leaves behind
    return str(folder)


def empty_table(spark, tmp_path: Path) -> str:
    spark.createDataFrame([], "message string, intent_label string").createOrReplaceTempView("no_tickets")
    return "no_tickets"


@pytest.mark.parametrize(
    ("make_source", "source_format", "found"),
    [
        (header_only_csv, "auto", "0 rows (columns found: 'message', 'intent_label')"),
        (empty_folder, "auto", "holds no data files"),
        (empty_folder, "parquet", "holds no data files"),
        (empty_table, "auto", "0 rows (columns found: 'message', 'intent_label')"),
    ],
    ids=["header-only-csv", "empty-folder", "empty-folder-as-parquet", "empty-table"],
)
def test_empty_input(spark, tokenizer_path, tmp_path, make_source, source_format, found):
    from sparktune.data.prepare_errors import EmptySourceError

    source = make_source(spark, tmp_path)
    with pytest.raises(EmptySourceError) as err:
        run(spark, tokenizer_path, tmp_path, source, source_format=source_format)
    message = str(err.value)
    assert f"Source {source!r} is empty" in message
    assert found in message and "Fix:" in message
    assert_no_prepared_data(tmp_path)


# --------------------------------------------------------------------------- columns


def test_missing_label_column_names_the_path_the_columns_found_and_a_close_match(
    spark, tokenizer_path, tmp_path
):
    from sparktune.data.prepare_errors import MissingColumnsError

    source = tmp_path / "tickets.csv"
    source.write_text(f"message,intent\n{GOOD},billing\n")
    with pytest.raises(MissingColumnsError) as err:
        run(spark, tokenizer_path, tmp_path, source)
    message = str(err.value)
    assert f"Source {str(source)!r} is missing column(s): label_column 'intent_label'" in message
    assert "did you mean 'intent'?" in message
    assert "Columns found: 'message', 'intent'." in message
    assert "Fix: set text_column / label_column" in message

    code, record = run_job(tokenizer_path, tmp_path, source)
    assert code == 2
    assert record == {"error": message, "kind": "MissingColumnsError"}
    assert_no_prepared_data(tmp_path)


@pytest.mark.parametrize(
    ("column", "shown"),
    [
        (pa.array([{"subject": GOOD, "body": "details"}]), "struct<subject:string,body:string>"),
        (pa.array([[GOOD, OTHER]]), "array<string>"),
        (pa.array([GOOD.encode()], type=pa.binary()), "binary"),
    ],
    ids=["struct", "array", "binary"],
)
def test_wrong_text_column_type(spark, tokenizer_path, tmp_path, column, shown):
    from sparktune.data.prepare_errors import WrongColumnTypeError

    source = write_parquet(tmp_path / "tickets.parquet", {"message": column, "intent_label": ["billing"]})
    with pytest.raises(WrongColumnTypeError) as err:
        run(spark, tokenizer_path, tmp_path, source)
    message = str(err.value)
    assert f"Source {str(source)!r} has column(s) of the wrong type" in message
    assert f"text_column 'message' is {shown}, expected a string" in message
    assert f"'message' ({shown})" in message and "'intent_label' (string)" in message  # what there is
    assert "Fix:" in message


def test_wrong_types_of_several_columns_are_reported_together(spark, tokenizer_path, tmp_path):
    from sparktune.data.prepare_errors import WrongColumnTypeError

    source = write_jsonl(
        tmp_path / "tickets.jsonl",
        [{"message": {"text": GOOD}, "intent_label": ["billing"], "score": {"v": 1}}],
    )
    with pytest.raises(WrongColumnTypeError) as err:
        run(spark, tokenizer_path, tmp_path, source, quality_column="score")
    message = str(err.value)
    assert "text_column 'message' is struct<text:string>" in message
    assert "label_column 'intent_label' is array<string>" in message
    assert "quality_column 'score' is struct<v:bigint>, expected a number" in message


def test_numeric_labels_are_not_a_wrong_type(spark, tokenizer_path, tmp_path):
    source = write_parquet(
        tmp_path / "tickets.parquet",
        {"message": [GOOD, OTHER], "intent_label": pa.array([3, 7], type=pa.int64())},
    )
    summary = run(spark, tokenizer_path, tmp_path, source)
    assert summary["labels"] == ["3", "7"] and summary["rows_out"] == 2


# --------------------------------------------------------------------------- values


def test_all_labels_null(spark, tokenizer_path, tmp_path):
    from sparktune.data.prepare_errors import NoRowsLeftError

    source = write_jsonl(
        tmp_path / "tickets.jsonl",
        [{"message": f"{GOOD} number {i}", "intent_label": None} for i in range(6)],
    )
    with pytest.raises(NoRowsLeftError) as err:
        run(spark, tokenizer_path, tmp_path, source)
    message = str(err.value)
    assert f"No rows left after preparing {str(source)!r}: all 6 row(s) were rejected" in message
    assert "null_label rejected 6 of the 6 row(s)" in message
    assert "label_column 'intent_label' is null or blank" in message
    assert "null_label                    6            0          6" in message  # the step table
    assert "Fix:" in message
    assert_no_prepared_data(tmp_path)

    code, record = run_job(tokenizer_path, tmp_path, source)
    assert code == 2 and record["kind"] == "NoRowsLeftError"
    assert "null_label rejected 6 of the 6 row(s)" in record["error"]


def test_every_text_too_short(spark, tokenizer_path, tmp_path):
    from sparktune.data.prepare_errors import NoRowsLeftError

    source = tmp_path / "tickets.csv"
    source.write_text("message,intent_label\nhi,greeting\nhelp!!,other\n  ok  ,other\n")
    with pytest.raises(NoRowsLeftError) as err:
        run(spark, tokenizer_path, tmp_path, source)
    message = str(err.value)
    assert "length rejected 3 of the 3 row(s)" in message
    assert "shorter than min_chars (20) or longer than max_chars (2048)" in message
    assert "(the rejected texts have 2 to 6 chars)" in message  # what was found instead
    assert "length                        3            0          3" in message
    quarantine = next((tmp_path / "lake" / "quarantine").iterdir())
    assert str(quarantine) in message  # where to look at the rejected rows
    assert_no_prepared_data(tmp_path)


def test_every_row_a_duplicate_passes_with_one_row_and_says_why(spark, tokenizer_path, tmp_path):
    # Prepare lets the single row through: the quality gate's min_rows rules stop the run.
    copies = [
        {"message": GOOD if i % 2 else f"  {GOOD.upper()} ", "intent_label": "billing"} for i in range(40)
    ]
    source = write_jsonl(tmp_path / "tickets.jsonl", copies)
    summary = run(spark, tokenizer_path, tmp_path, source)
    assert (summary["rows_in"], summary["rows_out"]) == (40, 1)
    dedupe = next(s for s in summary["steps"] if s["step"] == "dedupe")
    assert (dedupe["rows_in"], dedupe["rows_out"]) == (40, 1)
    assert summary["warnings"] == [
        "dedupe dropped 39 of 40 rows (98%): rows repeat another row's normalized text (a content hash): "
        "check that the source was not appended to itself"
    ]


# --------------------------------------------------------------------------- formats and bytes


@pytest.mark.parametrize(
    ("name", "content", "hint"),
    [
        ("tickets.xlsx", b"PK\x03\x04 a zipped workbook", "Save the workbook as 'CSV UTF-8'"),
        ("tickets.txt", f"message,intent_label\n{GOOD},billing\n".encode(), "set source_format to csv"),
    ],
)
def test_unknown_file_format(spark, tokenizer_path, tmp_path, name, content, hint):
    from sparktune.data.prepare_errors import UnsupportedFormatError

    source = tmp_path / name
    source.write_bytes(content)
    with pytest.raises(UnsupportedFormatError) as err:
        run(spark, tokenizer_path, tmp_path, source)
    message = str(err.value)
    suffix = Path(name).suffix
    assert f"Cannot read source {str(source)!r} with source_format 'auto': found {name}" in message
    assert f"'{suffix}' is not a format the pipeline reads" in message
    assert "Supported: Parquet (.parquet), CSV" in message and "JSON Lines" in message
    assert hint in message
    assert "set source_format to parquet, csv or json" in message

    if suffix == ".txt":  # and the fix the message gives works
        assert run(spark, tokenizer_path, tmp_path, source, source_format="csv")["rows_out"] == 1
    else:
        code, record = run_job(tokenizer_path, tmp_path, source)
        assert code == 2 and record == {"error": message, "kind": "UnsupportedFormatError"}


def test_unknown_formats_inside_a_folder(spark, tokenizer_path, tmp_path):
    from sparktune.data.prepare_errors import UnsupportedFormatError

    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "part-1.xls").write_bytes(b"\xd0\xcf\x11\xe0")
    (folder / "part-2.xls").write_bytes(b"\xd0\xcf\x11\xe0")
    with pytest.raises(UnsupportedFormatError, match=r"found part-1.xls, part-2.xls, and '.xls' is not"):
        run(spark, tokenizer_path, tmp_path, folder)


def latin1_csv(tmp_path: Path) -> Path:
    path = tmp_path / "export.csv"
    rows = [
        "message,intent_label",
        "Café au lait was cold and the crème brûlée too,complaint",
        f"{GOOD},billing",
    ]
    path.write_bytes("\r\n".join([*rows, ""]).encode("latin-1"))
    return path


def latin1_jsonl_one_bad_line(tmp_path: Path) -> Path:
    good = write_jsonl(tmp_path / "a.jsonl", [{"message": GOOD, "intent_label": "billing"}])
    write_jsonl(
        tmp_path / "b.jsonl",
        [
            {"message": OTHER, "intent_label": "account"},
            {"message": "Où est ma commande, déjà ?", "intent_label": "shipping"},
        ],
        encoding="latin-1",
    )
    return good.parent / "*.jsonl"


def latin1_jsonl_all_bad(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "tickets.jsonl",
        [{"message": "Où est ma commande, déjà ?", "intent_label": "shipping"}],
        "latin-1",
    )


@pytest.mark.parametrize(
    ("make_source", "bad_file", "shown"),
    [
        (latin1_csv, "export.csv", "Caf\ufffd au lait"),
        (latin1_jsonl_one_bad_line, "b.jsonl", "O\ufffd est ma commande"),
        (latin1_jsonl_all_bad, "tickets.jsonl", "O\ufffd est ma commande"),
    ],
    ids=["csv", "jsonl-one-line", "jsonl-every-line"],
)
def test_bytes_that_are_not_utf8(spark, tokenizer_path, tmp_path, make_source, bad_file, shown):
    from sparktune.data.prepare_errors import EncodingError

    source = make_source(tmp_path)
    with pytest.raises(EncodingError) as err:
        run(spark, tokenizer_path, tmp_path, source)
    message = str(err.value)
    assert bad_file in message and "not UTF-8" in message
    assert shown in message  # what Spark made of the bytes
    assert "re-encode the file(s) to UTF-8" in message and "iconv" in message
    if bad_file == "b.jsonl":
        assert "1 row(s)" in message and "a.jsonl" not in message  # the clean file is not blamed
    assert_no_prepared_data(tmp_path)
    if bad_file == "export.csv":
        code, record = run_job(tokenizer_path, tmp_path, source)
        assert code == 2 and record["kind"] == "EncodingError" and "export.csv" in record["error"]


def test_lines_that_are_not_json(spark, tokenizer_path, tmp_path):
    from sparktune.data.prepare_errors import UnreadableSourceError

    source = tmp_path / "tickets.jsonl"
    source.write_text(json.dumps({"message": GOOD, "intent_label": "billing"}) + '\n{"message": "cut off\n')
    with pytest.raises(
        UnreadableSourceError, match=r"1 line\(s\) of source .*tickets.jsonl.* not valid JSON"
    ):
        run(spark, tokenizer_path, tmp_path, source)


def test_a_file_that_is_not_parquet(spark, tokenizer_path, tmp_path):
    from sparktune.data.prepare_errors import UnreadableSourceError

    source = tmp_path / "tickets.parquet"
    source.write_text(f"message,intent_label\n{GOOD},billing\n")
    with pytest.raises(UnreadableSourceError) as err:
        run(spark, tokenizer_path, tmp_path, source)
    message = str(err.value)
    assert f"Cannot read source {str(source)!r} as parquet" in message
    assert "Could not read footer" in message and "at org.apache" not in message  # no stack trace
    assert "set source_format to their real format" in message


def test_main_does_not_stop_a_session_it_did_not_start(spark, tokenizer_path, tmp_path):
    source = write_jsonl(tmp_path / "tickets.jsonl", [{"message": GOOD, "intent_label": "billing"}])
    code, summary = run_job(tokenizer_path, tmp_path, source)
    assert code == 0 and summary["rows_out"] == 1
    assert spark.range(3).count() == 3  # the shared session still works
