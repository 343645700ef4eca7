"""``python -m sparktune.serve``: settings from flags and variables, and the real process end to end."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pyarrow.parquet as pq
import pytest
from sparktune.serve.__main__ import main
from sparktune.serve.settings import ServingSettings, ServingSettingsError, settings_from_env


def test_variables_override_defaults_and_bad_values_name_their_variable():
    config = settings_from_env(
        {
            "SPARKTUNE_SERVING_PORT": "6001",
            "SPARKTUNE_SERVING_MAX_WAIT_MS": "0.5",
            "SPARKTUNE_SERVING_CAPTURE": "off",
            "SPARKTUNE_SERVING_MODEL_NAME": "tickets",
            "SPARKTUNE_SERVING_MAX_QUEUED_REQUESTS": "16",
            "SPARKTUNE_SERVING_TRACKING_URI": "  ",  # blank: the default
        }
    )
    assert config.max_queued_requests == 16 and ServingSettings().max_queued_requests == 256
    assert (config.port, config.max_wait_ms, config.capture, config.model_name) == (
        6001,
        0.5,
        False,
        "tickets",
    )
    assert config.tracking_uri is None and config.model_uri == "models:/tickets@champion"
    assert ServingSettings().model_name == "support-intent" and ServingSettings().port == 5001
    with pytest.raises(ServingSettingsError, match="SPARKTUNE_SERVING_PORT='http' is not a valid int"):
        settings_from_env({"SPARKTUNE_SERVING_PORT": "http"})
    with pytest.raises(ServingSettingsError) as info:
        ServingSettings(max_batch_rows=0, port=70000, alias=" ", max_queued_requests=0)
    message = str(info.value)
    assert "max_queued_requests (SPARKTUNE_SERVING_MAX_QUEUED_REQUESTS) must be > 0" in message
    assert "max_batch_rows (SPARKTUNE_SERVING_MAX_BATCH_ROWS) must be > 0" in message
    assert "port (SPARKTUNE_SERVING_PORT) must be 1-65535" in message and "alias" in message


def test_a_bad_setting_exits_2_with_the_message(monkeypatch, capsys):
    monkeypatch.setenv("SPARKTUNE_SERVING_MAX_TEXT_CHARS", "-1")
    assert main([]) == 2
    assert "max_text_chars (SPARKTUNE_SERVING_MAX_TEXT_CHARS) must be > 0" in capsys.readouterr().err


@pytest.mark.slow  # a server process of its own (5-25 s); the e2e prediction-path tests start one too
def test_the_module_serves_the_champion_and_flushes_captures_when_stopped(registry, tmp_path):
    name = registry.register("serving-process")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    captures = tmp_path / "captures"
    command = [
        sys.executable,
        "-m",
        "sparktune.serve",
        f"--port={port}",
        f"--model-name={name}",
        f"--tracking-uri={registry.tracking_uri}",
        f"--download-dir={tmp_path / 'downloads'}",
        f"--capture-uri={captures}",
        "--capture-flush-seconds=60",
    ]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        response = httpx.post(f"http://127.0.0.1:{port}/invocations", json={"inputs": ["refund please"]})
        body = response.json()
        assert body["predictions"][0] == {
            "id": f"{body['request_id']}:0",
            "prediction": "billing_refund",
            "score": 0.9,
            "model_name": name,
            "model_version": "1",
        }
    finally:
        process.send_signal(signal.SIGTERM)  # what a supervisor sends: a graceful stop
        code = process.wait(30)
    # uvicorn stops gracefully, then re-raises the signal so the exit status says what stopped it.
    assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in log.read_text(), (
        log.read_text()
    )
    rows = [r for p in captures.glob("date=*/part-*.parquet") for r in pq.read_table(p).to_pylist()]
    assert [(r["text"], r["prediction"]) for r in rows] == [("refund please", "billing_refund")]


def test_predict_workers_fill_the_cores_that_one_call_leaves_free(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert ServingSettings().predict_workers == 1
    auto = ServingSettings(predict_workers=0)
    assert auto.resolved_predict_workers({"OMP_NUM_THREADS": "1"}) == 4  # one torch thread a call
    assert auto.resolved_predict_workers({"OMP_NUM_THREADS": "2"}) == 2
    assert auto.resolved_predict_workers({}) == 1  # torch takes every core for one call
    assert auto.resolved_predict_workers({"OMP_NUM_THREADS": "8"}) == 1
    assert ServingSettings(predict_workers=3).resolved_predict_workers({"OMP_NUM_THREADS": "1"}) == 3
    with pytest.raises(ServingSettingsError, match=r"predict_workers \(SPARKTUNE_SERVING_PREDICT_WORKERS\)"):
        ServingSettings(predict_workers=-1)
