"""How writing a dataset fails: :class:`MaterializeError` for data that cannot become the dataset asked
for, :class:`DiskFullError` when the volume fills, recognised in the driver's and the executors'
errors and explained with the sizes known and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import Any

from sparktune.data.dataset_fs import is_local, to_uri


class MaterializeError(ValueError):
    """The source cannot become a dataset as asked (missing column, unknown labels)."""


# The errors a full volume gives: no space left, or the user's quota used up.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


class DiskFullError(OSError):
    """The datasets volume filled while a dataset was written; nothing was published.

    The message names the location, the sizes known and the fix. ``fits_on_volume`` is False
    when the dataset is larger than the whole volume (no retry can help), None when unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        location: str,
        needed_bytes: int | None,
        written_bytes: int | None,
        volume_bytes: int | None,
        free_bytes: int | None,
    ) -> None:
        super().__init__(errno.ENOSPC, message)
        self.message = message
        self.location = location
        self.needed_bytes = needed_bytes
        self.written_bytes = written_bytes
        self.volume_bytes = volume_bytes
        self.free_bytes = free_bytes

    @property
    def fits_on_volume(self) -> bool | None:
        if self.needed_bytes is None or self.volume_bytes is None:
            return None
        return self.needed_bytes <= self.volume_bytes

    @property
    def retry_may_help(self) -> bool:
        """False only when the dataset is larger than the whole volume: freeing space cannot fit it."""
        return self.fits_on_volume is not False

    def __str__(self) -> str:
        return self.message


def executor_error(exc: Exception) -> MaterializeError | None:
    """The MaterializeError an executor raised, out of the PythonException Spark wraps it in."""
    text = str(exc)
    marker = "MaterializeError: "
    if marker not in text:
        return None
    return MaterializeError(text.split(marker, 1)[1].strip().splitlines()[0])


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException, path: str | None = None) -> bool:
    """An ENOSPC/EDQUOT in ``exc`` or its causes; with ``path``, also one an executor raised
    while writing under ``path`` (only its text survives Spark's PythonException)."""
    for error in _chain(exc):
        if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
            return True
        text = str(error)
        if path and path in text and any(t in text for t in _DISK_FULL_TEXTS):
            return True
    return False


def written_bytes(fs: Any, path: str) -> int | None:
    """The bytes under ``path`` (0 when it is gone), or None when the store cannot tell."""
    try:
        return int(fs.du(path, total=True)) if fs.exists(path) else 0
    except Exception:  # the size is for the message only
        return None


def _mount_point(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def disk_full_error(
    fs: Any,
    parent: str,
    data_fingerprint: str,
    expected_bytes: int | None,
    written_bytes: int | None,
    cause: BaseException,
) -> DiskFullError:
    """One message with the cause, the location, the sizes known and the fix."""
    location = to_uri(fs, parent)
    volume_bytes = free_bytes = None
    volume = location
    if is_local(fs):
        with contextlib.suppress(OSError):
            usage = os.statvfs(parent)
            volume_bytes, free_bytes = usage.f_blocks * usage.f_frsize, usage.f_bavail * usage.f_frsize
            volume = _mount_point(parent)
    needed = expected_bytes if expected_bytes and expected_bytes > (written_bytes or 0) else None
    what = os.strerror(errno.EDQUOT) if _is_quota(cause) else os.strerror(errno.ENOSPC)
    parts = [f"{what}: the dataset {data_fingerprint} under {location} did not fit"]
    if written_bytes is not None:
        parts.append(f" ({_mb(written_bytes)} had been written in finished shards)")
    if needed is not None:
        parts.append(f"; it needs about {_mb(needed)} (the Parquet source's uncompressed size)")
    elif written_bytes:
        parts.append(f"; it needs more than {_mb(written_bytes)}")
    if volume_bytes is not None:
        parts.append(
            f"; the volume mounted at {volume} holds {_mb(volume_bytes)} in all, {_mb(free_bytes)} free now"
        )
    parts.append(". Nothing was published and the partial write was removed. ")
    elsewhere = (
        "point the datasets at a bigger volume (the datasets_root of materialize_dataset, or "
        "SPARKTUNE_LAKE_URI for the pipeline, whose datasets go to <lake>/datasets)"
    )
    if needed is not None and volume_bytes is not None and needed > volume_bytes:
        parts.append(f"The dataset is larger than the whole volume; to fix, {elsewhere}.")
    elif needed is not None and free_bytes is not None and needed > free_bytes:
        parts.append(f"To fix, free at least {_mb(needed - free_bytes)} on {volume}, or {elsewhere}.")
    else:
        parts.append(f"To fix, free space on {volume}, or {elsewhere}.")
    return DiskFullError(
        "".join(parts),
        location=location,
        needed_bytes=needed,
        written_bytes=written_bytes,
        volume_bytes=volume_bytes,
        free_bytes=free_bytes,
    )


def _is_quota(exc: BaseException) -> bool:
    return any(
        (isinstance(e, OSError) and e.errno == errno.EDQUOT) or os.strerror(errno.EDQUOT) in str(e)
        for e in _chain(exc)
    )
