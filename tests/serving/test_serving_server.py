"""The server over real HTTP: uvicorn serving a registered keyword-rule pyfunc from a SQLite registry."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pyarrow.parquet as pq

try:
    from tests.serving.serving_harness import expected_label, running_server
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    from serving_harness import expected_label, running_server

TEXTS = ["I want a refund for the order", "forgot my password again", "the parcel is late", "hello there"]


def _rows_captured(root: Path) -> list[dict]:
    files = sorted(root.glob("date=*/part-*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def _check_answer(response: httpx.Response, texts: list[str], version: str = "1", name: str = "") -> None:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["request_id"] == response.headers["X-Request-ID"]
    assert [p["prediction"] for p in body["predictions"]] == [expected_label(t) for t in texts]
    for row in body["predictions"]:
        assert set(row) == {"id", "prediction", "score", "model_name", "model_version"}
        assert row["model_version"] == version and 0.0 <= row["score"] <= 1.0
        assert row["id"] == f"{body['request_id']}:{body['predictions'].index(row)}"
        if name:
            assert row["model_name"] == name


def test_every_mlflow_request_format_gets_one_answer_per_text(registry, serving_config):
    name = registry.register("serving-formats")
    texts = TEXTS
    bodies = {
        "dataframe_split": {"dataframe_split": {"columns": ["text"], "data": [[t] for t in texts]}},
        "dataframe_split with index and another column": {
            "dataframe_split": {
                "index": [0, 1, 2, 3],
                "columns": ["id", "text"],
                "data": [[i, t] for i, t in enumerate(texts)],
            }
        },
        "dataframe_records": {"dataframe_records": [{"text": t, "id": i} for i, t in enumerate(texts)]},
        "inputs as a list": {"inputs": texts},
        "inputs as columns": {"inputs": {"text": texts}},
        "instances as records": {"instances": [{"text": t} for t in texts]},
        "instances as a list": {"instances": texts},
    }
    with running_server(serving_config(name)) as served:
        served.wait_ready()
        for label, body in bodies.items():
            response = httpx.post(f"{served.url}/invocations", json=body)
            try:
                _check_answer(response, texts, name=name)
            except AssertionError as exc:
                raise AssertionError(f"{label}: {exc}") from exc
        one = httpx.post(f"{served.url}/invocations", json={"inputs": "my refund?"})
        _check_answer(one, ["my refund?"])
        csv_body = 'id,text\n1,I want a refund\n2,"late, again"\n'
        response = httpx.post(
            f"{served.url}/invocations", content=csv_body, headers={"Content-Type": "text/csv; charset=utf-8"}
        )
        _check_answer(response, ["I want a refund", "late, again"])
        own_id = httpx.post(
            f"{served.url}/invocations", json={"inputs": ["refund"]}, headers={"X-Request-ID": "req-42"}
        )
        assert own_id.json()["request_id"] == "req-42"

        # MLflow's own scoring client, as a notebook or spark_udf user would call the server.
        import pandas as pd
        from mlflow.pyfunc.scoring_server.client import ScoringServerClient

        host, port = served.url.removeprefix("http://").split(":")
        client = ScoringServerClient(host, int(port))
        client.wait_server_ready(timeout=10)
        answer = client.invoke(pd.DataFrame({"text": texts})).get_predictions()
        assert answer["prediction"].tolist() == [expected_label(t) for t in texts]
        assert client.get_version() == httpx.get(f"{served.url}/version").text

        health = httpx.get(f"{served.url}/health").json()
        assert (
            health["model_name"] == name and health["model_version"] == "1" and health["alias"] == "champion"
        )


BAD_REQUESTS = {
    "empty body": (b"", "application/json", 400, "body is empty"),
    "invalid JSON": (b'{"inputs": [', "application/json", 400, "not valid JSON"),
    "a JSON list": (b'["refund"]', "application/json", 400, '{"inputs": [...]}'),
    "no format field": (b'{"texts": ["refund"]}', "application/json", 400, "exactly one of the fields"),
    "two format fields": (b'{"inputs": ["a"], "instances": ["b"]}', "application/json", 400, "exactly one"),
    "params": (b'{"inputs": ["a"], "params": {"t": 1}}', "application/json", 400, "takes no params"),
    "no text column": (
        b'{"dataframe_split": {"columns": ["body"], "data": [["refund"]]}}',
        "application/json",
        400,
        'none named "text"',
    ),
    "record without text": (b'{"dataframe_records": [{"body": "x"}]}', "application/json", 400, 'no "text"'),
    "no texts": (b'{"inputs": []}', "application/json", 400, "holds no texts"),
    "a number": (b'{"inputs": ["refund", 5]}', "application/json", 400, 'row 1: "text" must be a string'),
    "a null": (b'{"dataframe_records": [{"text": null}]}', "application/json", 400, "got null"),
    "an empty text": (b'{"inputs": ["refund", "  "]}', "application/json", 400, 'row 1: "text" is empty'),
    "a ragged row": (
        b'{"dataframe_split": {"columns": ["id", "text"], "data": [[1]]}}',
        "application/json",
        400,
        "row 0 has a list of 1",
    ),
    "a text too long": (
        json.dumps({"inputs": ["x" * 101]}).encode(),
        "application/json",
        413,
        "more than the limit of 100 (SPARKTUNE_SERVING_MAX_TEXT_CHARS)",
    ),
    "too many texts": (
        json.dumps({"inputs": ["refund"] * 6}).encode(),
        "application/json",
        413,
        "more than the limit of 5 per request",
    ),
    "a body too large": (
        json.dumps({"inputs": ["refund " * 12] * 5}).encode(),
        "application/json",
        413,
        "SPARKTUNE_SERVING_MAX_BODY_BYTES",
    ),
    "a form post": (
        b"text=refund",
        "application/x-www-form-urlencoded",
        415,
        "Content-Type: application/json",
    ),
    "latin-1": (b'{"inputs": ["a"]}', "application/json; charset=latin-1", 415, "Only UTF-8"),
    "CSV without a text header": (b"body\nrefund\n", "text/csv", 400, "no 'text' column"),
    "not UTF-8": (b'{"inputs": ["\xff"]}', "application/json", 400, "not UTF-8"),
}


def test_a_bad_request_gets_a_4xx_saying_what_to_send_and_captures_nothing(
    registry, serving_config, tmp_path
):
    name = registry.register("serving-bad-requests")
    config = serving_config(name, max_text_chars=100, max_rows_per_request=5, max_body_bytes=300)
    with running_server(config) as served:
        served.wait_ready()
        for label, (body, content_type, status, says) in BAD_REQUESTS.items():
            response = httpx.post(
                f"{served.url}/invocations", content=body, headers={"Content-Type": content_type}
            )
            assert response.status_code == status, f"{label}: {response.status_code} {response.text}"
            error = response.json()
            assert says in error["message"], f"{label}: {error['message']}"
            assert error["error_code"] and response.headers["X-Request-ID"]
        listed = httpx.post(f"{served.url}/invocations", json={"inputs": [1, "", None, "ok"]}).json()[
            "message"
        ]
        assert (
            listed.startswith("3 of 4 rows cannot be scored: row 0")
            and "row 1" in listed
            and "row 2" in listed
        )
        assert httpx.get(f"{served.url}/invocations").status_code == 405
        stats = served.app.state.batcher.stats
        assert stats.batches == 0  # no bad request reached the model
    assert not list((tmp_path / "captures").rglob("*.parquet"))


def test_no_champion_is_a_503_saying_to_promote_until_one_is_promoted(registry, serving_config):
    name = registry.register("serving-unpromoted", champion=None)
    with running_server(serving_config(name)) as served:
        deadline = time.monotonic() + 10
        while served.app.state.watcher.last_checked_at is None and time.monotonic() < deadline:
            time.sleep(0.02)
        for path in ("/ping", "/health"):
            response = httpx.get(f"{served.url}{path}")
            assert response.status_code == 503
            assert "promote one" in response.json()["message"]
        response = httpx.post(f"{served.url}/invocations", json={"inputs": ["refund"]})
        assert response.status_code == 503
        message = response.json()["message"]
        assert f"no version of {name!r} with the alias 'champion'" in message
        assert "set_registered_model_alias" in message and "POST /admin/reload" in message

        refused = httpx.post(f"{served.url}/admin/reload")
        assert refused.status_code == 503 and refused.json()["serving_version"] is None

        registry.client().set_registered_model_alias(name, "champion", "2")
        reloaded = httpx.post(f"{served.url}/admin/reload")
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json() | {"previous_version": None} == {
            "model_name": name,
            "alias": "champion",
            "alias_version": "2",
            "serving_version": "2",
            "previous_version": None,
            "changed": True,
        }
        _check_answer(httpx.post(f"{served.url}/invocations", json={"inputs": ["refund"]}), ["refund"], "2")


def test_concurrent_requests_share_batches_and_each_gets_its_own_answers(registry, serving_config):
    name = registry.register("serving-batching")
    # Each request a different number of texts in a different order: a mixed-up slice would show.
    requests = [[TEXTS[(i + j) % len(TEXTS)] + f" #{i}" for j in range(1 + i % 3)] for i in range(24)]

    async def send_all(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(client.post(f"{url}/invocations", json={"inputs": texts}) for texts in requests)
            )

    with running_server(serving_config(name, max_batch_rows=64, max_wait_ms=20)) as served:
        served.wait_ready()
        responses = asyncio.run(send_all(served.url))
        stats = served.app.state.batcher.stats
    for texts, response in zip(requests, responses, strict=True):
        _check_answer(response, texts)
    assert stats.requests == len(requests) and stats.rows == sum(map(len, requests))
    # The model sleeps 20 ms per call: 24 calls would be one per request; batching makes a few.
    assert stats.batches <= len(requests) // 3, stats
    assert stats.largest_batch_rows > 3


def test_a_full_queue_is_a_503_with_retry_after_and_the_queued_requests_are_answered(
    registry, serving_config, tmp_path
):
    """A model held in predict by a gate: one request being predicted, two waiting (the most the
    queue holds), and the next gets a 503 at once with Retry-After, a body saying why and what to
    do, and nothing captured; once the model goes on, the three are answered."""
    from sparktune.serve.champion import ChampionWatcher, load_version

    name = registry.register("serving-queue-full")
    gate, entered = threading.Event(), threading.Event()

    class Gated:
        def __init__(self, model) -> None:
            self.model = model

        def predict(self, frame):
            entered.set()
            assert gate.wait(30), "the test never opened the gate"
            return self.model.predict(frame)

    config = serving_config(name, max_batch_rows=1, max_wait_ms=0, max_queued_requests=2, predict_workers=1)
    watcher = ChampionWatcher(
        name,
        "champion",
        registry.tracking_uri,
        tmp_path / "downloads",
        loader=lambda *args: Gated(load_version(*args)),
    )

    async def until(condition) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)

    async def overload(url: str, batcher):
        async with httpx.AsyncClient(timeout=30) as client:

            def post(text: str):
                return client.post(f"{url}/invocations", json={"inputs": [text]})

            first = asyncio.create_task(post(TEXTS[0]))
            await until(entered.is_set)
            waiting = [asyncio.create_task(post(text)) for text in TEXTS[1:3]]
            await until(lambda: batcher.queued_requests == 2)
            began = time.perf_counter()
            refused = await post(TEXTS[3])
            refused_after = time.perf_counter() - began
            health = (await client.get(f"{url}/health")).json()
            gate.set()
            return refused, refused_after, health, await asyncio.gather(first, *waiting)

    try:
        with running_server(config, watcher) as served:
            served.wait_ready()
            refused, refused_after, health, answered = asyncio.run(
                overload(served.url, served.app.state.batcher)
            )
    finally:
        gate.set()
    assert refused.status_code == 503 and refused_after < 2
    assert int(refused.headers["Retry-After"]) >= 1
    body = refused.json()
    assert body["error_code"] == "RESOURCE_EXHAUSTED"
    assert body["retry_after_seconds"] == int(refused.headers["Retry-After"])
    assert "2 requests are already waiting" in body["message"]
    assert "SPARKTUNE_SERVING_MAX_QUEUED_REQUESTS=2" in body["message"]
    assert f"Send it again after {body['retry_after_seconds']} s" in body["message"]
    assert refused.headers["X-Request-ID"]
    assert health["batching"]["rejected_requests"] == 1
    assert (health["batching"]["queued_requests"], health["batching"]["max_queued_requests"]) == (2, 2)
    for text, response in zip(TEXTS[:3], answered, strict=True):
        _check_answer(response, [text])
    captured = _rows_captured(tmp_path / "captures")
    assert sorted(r["text"] for r in captured) == sorted(TEXTS[:3])  # the refused text was not


def test_captures_land_in_the_lake_as_dated_parquet_with_every_answered_text(
    registry, serving_config, tmp_path
):
    name = registry.register("serving-capture")
    with running_server(serving_config(name, capture_flush_seconds=60)) as served:
        served.wait_ready()
        first = httpx.post(
            f"{served.url}/invocations", json={"inputs": TEXTS[:3]}, headers={"X-Request-ID": "a1"}
        )
        second = httpx.post(f"{served.url}/invocations", json={"instances": [TEXTS[3]]})
        httpx.post(f"{served.url}/invocations", json={"inputs": [3]})  # refused: not captured
        assert first.status_code == second.status_code == 200
    # Shutting down flushed the buffer (the 60 s timer never fired).
    root = tmp_path / "captures"
    files = list(root.rglob("*"))
    assert not [f for f in files if f.name.startswith(".")], "a hidden in-progress file was left behind"
    parts = sorted(root.glob("date=*/part-*.parquet"))
    assert parts and all(p.parent.name == f"date={time.strftime('%Y-%m-%d', time.gmtime())}" for p in parts)
    table = pq.read_table(parts[0])
    assert table.schema.names == [
        "request_id",
        "row",
        "text",
        "prediction",
        "score",
        "model_name",
        "model_version",
        "latency_ms",
        "requested_at",
    ]
    assert str(table.schema.field("requested_at").type) == "timestamp[us, tz=UTC]"
    rows = _rows_captured(root)
    assert [(r["request_id"], r["row"], r["text"]) for r in rows[:3]] == [
        ("a1", i, TEXTS[i]) for i in range(3)
    ]
    assert rows[3]["request_id"] == second.json()["request_id"] and len(rows) == 4
    for row in rows:
        assert row["prediction"] == expected_label(row["text"])
        assert row["model_name"] == name and row["model_version"] == "1" and row["latency_ms"] > 0


def test_the_champion_moves_under_load_without_a_failed_request(registry, serving_config, tmp_path):
    """A promotion found by the poll, then a rollback pushed by /admin/reload, with 6 clients sending
    requests all along: every request answered 200, by v1, then v2, then v1 again, and captured.
    v2 takes 0.5 s to load and each predict call 20 ms, so requests are in flight during both swaps."""
    name = registry.register("serving-switch")
    client = registry.client()
    results: list[tuple[float, int, str | None]] = []  # (time, status, version)
    stop = threading.Event()

    def keep_sending(worker: int) -> None:
        with httpx.Client(timeout=30) as http:
            i = 0
            while not stop.is_set():
                text = f"{TEXTS[i % len(TEXTS)]} from {worker}"
                try:
                    response = http.post(f"{served.url}/invocations", json={"inputs": [text]})
                    version = (
                        response.json()["predictions"][0]["model_version"] if response.is_success else None
                    )
                    if response.is_success:
                        assert response.json()["predictions"][0]["prediction"] == expected_label(text)
                    results.append((time.monotonic(), response.status_code, version))
                except Exception as exc:  # a dropped connection is a failed request too
                    results.append((time.monotonic(), -1, repr(exc)))
                i += 1

    # A poll every 3 s: the promotion waits for the next poll, the rollback (pushed) does not.
    with running_server(serving_config(name, poll_seconds=3)) as served:
        served.wait_ready()
        workers = [threading.Thread(target=keep_sending, args=(w,)) for w in range(6)]
        for worker in workers:
            worker.start()
        try:
            time.sleep(0.5)
            client.set_registered_model_alias(name, "champion", "2")  # promotion: the poll finds it
            deadline = time.monotonic() + 20
            while served.app.state.watcher.current.version != "2":
                assert time.monotonic() < deadline, "the poll never swapped in v2"
                time.sleep(0.02)
            promoted_at = time.monotonic()
            time.sleep(0.5)
            client.set_registered_model_alias(name, "champion", "1")  # rollback: pushed at once
            reload = httpx.post(f"{served.url}/admin/reload")
            rolled_back_at = time.monotonic()
            assert reload.status_code == 200 and reload.json()["changed"] is True, reload.text
            assert reload.json()["previous_version"] == "2" and reload.json()["serving_version"] == "1"
            time.sleep(0.5)
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
    failures = [r for r in results if r[1] != 200]
    assert not failures, f"{len(failures)} of {len(results)} requests failed: {failures[:5]}"
    versions = Counter(r[2] for r in results)
    assert set(versions) == {"1", "2"} and len(results) > 50, versions
    # Once a swap is done, no request is answered by the model it replaced.
    assert all(r[2] == "2" for r in results if promoted_at + 0.1 < r[0] < rolled_back_at - 0.1)
    assert all(r[2] == "1" for r in results if r[0] > rolled_back_at + 0.1)
    captured = Counter(r["model_version"] for r in _rows_captured(tmp_path / "captures"))
    assert captured == versions
