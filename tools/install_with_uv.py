"""``pip install <args>`` into this interpreter's environment, done by uv where it can be.

uv installs ``requirements.lock`` about 2x faster than pip (55 s against 117 s, bytecode compiled by both;
docs/benchmarks.md), but it reads none of pip's configuration: the machine's index, extra indexes,
find-links (where a CPU build of torch may lie), CA bundle and constraints would be lost. This passes
what ``pip config list`` reports (environment variables first, then the files' ``install`` and
``global`` sections, pip's own order) on as uv's flags. Where uv is missing or fails, pip installs
the same arguments, so a setting uv does not know costs time, never the install.

Run with the environment's interpreter: ``.venv/bin/python tools/install_with_uv.py -r requirements.lock``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# pip's option -> uv's, for the settings that say where packages come from and what bounds them.
_REPEATED = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
_SINGLE = {"index-url": "--index-url", "cert": "--cert"}
_SECTIONS = (":env:", "install", "global")  # the first that sets a key wins, as in pip


def pip_settings(config_list: str) -> dict[str, str]:
    """``pip config list`` output (``section.key='value'`` lines) -> key: value, by pip's precedence."""
    found: dict[str, dict[str, str]] = {}
    for line in config_list.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in _SECTIONS:
            continue
        value = shlex.split(raw)[0] if raw.strip() else ""
        found.setdefault(key, {})[section] = value
    return {key: next(by[s] for s in _SECTIONS if s in by) for key, by in found.items()}


def uv_flags(settings: dict[str, str]) -> list[str]:
    flags: list[str] = []
    for key, flag in _SINGLE.items():
        if settings.get(key):
            flags += [flag, settings[key]]
    for key, flag in _REPEATED.items():
        for value in settings.get(key, "").split():  # pip's lists are whitespace-separated
            flags += [flag, value]
    # pip takes the best match over all its indexes; uv by default only the first index that has
    # the package, which fails where a local mirror holds some releases of it.
    return [*flags, "--index-strategy", "unsafe-best-match"]


def main(args: list[str]) -> int:
    pip = [sys.executable, "-m", "pip"]
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv:
        listed = subprocess.run([*pip, "config", "list"], capture_output=True, text=True, check=False).stdout
        # pip compiles what it installs to bytecode; uv only when asked. Where PYTHONDONTWRITEBYTECODE
        # is set (as on this project's CI machines) nothing would compile it later, and every process
        # would compile each module it imports again: 19 s instead of 10 s for the pipeline's imports.
        command = [
            uv,
            "pip",
            "install",
            "--quiet",
            "--compile-bytecode",
            "--python",
            sys.executable,
            *uv_flags(pip_settings(listed)),
            *args,
        ]
        if subprocess.run(command, check=False).returncode == 0:
            return 0
        print(f"uv could not install {' '.join(args)}; pip installs it instead", file=sys.stderr)
    return subprocess.run([*pip, "install", "--quiet", *args], check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
