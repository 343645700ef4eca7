"""The production topology of docker-compose.yaml, natively on this machine (``make stack``).

Everything listens on 127.0.0.1 only (``SPARKTUNE_STACK_HOST`` names another address of this machine):

- Airflow on the local PostgreSQL server (its own database): api-server (UI, REST API, execution
  API), scheduler, dag-processor and triggerer as separate processes; SimpleAuthManager with one
  admin whose password is generated into the state folder. Tasks run on the LocalExecutor, or
  with ``SPARKTUNE_STACK_EXECUTOR=celery`` on the CeleryExecutor (compose's celery profile): the
  local Redis as broker (``SPARKTUNE_STACK_REDIS``), results in Airflow's database, and two
  Celery workers. Run as root, each worker has a host name of its own (``worker-1``,
  ``worker-2``: a UTS namespace from ``unshare``), as two machines would;
- an MLflow server on PostgreSQL (its own database), serving artifacts from a folder;
- a Spark standalone master and one worker, from the pyspark wheel (``spark-class``).

The DAGs reach Spark and MLflow through the ``spark_default`` and ``mlflow_default`` connections,
defined as ``AIRFLOW_CONN_*`` variables of the Airflow processes, as in docker-compose.yaml.
State (logs, pids, artifacts, lake) lives under ``$SPARKTUNE_HOME/stack`` (mode 0700), with the
generated secrets (Fernet key, JWT and session signing keys, the admin's password) in 0600 files;
``down`` stops the processes and keeps the databases, ``down --purge`` drops them too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparktune.core.config import HOME_ENV
from sparktune_dev import secret_files
from sparktune_dev.embedded.environment import PROJECT_ROOT, embedded_env

PG_ENV = "SPARKTUNE_STACK_PG"  # the server: postgresql://user@host:port (trust or password auth)
EXECUTOR_ENV = "SPARKTUNE_STACK_EXECUTOR"  # local (default) or celery
CELERY_CONFIG_OPTIONS = "sparktune_airflow.core.celery_worker.CELERY_CONFIG"
REDIS_ENV = "SPARKTUNE_STACK_REDIS"  # the Celery broker: redis://host:port/db
# The one address every service listens on (default 127.0.0.1): an address of this machine that
# other machines reach opens all of them to those machines, the MLflow server and Spark without a login.
HOST_ENV = "SPARKTUNE_STACK_HOST"
PORT_ENVS = {
    "airflow_port": "SPARKTUNE_STACK_AIRFLOW_PORT",
    "mlflow_port": "SPARKTUNE_STACK_MLFLOW_PORT",
    "spark_port": "SPARKTUNE_STACK_SPARK_PORT",
    "spark_ui_port": "SPARKTUNE_STACK_SPARK_UI_PORT",
    "spark_worker_ui_port": "SPARKTUNE_STACK_SPARK_WORKER_UI_PORT",
    "serving_port": "SPARKTUNE_STACK_SERVING_PORT",
}
AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# MLflow 3's server also starts a job runner and its workers (for MLflow's own background jobs,
# which this project does not use) unless told not to: a start took 44 s with it, 7 s without.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class StackError(RuntimeError):
    """The stack could not start or stop; the message says which service and where its log is."""


@dataclass
class StackConfig:
    """Where the stack's services listen and keep their state; ``from_env`` reads the overrides."""

    home: Path
    host: str = "127.0.0.1"
    airflow_port: int = 8080
    mlflow_port: int = 5000
    spark_port: int = 7077
    spark_ui_port: int = 8081
    spark_worker_ui_port: int = 8082
    serving_port: int = 5001
    postgres: str = "postgresql://postgres@127.0.0.1:5432"
    database_prefix: str = "sparktune"
    username: str = "admin"
    parallelism: int = 4
    executor: str = "local"
    redis: str = "redis://127.0.0.1:6379/0"
    celery_workers: tuple[str, ...] = ("worker-1", "worker-2")
    celery_concurrency: int = 2
    worker_cores: int = 2
    worker_memory: str = "6g"
    extra_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, home: Path, **overrides: Any) -> StackConfig:
        values: dict[str, Any] = {"home": home}
        for name, env_name in PORT_ENVS.items():
            if os.environ.get(env_name):
                values[name] = int(os.environ[env_name])
        if os.environ.get(HOST_ENV):
            values["host"] = os.environ[HOST_ENV]
        if os.environ.get(PG_ENV):
            values["postgres"] = os.environ[PG_ENV]
        if os.environ.get(EXECUTOR_ENV):
            values["executor"] = os.environ[EXECUTOR_ENV]
        if os.environ.get(REDIS_ENV):
            values["redis"] = os.environ[REDIS_ENV]
        values.update(overrides)
        config = cls(**values)
        if config.executor not in ("local", "celery"):
            raise StackError(f"{EXECUTOR_ENV}={config.executor!r}: use local or celery")
        return config

    @property
    def components(self) -> tuple[str, ...]:
        """The Airflow processes: the four services, and the Celery workers with that executor."""
        workers = tuple(f"celery-{name}" for name in self.celery_workers) if self.executor == "celery" else ()
        return (*AIRFLOW_COMPONENTS, *workers)

    @property
    def state_dir(self) -> Path:
        return self.home / "stack"

    @property
    def airflow_db(self) -> str:
        return f"{self.database_prefix}_airflow"

    @property
    def mlflow_db(self) -> str:
        return f"{self.database_prefix}_mlflow"

    def sqlalchemy_url(self, database: str) -> str:
        return self.postgres.replace("postgresql://", "postgresql+psycopg2://", 1) + f"/{database}"

    @property
    def airflow_url(self) -> str:
        return f"http://{self.host}:{self.airflow_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def serving_url(self) -> str:
        return f"http://{self.host}:{self.serving_port}"

    @property
    def spark_master(self) -> str:
        return f"spark://{self.host}:{self.spark_port}"

    @property
    def spark_ui_url(self) -> str:
        return f"http://{self.host}:{self.spark_ui_port}"


