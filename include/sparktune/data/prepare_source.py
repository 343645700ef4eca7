"""Reading the source of a preparation run: a Parquet/CSV/JSON Lines path or glob, or a catalog table.

The format is told from the names (or set by ``source_format``), the mapped columns are checked
for presence and a usable type, and rows a CSV or JSON reader could not decode cleanly are
recognised, so that bad input fails before the recipe with a
:class:`~sparktune.data.prepare_errors.DataPreparationError` subclass naming the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.source_names import (
    COMPRESSION_SUFFIXES,
    UNSUPPORTED_EXTENSIONS,
    format_from_name,
    looks_like_table,
    unsupported_extension,
)
from sparktune.data.prepare_errors import (
    DataPreparationError,
    EmptySourceError,
    EncodingError,
    MissingColumnsError,
    SourceNotFoundError,
    UnreadableSourceError,
    UnsupportedFormatError,
    WrongColumnTypeError,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from sparktune.core.params import DataSource, PipelineParams

# Spark's JSON reader puts lines it cannot parse in this column (PERMISSIVE mode).
CORRUPT_RECORD = "_corrupt_record"
# What Java's decoders put in place of bytes that are not valid UTF-8.
REPLACEMENT_CHAR = "\ufffd"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def quoted_column(name: str) -> Column:
    """The column ``name`` of a DataFrame, taken literally: a column named "a.b" or "my text" too."""
    from pyspark.sql import functions as F

    return F.col(_quote(name))


def hadoop_fs(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    """The Hadoop FileSystem and Path for ``uri``: works for file://, hdfs://, s3a://, dbfs:/ alike."""
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark._jsc.hadoopConfiguration()), path


def _glob(spark: SparkSession, uri: str) -> list[Any]:
    fs, path = hadoop_fs(spark, uri)
    statuses = fs.globStatus(path)
    return list(statuses) if statuses is not None else []


def _is_data_file(name: str) -> bool:
    return not name.startswith(("_", "."))


def _files_inside(
    spark: SparkSession, uri: str, statuses: list[Any], limit: int = 200
) -> list[tuple[str, int]]:
    """(name, size) of the data files under the matched paths, walked breadth-first.

    Bounded, because a folder can hold millions of part files and a few are enough to tell the
    format or to see that there is nothing to read.
    """
    fs, _ = hadoop_fs(spark, uri)
    files: list[tuple[str, int]] = []
    queue = list(statuses)
    seen = 0
    while queue and seen < limit:
        status = queue.pop(0)
        seen += 1
        name = status.getPath().getName()
        if not _is_data_file(name):
            continue
        if status.isDirectory():
            queue.extend(fs.listStatus(status.getPath()))
        else:
            files.append((name, int(status.getLen())))
    return files


def _supported_formats_text() -> str:
    return (
        "Parquet (.parquet), CSV with a header row (.csv), JSON Lines (.jsonl, .ndjson, .json), "
        f"each optionally compressed ({', '.join(COMPRESSION_SUFFIXES[:4])}, ...), or a Spark catalog table"
    )


def _unsupported_format(source_uri: str, found: list[str]) -> UnsupportedFormatError:
    extensions = sorted({unsupported_extension(name) or Path(name).suffix.lower() or name for name in found})
    hints = [UNSUPPORTED_EXTENSIONS[ext] for ext in extensions if ext in UNSUPPORTED_EXTENSIONS]
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return UnsupportedFormatError(
        f"Cannot read source {source_uri!r} with source_format 'auto': found {shown}, and "
        f"{', '.join(repr(e) for e in extensions)} is not a format the pipeline reads. Supported: "
        f"{_supported_formats_text()}. Fix: "
        + (" ".join(hints) + " Or " if hints else "")
        + "if the files are Parquet, CSV or JSON Lines under another extension, set source_format "
        "to parquet, csv or json."
    )


