"""The secrets the project generates for its own servers: random, long enough, owner-only, never printed.

Each secret is one file under the state folder (``$SPARKTUNE_HOME``), mode 0600 in a folder of mode
0700, made once and read again on every start: servers restarted later keep validating what the
earlier ones signed. Processes get the value in their environment, which only their user can read
(``/proc/<pid>/environ`` is 0400); shell exports meant for the user's terminal name the file
instead, through Airflow's ``AIRFLOW__<SECTION>__<KEY>_CMD`` variables (see :func:`shell_exports`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

SECRET_DIR_MODE = 0o700
SECRET_FILE_MODE = 0o600
# Airflow 3.3 signs its JWTs with HS512 when [api_auth] jwt_secret is set (tokens.py guesses HS512 for a
# shared secret): RFC 7518 section 3.2 wants an HMAC key at least as long as the hash, 64 bytes, and
# PyJWT warns below that. Airflow's own generated default is 16 random bytes in base64 (24 characters).
MIN_SIGNING_KEY_BYTES = 64


def signing_key() -> str:
    """64 random bytes, URL-safe base64 (86 characters): a full-strength HS512 key, as text."""
    return secrets.token_urlsafe(MIN_SIGNING_KEY_BYTES)


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter (0700), created when missing, tightened when looser."""
    path.mkdir(parents=True, exist_ok=True, mode=SECRET_DIR_MODE)
    if stat.S_IMODE(path.stat().st_mode) != SECRET_DIR_MODE:
        path.chmod(SECRET_DIR_MODE)
    return path


def _write_private(path: Path, value: str) -> Path:
    """A new file beside ``path`` holding ``value``, 0600 from its creation: never readable by others."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
    try:
        os.fchmod(fd, SECRET_FILE_MODE)  # the umask may have taken bits; the mode is exactly 0600
        # No trailing newline: `cat` (the _CMD exports) must give Airflow the same bytes as the file.
        os.write(fd, value.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return temp


def ensure_secret(
    path: Path, make: Callable[[], str], *, min_length: int = 0, renew_weak: bool = True
) -> str:
    """The secret kept in ``path``; made by ``make()`` and written (0600, folder 0700) when missing.

    A file shorter than ``min_length`` (written by an older version of the project, or by hand) is
    replaced by a new secret when ``renew_weak``: a caller passes False while servers that hold the
    old value still run, since they would reject what the new one signs. A file others may read is
    made owner-only again. Two processes creating the same secret at once end up with one value.
    """
    private_dir(path.parent)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            path.chmod(SECRET_FILE_MODE)
        value = path.read_text()
        if len(value) >= min_length or not renew_weak:
            return value
        temp = _write_private(path, make())
        os.replace(temp, path)
        return path.read_text()
    temp = _write_private(path, make())
    try:
        # link() fails when the name exists: the first writer's secret wins, the others read it.
        os.link(temp, path)
    except FileExistsError:
        pass
    finally:
        temp.unlink()
    return path.read_text()


def ensure_password_file(path: Path, users: Iterable[str]) -> str:
    """SimpleAuthManager's passwords file (JSON ``{user: password}``), with a generated password for
    each user it lacks; returns the path. Airflow would write one itself, readable by every user of
    the machine, and print the passwords to its log."""
    users = list(users)
    current = json.loads(
        ensure_secret(path, lambda: json.dumps({u: secrets.token_urlsafe(16) for u in users}))
    )
    missing = [u for u in users if u not in current]
    if missing:
        current.update({u: secrets.token_urlsafe(16) for u in missing})
        os.replace(_write_private(path, json.dumps(current)), path)
    return str(path)


def read_command(path: Path) -> str:
    """The command an ``AIRFLOW__..._CMD`` variable runs to read the secret in ``path``."""
    return f"cat {shlex.quote(str(path))}"


def _holds(path: Path, value: str) -> bool:
    try:
        return path.read_text() == value
    except OSError:
        return False


def shell_exports(
    env: Mapping[str, str], prefixes: tuple[str, ...], secret_files: Mapping[str, Path]
) -> list[str]:
    """``export`` lines for the variables of ``env`` that start with one of ``prefixes``, for a user's shell.

    A variable of ``secret_files`` whose file holds its value is exported as its ``_CMD`` variant,
    which makes Airflow read the file when it needs the value: the secret stays out of the terminal,
    its scrollback and any log of the session. One with another value came from the caller's own
    environment, which has it already: it is left out. Airflow 3.3 honours ``_CMD`` for the options
    its config marks sensitive, which ``[core] fernet_key``, ``[api] secret_key`` and
    ``[api_auth] jwt_secret`` are.
    """
    lines = []
    for key, value in sorted(env.items()):
        if not key.startswith(prefixes):
            continue
        if key not in secret_files:
            lines.append(f"export {key}={json.dumps(value)}")
        elif _holds(secret_files[key], value):
            # unset: a value a shell kept from an earlier export would win over the _CMD variant.
            lines.append(f"unset {key}; export {key}_CMD={json.dumps(read_command(secret_files[key]))}")
    return lines