def admin_password(config: StackConfig) -> str:
    return json.loads((config.state_dir / "passwords.json").read_text())[config.username]


def secret_paths(config: StackConfig) -> dict[str, Path]:
    """The Airflow options the stack generates a secret for, and the file (0600, in the 0700 state
    folder) that keeps each."""
    state = config.state_dir
    return {
        "AIRFLOW__CORE__FERNET_KEY": state / "fernet.key",
        "AIRFLOW__API_AUTH__JWT_SECRET": state / "jwt.secret",
        "AIRFLOW__API__SECRET_KEY": state / "api.secret",
    }


def _write_secrets(config: StackConfig, renew_weak: bool = False) -> dict[str, str]:
    """Each generated secret's value, made on the first start and the same on every later one.

    A signing secret shorter than HS512's 64 bytes (a stack started by an older version made 43
    characters) is made again only with ``renew_weak``: ``up`` asks for it when no service runs,
    since a running api-server would reject the tokens a new secret signs.
    """
    files = secret_paths(config)
    keys = {
        "AIRFLOW__CORE__FERNET_KEY": secret_files.ensure_secret(
            files["AIRFLOW__CORE__FERNET_KEY"], _fernet_key
        )
    }
    for name in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        keys[name] = secret_files.ensure_secret(
            files[name],
            secret_files.signing_key,
            min_length=secret_files.MIN_SIGNING_KEY_BYTES,
            renew_weak=renew_weak,
        )
    secret_files.ensure_password_file(config.state_dir / "passwords.json", [config.username])
    return keys


def _fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()


