"""The ``airflow`` CLI, run with its output reaching the terminal as it comes and a file as lines."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def run_airflow(
    args: list[str], env: dict[str, str], *, output: Path | None = None, **kwargs: Any
) -> subprocess.CompletedProcess:
    """``python -m airflow ARGS``; with ``output``, its stdout and stderr also go to that file."""
    command = [sys.executable, "-m", "airflow", *args]
    if output is None:
        return subprocess.run(command, env=env, check=False, **kwargs)
    return run_copying_output(command, env, output)


# Colours and cursor moves: the terminal gets them, the log files do not.
_ANSI_ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _clean_line(line: bytes) -> bytes:
    """A line of output as a log file keeps it: no ANSI escapes, and of a line a progress bar
    redrew with carriage returns, the text after the last one."""
    line = _ANSI_ESCAPE.sub(b"", line).rstrip(b"\r")
    return line.rsplit(b"\r", 1)[-1]


def _byte_writer(stream: IO[str]) -> Callable[[bytes], None]:
    """Write bytes to a text stream as they come: to its binary buffer when it has one."""
    binary = getattr(stream, "buffer", None)
    if binary is not None:

        def write(chunk: bytes) -> None:
            binary.write(chunk)
            binary.flush()

        return write
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write_text(chunk: bytes) -> None:
        stream.write(decoder.decode(chunk))
        stream.flush()

    return write_text


def run_copying_output(command: list[str], env: dict[str, str], output: Path) -> subprocess.CompletedProcess:
    """Run ``command`` with its stdout and stderr passed on to this process's as they come, and
    copied line by line into ``output``."""
    output.parent.mkdir(parents=True, exist_ok=True)
    if sys.stdout.isatty() and "NO_COLOR" not in env:
        env = {"FORCE_COLOR": "1", **env}  # Airflow colours its lines only on a terminal it sees
    lock = threading.Lock()
    with (
        output.open("wb") as sink,
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
        ) as process,
    ):

        def copy(source: IO[bytes], write: Callable[[bytes], None] | None) -> None:
            pending = b""
            # OSError, ValueError: the pipe or the file was closed under a copier given up on below.
            with contextlib.suppress(OSError, ValueError):
                while chunk := os.read(source.fileno(), 65536):
                    if write is not None:
                        try:
                            write(chunk)
                        except (OSError, ValueError):  # a closed terminal or pipe: keep draining
                            write = None
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    if lines:
                        with lock:
                            sink.writelines(_clean_line(line) + b"\n" for line in lines)
                    if len(pending) > 65536 and b"\r" in pending:  # a progress bar redrawn for long
                        pending = pending[pending.rindex(b"\r") + 1 :]
                if pending:
                    with lock:
                        sink.write(_clean_line(pending) + b"\n")

        assert process.stdout is not None and process.stderr is not None
        copiers = [
            threading.Thread(target=copy, args=(process.stdout, _byte_writer(sys.stdout)), daemon=True),
            threading.Thread(target=copy, args=(process.stderr, _byte_writer(sys.stderr)), daemon=True),
        ]
        for copier in copiers:
            copier.start()
        try:
            code = process.wait()
        except KeyboardInterrupt:
            process.wait()  # the terminal's Ctrl-C reached Airflow too: let it end its run
            raise
        # A process Airflow started and left running may hold the pipes open: do not wait for it.
        for copier in copiers:
            copier.join(timeout=10)
    return subprocess.CompletedProcess(command, code)
