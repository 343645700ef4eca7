"""Content fingerprints: what names a data version in the lake, the dataset cache and MLflow.

A fingerprint depends on WHAT the data is, never on how Spark happens to hold it: the same rows
in any order or partitioning give the same value (unlike the plan's ``semanticHash``, which
changes with the plan and stays the same when the files under it change).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparktune.core.params import FINGERPRINT_PARAMS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from sparktune.core.params import PipelineParams

# Bump when the recipe changes meaning without any param changing, so old versions are not reused.
RECIPE_VERSION = 1
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    # transformers 5 saves a chat template beside the tokenizer: it shapes the prompts.
    "chat_template.jinja",
    "chat_template.json",
)
_HEX_DIGITS = 15  # 60 bits per slice: a sum over 10^12 rows still fits decimal(38, 0)


def preparation_params(params: PipelineParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in FINGERPRINT_PARAMS}


def rows_digest(rows: DataFrame) -> dict[str, Any]:
    """An order-independent digest of a DataFrame: row count and two sums of per-row sha256 slices.

    Addition is commutative, so the digest is the same for any order or partitioning of the same
    rows; changing any value of any row changes a sum (two 60-bit slices: collisions are out of reach).
    """
    from pyspark.sql import functions as F

    row = F.to_json(F.struct(*[F.col(f"`{c}`") for c in sorted(rows.columns)]))
    digest = F.sha2(row, 256)

    def piece(start: int) -> Any:
        return F.conv(F.substring(digest, start, _HEX_DIGITS), 16, 10).cast("decimal(38,0)")

    result = (
        rows.select(piece(1).alias("a"), piece(1 + _HEX_DIGITS).alias("b"))
        .agg(F.count(F.lit(1)).alias("n"), F.sum("a").alias("a"), F.sum("b").alias("b"))
        .first()
    )
    return {
        "rows": int(result["n"]),
        "sum_a": str(result["a"] or 0),
        "sum_b": str(result["b"] or 0),
        "columns": sorted(rows.columns),
    }


def data_fingerprint(rows: DataFrame, params: PipelineParams, tokenizer_fingerprint: str) -> str:
    """A 20-hex-digit key of the prepared rows, the preparation params and the tokenizer."""
    payload = {
        "recipe": RECIPE_VERSION,
        "rows": rows_digest(rows),
        "params": preparation_params(params),
        "tokenizer": tokenizer_fingerprint,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def tokenizer_fingerprint(tokenizer_path: str) -> str:
    """A 16-hex-digit hash of the tokenizer files in a local folder, or of the id for a hub model."""
    folder = Path(tokenizer_path).expanduser()
    sha = hashlib.sha256()
    found = folder.is_dir() and [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if found:
        for name in found:
            sha.update(name.encode() + b"\0")
            sha.update(hashlib.sha256((folder / name).read_bytes()).digest())
    else:
        # A hub id (or a folder without tokenizer files, which loading will reject anyway).
        sha.update(b"id\0" + tokenizer_path.encode())
    return sha.hexdigest()[:16]


# What fsspec file systems call a file's modification time (local, S3, Azure, GCS) or, failing that, its ETag.
_CHANGE_STAMPS = ("mtime", "LastModified", "last_modified", "updated", "ETag")


@dataclass(frozen=True)
class SourceFiles:
    """The files a file source (a file, a folder, or a glob) holds, from its listing alone."""

    uri: str  # the root, with its protocol
    root: str
    files: dict[str, dict[str, Any]]  # path -> fsspec info (size, mtime or ETag, ...)

    @property
    def size(self) -> int:
        return sum(int(info.get("size") or 0) for info in self.files.values())


def list_source_files(uri: str | None, storage_options: dict[str, Any] | None = None) -> SourceFiles | None:
    """The files at ``uri`` (local or any fsspec URI; a folder is walked, a glob expanded), or None
    for an empty value, a catalog table, a location that does not exist and a listing that fails:
    what only Spark could tell."""
    text = str(uri or "").strip()
    if not text or ("/" not in text and "\\" not in text and "://" not in text):
        return None  # empty, or a catalog table
    from fsspec.core import url_to_fs

    try:
        fs, root = url_to_fs(text, **(storage_options or {}))
        if any(ch in root for ch in "*?["):
            matched = fs.glob(root)
            if not matched:
                return None  # like a path that does not exist
            files: dict[str, dict[str, Any]] = {}
            for path in matched:
                info = fs.info(path)
                files.update(fs.find(path, detail=True) if info.get("type") == "directory" else {path: info})
        elif fs.isdir(root):
            files = fs.find(root, detail=True)
        elif fs.exists(root):
            files = {root: fs.info(root)}
        else:
            return None
    except (OSError, ImportError, ValueError):
        # No fsspec implementation for the scheme here (Spark may still read it through Hadoop),
        # or the listing failed: the caller decides without it.
        return None
    return SourceFiles(uri=fs.unstrip_protocol(root), root=root, files=files)


def source_signature(uri: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """A 20-hex-digit key of the files at ``uri`` as they are listed: each file's path under ``uri``,
    size and modification time (or ETag), in order. None when it cannot be told without Spark.

    Unlike :func:`data_fingerprint` it reads no data, so a scheduled run can tell in milliseconds,
    before any Spark job, that its source is the very files the champion was trained on. The same
    bytes rewritten get a new signature (a new modification time): such a run goes on to prepare
    the data and is still skipped afterwards by the content fingerprint. None for a catalog table,
    a location that does not exist or holds no file, and a store whose listing gives no
    modification time or ETag.
    """
    return files_signature(list_source_files(uri, storage_options))


def files_signature(listed: SourceFiles | None) -> str | None:
    """:func:`source_signature` of a listing already made (None: nothing to sign)."""
    if listed is None or not listed.files:
        return None
    entries = []
    for path, info in sorted(listed.files.items()):
        stamp = next((info[key] for key in _CHANGE_STAMPS if info.get(key)), None)
        if stamp is None:
            return None
        entries.append([_relative(path, listed.root), int(info.get("size") or 0), str(stamp)])
    payload = json.dumps({"uri": listed.uri, "files": entries}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` when it lies under it, else ``path`` itself."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path