def stack_env(
    config: StackConfig, base: dict[str, str] | None = None, renew_weak_secrets: bool = False
) -> dict[str, str]:
    """The environment of every stack process (and of ``airflow`` commands run against it)."""
    keys = _write_secrets(config, renew_weak=renew_weak_secrets)
    state = config.state_dir
    base = dict(os.environ if base is None else base)
    # The stack decides where MLflow is (the connection), not a URI left in the caller's shell.
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        base.pop(name, None)
    # The stack's secrets, not the embedded state's (embedded_env generates those only when unset).
    base.update(keys)
    env = embedded_env(config.home, base=base)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(
        {
            HOME_ENV: str(config.home),
            "AIRFLOW_HOME": str(state / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(state / "logs" / "tasks"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": config.sqlalchemy_url(config.airflow_db),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor" if config.executor == "celery" else "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(config.parallelism),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__API__HOST": config.host,
            "AIRFLOW__API__PORT": str(config.airflow_port),
            "AIRFLOW__API__BASE_URL": config.airflow_url,
            **keys,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{config.airflow_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{config.username}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(state / "passwords.json"),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                {"conn_type": "spark", "host": f"spark://{config.host}", "port": config.spark_port}
            ),
            # "generic": no HTTP provider is installed; the schema says http (see mlflow_connection).
            "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
                {"conn_type": "generic", "host": config.host, "port": config.mlflow_port, "schema": "http"}
            ),
            # Experiments keep artifacts behind the server (--artifacts-destination), as in compose.
            "SPARKTUNE_MLFLOW_ARTIFACTS": "mlflow-artifacts:/sparktune",
            "SPARKTUNE_SPARK_UI_URL": config.spark_ui_url,
            "SPARK_HOME": spark_home(),
            # Spark's RPC, block manager and web UIs (master, worker, each driver) bind here.
            "SPARK_LOCAL_IP": config.host,
            "SPARK_LOG_DIR": str(state / "logs"),
            **MLFLOW_SERVER_ENV,
        }
    )
    if config.executor == "celery":
        env.update(
            {
                "AIRFLOW__CELERY__BROKER_URL": config.redis,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + config.sqlalchemy_url(config.airflow_db),
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(config.celery_concurrency),
                # The workers import MLflow once, not every task (sparktune_airflow.core.celery_worker).
                "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": CELERY_CONFIG_OPTIONS,
            }
        )
    env.update(config.extra_env)
    return env


def spark_home() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent)


def spark_commands(config: StackConfig) -> dict[str, list[str]]:
    """The standalone master and one worker, as ``spark-class`` runs them on any cluster."""
    spark_class = str(Path(spark_home()) / "bin" / "spark-class")
    return {
        "spark-master": [
            spark_class, "org.apache.spark.deploy.master.Master",
            "--host", config.host, "--port", str(config.spark_port),
            "--webui-port", str(config.spark_ui_port),
        ],
        "spark-worker": [
            spark_class, "org.apache.spark.deploy.worker.Worker", config.spark_master,
            "--host", config.host, "--cores", str(config.worker_cores),
            "--memory", config.worker_memory, "--webui-port", str(config.spark_worker_ui_port),
            "--work-dir", str(config.state_dir / "spark-work"),
        ],
    }  # fmt: skip


def mlflow_command(config: StackConfig) -> list[str]:
    """The MLflow server on its PostgreSQL database, serving artifacts from the state folder."""
    return [
        str(Path(sys.executable).parent / "mlflow"), "server",
        "--backend-store-uri", config.sqlalchemy_url(config.mlflow_db),
        "--artifacts-destination", str(config.state_dir / "mlflow-artifacts"),
        "--host", config.host, "--port", str(config.mlflow_port), "--workers", "1",
    ]  # fmt: skip


def serving_command(config: StackConfig) -> list[str]:
    """make serve's server over the stack's MLflow: the champion online, every answer captured to the lake."""
    return [
        sys.executable, "-m", "sparktune.serve",
        "--host", config.host, "--port", str(config.serving_port), "--tracking-uri", config.mlflow_url,
    ]  # fmt: skip


def _commands(config: StackConfig) -> dict[str, list[str]]:
    commands = {
        "mlflow": mlflow_command(config),
        "serving": serving_command(config),
        **spark_commands(config),
    }
    for component in AIRFLOW_COMPONENTS:
        commands[component] = [sys.executable, "-m", "airflow", component]
    # Task logs are files on this machine that the api-server reads itself; Airflow's log servers
    # would listen on every interface (they have no host setting), so they stay off.
    for component in ("scheduler", "triggerer"):
        commands[component].append("--skip-serve-logs")
    if config.executor == "celery":
        for name in config.celery_workers:
            commands[f"celery-{name}"] = _own_host(name, [
                sys.executable, "-m", "airflow", "celery", "worker",
                "--celery-hostname", f"{name}@%h", "--skip-serve-logs",
            ])  # fmt: skip
    return commands


