"""``prepare_data`` without Spark when the lake already holds its output for the very same inputs.

A run that changes only training params (another learning rate on the same data), a retried run
or a rerun on untouched files would prepare the same rows again: the same source files, the same
preparation params, tokenizer and code give the same prepared data. After a job publishes, its
summary is recorded under a key of those inputs (:func:`inputs_key`); a later run with the same
key, whose prepared and quarantine folders are still complete, takes that summary and starts no
Spark job (:func:`find_prepared`).

The files are known by their listing (``sparktune.data.fingerprint.source_signature``: each file's
path, size and modification time or ETag), so a source rewritten in place, even with the same
bytes, gets a new key and is prepared again. A catalog table, or a store whose listing gives no
modification time, has no signature: its runs always submit the job.

The record keeps the job's quality report too, with a key of the rules it checked
(``sparktune.data.quality_rules.rules_key``): the same data checked under the same rules gets the
same verdict, so a later run under the same rules takes the report; under others it validates again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from sparktune.core.params import PipelineParams

log = logging.getLogger("sparktune.data.prepare_reuse")

INDEX_FOLDER = "prepare_index"  # under the lake: one small JSON summary per inputs key
QUALITY_RULES_KEY = "quality_rules_key"  # the key of the rules the recorded report checked


def inputs_key(source_signature: str | None, params: PipelineParams, tokenizer_path: str) -> str | None:
    """A 24-hex-digit key of what decides the prepared rows, or None when the source has no
    signature (``sparktune.data.fingerprint.source_signature``: a catalog table, a store without
    modification times)."""
    from sparktune.core.provenance import code_fingerprint
    from sparktune.data.fingerprint import RECIPE_VERSION, preparation_params, tokenizer_fingerprint

    if source_signature is None:
        return None
    payload = {
        "recipe": RECIPE_VERSION,
        "source": source_signature,
        "params": preparation_params(params),
        "tokenizer": tokenizer_fingerprint(tokenizer_path),
        "code": code_fingerprint(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _index_path(lake_uri: str, key: str) -> str:
    return f"{lake_uri.rstrip('/')}/{INDEX_FOLDER}/{key}.json"


def record_prepared(lake_uri: str, key: str, summary: dict[str, Any]) -> None:
    """Record a published job's summary under ``key``. A lake the worker cannot write to only costs
    the next run its shortcut, so a failure is logged, not raised."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(_index_path(lake_uri, key))
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(path, "w") as handle:
            handle.write(json.dumps(summary, sort_keys=True, default=str))
    except (OSError, ValueError, ImportError) as exc:
        log.warning("Could not record prepared data under %s (%s): the next run prepares again.", key, exc)


def find_prepared(lake_uri: str, key: str) -> dict[str, Any] | None:
    """The summary recorded under ``key`` when its prepared and quarantine folders are still
    complete (their ``_SUCCESS`` marker), else None."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(_index_path(lake_uri, key))
        if not fs.exists(path):
            return None
        with fs.open(path, "r") as handle:
            summary = json.loads(handle.read())
        for folder in (summary["prepared_uri"], summary["quarantine_uri"]):
            folder_fs, folder_path = url_to_fs(folder)
            if not folder_fs.exists(f"{folder_path.rstrip('/')}/_SUCCESS"):
                log.info("%s was recorded for these inputs but is gone or incomplete.", folder)
                return None
    except (OSError, ValueError, KeyError, ImportError):
        return None  # an unreadable record is no record: the job runs and records again
    return summary


def _without_quality(summary: dict[str, Any]) -> dict[str, Any]:
    dropped = ("quality", "quality_error", QUALITY_RULES_KEY)
    return {k: v for k, v in summary.items() if k not in dropped}


def recorded_summary(summary: dict[str, Any], params: PipelineParams) -> dict[str, Any]:
    """What to record for a published job's ``summary``: the summary, and its quality report with
    the key of the rules ``params`` give (an error running the gate is not recorded)."""
    recorded = _without_quality(summary)
    if summary.get("quality"):
        from sparktune.data.quality_rules import rules_key

        recorded["quality"] = summary["quality"]
        recorded[QUALITY_RULES_KEY] = rules_key(params)
    return recorded


def reused_summary(
    found: dict[str, Any], params: PipelineParams
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A record (:func:`find_prepared`) split into the summary without its quality report, and the
    report when it checked the rules ``params`` give (else None: the gate must run again)."""
    report = found.get("quality")
    if report:
        from sparktune.data.quality_rules import rules_key

        if found.get(QUALITY_RULES_KEY) != rules_key(params):
            report = None
    return _without_quality(found), report or None
