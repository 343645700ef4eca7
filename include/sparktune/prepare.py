"""The data preparation recipe: a source of labelled text -> prompt/completion rows split 80/10/10.

Every step is a named filter with row counts (``read``, ``min_quality_score``, ``null_label``,
``length``, ``dedupe``, ``format``, ``max_length``, ``split``). Rejected rows are not lost: they go
to a quarantine DataFrame with their original values and the step that rejected them.

The recipe runs as ONE pass over the source: each row is annotated with the first step that
rejects it, the annotated DataFrame is persisted, and one aggregation yields every step's counts.
That is what keeps a multi-million-row run from re-reading the source once per step.

The split is stable: a row's split is a function of ``(split_seed, example_id)`` only, so adding
rows to the source never moves an existing row between train, validation and test (see
:func:`_split_fixups` for the one documented exception on tiny labels).

``example_id`` and the dedupe key are the ``id_column`` value when one is mapped and set, else a
sha256 of the normalized text. Among copies of one key the kept one is the most recent by
``timestamp_column`` (when mapped), then the one with the smallest hash of its values.

Bad input fails with a :class:`DataPreparationError` subclass whose message names the path or
column, what was found instead and the fix: a missing, empty, unsupported or unparseable source,
a missing or unusable column, bytes that are not UTF-8, no row surviving the recipe.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The prompt a model is trained on and the one it is asked with come from one function.
from sparktune.label_scoring import fast_backend, format_example  # noqa: F401 (re-exported)
from sparktune.source_names import (
    COMPRESSION_SUFFIXES,
    UNSUPPORTED_EXTENSIONS,
    format_from_name,
    looks_like_table,
    unsupported_extension,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame, SparkSession
    from sparktune.params import PipelineParams

log = logging.getLogger(__name__)

STEPS = ("read", "min_quality_score", "null_label", "length", "dedupe", "format", "max_length", "split")
# Steps that can reject rows, in the order they are applied (a row is charged to the first one).
REJECTING_STEPS = ("min_quality_score", "null_label", "length", "dedupe", "max_length")
SPLITS = ("train", "validation", "test")
TRAIN_FRACTION = 0.8
VALIDATION_FRACTION = 0.1
# A label with at least this many kept rows is guaranteed one validation and one test row.
MIN_ROWS_FOR_FULL_SPLIT = 10
# Input bytes per dedupe partition, and at most this many partitions per input split.
BYTES_PER_PARTITION = 32 << 20
MAX_PARTITIONS_PER_SPLIT = 4
OUTPUT_COLUMNS = ("example_id", "text", "label", "prompt", "completion", "n_tokens", "split")
QUARANTINE_COLUMNS = ("example_id", "text", "label", "quality", "reject_reason", "reject_detail")

# Spark's JSON reader puts lines it cannot parse in this column (PERMISSIVE mode).
CORRUPT_RECORD = "_corrupt_record"
# What Java's decoders put in place of bytes that are not valid UTF-8.
REPLACEMENT_CHAR = "\ufffd"
# Java regex; (?U) makes \s match Unicode whitespace (no-break space etc.) like Python's str.strip.
_TRIM_RE = r"(?U)^\s+|\s+$"
_SPACES_RE = r"(?U)\s+"


class DataPreparationError(ValueError):
    """A problem with the source or its data: deterministic, so retrying will not help."""


class SourceNotFoundError(DataPreparationError):
    """``source_uri`` matches no file, folder or catalog table."""


class UnsupportedFormatError(DataPreparationError):
    """The source's files are in a format the recipe does not read (an .xlsx, a .txt, ...)."""


class UnreadableSourceError(DataPreparationError):
    """The source exists but cannot be parsed in its format (a broken Parquet file, bad JSON lines)."""


class EncodingError(UnreadableSourceError):
    """A CSV or JSON source holds bytes that are not UTF-8."""


class EmptySourceError(DataPreparationError):
    """The source has no rows: a header-only CSV, an empty folder or file, an empty table."""


class MissingColumnsError(DataPreparationError):
    """A mapped column (text, label, id, timestamp) is not in the source."""


class WrongColumnTypeError(DataPreparationError):
    """A mapped column has a type that cannot be read as text (a struct, array, map, binary)."""


class NoRowsLeftError(DataPreparationError):
    """Every row of the source was rejected by some step."""


@dataclass(frozen=True)
class StepCount:
    step: str
    rows_in: int
    rows_out: int
    skipped: bool = False

    @property
    def dropped(self) -> int:
        return self.rows_in - self.rows_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PreparedData:
    """The result of :func:`prepare`. ``rows`` and ``quarantine`` read from a persisted frame."""

    rows: DataFrame
    quarantine: DataFrame
    steps: list[StepCount]
    quality_used: bool = True
    # What some steps saw in the rows they rejected, for messages (e.g. "length": "2 to 6 chars").
    findings: dict[str, str] = field(default_factory=dict)
    _persisted: list[DataFrame] = field(default_factory=list, repr=False)

    def unpersist(self) -> None:
        for frame in self._persisted:
            frame.unpersist()


