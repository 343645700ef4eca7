"""Allowed roots: keep the URIs users pass in params (``source_uri``, ``output_uri``, ...) inside
the storage a deployment opened to them.

A deployment sets ``SPARKTUNE_ALLOWED_ROOTS`` to comma-separated URI prefixes (``/data,s3://bucket/lake``);
unset, every URI is allowed. A URI is inside a root when, after normalization, it has the same
scheme and bucket (host) and its path starts with the root's path on a segment boundary
(``/data2`` is not inside ``/data``). Normalization, before any comparison:

- local paths (no scheme, or ``file:``): made absolute against the current directory, ``.`` and
  ``..`` collapsed and symlinks resolved (``os.path.realpath``), so neither ``/data/../etc`` nor a
  symlink under ``/data`` pointing elsewhere gets out;
- object-store URIs (``s3://``, ``gs://``, ``abfss://``, ``dbfs:/``, ...): percent-escapes decoded,
  ``.`` and ``..`` collapsed in the path (as Hadoop's ``Path`` does), the scheme lower-cased, the
  bucket compared exactly; ``?`` and ``#`` stay part of the path, as Hadoop reads them;
- brace globs (``{a,b}``) are expanded first and every expansion must be inside a root, so
  ``/data/{.}{.}/etc`` cannot become ``/data/../etc`` once Hadoop expands it; a local glob
  (``*``, ``?``, ``[...]``) is also matched against the disk, so a symlink it would go through
  is resolved too.

Pure functions of their arguments (the file system is read only to resolve symlinks); the
deployment setting is read by :func:`sparktune.core.config.Settings.allowed_roots`.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from sparktune.core.config import ALLOWED_ROOTS_ENV, settings
from sparktune.core.source_names import looks_like_table

# Hadoop's Path: a colon before the first slash ends a scheme ("s3:x/y" is not a local file).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_GLOB = re.compile(r"[*?\[]")
# Spark reads `parquet.`/some/path`` (SQL on files) as a file even where a table name is expected.
_FILE_SOURCES = frozenset(
    {"parquet", "orc", "json", "csv", "text", "avro", "binaryfile", "delta", "xml", "jdbc", "libsvm"}
)
_PLAIN_TABLE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+){0,2}$")
MAX_BRACE_EXPANSIONS = 256


@dataclass(frozen=True)
class NormalizedUri:
    """``scheme`` lower-cased (``file`` for local paths), ``authority`` (bucket, host) as given,
    ``path`` absolute with ``.``/``..`` collapsed (and symlinks resolved for local paths)."""

    scheme: str
    authority: str
    path: str

    def __str__(self) -> str:
        if self.scheme == "file" and not self.authority:
            return self.path
        if not self.authority:  # dbfs:/Volumes/x
            return f"{self.scheme}:{self.path}"
        return f"{self.scheme}://{self.authority}{self.path}"

    def segments(self) -> tuple[str, ...]:
        return tuple(s for s in self.path.split("/") if s)

    def within(self, root: NormalizedUri) -> bool:
        """Same scheme and authority, and ``root``'s path segments are a prefix of this one's."""
        if (self.scheme, self.authority) != (root.scheme, root.authority):
            return False
        prefix = root.segments()
        return self.segments()[: len(prefix)] == prefix


def normalize_uri(uri: str, *, cwd: str | None = None) -> NormalizedUri:
    """``uri`` in the form roots are compared in (see the module docstring).

    A relative local path is taken relative to ``cwd`` (default: the current directory).
    """
    value = uri.strip()
    if not value:
        raise ValueError("an empty URI has no location")
    match = _SCHEME.match(value)
    scheme = match.group(1).lower() if match else "file"
    rest = value[match.end() :] if match else value
    authority = ""
    if match:
        if rest.startswith("//"):
            authority, slash, path = rest[2:].partition("/")
            rest = slash + path
        rest = unquote(rest)
    if scheme == "file" and authority in ("", "localhost"):
        local = os.path.expanduser(rest) if not match else rest
        if not os.path.isabs(local):
            local = os.path.join(cwd or os.getcwd(), local)
        return NormalizedUri("file", "", os.path.realpath(local))
    path = posixpath.normpath("/" + rest.lstrip("/"))
    return NormalizedUri(scheme, authority, "/" if path == "/" else path)


def expand_braces(value: str) -> list[str]:
    """Every string a Hadoop glob's ``{a,b}`` alternatives (nested too) stand for; no braces: ``[value]``."""
    start = value.find("{")
    if start < 0:
        return [value]
    depth, end, commas = 0, -1, []
    for i in range(start, len(value)):
        ch = value[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                end = i
                break
        elif ch == "," and depth == 1:
            commas.append(i)
    if end < 0:  # unbalanced: Hadoop refuses the glob; treat the brace literally
        return [value]
    bounds = [start, *commas, end]
    options = [value[bounds[i] + 1 : bounds[i + 1]] for i in range(len(bounds) - 1)]
    out: list[str] = []
    for option in options:
        for expanded in expand_braces(value[:start] + option + value[end + 1 :]):
            out.append(expanded)
            if len(out) > MAX_BRACE_EXPANSIONS:
                raise ValueError(f"the glob expands to more than {MAX_BRACE_EXPANSIONS} paths")
    return out


def _glob(pattern: str) -> list[str]:
    import glob

    return glob.glob(pattern, include_hidden=True)[:MAX_BRACE_EXPANSIONS]


def outside_roots_message(param: str, value: str, roots: Sequence[str], resolved: str | None = None) -> str:
    where = f" (resolves to {resolved})" if resolved and resolved != value.strip() else ""
    return (
        f"{param}: {value!r}{where} is outside the allowed roots {', '.join(roots)} "
        f"({ALLOWED_ROOTS_ENV}). Fix: use a location under one of those roots, or ask whoever runs "
        f"this deployment to add its root to {ALLOWED_ROOTS_ENV}."
    )


def check_allowed_uri(param: str, value: str, roots: Sequence[str], *, cwd: str | None = None) -> None:
    """Return when ``value`` lies inside one of ``roots`` (any value when ``roots`` is empty).

    Raises ValueError naming ``param``, the value, what it resolves to, the roots and the fix.
    """
    if not roots:
        return
    allowed = [normalize_uri(root, cwd=cwd) for root in roots]
    try:
        candidates = [normalize_uri(v, cwd=cwd) for v in expand_braces(value)]
    except ValueError as exc:
        raise ValueError(f"{outside_roots_message(param, value, roots)} ({exc})") from exc
    for expanded, candidate in zip(expand_braces(value), list(candidates), strict=True):
        if candidate.scheme == "file" and not candidate.authority and _GLOB.search(expanded):
            # What a local glob matches now, symlinks resolved: "/data/*/x" through /data/link -> /etc.
            candidates += [NormalizedUri("file", "", os.path.realpath(m)) for m in _glob(candidate.path)]
    for candidate in candidates:
        if not any(candidate.within(root) for root in allowed):
            raise ValueError(outside_roots_message(param, value, roots, str(candidate)))


def check_table_name(param: str, value: str, roots: Sequence[str]) -> None:
    """With roots set, a catalog table name must be a plain ``[catalog.]db.table`` name: Spark reads
    ``parquet.`/any/path``` (SQL on files) as a file, which would step around the roots."""
    if not roots:
        return
    name = value.strip()
    parts = name.split(".")
    if not _PLAIN_TABLE.match(name) or (len(parts) == 2 and parts[0].lower() in _FILE_SOURCES):
        raise ValueError(
            f"{param}: {value!r} is not a plain table name ([catalog.]database.table of letters, digits "
            f"and _), and Spark may read such a name as a file path, which the allowed roots "
            f"{', '.join(roots)} ({ALLOWED_ROOTS_ENV}) do not permit. Fix: name the table plainly, "
            "or pass the files' location under one of the roots."
        )


def check_source(param: str, value: str, source_format: str, roots: Sequence[str]) -> None:
    """A source as ``sparktune.data.prepare_source.resolve_source_uri`` reads it: a catalog table
    name (checked by :func:`check_table_name`) or a path/URI (:func:`check_allowed_uri`). Empty: the
    demo data."""
    from pathlib import Path

    uri = value.strip()
    if not roots or not uri:
        return
    is_table = source_format == "table" or (
        "://" not in uri and looks_like_table(uri) and not Path(uri).expanduser().exists()
    )
    if is_table:
        check_table_name(param, uri, roots)
    else:
        check_allowed_uri(param, uri, roots)


def source_root_problems(values: Mapping[str, Any], roots: Sequence[str] | None = None) -> list[str]:
    """The pipeline params' allowed-roots problems (``source_uri``), for ``parse_params``; ``roots``
    default: the deployment's (:attr:`sparktune.core.config.Settings.allowed_roots`)."""
    if roots is None:
        roots = settings().allowed_roots
    try:
        check_source(
            "source_uri", str(values.get("source_uri") or ""), str(values.get("source_format")), roots
        )
    except ValueError as exc:
        return [str(exc)]
    return []


def path_segment(value: str) -> str:
    """``value`` (a run id, a batch id) as one folder name on any file system: characters other
    than letters, digits, ``-``, ``_`` and ``.`` become ``_`` (``manual__2026-11-23T10:00:00+00:00``
    has ``:`` and ``+``), at most 200 of them."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in value)[:200]
