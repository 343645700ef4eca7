"""What a data version folder records: a training source the feedback loop wrote
(``sparktune.serve.feedback.merge_feedback``), and what corrections changed in it.

A version is a folder of Parquet files plus two small files Spark skips (their names start with
``_``): :data:`VERSION_MARKER`, written last (a folder without it is a crashed write and is
rebuilt), and :data:`OVERRIDES_FILE`, one CSV line per source text whose label a correction
replaced. Preparation and the quality gate read the marker to report what feedback changed.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

VERSION_MARKER = "_SPARKTUNE_SOURCE.json"
OVERRIDES_FILE = "_label_overrides.csv"


def write_small_file(spark: SparkSession, uri: str, text: str) -> None:
    """A small file written through Hadoop's file system (any URI the Spark job can write)."""
    from sparktune.data.prepare_source import hadoop_fs

    fs, path = hadoop_fs(spark, uri)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def read_version(spark: SparkSession, source_uri: str) -> dict[str, Any] | None:
    """The marker of the data version at ``source_uri`` (``base_source_uri``, ``corrections``,
    ``added_rows``, ``labels_changed``, and ``overrides_uri``), or None for any other source."""
    from sparktune.data.prepare_source import hadoop_fs

    if any(c in source_uri for c in "*?[") or "/" not in source_uri:  # a glob or a catalog table
        return None
    marker = f"{source_uri.rstrip('/')}/{VERSION_MARKER}"
    try:
        fs, path = hadoop_fs(spark, marker)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            data = bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()
        record = json.loads(data.decode())
    except Exception as exc:  # noqa: BLE001 - an unreadable marker only costs the report its feedback line
        log.warning("Could not read %s (%s): what feedback changed is left out of the report", marker, exc)
        return None
    if record.get("overrides"):
        record["overrides_uri"] = f"{source_uri.rstrip('/')}/{record['overrides']}"
    return record


def feedback_line(record: dict[str, Any]) -> str:
    """One sentence on what the corrections changed in a data version."""
    return (
        f"feedback: corrections changed the label of {record.get('labels_changed', 0):,} source row(s) "
        f"and added {record.get('added_rows', 0):,} text(s) ({record.get('corrections', 0):,} corrected "
        f"texts; base source {record.get('base_source_uri')}; relabelled rows listed in "
        f"{record.get('overrides_uri', '(none)')})"
    )
