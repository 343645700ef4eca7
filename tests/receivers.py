"""Where the notification tests receive what the pipeline sends: a real SMTP server (aiosmtpd) and a
real HTTP server on 127.0.0.1, started by the test, and the Airflow connections that point at them."""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
import time
from collections.abc import Callable
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECIPIENTS = "ml-team@example.com,oncall@example.com"
SENDER = "sparktune@example.com"


def _wait(items: list, predicate: Callable[[Any], bool], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for item in list(items):
            if predicate(item):
                return item
        time.sleep(0.2)
    raise AssertionError(f"no {what} matched within {timeout:g} s; received: {items!r}")


class SmtpReceiver:
    """An SMTP server on 127.0.0.1 (aiosmtpd) that keeps every message it is sent."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
                receiver.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
                receiver.messages.append(
                    email.message_from_bytes(envelope.original_content, policy=email.policy.default)
                )
                return "250 OK"

        # A port picked here: the controller checks its server by connecting to the port it was given.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()

    def connection(self) -> str:
        """``AIRFLOW_CONN_...`` value of an SMTP connection to this server, recipients in its extra."""
        extra = {"from_email": SENDER, "to": RECIPIENTS, "disable_ssl": True, "disable_tls": True}
        return json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": self.port, "extra": extra})

    def wait_for(self, predicate: Callable[[EmailMessage], bool], timeout: float = 30) -> EmailMessage:
        return _wait(self.messages, predicate, timeout, "e-mail")


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that keeps the JSON body and headers of every POST."""

    def __init__(self, status: int = 200) -> None:
        self.payloads: list[dict] = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's hook name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.headers.append(dict(self.headers))
                receiver.payloads.append(json.loads(body))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # keep the test output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks/sparktune"

    def __enter__(self) -> WebhookReceiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def connection(self, token: str = "test-token") -> str:
        """``AIRFLOW_CONN_...`` value of an HTTP connection whose host is this URL; the extra's keys
        are headers (the HTTP provider's convention)."""
        return json.dumps(
            {"conn_type": "http", "host": self.url, "extra": {"Authorization": f"Bearer {token}"}}
        )

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float = 30) -> dict:
        return _wait(self.payloads, predicate, timeout, "webhook call")


def connection_env(smtp: SmtpReceiver, webhook: WebhookReceiver) -> dict[str, str]:
    """The environment that gives a process the two notification connections."""
    return {
        "AIRFLOW_CONN_SPARKTUNE_SMTP": smtp.connection(),
        "AIRFLOW_CONN_SPARKTUNE_WEBHOOK": webhook.connection(),
    }


def body_text(message: EmailMessage) -> str:
    """The text of an e-mail's (HTML) body."""
    part = message.get_body(preferencelist=("html", "plain"))
    return part.get_content() if part is not None else ""
