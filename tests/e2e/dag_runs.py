"""Run one DAG with `airflow dags test` on embedded defaults in a SPARKTUNE_HOME of a test's own.

Goes through `python -m sparktune_dev.embedded run`, as `make run` does; the output is kept
beside the state as `dags-test-<n>.log` for a failing test to be read afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Variables the test session set for unit tests; the DAG run must get the embedded defaults instead.
SESSION_ONLY = ("AIRFLOW_HOME", "MLFLOW_TRACKING_URI", "SPARKTUNE_LAKE_URI")


def run_dag(home: Path, dag: str, conf: dict, *, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    env["SPARKTUNE_HOME"] = str(home)
    command = [sys.executable, "-m", "sparktune_dev.embedded", "run", "--dag", dag]
    result = subprocess.run(
        [*command, "--conf", json.dumps(conf)], env=env, capture_output=True, text=True, timeout=timeout
    )
    (home / f"dags-test-{len(list(home.glob('dags-test-*')))}.log").write_text(result.stdout + result.stderr)
    return result


def output_tail(result: subprocess.CompletedProcess, chars: int = 8000) -> str:
    """The end of a run's stdout and stderr, for an assertion message."""
    return result.stdout[-chars:] + result.stderr[-chars:]


# --- one prediction path: what evaluation scored is what every way of using the model answers ---


def evaluated_split(home: Path, model_name: str, folder: Path, version: str | None = None) -> dict:
    """The champion's (or ``version``'s) evaluation of its test split, row by row (its logged
    ``predictions.csv``), beside the split's texts: ``{"champion", "rows", "texts", "folder"}``."""
    import csv

    import datasets
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    if version is None:
        champion = client.get_model_version_by_alias(model_name, "champion")
    else:
        champion = client.get_model_version(model_name, version)
    local = client.download_artifacts(champion.run_id, "evaluation/predictions.csv", str(folder))
    with open(local, newline="") as handle:
        evaluated = {row["example_id"]: row for row in csv.DictReader(handle)}
    fingerprint = champion.tags["data_fingerprint"]
    test = datasets.load_from_disk(str(home / "lake" / "datasets" / fingerprint))["test"]
    texts = dict(zip(test["example_id"], test["text"], strict=True))
    assert set(evaluated) == set(texts)
    return {"champion": champion, "rows": evaluated, "texts": texts, "folder": Path(local).parent}


def assert_same_predictions(where: str, evaluated: dict, predictions: dict, scores: dict) -> None:
    """``predictions`` and ``scores`` (by example id) are evaluation's, row by row."""
    assert set(predictions) == set(evaluated), where
    differ = [i for i, row in evaluated.items() if predictions[i] != row["prediction"]]
    assert not differ, (
        f"{where}: {len(differ)} of {len(evaluated)} rows differ from evaluation, e.g. {differ[:3]}"
    )
    worst = max(abs(scores[i] - float(row["score"])) for i, row in evaluated.items())
    assert worst < 1e-4, f"{where}: scores differ from evaluation's by up to {worst:.2g}"


def pyfunc_answers(home: Path, model_uri: str, texts: list[str]) -> dict:
    """``mlflow.pyfunc.load_model(model_uri).predict(texts)`` against the home's store, MLflow's
    global tracking URI left as it was."""
    import mlflow
    from sparktune.model.process_setup import using_tracking_uri

    with using_tracking_uri(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"):  # models:/ reads the globals
        return mlflow.pyfunc.load_model(model_uri).predict(texts)


def served_answers(home: Path, texts: list[str], captures: Path, *, model_name: str = "") -> list[dict]:
    """make serve's server over the champion (``model_name``: another registered model), sent
    ``texts`` over HTTP in requests of 16; its answers, in order. The server stops gracefully, which
    writes its buffered captures under ``captures``."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}
    env["SPARKTUNE_HOME"] = str(home)
    log = home / "serving.log"
    command = [sys.executable, "-m", "sparktune.serve", f"--port={port}", f"--capture-uri={captures}"]
    command.append(f"--tracking-uri=sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    if model_name:
        command.append(f"--model-name={model_name}")
    with log.open("w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    answers: list[dict] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        for begin in range(0, len(texts), 16):
            rows = [[text] for text in texts[begin : begin + 16]]
            body = json.dumps({"dataframe_split": {"columns": ["text"], "data": rows}}).encode()
            request = urllib.request.Request(
                f"{url}/invocations", body, {"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(request, timeout=120) as reply:
                answers.extend(json.loads(reply.read())["predictions"])
    finally:
        server.send_signal(signal.SIGTERM)  # a graceful stop writes the buffered captures
        server.wait(60)
    return answers