def empty_source_error(source_uri: str, what: str) -> EmptySourceError:
    """The error for a source with nothing to read; ``what`` says what was found."""
    return EmptySourceError(
        f"Source {source_uri!r} is empty: {what}. Fix: point source_uri at the files or table that "
        "hold the rows (check the export or the upstream job that should have written them)."
    )


def resolve_format(spark: SparkSession, source_uri: str, source_format: str = "auto") -> str:
    """The concrete reader for ``source_uri``: parquet, csv, json or table."""
    if source_format != "auto":
        return source_format
    if looks_like_table(source_uri):
        return "table"
    by_name = format_from_name(source_uri)
    if by_name:
        return by_name
    statuses = _glob(spark, source_uri)
    if not statuses:
        raise _not_found(source_uri)
    files = _files_inside(spark, source_uri, statuses)
    if not files:
        raise empty_source_error(
            source_uri, "it holds no data files (an empty folder, or only _SUCCESS/hidden files)"
        )
    formats = {format_from_name(name) for name, _ in files}
    known = {f for f in formats if f}
    if len(known) == 1:
        return known.pop()
    if not known:
        raise _unsupported_format(source_uri, sorted(name for name, _ in files))
    raise UnsupportedFormatError(
        f"Cannot tell the format of source {source_uri!r}: it mixes {', '.join(sorted(known))} files "
        f"({', '.join(sorted(name for name, _ in files)[:5])}, ...). Fix: point source_uri at files of one "
        "format (a glob such as folder/*.parquet), or set source_format to parquet, csv or json."
    )


def _not_found(source_uri: str) -> SourceNotFoundError:
    return SourceNotFoundError(
        f"Source not found: {source_uri!r} matches no file or folder. "
        "Fix: set source_uri to an existing Parquet/CSV/JSON Lines path or glob (any Hadoop URI "
        "the cluster can read), or to a Spark catalog table name (no '/' and no file extension)."
    )


def _spark_error_summary(exc: Exception) -> str:
    """The first line of a Spark error, without the JVM stack trace (that goes to the log)."""
    text = str(exc)
    # Py4JJavaError: "An error occurred while calling o1.parquet.\n: org.apache...Exception: [...]"
    lines = [line.strip(" :") for line in text.splitlines() if line.strip(" :")]
    lines = [line for line in lines if not line.startswith("An error occurred while calling")]
    first = lines[0] if lines else text
    # "org.apache.spark.SparkException: [ERROR_CLASS] ..." -> "[ERROR_CLASS] ..."
    if ": " in first and first.split(": ", 1)[0].rsplit(".", 1)[-1].endswith(("Exception", "Error")):
        first = first.split(": ", 1)[1]
    return first.rstrip(".")[:500]


def _read_files(spark: SparkSession, source_uri: str, fmt: str) -> DataFrame:
    if fmt == "parquet":
        return spark.read.parquet(source_uri)
    if fmt == "csv":
        # Options for CSV as spreadsheets and databases export it: quoted fields may hold
        # newlines and doubled quotes; CRLF line ends are handled by the multi-line parser.
        df = spark.read.options(header=True, multiLine=True, escape='"', encoding="UTF-8").csv(source_uri)
        renamed = [c.lstrip("\ufeff") for c in df.columns]
        return df.toDF(*renamed) if renamed != df.columns else df
    if fmt == "json":
        df = spark.read.json(source_uri)
        if df.columns == [CORRUPT_RECORD]:
            # Not JSON Lines: one JSON document (an array of objects) per file?
            df = spark.read.option("multiLine", True).json(source_uri)
        if df.columns == [CORRUPT_RECORD]:
            raise _unparseable_json(spark, source_uri)
        return df
    raise DataPreparationError(f"Unknown source_format {fmt!r}. Fix: use auto, parquet, csv, json or table.")


