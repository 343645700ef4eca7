"""The serving tests' harness: the keyword model's labels, a registry of its versions, and a real
server (uvicorn in a thread of this process, on a port of its own)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

KEYWORD_MODEL = Path(__file__).with_name("keyword_model.py")
KEYWORDS = {"refund": "billing_refund", "password": "password_reset", "late": "shipping_delay"}
# v1 and v2 answer alike (the tests tell them apart by model_version); v2 loads slowly, so a swap
# to it overlaps the requests of the test that makes it.
V1_CONFIG = {"keywords": KEYWORDS, "default": "other", "predict_delay_s": 0.02}
V2_CONFIG = {"keywords": KEYWORDS, "default": "other", "predict_delay_s": 0.02, "load_delay_s": 0.5}


def expected_label(text: str) -> str:
    return next((label for key, label in KEYWORDS.items() if key in text.lower()), "other")


@dataclass(frozen=True)
class LoggedVersion:
    """A logged model that any number of registered names can take as a version."""

    artifact_location: str
    run_id: str
    model_id: str


@dataclass(frozen=True)
class Registry:
    tracking_uri: str
    root: Path
    v1: LoggedVersion
    v2: LoggedVersion

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    def register(self, name: str, *, champion: str | None = "1") -> str:
        """``name`` with v1 (V1_CONFIG) and v2 (V2_CONFIG); ``champion`` on that version (None: no alias)."""
        client = self.client()
        client.create_registered_model(name)
        for logged in (self.v1, self.v2):
            # The storage location, not models:/m-...: the registry resolves that one through
            # MLflow's global tracking URI, not this client's.
            client.create_model_version(
                name, source=logged.artifact_location, run_id=logged.run_id, model_id=logged.model_id
            )
        if champion:
            client.set_registered_model_alias(name, "champion", champion)
        return name


@dataclass
class Served:
    url: str
    app: object  # the FastAPI app: its state holds the watcher, batcher and capture writer

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ping = httpx.get(f"{self.url}/ping")
            if ping.status_code == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"the server at {self.url} loaded no model in {timeout} s: {ping.text}")


@contextlib.contextmanager
def running_server(config, watcher=None) -> Iterator[Served]:
    """``create_app(config, watcher=watcher)`` under uvicorn in a thread, on a socket bound before it
    starts (no port race); stopped as uvicorn stops on SIGTERM (graceful: its lifespan flushes the
    capture)."""
    import uvicorn
    from sparktune.serve.app import create_app

    app = create_app(config, watcher=watcher)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield Served(f"http://127.0.0.1:{port}", app)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop within 30 s"