# --------------------------------------------------------------------------- loading


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _col(name: str) -> Column:
    from pyspark.sql import functions as F

    # Backticks so that a column named "a.b" or "my text" is taken literally.
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


def _empty_source(source_uri: str, what: str) -> EmptySourceError:
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
        raise _empty_source(
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
                raise _empty_source(
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
        raise _empty_source(source_uri, f"its {fmt} file(s) hold no header and no rows")
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


def _find_column(columns: list[str], name: str) -> str | None:
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
        actual = _find_column(df.columns, name)
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
    quality_col = _find_column(df.columns, quality) if quality else None
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


# --------------------------------------------------------------------------- tokens

_TOKENIZERS: dict[str, Any] = {}
_BACKENDS: dict[str, Any] = {}


def load_tokenizer(tokenizer_path: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer for ``tokenizer_path``, loaded once per Python process (executor workers too).

    Its own Python code (a custom tokenizer class) runs only with ``trust_remote_code``."""
    key = f"{tokenizer_path}\0{bool(trust_remote_code)}"
    tokenizer = _TOKENIZERS.get(key)
    if tokenizer is None:
        from sparktune import model_safety

        tokenizer = model_safety.load_tokenizer(tokenizer_path, trust_remote_code=trust_remote_code)
        _TOKENIZERS[key] = tokenizer
    return tokenizer


def _backend_from_json(spec: str) -> Any:
    """A bare Rust tokenizer rebuilt from its JSON, once per worker process."""
    import hashlib

    key = hashlib.sha256(spec.encode()).hexdigest()
    backend = _BACKENDS.get(key)
    if backend is None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(spec)
        backend.no_truncation()
        backend.no_padding()
        _BACKENDS[key] = backend
    return backend


def count_tokens(tokenizer: Any, texts: pd.Series) -> pd.Series:
    """Tokens per text with special tokens (as training sees them); null texts stay null.

    ``tokenizer`` is a transformers tokenizer or the bare ``tokenizers.Tokenizer`` under a fast one.
    """
    import pandas as pd

    values: list[int | None] = [None] * len(texts)
    present = [i for i, text in enumerate(texts) if isinstance(text, str)]
    if present:
        batch = [texts.iat[i] for i in present]
        backend = fast_backend(tokenizer)
        if backend is not None:
            # What a fast tokenizer's __call__ runs underneath, minus the offsets and the Python
            # BatchEncoding: the same counts, about 20 % faster on the tiny model's tokenizer.
            lengths = [len(e) for e in backend.encode_batch_fast(batch, add_special_tokens=True)]
        else:
            encoded = tokenizer(batch, add_special_tokens=True, verbose=False)
            lengths = [len(ids) for ids in encoded["input_ids"]]
        for i, length in zip(present, lengths, strict=True):
            values[i] = length
    return pd.Series(pd.array(values, dtype="Int32"), index=texts.index)


# Bump when what backend_spec stores, or how it is derived, changes: old entries are then ignored.
_BACKEND_CACHE_VERSION = 1


def _backend_cache_key(folder: Path, trust_remote_code: bool) -> str:
    """What the backend transformers builds from ``folder`` depends on: the tokenizer files, the
    model config (it names the tokenizer class), both libraries' versions and trust_remote_code."""
    import hashlib
    from importlib import metadata

    from sparktune.fingerprint import tokenizer_fingerprint

    config = folder / "config.json"
    parts = [
        f"v{_BACKEND_CACHE_VERSION}",
        tokenizer_fingerprint(str(folder)),
        hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else "no-config",
        f"transformers {metadata.version('transformers')}",
        f"tokenizers {metadata.version('tokenizers')}",
        f"trust_remote_code {bool(trust_remote_code)}",
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def backend_spec(
    tokenizer_path: str, trust_remote_code: bool = False, cache_dir: Path | None = None
) -> str | None:
    """The JSON of the Rust backend that counts tokens (:func:`fast_backend`), or None for a
    tokenizer without one (it then loads with transformers wherever it counts).

    Loading the tokenizer with transformers costs a driver about 5 s, most of it importing
    transformers and torch, on every job. For a local folder the JSON that transformers built is
    kept in ``cache_dir`` (default ``$SPARKTUNE_HOME/cache/tokenizers``) under a key of everything
    that goes into it (:func:`_backend_cache_key`): a later job with the same key reads back the
    very backend transformers built, so it counts the same ids, in milliseconds. The folder's
    safety checks run every time. A hub id is loaded with transformers every time.
    """
    folder = Path(str(tokenizer_path)).expanduser()
    from sparktune import model_safety

    if not model_safety.is_local_folder(tokenizer_path):
        backend = fast_backend(load_tokenizer(tokenizer_path, trust_remote_code))
        return backend.to_str() if backend is not None else None
    model_safety.check_model_folder(folder, trust_remote_code=trust_remote_code)
    if cache_dir is None:
        from sparktune.config import settings

        cache_dir = settings().home / "cache" / "tokenizers"
    entry = cache_dir / f"{_backend_cache_key(folder, trust_remote_code)}.json"
    try:
        cached = json.loads(entry.read_text())
        return cached["backend"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no entry yet, or an unreadable one: build it again
    backend = fast_backend(load_tokenizer(tokenizer_path, trust_remote_code))
    spec = backend.to_str() if backend is not None else None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}")
        partial.write_text(json.dumps({"tokenizer": str(folder), "backend": spec}))
        partial.replace(entry)  # atomic: a concurrent job reads a whole entry or none
    except OSError as exc:  # a read-only home only costs the next job the load
        log.warning("could not cache the tokenizer backend in %s: %s", cache_dir, exc)
    return spec


def token_counter(tokenizer_path: str, trust_remote_code: bool = False) -> Callable[[Column], Column]:
    """An iterator pandas UDF counting tokens; each worker loads the tokenizer once, not per batch.

    When the tokenizer is a fast one, its configured Rust backend travels to the workers as JSON
    (:func:`backend_spec`), so workers import only ``tokenizers``: importing transformers cost each
    Python worker seconds per job (and every executor of a cluster would need it installed).
    Slow tokenizers load in each worker.
    """
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    spec = backend_spec(tokenizer_path, trust_remote_code)

    def n_tokens(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        # The loaders are module-level functions, pickled by reference: their caches live in the
        # worker's imported module, surviving across batches, tasks and reused workers.
        if spec is not None:
            tokenizer = _backend_from_json(spec)
        else:
            tokenizer = load_tokenizer(tokenizer_path, trust_remote_code)
        for batch in batches:
            yield count_tokens(tokenizer, batch)

    # Real types, not the strings of `from __future__ import annotations`: Spark reads the hints
    # to pick the iterator-of-Series UDF kind, and pandas is imported lazily in this module.
    n_tokens.__annotations__ = {"batches": Iterator[pd.Series], "return": Iterator[pd.Series]}
    return pandas_udf(n_tokens, "int")  # type: ignore[call-overload]


# --------------------------------------------------------------------------- recipe


def split_template(template: str) -> tuple[list[str], str, str]:
    """Split the prompt template into (literal pieces around {text}, whitespace before {label}, tail).

    The prompt is the part before ``{label}`` with ``{text}`` filled in, right-stripped; the
    completion is that stripped whitespace + the label + what follows ``{label}``.
    """
    before, _, after = template.partition("{label}")
    pieces = before.split("{text}")
    last = pieces[-1]
    stripped = last.rstrip()
    pieces[-1] = stripped
    return pieces, last[len(stripped) :], after


def _format_columns(template: str, text: Column, label: Column) -> tuple[Column, Column]:
    from pyspark.sql import functions as F

    pieces, whitespace, after = split_template(template)
    parts: list[Column] = [F.lit(pieces[0])]
    for piece in pieces[1:]:
        parts += [text, F.lit(piece)]
    # Texts are trimmed and non-empty here, so stripping only the template's tail is exact.
    return F.concat(*parts), F.concat(F.lit(whitespace), label, F.lit(after))


def content_key(text: Column) -> Column:
    """sha256 of the trimmed, lower-cased, space-collapsed text: the dedupe key of a text row.

    Feedback merging uses the same key, so a corrected text already in the source is recognised
    whatever split it landed in.
    """
    from pyspark.sql import functions as F

    trimmed = F.regexp_replace(text, _TRIM_RE, "")
    return F.sha2(F.lower(F.regexp_replace(trimmed, _SPACES_RE, " ")), 256)


def _bucket(seed: int, example_id: Column) -> Column:
    """A uniform number in [0, 1) from sha256(seed:example_id): stable across runs and engines."""
    from pyspark.sql import functions as F

    digest = F.sha2(F.concat(F.lit(f"{seed}:"), example_id), 256)
    return F.conv(F.substring(digest, 1, 13), 16, 10).cast("double") / float(16**13)


def _base_split(bucket: Column) -> Column:
    from pyspark.sql import functions as F

    return (
        F.when(bucket < TRAIN_FRACTION, "train")
        .when(bucket < TRAIN_FRACTION + VALIDATION_FRACTION, "validation")
        .otherwise("test")
    )


def _timestamp_key(df: DataFrame, column: str) -> Column:
    """An orderable key for ``column``: native for times and numbers, parsed for ISO-8601 strings."""
    from pyspark.sql import types as T

    if isinstance(df.schema[column].dataType, T.StringType):
        return _col(column).try_cast("timestamp")
    return _col(column)


def _decoding_problem(df: DataFrame, text: Column, label: Column) -> tuple[Column, Column]:
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


def _dedupe_partitions(df: DataFrame) -> int:
    """Partitions for the dedupe shuffle: about 32 MB of input each, a multiple of the cores.

    Not too few: a cached partition of millions of rows overflows the 1 GB heap of a default
    local driver (the job failed so at 5M rows in 3 partitions). A multiple of the cores: token
    counting after the shuffle is the costly part, and 3 tasks on 2 cores would leave one core
    idle for a third of it. Spark's size estimate is the files' size for a file source (Parquet
    compressed, so about a quarter of the strings in memory); frames without one (built in the
    driver, RDD-backed) get one partition per input split.
    """
    cores = max(1, df.sparkSession.sparkContext.defaultParallelism)
    splits = max(1, df.rdd.getNumPartitions())
    try:
        size: int | None = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    except Exception:  # no estimate (a Spark Connect session, an exotic source)
        size = None
    wanted = splits
    if size is not None and size < 2**50:  # an unknown size is reported as a huge placeholder
        wanted = min(splits * MAX_PARTITIONS_PER_SPLIT, max(splits, -(-size // BYTES_PER_PARTITION)))
    return -(-max(wanted, cores) // cores) * cores


def prepare(
    df: DataFrame,
    params: PipelineParams,
    tokenizer_path: str,
    *,
    source: str | None = None,
    check_decoding: bool = False,
) -> PreparedData:
    """Apply the recipe to ``df``; the returned frames are backed by a persisted annotated frame.

    ``source`` names the source in error messages. ``check_decoding`` (for CSV and JSON files)
    fails on rows that were not decoded cleanly: bytes that are not UTF-8, JSON lines that do
    not parse; pass ``df`` straight from the reader so the offending files can be named.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    check_columns(df, params, source)
    text_col = _find_column(df.columns, params.text_column)
    label_col = _find_column(df.columns, params.label_column)
    quality_name = params.quality_column.strip()
    quality_col = _find_column(df.columns, quality_name) if quality_name else None
    id_col = _find_column(df.columns, params.id_column.strip()) if params.id_column.strip() else None
    ts_name = params.timestamp_column.strip()
    ts_col = _find_column(df.columns, ts_name) if ts_name else None
    if quality_name and quality_col is None:
        log.warning(
            "quality column %r is not in the source (columns: %s): min_quality_score is skipped",
            quality_name,
            ", ".join(df.columns),
        )

    src_text = _col(text_col).cast("string")
    src_label = _col(label_col).cast("string")
    null_string = F.lit(None).cast("string")
    if id_col is None:
        src_id = null_string
    elif df.schema[id_col].dataType.typeName() == "binary":
        src_id = F.lower(F.hex(_col(id_col)))  # a binary digest reads as its usual hex form
    else:
        src_id = _col(id_col).cast("string")
    columns = [
        src_text.alias("_src_text"),
        src_label.alias("_src_label"),
        (_col(quality_col).cast("string") if quality_col else null_string).alias("_src_quality"),
        (_col(quality_col).try_cast("double") if quality_col else F.lit(None).cast("double")).alias(
            "_quality"
        ),
        src_id.alias("_src_id"),
    ]
    if ts_col:
        columns += [_timestamp_key(df, ts_col).alias("_ts"), _col(ts_col).cast("string").alias("_src_ts")]
    if check_decoding:
        kind, example = _decoding_problem(df, src_text, src_label)
        # input_file_name() only knows the file in the scan's own stage: this select is that stage.
        columns += [
            kind.alias("_bad_kind"),
            example.alias("_bad_example"),
            F.when(kind.isNotNull(), F.input_file_name()).alias("_bad_file"),
        ]
    source_rows = df.select(*columns)

    text = F.regexp_replace("_src_text", _TRIM_RE, "")
    label = F.regexp_replace("_src_label", _TRIM_RE, "")
    example_id = content_key(F.col("_src_text"))
    if id_col:
        given = F.regexp_replace("_src_id", _TRIM_RE, "")
        # A blank or missing id falls back to the content hash, so such rows still dedupe by text.
        example_id = F.coalesce(F.when(given != "", given), example_id)
    # Only what the dedupe needs crosses the shuffle: the trimmed text, the prompt and the completion
    # are derived after it, which keeps the shuffled and cached rows about one text wide, not four.
    staged = source_rows.select(
        "*",
        label.alias("label"),
        example_id.alias("example_id"),
        F.coalesce(F.length(text), F.lit(0)).alias("_chars"),
        # Orders duplicates: the kept copy is the one with the smallest hash of its source values,
        # whatever order or partitioning Spark reads them in (equal hashes: identical copies).
        F.sha2(F.to_json(F.struct("_src_text", "_src_label", "_src_quality")), 256).alias("_row_hash"),
    )
    if ts_col:
        staged = staged.withColumn("_ts_unparsed", F.col("_src_ts").isNotNull() & F.col("_ts").isNull())

    min_q, min_c, max_c = params.min_quality_score, params.min_chars, params.max_chars
    early_reason = F.lit(None).cast("string")
    early_detail = F.lit(None).cast("string")
    if quality_col:
        low_quality = F.col("_quality").isNull() | (F.col("_quality") < F.lit(min_q))
        early_reason = F.when(low_quality, "min_quality_score")
        early_detail = F.when(
            F.col("_quality").isNull(),
            F.concat(
                F.lit(f"{quality_col} is missing or not a number: "),
                F.coalesce("_src_quality", F.lit("null")),
            ),
        ).when(low_quality, F.concat(F.lit(f"{quality_col} "), "_src_quality", F.lit(f" < {min_q:g}")))
    blank_label = F.col("label").isNull() | (F.col("label") == "")
    bad_length = (F.col("_chars") < min_c) | (F.col("_chars") > max_c)
    early_reason = F.coalesce(early_reason, F.when(blank_label, "null_label"), F.when(bad_length, "length"))
    early_detail = F.coalesce(
        early_detail,
        F.when(F.col("_src_label").isNull(), "label is null").when(blank_label, "label is blank"),
        F.when(
            bad_length,
            F.concat(
                F.lit("text has "), F.col("_chars").cast("string"), F.lit(f" chars, allowed {min_c}-{max_c}")
            ),
        ),
    )
    staged = staged.select("*", early_reason.alias("_reason"), early_detail.alias("_detail"))

    # Dedupe among the rows that survived the earlier steps only. The explicit repartition sizes
    # the shuffle by the input, not by spark.sql.shuffle.partitions: the result is cached, and
    # adaptive execution does not coalesce the partitions of a cached plan, so 200 mostly empty
    # partitions would be paid for by every count and write that follows.
    staged = staged.repartition(_dedupe_partitions(df), "example_id")
    order: list[Any] = ["_row_hash"]
    if ts_col:
        # The most recent copy wins; copies without a usable timestamp count as the oldest.
        order = [F.col("_ts").desc_nulls_last(), *order]
    by_content = Window.partitionBy("example_id", F.col("_reason").isNull()).orderBy(*order)
    kept_extra = [F.first("_src_ts").over(by_content).alias("_kept_ts")] if ts_col else []
    staged = staged.select(
        "*",
        F.row_number().over(by_content).alias("_copy"),
        F.first("label").over(by_content).alias("_kept_label"),
        *kept_extra,
    )
    duplicate = F.col("_reason").isNull() & (F.col("_copy") > 1)
    dup_detail = F.concat(
        F.lit("duplicate of example_id "),
        F.substring("example_id", 1, 16),
        F.when(
            F.col("_kept_label") != F.col("label"),
            F.concat(F.lit(" with a different label (kept "), "_kept_label", F.lit(")")),
        ).otherwise(F.lit("")),
        *(
            [F.concat(F.lit(f"; kept the copy with {ts_col} "), F.coalesce("_kept_ts", F.lit("null")))]
            if ts_col
            else []
        ),
    )
    staged = staged.select(
        "*",
        F.coalesce("_reason", F.when(duplicate, "dedupe")).alias("_reason2"),
        F.coalesce("_detail", F.when(duplicate, dup_detail)).alias("_detail2"),
    )

    # Tokens are counted after the dedupe, on its evenly sized partitions, for the surviving rows
    # only: rejected rows and duplicates get null and cost the tokenizer nothing.
    survivor = F.col("_reason2").isNull()
    staged = staged.select("*", F.when(survivor, text).alias("text"))
    prompt, completion = _format_columns(params.prompt_template, F.col("text"), F.col("label"))
    n_tokens = token_counter(tokenizer_path, params.trust_remote_code)(
        F.when(survivor, F.concat(prompt, completion))
    )
    staged = staged.select("*", n_tokens.alias("n_tokens"))

    too_long = survivor & (F.col("n_tokens") > params.max_length)
    staged = staged.select(
        "*",
        F.coalesce("_reason2", F.when(too_long, "max_length")).alias("reject_reason"),
        F.coalesce(
            "_detail2",
            F.when(
                too_long,
                F.concat(
                    F.col("n_tokens").cast("string"), F.lit(f" tokens > max_length {params.max_length}")
                ),
            ),
        ).alias("reject_detail"),
    )
    extra = ["_bad_kind", "_bad_example", "_bad_file"] if check_decoding else []
    if ts_col:
        extra.append("_ts_unparsed")
    rejected_row = F.col("reject_reason").isNotNull()
    annotated = staged.select(
        "example_id",
        "text",
        "label",
        "n_tokens",
        # The source values are kept for the quarantine only: kept rows have `text` instead.
        F.when(rejected_row, F.col("_src_text")).alias("_src_text"),
        "_src_label",
        "_src_quality",
        "_chars",
        "reject_reason",
        "reject_detail",
        _base_split(_bucket(params.split_seed, F.col("example_id"))).alias("_base_split"),
        _bucket(params.split_seed, F.col("example_id")).alias("_bucket"),
        *extra,
    ).persist()

    kept = annotated.filter(F.col("reject_reason").isNull())
    # One aggregation gives every step's counts, the per-label split counts and the input checks.
    checks = []
    if check_decoding:
        checks += [
            F.collect_set("_bad_kind").alias("bad_kinds"),
            F.count("_bad_kind").alias("bad_rows"),
            F.collect_set("_bad_file").alias("bad_files"),
            F.min("_bad_example").alias("bad_example"),
        ]
    if ts_col:
        checks.append(
            F.count(F.when(F.col("_ts_unparsed"), 1)).alias("bad_ts"),
        )
    stats = (
        annotated.groupBy(
            "reject_reason",
            F.when(F.col("reject_reason").isNull(), F.col("label")).alias("label"),
            F.when(F.col("reject_reason").isNull(), F.col("_base_split")).alias("split"),
        )
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.min("_chars").alias("min_chars"),
            F.max("_chars").alias("max_chars"),
            *checks,
        )
        .collect()
    )
    if check_decoding and any(row["bad_rows"] for row in stats):
        annotated.unpersist()
        raise _decoding_error(source, stats)
    if ts_col and (bad_ts := sum(row["bad_ts"] for row in stats)):
        log.warning(
            "%d row(s) have a %s value that is not a timestamp (expected ISO-8601 such as 2024-05-01 or "
            "2024-05-01T12:30:00): among duplicates they count as the oldest copy",
            bad_ts,
            ts_col,
        )
    rejected = {step: 0 for step in REJECTING_STEPS}
    per_label: dict[str, dict[str, int]] = {}
    for row in stats:
        if row["reject_reason"] is not None:
            rejected[row["reject_reason"]] += row["count"]
        else:
            per_label.setdefault(row["label"], dict.fromkeys(SPLITS, 0))[row["split"]] += row["count"]
    total = sum(r["count"] for r in stats)
    steps = _step_counts(total, rejected, quality_used=quality_col is not None)
    findings = {}
    length_rows = [row for row in stats if row["reject_reason"] == "length"]
    if length_rows:
        shortest = min(row["min_chars"] for row in length_rows)
        longest = max(row["max_chars"] for row in length_rows)
        span = f"{shortest:,}" if shortest == longest else f"{shortest:,} to {longest:,}"
        findings["length"] = f"the rejected texts have {span} chars"

    to_test, to_validation = _split_fixups(kept, per_label)
    split = F.col("_base_split")
    if to_test or to_validation:
        split = (
            F.when(F.col("example_id").isin(to_test), "test")
            .when(F.col("example_id").isin(to_validation), "validation")
            .otherwise(split)
        )
    prompt, completion = _format_columns(params.prompt_template, F.col("text"), F.col("label"))
    rows = kept.select(
        "example_id",
        "text",
        "label",
        prompt.alias("prompt"),
        completion.alias("completion"),
        "n_tokens",
        split.alias("split"),
    )
    quarantine = annotated.filter(F.col("reject_reason").isNotNull()).select(
        "example_id",
        F.col("_src_text").alias("text"),
        F.col("_src_label").alias("label"),
        F.col("_src_quality").alias("quality"),
        "reject_reason",
        "reject_detail",
    )
    return PreparedData(
        rows=rows,
        quarantine=quarantine,
        steps=steps,
        quality_used=quality_col is not None,
        findings=findings,
        _persisted=[annotated],
    )


def _decoding_error(source: str | None, stats: list[Any]) -> UnreadableSourceError:
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


def _step_counts(total: int, rejected: dict[str, int], quality_used: bool) -> list[StepCount]:
    steps = []
    remaining = total
    for step in STEPS:
        dropped = rejected.get(step, 0)
        steps.append(
            StepCount(
                step, remaining, remaining - dropped, skipped=step == "min_quality_score" and not quality_used
            )
        )
        remaining -= dropped
    return steps


def _split_fixups(kept: DataFrame, per_label: dict[str, dict[str, int]]) -> tuple[list[str], list[str]]:
    """Rows moved out of train so that every label with >= 10 rows has a validation and a test row.

    Hashing alone leaves a 10-row label without a test row about a third of the time. For such a
    label the train row(s) closest to the validation boundary (highest bucket) move: the highest
    to test if test is empty, the next to validation if validation is empty. This is the one
    exception to split stability: once new rows give the label a test (validation) row of its
    own, the moved row goes back to train. It touches at most two rows per small label.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    needy = {
        label: counts
        for label, counts in per_label.items()
        if sum(counts.values()) >= MIN_ROWS_FOR_FULL_SPLIT
        and (counts["validation"] == 0 or counts["test"] == 0)
    }
    if not needy:
        return [], []
    closest = Window.partitionBy("label").orderBy(F.col("_bucket").desc(), F.col("example_id"))
    candidates = (
        kept.filter(F.col("label").isin(list(needy)) & (F.col("_base_split") == "train"))
        .select("label", "example_id", F.row_number().over(closest).alias("rank"))
        .filter(F.col("rank") <= 2)
        .collect()
    )
    by_label: dict[str, list[str]] = {}
    for row in sorted(candidates, key=lambda r: (r["label"], r["rank"])):
        by_label.setdefault(row["label"], []).append(row["example_id"])
    to_test: list[str] = []
    to_validation: list[str] = []
    for label, counts in needy.items():
        ids = by_label.get(label, [])
        if counts["test"] == 0 and ids:
            to_test.append(ids.pop(0))
        if counts["validation"] == 0 and ids:
            to_validation.append(ids.pop(0))
    log.info(
        "split: moved %d row(s) to test and %d to validation for small labels",
        len(to_test),
        len(to_validation),
    )
    return to_test, to_validation


# --------------------------------------------------------------------------- publishing


def _publish(spark: SparkSession, write: Callable[[str], None], lake_uri: str, final_uri: str) -> bool:
    """Write through ``write`` into a temp folder, then rename it to ``final_uri``.

    Returns False (and writes nothing) when ``final_uri`` is already complete: its ``_SUCCESS``
    exists. A folder without ``_SUCCESS`` is a leftover of a crashed writer and is replaced.
    """
    jvm_path = spark._jvm.org.apache.hadoop.fs.Path
    fs, final = hadoop_fs(spark, final_uri)
    if fs.exists(jvm_path(final, "_SUCCESS")):
        return False
    tmp_uri = f"{lake_uri}/_tmp/{uuid.uuid4().hex}"
    write(tmp_uri)
    tmp_fs, tmp = hadoop_fs(spark, tmp_uri)
    marker = jvm_path(tmp, "_SUCCESS")
    if not tmp_fs.exists(marker):  # the cluster may turn Spark's own marker off
        tmp_fs.create(marker).close()
    if fs.exists(final):
        fs.delete(final, True)
    fs.mkdirs(final.getParent())
    # Hadoop's rename moves INTO an existing folder, hence the delete above.
    if not fs.rename(tmp, final):
        if fs.exists(jvm_path(final, "_SUCCESS")):  # a concurrent run published the same data
            tmp_fs.delete(tmp, True)
            return False
        raise OSError(f"Could not rename {tmp_uri} to {final_uri}; check permissions on the lake {lake_uri}")
    return True


# A step that drops at least this share of the rows reaching it is called out in the summary.
WARN_DROP_SHARE = 0.5


def _step_hint(step: str, params: PipelineParams, finding: str | None = None) -> str:
    """What usually makes ``step`` reject most rows (with what it saw, if known) and what to check."""
    id_column = params.id_column.strip()
    key = f"id_column {id_column!r}" if id_column else "normalized text (a content hash)"
    hints = {
        "min_quality_score": (
            f"quality_column {params.quality_column!r} is below min_quality_score "
            f"({params.min_quality_score:g}) or not a number: check quality_column and min_quality_score"
        ),
        "null_label": f"label_column {params.label_column!r} is null or blank: check label_column",
        "length": (
            f"text_column {params.text_column!r} is shorter than min_chars ({params.min_chars}) or longer "
            f"than max_chars ({params.max_chars}) after trimming: check text_column and the thresholds"
        ),
        "dedupe": (
            f"rows repeat another row's {key}: check that the source was not appended to itself"
            + (f" and that {id_column!r} is unique per example" if id_column else "")
        ),
        "max_length": (
            f"prompt + label exceed max_length ({params.max_length}) tokens: raise max_length or shorten "
            "prompt_template or the texts (max_chars)"
        ),
    }
    hint = hints.get(step, "")
    if finding and ": " in hint:
        cause, fix = hint.split(": ", 1)
        hint = f"{cause} ({finding}): {fix}"
    return hint


def step_warnings(steps: list[StepCount], params: PipelineParams) -> list[str]:
    """A sentence for every step that rejected at least half of the rows reaching it."""
    warnings = []
    for s in steps:
        if s.step in REJECTING_STEPS and s.rows_in and s.dropped / s.rows_in >= WARN_DROP_SHARE:
            warnings.append(
                f"{s.step} dropped {s.dropped:,} of {s.rows_in:,} rows ({s.dropped / s.rows_in:.0%}): "
                f"{_step_hint(s.step, params)}"
            )
    return warnings


def summarize(steps: list[StepCount], split_label_counts: list[tuple[str, str, int]]) -> dict[str, Any]:
    split_counts = dict.fromkeys(SPLITS, 0)
    rows_per_label: dict[str, int] = {}
    for label, split, count in split_label_counts:
        split_counts[split] = split_counts.get(split, 0) + count
        rows_per_label[label] = rows_per_label.get(label, 0) + count
    return {
        "rows_in": steps[0].rows_in,
        "rows_out": steps[-1].rows_out,
        "steps": [s.to_dict() for s in steps],
        "split_counts": split_counts,
        "labels": sorted(rows_per_label),
        "rows_per_label": dict(sorted(rows_per_label.items())),
    }


def format_steps(steps: list[StepCount]) -> list[str]:
    """One line per step for the task log."""
    lines = [f"{'step':<18} {'rows_in':>12} {'rows_out':>12} {'dropped':>10}"]
    for s in steps:
        note = "  (skipped)" if s.skipped else ""
        lines.append(f"{s.step:<18} {s.rows_in:>12,} {s.rows_out:>12,} {s.dropped:>10,}{note}")
    return lines


def resolve_source_uri(params: PipelineParams) -> str:
    """The source to read: ``params.source_uri`` (a local relative path made absolute, so the
    submitting process and the Spark driver agree), or the generated demo data when it is empty."""
    from sparktune.config import settings

    uri = params.source_uri.strip()
    if not uri:
        demo = settings().demo_source_path
        if not demo.exists():
            raise SourceNotFoundError(
                f"source_uri is empty and the demo data {demo} does not exist. Fix: generate it with "
                f"`python -m sparktune.demo_data --out {demo}` (make demo does) or set source_uri."
            )
        return str(demo)
    if params.source_format == "table" or "://" in uri:
        return uri
    # "db.tickets" is a table, "tickets.csv" and "exports/tickets" are files.
    if "/" in uri or "\\" in uri or not looks_like_table(uri) or Path(uri).expanduser().exists():
        return str(Path(uri).expanduser().resolve())
    return uri


def _no_rows_left(
    source_uri: str, prepared: PreparedData, params: PipelineParams, quarantine_uri: str
) -> NoRowsLeftError:
    steps = prepared.steps
    worst = max((s for s in steps if s.step in REJECTING_STEPS), key=lambda s: s.dropped)
    return NoRowsLeftError(
        f"No rows left after preparing {source_uri!r}: all {steps[0].rows_in:,} row(s) were rejected; "
        f"{worst.step} rejected {worst.dropped:,} of the {worst.rows_in:,} row(s) reaching it, because "
        f"{_step_hint(worst.step, params, prepared.findings.get(worst.step))}.\n"
        + "\n".join(format_steps(steps))
        + f"\nEvery rejected row, with its reason, is in {quarantine_uri}. Fix: check the column mapping "
        "(text_column, label_column, quality_column) and the thresholds (min_quality_score, min_chars, "
        "max_chars, max_length)."
    )


def run_prepare(
    spark: SparkSession,
    params: PipelineParams,
    tokenizer_path: str,
    lake_uri: str,
    *,
    after_publish: Callable[[DataFrame, dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Load, prepare, fingerprint and publish; a rerun on the same data rewrites nothing.

    Writes ``{lake_uri}/prepared/{fingerprint}/split=*/part-*.parquet`` and
    ``{lake_uri}/quarantine/{fingerprint}/``; returns a small JSON-serializable summary. Bad input
    (missing source or column, empty source, undecodable bytes, no row surviving) raises a
    :class:`DataPreparationError` subclass and publishes no prepared data.

    ``after_publish(source_df, summary)`` runs once the data is published, on the source as this
    call read it (the job's quality gate); what it returns joins the summary.
    """
    from sparktune.fingerprint import data_fingerprint, tokenizer_fingerprint

    lake_uri = lake_uri.rstrip("/")
    source_uri = resolve_source_uri(params)
    df, fmt = read_source(spark, source_uri, params.source_format)
    prepared = prepare(df, params, tokenizer_path, source=source_uri, check_decoding=fmt in ("csv", "json"))
    try:
        if prepared.steps[0].rows_in == 0:
            raise _empty_source(
                source_uri,
                f"it has 0 rows (columns found: {', '.join(repr(c) for c in df.columns)})",
            )
        fingerprint = data_fingerprint(prepared.rows, params, tokenizer_fingerprint(tokenizer_path))
        counts = [
            (r["label"], r["split"], r["count"])
            for r in prepared.rows.groupBy("label", "split").count().collect()
        ]
        summary = summarize(prepared.steps, counts)
        prepared_uri = f"{lake_uri}/prepared/{fingerprint}"
        quarantine_uri = f"{lake_uri}/quarantine/{fingerprint}"
        _publish(
            spark,
            lambda tmp: (
                prepared.quarantine.orderBy("reject_reason", "example_id", "text")
                .write.mode("error")
                .parquet(tmp)
            ),
            lake_uri,
            quarantine_uri,
        )
        if summary["rows_out"] == 0:
            raise _no_rows_left(source_uri, prepared, params, quarantine_uri)
        wrote_rows = _publish(
            spark,
            lambda tmp: (
                prepared.rows.orderBy("split", "example_id")
                .write.mode("error")
                .partitionBy("split")
                .parquet(tmp)
            ),
            lake_uri,
            prepared_uri,
        )
    finally:
        prepared.unpersist()
    summary = {
        "data_fingerprint": fingerprint,
        "prepared_uri": prepared_uri,
        "quarantine_uri": quarantine_uri,
        **summary,
        "warnings": step_warnings(prepared.steps, params),
        # The prepared dataset decides: the quarantine is a by-product of the same fingerprint.
        "reused": not wrote_rows,
        "tokenizer": tokenizer_path,
        "source_uri": source_uri,
        "source_format": fmt,
    }
    log.info("prepare_data %s -> %s (reused=%s)", source_uri, prepared_uri, summary["reused"])
    for line in format_steps(prepared.steps):
        log.info("%s", line)
    log.info("split counts: %s", json.dumps(summary["split_counts"]))
    for warning in summary["warnings"]:
        log.warning("%s", warning)
    if after_publish is not None:
        summary.update(after_publish(df, summary))
    return summary
