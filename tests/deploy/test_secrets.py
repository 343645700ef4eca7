"""The secrets the project generates for its servers: long enough for HS512, in owner-only files
under the state folder, made once and reused, and never printed by the ``env`` commands.

The servers themselves are started by tests/deploy/test_listeners.py (``make airflow-ui`` there
must log no weak-key warning) and by the stack tests.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sparktune_dev import secret_files
from sparktune_dev.embedded.environment import embedded_env, embedded_secret_files, secrets_dir
from sparktune_dev.stack import StackConfig, secret_paths, stack_env

HS512_KEY_BYTES = 64


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _assert_private(path: Path) -> None:
    assert _mode(path) == 0o600, f"{path} has mode {oct(_mode(path))}"
    assert _mode(path.parent) == 0o700, f"{path.parent} has mode {oct(_mode(path.parent))}"


def test_a_secret_is_made_once_owner_only_and_a_weak_one_is_renewed_only_when_asked(tmp_path):
    path = tmp_path / "state" / "secrets" / "key.secret"
    first = secret_files.ensure_secret(path, secret_files.signing_key, min_length=HS512_KEY_BYTES)
    assert (
        len(first.encode()) >= HS512_KEY_BYTES and first == path.read_text()
    )  # no newline: `cat` gives it whole
    _assert_private(path)
    assert secret_files.ensure_secret(path, secret_files.signing_key, min_length=HS512_KEY_BYTES) == first

    # Loosened by hand (or by an older version): made owner-only again, value kept.
    path.chmod(0o644)
    path.parent.chmod(0o755)
    assert secret_files.ensure_secret(path, secret_files.signing_key, min_length=HS512_KEY_BYTES) == first
    _assert_private(path)

    path.write_text("short")
    kept = secret_files.ensure_secret(
        path, secret_files.signing_key, min_length=HS512_KEY_BYTES, renew_weak=False
    )
    assert kept == "short"
    renewed = secret_files.ensure_secret(path, secret_files.signing_key, min_length=HS512_KEY_BYTES)
    assert len(renewed) >= HS512_KEY_BYTES and renewed != first
    _assert_private(path)
    assert [p.name for p in path.parent.iterdir()] == ["key.secret"], "a temporary file was left behind"


def test_the_embedded_airflow_signs_with_generated_keys_and_listens_on_loopback(tmp_path):
    env = embedded_env(tmp_path, base={"PATH": "/usr/bin"})
    files = embedded_secret_files(tmp_path)
    assert set(files) == {"AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"}
    for key, path in files.items():
        assert len(env[key].encode()) >= HS512_KEY_BYTES, key
        assert path.read_text() == env[key]
        assert path.parent == secrets_dir(tmp_path)
        _assert_private(path)
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] != env["AIRFLOW__API__SECRET_KEY"]
    assert (
        embedded_env(tmp_path, base={"PATH": "/usr/bin"})["AIRFLOW__API_AUTH__JWT_SECRET"]
        == env["AIRFLOW__API_AUTH__JWT_SECRET"]
    )
    assert env["AIRFLOW__API__HOST"] == env["SPARK_LOCAL_IP"] == "127.0.0.1"

    # A deployment's own address and secret win; a private JWT key rules out a shared secret.
    own = embedded_env(
        tmp_path,
        base={
            "PATH": "/usr/bin",
            "AIRFLOW__API__HOST": "10.1.2.3",
            "SPARK_LOCAL_IP": "10.1.2.3",
            "AIRFLOW__API__SECRET_KEY_CMD": "cat /run/secrets/api",
            "AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH": "/run/secrets/jwt.pem",
        },
    )
    assert own["AIRFLOW__API__HOST"] == own["SPARK_LOCAL_IP"] == "10.1.2.3"
    assert "AIRFLOW__API__SECRET_KEY" not in own and "AIRFLOW__API_AUTH__JWT_SECRET" not in own


def test_the_stack_keeps_its_secrets_private_and_renews_a_weak_one_only_when_asked(tmp_path):
    from cryptography.fernet import Fernet

    config = StackConfig(home=tmp_path)
    env = stack_env(config, base={"PATH": "/usr/bin"})
    paths = secret_paths(config)
    for key, path in paths.items():
        assert path.read_text() == env[key], key
        _assert_private(path)
    Fernet(env["AIRFLOW__CORE__FERNET_KEY"].encode())  # a valid key, or this raises
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        assert len(env[key].encode()) >= HS512_KEY_BYTES, key
    passwords = Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    _assert_private(passwords)
    assert len(json.loads(passwords.read_text())[config.username]) >= 16
    assert env["AIRFLOW__API__HOST"] == env["SPARK_LOCAL_IP"] == config.host == "127.0.0.1"
    # No embedded secrets are made for the stack: it has its own.
    assert not secrets_dir(tmp_path).exists()

    # A stack an older version started: 43-character signing keys, kept while it may be running.
    weak = "w" * 43
    paths["AIRFLOW__API_AUTH__JWT_SECRET"].write_text(weak)
    assert stack_env(config, base={"PATH": "/usr/bin"})["AIRFLOW__API_AUTH__JWT_SECRET"] == weak
    renewed = stack_env(config, base={"PATH": "/usr/bin"}, renew_weak_secrets=True)
    assert len(renewed["AIRFLOW__API_AUTH__JWT_SECRET"]) >= HS512_KEY_BYTES
    # The Fernet key decrypts what the database holds: never made again.
    assert renewed["AIRFLOW__CORE__FERNET_KEY"] == env["AIRFLOW__CORE__FERNET_KEY"]


def test_the_env_commands_name_the_secret_files_and_airflow_reads_them(tmp_path, monkeypatch, capsys):
    from airflow.configuration import conf
    from sparktune_dev.embedded.__main__ import main as embedded_main
    from sparktune_dev.stack import main as stack_main

    monkeypatch.setenv("SPARKTUNE_HOME", str(tmp_path))
    assert embedded_main(["env"]) == 0
    embedded = capsys.readouterr().out
    assert stack_main(["env"]) == 0
    stack = capsys.readouterr().out
    secrets = {
        **{k: p.read_text() for k, p in embedded_secret_files(tmp_path).items()},
        **{f"stack {k}": p.read_text() for k, p in secret_paths(StackConfig(home=tmp_path)).items()},
    }
    for name, value in secrets.items():
        assert value not in embedded and value not in stack, f"{name} is printed"
    for output, files in (
        (embedded, embedded_secret_files(tmp_path)),
        (stack, secret_paths(StackConfig(home=tmp_path))),
    ):
        for key, path in files.items():
            assert f"export {key}_CMD={json.dumps(secret_files.read_command(path))}" in output
            section, option = key.removeprefix("AIRFLOW__").lower().split("__")
            # Airflow runs a _CMD variable only for an option its config marks sensitive.
            assert (section, option) in conf.sensitive_config_values, key

    # The exports as a shell evaluates them, read back by Airflow's own configuration.
    probe = (
        "import json; from airflow.configuration import conf; print(json.dumps(["
        "conf.get('core', 'fernet_key'), conf.get('api', 'secret_key'), conf.get('api_auth', 'jwt_secret')]))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    script = f'eval "$1"; exec "{sys.executable}" -c "$2"'
    read = subprocess.run(
        ["bash", "-c", script, "bash", stack, probe], env=clean, capture_output=True, text=True, check=True
    )
    paths = secret_paths(StackConfig(home=tmp_path))
    expected = [paths[k].read_text() for k in ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API__SECRET_KEY")]
    expected.append(paths["AIRFLOW__API_AUTH__JWT_SECRET"].read_text())
    assert json.loads(read.stdout.strip().splitlines()[-1]) == expected


def test_make_airflow_ui_asks_for_a_login_on_an_address_other_machines_reach(tmp_path):
    from sparktune_dev.embedded.ui import ALL_ADMINS_ENV, PASSWORDS_FILE_ENV, UiError, ui_env

    local = ui_env(tmp_path, base={"PATH": "/usr/bin", "AIRFLOW__API__PORT": "18080"})
    assert local["AIRFLOW__API__HOST"] == "127.0.0.1" and local[ALL_ADMINS_ENV] == "True"
    assert local["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18080/execution/"

    opened = ui_env(tmp_path, base={"PATH": "/usr/bin", "AIRFLOW__API__HOST": "0.0.0.0"})
    assert opened[ALL_ADMINS_ENV] == "False"
    passwords = Path(opened[PASSWORDS_FILE_ENV])
    _assert_private(passwords)
    assert len(json.loads(passwords.read_text())["admin"]) >= 16
    with pytest.raises(UiError, match="unset AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"):
        ui_env(tmp_path, base={"PATH": "/usr/bin", "AIRFLOW__API__HOST": "0.0.0.0", ALL_ADMINS_ENV: "True"})
