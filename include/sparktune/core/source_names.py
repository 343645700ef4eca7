"""What a source's name says about it: a Spark catalog table, or files of a format the recipe reads.

``source_uri`` may name a table (``db.tickets``) or files (``tickets.csv.gz``, ``exports/``); the
data preparation (:mod:`sparktune.data.prepare`) reads it by these rules and the allowed-roots check
(:mod:`sparktune.core.paths`) checks it by the same ones. Pure functions of the name: no file system,
no Spark.
"""

from __future__ import annotations

FILE_FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json", ".json": "json"}
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".zst", ".zstd", ".lz4", ".snappy", ".deflate", ".xz")
# Formats people hand over that the recipe does not read, with what to do about each.
UNSUPPORTED_EXTENSIONS = {
    ".xlsx": "Save the workbook as 'CSV UTF-8' (Excel: File > Save As) and point source_uri at the .csv.",
    ".xls": "Save the workbook as 'CSV UTF-8' (Excel: File > Save As) and point source_uri at the .csv.",
    ".ods": "Save the spreadsheet as CSV (UTF-8) and point source_uri at the .csv.",
    ".txt": "A .txt export with a header row and commas is CSV: set source_format to csv.",
    ".tsv": "Convert the tab-separated file to CSV, or to Parquet.",
    ".xml": "Convert the XML to JSON Lines or Parquet.",
    ".avro": "Convert it to Parquet, or register it as a catalog table and use the table name.",
    ".orc": "Convert it to Parquet, or register it as a catalog table and use the table name.",
    ".zip": "Unzip it first (Spark reads .gz/.bz2 files, not .zip archives).",
    ".pkl": "Write the DataFrame as Parquet (pandas: df.to_parquet).",
    ".pickle": "Write the DataFrame as Parquet (pandas: df.to_parquet).",
    ".feather": "Write it as Parquet (pyarrow.parquet.write_table).",
    ".arrow": "Write it as Parquet (pyarrow.parquet.write_table).",
}


def _strip_compression(name: str) -> str:
    lowered = name.lower().rstrip("/")
    for suffix in COMPRESSION_SUFFIXES:
        if lowered.endswith(suffix):
            return lowered[: -len(suffix)]
    return lowered


def format_from_name(name: str) -> str | None:
    """The reader a file name's extension asks for (``parquet``, ``csv``, ``json``), a compression
    suffix (``.gz``, ``.zst``, ...) looked through; None when the extension names no format read."""
    lowered = _strip_compression(name)
    for extension, fmt in FILE_FORMATS.items():
        if lowered.endswith(extension):
            return fmt
    return None


def unsupported_extension(name: str) -> str | None:
    """The extension of :data:`UNSUPPORTED_EXTENSIONS` the name ends with (compression looked
    through), or None."""
    lowered = _strip_compression(name)
    return next((ext for ext in UNSUPPORTED_EXTENSIONS if lowered.endswith(ext)), None)


def looks_like_table(source_uri: str) -> bool:
    """True when ``source_uri`` reads as a catalog table name (``db.tickets``) rather than files:
    no path separator, no glob, and no file extension, read or unsupported ("report.xlsx" is a file
    someone meant to read, not a table in database "report")."""
    return (
        "/" not in source_uri
        and "\\" not in source_uri
        and not any(ch in source_uri for ch in "*?[{")
        and format_from_name(source_uri) is None
        and unsupported_extension(source_uri) is None
    )
