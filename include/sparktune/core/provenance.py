"""Which code trained a model: the sparktune version and commit, and a hash of the package's sources.

The register step tags every model version with both; a scheduled run compares the hash with the
champion's to decide whether the code changed (``sparktune.release.retrain``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def code_fingerprint(package: Path | None = None) -> str:
    """sha256 of the installed ``sparktune`` package's Python sources (first 16 hex digits).

    What decides whether the same data and config would train the same model again: unlike the git
    commit in :func:`code_version`, a commit that touches only docs, tests or DAG wiring leaves it
    alone, and an uncommitted change to the trainer changes it.
    """
    import hashlib

    package = package or Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def code_version() -> str:
    """The sparktune version, plus the git commit when it runs from a checkout (``0.1.0+g1a2b3c4``)."""
    import subprocess

    try:
        release = version("sparktune")
    except PackageNotFoundError:
        release = "unknown"
    source = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return release
    return f"{release}+g{sha}" if sha else release
