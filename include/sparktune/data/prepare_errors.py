"""The errors bad input raises while preparing data: one :class:`DataPreparationError` subclass per
kind of problem (a missing, empty, unsupported or unparseable source, a missing or unusable column,
bytes that are not UTF-8, no row surviving the recipe), each message naming the path or column,
what was found instead and the fix.
"""

from __future__ import annotations


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