def _own_host(name: str, command: list[str]) -> list[str]:
    """``command`` on a host name of its own (a UTS namespace), where this user may make one: each
    Celery worker then records its tasks and training processes under its own host, as on two
    machines. Otherwise the command as it is, on this machine's name."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return command
    return ["unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh", *command]


def ensure_databases(config: StackConfig) -> None:
    """Create the Airflow and MLflow databases on the PostgreSQL server when they are missing."""
    import psycopg2

    try:
        connection = psycopg2.connect(config.postgres + "/postgres", connect_timeout=10)
    except psycopg2.OperationalError as exc:
        raise StackError(
            f"cannot reach PostgreSQL at {config.postgres} ({str(exc).strip()}); start the server "
            f"or point {PG_ENV} at one (postgresql://user@host:port)"
        ) from exc
    connection.autocommit = True
    with connection.cursor() as cursor:  # not `with connection`: that opens a transaction
        for database in (config.airflow_db, config.mlflow_db):
            cursor.execute("select 1 from pg_database where datname = %s", (database,))
            if not cursor.fetchone():
                cursor.execute(f'create database "{database}"')
    connection.close()


def drop_databases(config: StackConfig) -> None:
    import psycopg2

    connection = psycopg2.connect(config.postgres + "/postgres", connect_timeout=10)
    connection.autocommit = True
    with connection.cursor() as cursor:
        for database in (config.airflow_db, config.mlflow_db):
            cursor.execute(f'drop database if exists "{database}" with (force)')
    connection.close()


def _pids_file(config: StackConfig) -> Path:
    return config.state_dir / "pids.json"


def _read_pids(config: StackConfig) -> dict[str, int]:
    path = _pids_file(config)
    return json.loads(path.read_text()) if path.exists() else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by the parent that started it) is not a running service.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _log(config: StackConfig, name: str) -> Path:
    return config.state_dir / "logs" / f"{name}.log"


def _start(config: StackConfig, name: str, command: list[str], env: dict[str, str]) -> int:
    log_path = _log(config, name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # Its own session: `down` stops the whole group (uvicorn workers, task supervisors, JVMs).
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=config.home
        )
    return process.pid


def _get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.load(reply)


def _health(config: StackConfig) -> dict[str, bool]:
    """Each service's own health endpoint, as the compose healthchecks ask them."""
    status: dict[str, bool] = {}
    try:
        airflow = _get_json(f"{config.airflow_url}/api/v2/monitor/health")
        status["api-server"] = airflow["metadatabase"]["status"] == "healthy"
        status["scheduler"] = airflow["scheduler"]["status"] == "healthy"
        status["dag-processor"] = (airflow.get("dag_processor") or {}).get("status") == "healthy"
        status["triggerer"] = airflow["triggerer"]["status"] == "healthy"
    except (OSError, ValueError, KeyError):
        status.update(dict.fromkeys(AIRFLOW_COMPONENTS, False))
    try:
        with urllib.request.urlopen(f"{config.mlflow_url}/health", timeout=5) as reply:
            status["mlflow"] = reply.status == 200
    except OSError:
        status["mlflow"] = False
    # Up is enough: /ping answers 503 until a version holds the champion alias, which a fresh
    # stack has not (the answer's error code says the server is there and waiting for one).
    try:
        with urllib.request.urlopen(f"{config.serving_url}/ping", timeout=5) as reply:
            status["serving"] = reply.status == 200
    except urllib.error.HTTPError as exc:
        status["serving"] = exc.code == 503 and b"TEMPORARILY_UNAVAILABLE" in exc.read()
    except OSError:
        status["serving"] = False
    try:
        master = _get_json(f"{config.spark_ui_url}/json/")
        status["spark-master"] = master.get("status") == "ALIVE"
        status["spark-worker"] = master.get("aliveworkers", 0) >= 1
    except (OSError, ValueError):
        status["spark-master"] = status["spark-worker"] = False
    if config.executor == "celery":
        status.update(_celery_workers_answering(config))
    return status


def _celery_workers_answering(config: StackConfig) -> dict[str, bool]:
    """Which workers answer a ping over the broker (compose's healthcheck: ``celery inspect ping``)."""
    from celery import Celery

    app = Celery(broker=config.redis)
    try:
        replies = app.control.ping(timeout=1.0) or []
    except OSError:
        replies = []
    finally:
        app.close()
    nodes = {node for reply in replies for node in reply}
    return {
        f"celery-{name}": any(node.startswith(f"{name}@") for node in nodes) for name in config.celery_workers
    }


def wait_healthy(config: StackConfig, timeout: float = 240) -> dict[str, bool]:
    deadline = time.monotonic() + timeout
    pids = _read_pids(config)
    while True:
        status = _health(config)
        if all(status.values()):
            return status
        dead = [name for name, pid in pids.items() if not _alive(pid)]
        if dead or time.monotonic() > deadline:
            unhealthy = [name for name, ok in status.items() if not ok]
            logs = ", ".join(str(_log(config, name)) for name in (dead or unhealthy))
            reason = (
                f"exited: {', '.join(dead)}" if dead else f"not healthy after {timeout:.0f} s: {unhealthy}"
            )
            raise StackError(f"the stack did not come up ({reason}); see {logs}")
        time.sleep(2)


