"""What every spark-submit job of sparktune shares: the summary file and the exit code for bad input.

spark-submit only passes on an exit code, so each job writes a small JSON summary where the
Airflow operator looks for it: the result on success, ``{"error": ..., "kind": ...}`` on input the
job rejects (exit code 2: retrying will not help).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

EXIT_BAD_INPUT = 2


def _local_path(path_or_uri: str) -> Path:
    parsed = urlparse(path_or_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # a one-letter scheme is a Windows drive
        raise ValueError(f"--summary-path must be a local path or file:// URI, got {path_or_uri!r}")
    return Path(path_or_uri)


def write_summary(summary: dict, path_or_uri: str) -> Path:
    """Write the summary JSON atomically: a reader never sees half a file."""
    target = _local_path(path_or_uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(summary, handle, indent=2, sort_keys=True)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def bad_input(log: logging.Logger, exc: Exception, summary_path: str | None) -> int:
    """Record a deterministic input error where the submitter looks for the summary, then exit 2.

    spark-submit only passes on an exit code; the record lets the Airflow operator tell bad
    input (fail now) from a lost executor (retry) and show the user the actual message.
    """
    log.error("%s", exc)
    if summary_path:
        write_summary({"error": str(exc), "kind": type(exc).__name__}, summary_path)
    return EXIT_BAD_INPUT
