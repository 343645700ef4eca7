"""File systems as the dataset writer uses them: one fsspec file system per URI (local disk or any
object store), paths back to URIs, and writes made durable before a dataset is published.
"""

from __future__ import annotations

import os
from typing import Any


def filesystem(uri: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """The fsspec file system of ``uri`` and the path on it (``storage_options`` as fsspec takes them)."""
    from fsspec.core import url_to_fs

    return url_to_fs(uri, **(storage_options or {}))


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local disk (where renames are atomic and files can be fsynced)."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def to_uri(fs: Any, path: str) -> str:
    """A path from ``url_to_fs`` back to a URI for libraries that open it themselves."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def absolute_uri(uri: str) -> str:
    """``uri`` with a relative local path made absolute; URIs with a scheme as they are."""
    # Executors resolve relative paths against their own working directory.
    return uri if "://" in uri else os.path.abspath(uri)


def fsync(path: str, fs: Any) -> None:
    """Flush the written file ``path`` to the disk (a no-op off the local disk)."""
    # Durable before the marker says "complete": a crash after publishing must not expose
    # shards whose pages never reached the disk. Object stores are durable on close.
    if is_local(fs):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
