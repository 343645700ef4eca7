"""A small file is written whole or not at all, through any fsspec filesystem."""

from __future__ import annotations

import fsspec
import pytest
from sparktune.core.files import publish_file


def test_a_file_is_published_whole_and_a_failed_write_leaves_nothing(tmp_path):
    fs = fsspec.filesystem("file")
    target = str(tmp_path / "deep" / "report.html")
    publish_file(fs, target, lambda stream: stream.write(b"first"))
    assert (tmp_path / "deep" / "report.html").read_bytes() == b"first"

    def half_then_fail(stream):
        stream.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish_file(fs, target, half_then_fail)
    # The old file stands, and no temporary file is left beside it.
    assert (tmp_path / "deep" / "report.html").read_bytes() == b"first"
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["report.html"]
