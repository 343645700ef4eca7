"""The HTTP server: MLflow's scoring protocol over the champion, micro-batched, every answer captured.

Endpoints (those of ``mlflow models serve``, plus one for the pipeline):

- ``POST /invocations``: texts in any of MLflow's request formats (:mod:`.protocol`); the answer is
  ``{"predictions": [{"id", "prediction", "score", "model_name", "model_version"}, ...],
  "request_id"}``, one object per text, in order; ``id`` (``<request_id>:<row>``) is what a
  reviewer corrects the answer by (``record_corrections`` reads the capture table). A client's
  mistake is a 4xx saying what to send; no model to answer with is a 503 saying how to get one.
  When ``max_queued_requests`` requests already wait for the model, the next is a 503 at once with
  ``Retry-After`` (seconds) and a body saying why and what to do: the queue never grows past it.
- ``GET /ping``, ``GET /health``: 200 once a model is loaded, else 503 with the reason (a
  readiness probe); ``/health`` also reports the batching and capture counters.
- ``GET /version``: the MLflow version, as MLflow's server answers.
- ``POST /admin/reload`` (loopback clients only): look at the alias now instead of at the next
  poll, e.g. from the DAG task that just moved it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from sparktune.serve.batching import BatcherStopped, MicroBatcher, QueueFull, predict_in_length_groups
from sparktune.serve.capture import CaptureWriter
from sparktune.serve.champion import ChampionWatcher, NoModelError
from sparktune.serve.feedback import captured_row_id
from sparktune.serve.protocol import (
    BadRequest,
    RequestLimits,
    body_too_large,
    error_body,
    parse_texts,
    predictions_body,
)
from sparktune.serve.settings import ServingSettings, env_name

log = logging.getLogger(__name__)

JSON = "application/json"
REQUEST_ID_HEADER = "X-Request-ID"
# A caller's own request id is kept when it is a plain token; anything else gets one of ours.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_LOOPBACK = ("127.", "::1", "::ffff:127.")


def _json(status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload), status_code=status, media_type=JSON, headers=headers)


def _error(status: int, error_code: str, message: str, request_id: str | None = None) -> Response:
    headers = {REQUEST_ID_HEADER: request_id} if request_id else None
    return Response(error_body(error_code, message), status_code=status, media_type=JSON, headers=headers)


def _queue_full(exc: QueueFull, request_id: str) -> Response:
    """503 with ``Retry-After``: the model is behind, this request was not queued (nor captured)."""
    message = (
        f"The server is at capacity: {exc.waiting} requests are already waiting for the model, the most "
        f"it queues ({env_name('max_queued_requests')}={exc.limit}). This request was not queued. Send it "
        f"again after {exc.retry_after_s} s (Retry-After), send fewer requests at once (several texts in "
        "one request are scored together), or add a replica behind the load balancer."
    )
    return _json(
        503,
        {"error_code": "RESOURCE_EXHAUSTED", "message": message, "retry_after_seconds": exc.retry_after_s},
        headers={"Retry-After": str(exc.retry_after_s), REQUEST_ID_HEADER: request_id},
    )


async def _read_body(request: Request, limits: RequestLimits) -> bytes:
    """The body, refused as soon as it is known to exceed ``max_body_bytes`` (before reading it all)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise body_too_large(int(declared), limits)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise body_too_large(size, limits)
        chunks.append(chunk)
    return b"".join(chunks)


async def _follow_alias(watcher: ChampionWatcher, poll_seconds: float) -> None:
    """Check the alias at once (the first load), then every ``poll_seconds``, off the event loop."""
    while True:
        # check() keeps registry and model faults to itself; anything else must not end the polling.
        try:
            await asyncio.to_thread(watcher.check)
        except Exception:
            log.exception(
                "Checking %s@%s failed; trying again in %s s", watcher.model_name, watcher.alias, poll_seconds
            )
        await asyncio.sleep(poll_seconds)