def _unparseable_json(spark: SparkSession, source_uri: str) -> UnreadableSourceError:
    from pyspark.sql import functions as F

    first = spark.read.text(source_uri).select(F.make_valid_utf8("value")).first()
    line = (first[0] if first else "")[:120]
    if REPLACEMENT_CHAR in line:
        return EncodingError(
            f"Source {source_uri!r} is not UTF-8: Spark could not decode its bytes (first line: {line!r}, "
            f"{REPLACEMENT_CHAR!r} marks the bytes that failed). {_REENCODE_FIX}"
        )
    return UnreadableSourceError(
        f"Cannot parse source {source_uri!r} as JSON: no line is a JSON object and the file is not a JSON "
        f"array either (first line: {line!r}). Fix: write one JSON object per line (JSON Lines), or set "
        "source_format to the file's real format (csv, parquet)."
    )


_REENCODE_FIX = (
    "Fix: re-encode the file(s) to UTF-8, e.g. `iconv -f WINDOWS-1252 -t UTF-8 in.csv > out.csv` or in "
    "Python `Path(out).write_text(Path(src).read_text(encoding='cp1252'), encoding='utf-8')`; from Excel, "
    "save as 'CSV UTF-8'."
)


def read_source(spark: SparkSession, source_uri: str, source_format: str = "auto") -> tuple[DataFrame, str]:
    """Read the source and return ``(DataFrame, resolved format)``; see :func:`load_source`."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException

    source_uri = source_uri.strip()
    if not source_uri:
        raise DataPreparationError(
            "source_uri is empty. Fix: set source_uri to a Parquet/CSV/JSON Lines path or a table name."
        )
    fmt = resolve_format(spark, source_uri, source_format)
    if fmt == "table":
        if not spark.catalog.tableExists(source_uri):
            raise SourceNotFoundError(
                f"Source not found: table {source_uri!r} is not in the Spark catalog. Fix: create or "
                "register the table (saveAsTable / CREATE TABLE), or, for a file, use a path with a '/' "
                "or set source_format."
            )
        return spark.table(source_uri), fmt
    statuses = _glob(spark, source_uri)
    if not statuses:
        raise _not_found(source_uri)
    try:
        df = _read_files(spark, source_uri, fmt)
    except (AnalysisException, Py4JJavaError) as exc:
        # Only what a bad source causes; anything else (a lost connection to the store) is transient
        # and must keep its own type so that the task is retried.
        message = str(exc)
        if "UNABLE_TO_INFER_SCHEMA" in message:
            files = _files_inside(spark, source_uri, statuses)
            if not files or all(size == 0 for _, size in files):
                raise empty_source_error(
                    source_uri,
                    f"found {len(files)} data file(s), all of 0 bytes" if files else "it holds no data files",
                ) from exc
        if any(marker in message for marker in _UNREADABLE_MARKERS):
            raise UnreadableSourceError(
                f"Cannot read source {source_uri!r} as {fmt} ({_spark_error_summary(exc)}). Fix: check that "
                f"the files really are {fmt} (set source_format to their real format) and not truncated or "
                "corrupt; re-export them if they are."
            ) from exc
        raise
    if not df.columns:
        raise empty_source_error(source_uri, f"its {fmt} file(s) hold no header and no rows")
    return df, fmt


_UNREADABLE_MARKERS = (
    "UNABLE_TO_INFER_SCHEMA",
    "FAILED_READ_FILE",
    "CANNOT_READ_FILE_FOOTER",
    "is not a Parquet file",
    "MALFORMED_RECORD_IN_PARSING",
)


def load_source(spark: SparkSession, source_uri: str, source_format: str = "auto") -> DataFrame:
    """Read the source as a DataFrame: a Parquet/CSV/JSON Lines path or glob, or a catalog table.

    A source that does not exist, is empty, is in an unsupported format or cannot be parsed raises
    a :class:`DataPreparationError` subclass naming the path and what was found.
    """
    return read_source(spark, source_uri, source_format)[0]


# --------------------------------------------------------------------------- columns


def find_column(columns: list[str], name: str) -> str | None:
    """The column of ``columns`` that ``name`` means, or None: the exact name, else the one column
    equal to it ignoring case."""
    # Spark resolves column names case-insensitively by default, so accept what Spark accepts.
    if name in columns:
        return name
    matches = [c for c in columns if c.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None


def _mapped_columns(params: PipelineParams) -> dict[str, str]:
    """Param name -> column name of every mapped column that must exist (optional ones when set)."""
    wanted = {"text_column": params.text_column, "label_column": params.label_column}
    for name in ("id_column", "timestamp_column"):
        value = getattr(params, name).strip()
        if value:
            wanted[name] = value
    return wanted


def _type_problem(param: str, data_type: Any) -> str | None:
    """Why a column of ``data_type`` cannot serve as ``param``, or None when it can."""
    from pyspark.sql import types as T

    scalar = (T.StringType, T.CharType, T.VarcharType, T.NumericType, T.BooleanType, T.NullType)
    if param in ("text_column", "label_column"):
        ok = isinstance(data_type, scalar)
        expected = "a string (numbers and booleans are read as text)"
    elif param == "quality_column":
        ok = isinstance(data_type, T.NumericType | T.StringType | T.NullType)
        expected = "a number, or a string holding one"
    elif param == "id_column":
        ok = isinstance(data_type, (*scalar, T.BinaryType, T.DateType, T.TimestampType, T.TimestampNTZType))
        expected = "a string, number or binary hash"
    else:  # timestamp_column
        ok = isinstance(
            data_type,
            T.DateType | T.TimestampType | T.TimestampNTZType | T.NumericType | T.StringType | T.NullType,
        )
        expected = "a timestamp, date, number (epoch) or ISO-8601 string"
    return None if ok else expected


def check_columns(df: DataFrame, params: PipelineParams, source: str | None = None) -> None:
    """Raise one error naming every missing or unusable mapped column and what the source has instead.

    Missing columns raise :class:`MissingColumnsError`; columns whose type cannot be read as
    text (struct, array, map, binary ...) raise :class:`WrongColumnTypeError`. Both list every
    problem at once, with the columns and types that exist.
    """
    import difflib

    where = f"Source {source!r}" if source else "The source"
    found = ", ".join(f"{c!r} ({t})" for c, t in df.dtypes) or "none"
    missing: list[str] = []
    wrong: list[str] = []
    for param, name in _mapped_columns(params).items():
        actual = find_column(df.columns, name)
        if actual is None:
            close = difflib.get_close_matches(name.lower(), [c.lower() for c in df.columns], n=1, cutoff=0.6)
            guess = next((c for c in df.columns if close and c.lower() == close[0]), None)
            missing.append(f"{param} {name!r}" + (f" (did you mean {guess!r}?)" if guess else ""))
            continue
        data_type = df.schema[actual].dataType
        expected = _type_problem(param, data_type)
        if expected:
            wrong.append(f"{param} {actual!r} is {data_type.simpleString()}, expected {expected}")
    quality = params.quality_column.strip()
    quality_col = find_column(df.columns, quality) if quality else None
    if quality_col is not None:
        data_type = df.schema[quality_col].dataType
        expected = _type_problem("quality_column", data_type)
        if expected:
            wrong.append(f"quality_column {quality_col!r} is {data_type.simpleString()}, expected {expected}")
    if missing:
        raise MissingColumnsError(
            f"{where} is missing column(s): {', '.join(missing)}. Columns found: "
            f"{', '.join(repr(c) for c in df.columns) or 'none'}."
            + (f" Also: {'; '.join(wrong)}." if wrong else "")
            + " Fix: set text_column / label_column (and id_column / timestamp_column, if used) to "
            "columns of the source, or rename the columns in the source."
        )
    if wrong:
        raise WrongColumnTypeError(
            f"{where} has column(s) of the wrong type: {'; '.join(wrong)}. Columns found: {found}. Fix: "
            "map the param to a column that holds plain text, or flatten the column in the source (e.g. "
            "select its text field into a column of its own) and map that one."
        )


# --------------------------------------------------------------------------- decoding


def decoding_problem(df: DataFrame, text: Column, label: Column) -> tuple[Column, Column]:
    """(kind, example) of a row that was not decoded cleanly from a CSV/JSON file; null when fine.

    The CSV reader's Java decoder turns bytes that are not UTF-8 into U+FFFD without a word; the
    JSON reader turns a line it cannot parse (bad bytes included) into a row of nulls that keeps
    the raw line, invalid bytes and all, in _corrupt_record.
    """
    from pyspark.sql import functions as F

    def garbled(value: Column) -> Column:
        return F.coalesce(F.contains(value, F.lit(REPLACEMENT_CHAR)) | ~F.is_valid_utf8(value), F.lit(False))

    kind = F.when(garbled(text) | garbled(label), F.lit("encoding"))
    example = F.when(kind.isNotNull(), F.coalesce(text, label))
    if CORRUPT_RECORD in df.columns:
        corrupt = F.col(CORRUPT_RECORD)
        kind = F.coalesce(
            kind,
            F.when(garbled(corrupt), F.lit("encoding")).when(corrupt.isNotNull(), F.lit("malformed")),
        )
        example = F.coalesce(example, corrupt)
    return kind, F.when(kind.isNotNull(), F.substring(F.make_valid_utf8(example), 1, 200))


def decoding_error(source: str | None, stats: list[Any]) -> UnreadableSourceError:
    """The error for the rows :func:`decoding_problem` flagged, from the recipe's aggregated ``stats``
    (``bad_kinds``, ``bad_files``, ``bad_rows``, ``bad_example`` per row): how many, in which files, an
    example and the fix."""
    kinds: set[str] = set()
    files: set[str] = set()
    examples: list[str] = []
    count = 0
    for row in stats:
        kinds.update(row["bad_kinds"] or [])
        files.update(f for f in row["bad_files"] or [] if f)
        count += row["bad_rows"]
        if row["bad_example"]:
            examples.append(row["bad_example"])
    where = f"source {source!r}" if source else "the source"
    named = sorted(files)
    in_files = (
        f" in {', '.join(named[:5])}" + (f" and {len(named) - 5} more file(s)" if len(named) > 5 else "")
        if named
        else ""
    )
    example = min(examples)[:80] if examples else ""
    if "encoding" in kinds:
        return EncodingError(
            f"{count:,} row(s) of {where}{in_files} hold bytes that are not UTF-8: Spark decoded them as "
            f"U+FFFD {REPLACEMENT_CHAR!r} (e.g. {example!r}), so the file was probably saved as "
            "Latin-1/Windows-1252. " + _REENCODE_FIX
        )
    return UnreadableSourceError(
        f"{count:,} line(s) of {where}{in_files} are not valid JSON (e.g. {example!r}). Fix: repair or drop "
        "those lines (each line must be one JSON object), or set source_format to the file's real format."
    )


# --------------------------------------------------------------------------- source_uri


def resolve_source_uri(params: DataSource) -> str:
    """The source to read: ``params.source_uri`` (a local relative path made absolute, so the
    submitting process and the Spark driver agree), or the generated demo data when it is empty."""
    from sparktune.core.config import settings

    uri = params.source_uri.strip()
    if not uri:
        demo = settings().demo_source_path
        if not demo.exists():
            raise SourceNotFoundError(
                f"source_uri is empty and the demo data {demo} does not exist. Fix: generate it with "
                f"`python -m sparktune_dev.demo_data --out {demo}` (make demo does) or set source_uri."
            )
        return str(demo)
    if params.source_format == "table" or "://" in uri:
        return uri
    # "db.tickets" is a table, "tickets.csv" and "exports/tickets" are files.
    if "/" in uri or "\\" in uri or not looks_like_table(uri) or Path(uri).expanduser().exists():
        return str(Path(uri).expanduser().resolve())
    return uri
