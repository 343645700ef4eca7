"""A small HTTP client for the stack's REST APIs (Airflow /api/v2, MLflow /api/2.0), stdlib only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class HTTPError(AssertionError):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


def request(method: str, url: str, body: Any = None, token: str | None = None) -> Any:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            payload = reply.read()
    except urllib.error.HTTPError as exc:
        raise HTTPError(exc.code, exc.read().decode(errors="replace")) from None
    return json.loads(payload) if payload else None
