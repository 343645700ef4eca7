"""Small files written whole on any fsspec filesystem: under a hidden name, then renamed into place,
so a reader (or a rerun after a crash) never sees half a file."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable
from typing import Any, BinaryIO


def publish_file(fs: Any, path: str, write: Callable[[BinaryIO], Any]) -> None:
    """``write(stream)`` into ``path`` on ``fs`` (an fsspec filesystem), atomically where ``fs.mv`` is."""
    folder, name = posixpath.split(path)
    fs.makedirs(folder, exist_ok=True)
    temporary = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with fs.open(temporary, "wb") as stream:
            write(stream)
        fs.mv(temporary, path)
    finally:
        if fs.exists(temporary):
            fs.rm(temporary)