def create_app(config: ServingSettings, *, watcher: ChampionWatcher | None = None) -> FastAPI:
    """The server's app; models load and capture starts when it starts (its lifespan)."""
    watcher = watcher or ChampionWatcher(
        config.model_name,
        config.alias,
        config.resolved_tracking_uri(),
        config.resolved_download_dir(),
    )
    limits = RequestLimits(config.max_rows_per_request, config.max_text_chars, config.max_body_bytes)
    # The model is taken once per batch, in the worker thread: a swap lands between batches.
    batcher = MicroBatcher(
        lambda texts: predict_in_length_groups(
            watcher.require_current().predict, texts, config.max_length_ratio
        ),
        max_batch_rows=config.max_batch_rows,
        max_wait_s=config.max_wait_ms / 1000,
        max_queued_requests=config.max_queued_requests,
        workers=config.resolved_predict_workers(),
    )
    capture = (
        CaptureWriter(
            config.resolved_capture_uri(),
            flush_rows=config.capture_flush_rows,
            flush_seconds=config.capture_flush_seconds,
            max_pending_rows=config.capture_max_pending_rows,
        )
        if config.capture
        else None
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        if capture is not None:
            capture.start()
        poller = asyncio.create_task(_follow_alias(watcher, config.poll_seconds), name="sparktune-alias-poll")
        log.info(
            "Serving %s on http://%s:%s (alias polled every %s s, %d predict worker(s), captures %s)",
            config.model_uri,
            config.host,
            config.port,
            config.poll_seconds,
            batcher.workers,
            capture.root_uri if capture else "off",
        )
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await batcher.stop()
            if capture is not None:
                await asyncio.to_thread(capture.close)
                log.info("Capture closed: %s", capture.stats.to_summary())

    app = FastAPI(
        title="sparktune serving",
        description=f"{config.model_uri} over MLflow's scoring protocol",
        lifespan=lifespan,
    )
    app.state.settings, app.state.watcher, app.state.batcher, app.state.capture = (
        config,
        watcher,
        batcher,
        capture,
    )

    def readiness() -> Response:
        model = watcher.current
        if model is None:
            return _error(503, "TEMPORARILY_UNAVAILABLE", watcher.unavailable_message())
        return _json(200, {"status": "ok", "model_name": model.name, "model_version": model.version})

    @app.get("/ping")
    async def ping() -> Response:
        return readiness()

    @app.get("/health")
    async def health() -> Response:
        ready = readiness()
        if ready.status_code != 200:
            return ready
        model = watcher.current
        assert model is not None
        return _json(
            200,
            {
                "status": "ok",
                "model_name": model.name,
                "model_version": model.version,
                "alias": watcher.alias,
                "loaded_at": model.loaded_at.isoformat(),
                "load_seconds": round(model.load_seconds, 3),
                "last_checked_at": watcher.last_checked_at.isoformat() if watcher.last_checked_at else None,
                "last_error": watcher.last_error,
                "batching": {
                    **batcher.stats.to_summary(),
                    "queued_requests": batcher.queued_requests,
                    "max_queued_requests": batcher.max_queued_requests,
                    "predict_workers": batcher.workers,
                },
                "capture": capture.stats.to_summary() if capture else None,
            },
        )

    @app.get("/version")
    async def version() -> Response:
        from mlflow.version import VERSION

        return Response(VERSION, media_type=JSON)

    @app.post("/admin/reload")
    async def reload(request: Request) -> Response:
        client = request.client.host if request.client else ""
        if not client.startswith(_LOOPBACK):
            return _error(
                403,
                "PERMISSION_DENIED",
                f"/admin/reload answers loopback clients only, not {client}: call it on the server's host.",
            )
        check = await asyncio.to_thread(watcher.check, force=True)
        served = watcher.current.version if watcher.current else None
        payload = {
            "model_name": watcher.model_name,
            "alias": watcher.alias,
            "alias_version": check.version,
            "serving_version": served,
            "previous_version": check.previous_version,
            "changed": check.changed,
        }
        if check.version is None or served != check.version:
            return _json(503, {**payload, "error_code": "TEMPORARILY_UNAVAILABLE", "message": check.error})
        return _json(200, payload)

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        started = time.perf_counter()
        requested_at = datetime.now(UTC)
        given = request.headers.get(REQUEST_ID_HEADER)
        request_id = given if given and _REQUEST_ID.match(given) else uuid.uuid4().hex
        try:
            body = await _read_body(request, limits)
            texts = parse_texts(body, request.headers.get("content-type"), limits)
        except BadRequest as exc:
            return _error(exc.status, exc.error_code, str(exc), request_id)
        if watcher.current is None:
            return _error(503, "TEMPORARILY_UNAVAILABLE", watcher.unavailable_message(), request_id)
        try:
            scored = await batcher.submit(texts)
        except QueueFull as exc:
            return _queue_full(exc, request_id)
        except (NoModelError, BatcherStopped) as exc:
            return _error(503, "TEMPORARILY_UNAVAILABLE", str(exc), request_id)
        except Exception as exc:  # the model failed: the server's fault, never the client's
            log.exception("predict failed for request %s", request_id)
            return _error(
                500,
                "INTERNAL_ERROR",
                f"The model failed on this request ({type(exc).__name__}: {exc}); the server log has "
                f"the traceback under request id {request_id}.",
                request_id,
            )
        latency_ms = (time.perf_counter() - started) * 1000
        if capture is not None:
            capture.add(
                request_id,
                texts,
                scored.predictions,
                scored.scores,
                scored.model_name,
                scored.model_version,
                latency_ms,
                requested_at,
            )
        rows = [
            {
                # What a reviewer corrects this answer by (record_corrections reads the capture).
                "id": captured_row_id(request_id, row),
                "prediction": prediction,
                "score": score,
                "model_name": scored.model_name,
                "model_version": scored.model_version,
            }
            for row, (prediction, score) in enumerate(zip(scored.predictions, scored.scores, strict=True))
        ]
        return Response(
            predictions_body(rows, request_id), media_type=JSON, headers={REQUEST_ID_HEADER: request_id}
        )

    return app