def up(config: StackConfig, timeout: float = 240, base: dict[str, str] | None = None) -> dict[str, Any]:
    """Start every service that is not running yet and wait until all are healthy; ``base`` is
    the environment the services start from (default: this process's)."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    ensure_databases(config)
    pids = {name: pid for name, pid in _read_pids(config).items() if _alive(pid)}
    env = stack_env(config, base, renew_weak_secrets=not pids)
    (config.state_dir / "airflow").mkdir(exist_ok=True)
    (config.state_dir / "mlflow-artifacts").mkdir(exist_ok=True)
    if not pids:
        migrate = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True
        )
        if migrate.returncode != 0:
            output = migrate.stdout[-3000:] + migrate.stderr[-3000:]
            raise StackError(f"airflow db migrate failed on {config.airflow_db}:\n{output}")
    commands = _commands(config)
    # Spark and MLflow first: the Airflow processes' health does not depend on them, the DAGs do.
    for name in ("spark-master", "spark-worker", "mlflow", "serving", *config.components):
        if name not in pids:
            pids[name] = _start(config, name, commands[name], env)
            _pids_file(config).write_text(json.dumps(pids, indent=2))
    wait_healthy(config, timeout)
    info = describe(config)
    (config.state_dir / "stack.json").write_text(json.dumps(info, indent=2))
    return info


def describe(config: StackConfig) -> dict[str, Any]:
    return {
        "airflow": config.airflow_url,
        "mlflow": config.mlflow_url,
        "serving": config.serving_url,
        "spark_master": config.spark_master,
        "spark_ui": config.spark_ui_url,
        "username": config.username,
        "password_file": str(config.state_dir / "passwords.json"),
        "logs": str(config.state_dir / "logs"),
        "databases": [config.airflow_db, config.mlflow_db],
        "config": {k: str(v) for k, v in asdict(config).items() if k != "extra_env"},
    }


def down(config: StackConfig, purge: bool = False, timeout: float = 60) -> list[str]:
    """Stop the stack's processes (SIGTERM to each group, SIGKILL after ``timeout``)."""
    pids = _read_pids(config)
    stopped = []
    # Airflow first, so no task is started against a server that is going away.
    order = [*config.components, "serving", "mlflow", "spark-worker", "spark-master"]
    for name in sorted(pids, key=lambda n: order.index(n) if n in order else len(order)):
        pid = pids[name]
        if not _alive(pid):
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        stopped.append(name)
    deadline = time.monotonic() + timeout
    for name in stopped:
        while _alive(pids[name]) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(pids[name]):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pids[name], signal.SIGKILL)
    _pids_file(config).unlink(missing_ok=True)
    if purge:
        drop_databases(config)
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparktune_dev.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="start the stack (idempotent) and wait until every service is healthy")
    start.add_argument("--timeout", type=float, default=240)
    stop = sub.add_parser("down", help="stop every process of the stack")
    stop.add_argument("--purge", action="store_true", help="also drop the Airflow and MLflow databases")
    sub.add_parser("status", help="health of every service")
    sub.add_parser("env", help="shell exports for airflow commands against the stack")
    args = parser.parse_args(argv)
    home = Path(os.environ.get(HOME_ENV, ".local")).expanduser().resolve()
    config = StackConfig.from_env(home)
    try:
        if args.command == "up":
            info = up(config, args.timeout)
            print(
                f"stack up: Airflow {info['airflow']} (user {info['username']}, password in "
                f"{info['password_file']}), MLflow {info['mlflow']}, Spark {info['spark_master']} "
                f"(UI {info['spark_ui']}); logs in {info['logs']}"
            )
        elif args.command == "down":
            stopped = down(config, purge=args.purge)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        elif args.command == "status":
            status = _health(config)
            for name, ok in status.items():
                print(f"{name:14} {'healthy' if ok else 'DOWN'}")
            return 0 if all(status.values()) else 1
        else:
            # The generated secrets as _CMD variables that read their files: never on the terminal.
            prefixes = ("AIRFLOW", "SPARKTUNE", "MLFLOW", "PYSPARK", "SPARK_")
            print("\n".join(secret_files.shell_exports(stack_env(config), prefixes, secret_paths(config))))
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
