"""Benchmark: online serving, this project's server vs ``mlflow models serve``, on one model version.

    make bench-serve                               # 400 requests per server and concurrency
    BENCH_SERVE_REQUESTS=2000 make bench-serve
    python benchmarks/bench_serve.py --concurrency 1,8,32 --requests 400

Both servers run side by side in this one run, on 127.0.0.1, serving the same registered version
from the same throwaway SQLite registry (``$SPARKTUNE_HOME/bench/serve/``):

- ``project``: ``python -m sparktune.serve`` with its defaults (micro-batching, the alias
  followed, request capture ON into ``bench/serve/captures``);
- ``mlflow_models_serve``: ``mlflow models serve -m models:/NAME/VERSION --env-manager local`` with
  its defaults (uvicorn, one worker process, each request predicted on its own in a thread);
  ``--mlflow-workers N`` (``BENCH_SERVE_MLFLOW_WORKERS``) gives it ``--workers N``.

One load generator (aiohttp, keep-alive connections, one text per request, the ``dataframe_split``
format both accept) sends a fixed number of requests at concurrency 1, 8 and 32 to one server at a
time, after a warm-up at that concurrency, alternating which server goes first. Reported per server
and concurrency: answered requests per second over the level's wall time, latency p50/p95/p99
(ms) and errors (any non-200 answer, or an answer without a prediction for its text).

The model (:func:`bench_model`, the one place to change to time another version): a version the
pipeline's training logged, the label pyfunc every version is (a causal LM scored over its labels),
here the tiny test model fine-tuned on four intents. Both servers' processes get
``OMP_NUM_THREADS`` = ``--torch-threads`` (default 1: with 2 threads per process on this shared
2-core machine one call took 14x longer).

Targets: the project's requests/s at least 2x ``mlflow models serve``'s at concurrency 8, with no
failed request, and every answered text in the capture table once the server stopped.
Prints a table and writes ``$SPARKTUNE_HOME/bench/serve.json``; exits 1 when a target is missed.
Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import finish, not_checked, target, tiny_champion  # noqa: E402

TARGET_SPEEDUP = 2.0  # at TARGET_CONCURRENCY, the issue's
TARGET_CONCURRENCY = 8
MODEL_NAME = "bench-serve-intent"
PROJECT, MLFLOW = "project", "mlflow_models_serve"
READY_TIMEOUT_S = 180


def _home() -> Path:
    return Path(os.environ.get("SPARKTUNE_HOME", ROOT / ".local")).expanduser().resolve()


@dataclass(frozen=True)
class BenchModel:
    name: str
    version: str
    tracking_uri: str
    description: str


def bench_model(work: Path) -> BenchModel:
    """The registered version both servers serve (``champion`` on it), in a registry under ``work``.

    A version the pipeline's training logged: the tiny test model (``tests/unit/tiny_model.py``,
    the model bench-inference scores with) fully fine-tuned by :func:`sparktune.model.training.train` on
    its four intents, logged as the label pyfunc every version is, and registered. To time another
    version, return its name, version and tracking URI here: the servers take nothing else.
    """
    uri, version, tiny_model = tiny_champion(work / "model", MODEL_NAME)
    return BenchModel(
        MODEL_NAME,
        version,
        uri,
        f"{MODEL_NAME} v{version}: the tiny LLaMA fully fine-tuned on {len(tiny_model.LABELS)} intents, "
        "the label pyfunc (causal LM scored over its labels)",
    )


def _texts(n: int) -> list[str]:
    from sparktune.model.builtin_corpus import generate_support_tickets

    messages = generate_support_tickets(n * 2, seed=23).column("message").to_pylist()
    return [m for m in messages if m and m.strip()][:n]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server process, its log, and its URL."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], port: int, log: Path) -> None:
        self.name, self.url, self.log = name, f"http://127.0.0.1:{port}", log
        with open(log, "wb") as out:
            # Its own session: stopping it reaches uvicorn's worker processes too.
            self.process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        import urllib.error
        import urllib.request

        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.process.returncode}); see {self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready after {timeout} s; see {self.log}")

    def stop(self) -> int | None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # graceful: the project flushes its captures
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return self.process.returncode


async def _load(url: str, texts: list[str], concurrency: int, requests: int) -> dict[str, Any]:
    """``requests`` one-text requests from ``concurrency`` clients; latencies and errors."""
    import aiohttp

    bodies = [
        json.dumps({"dataframe_split": {"columns": ["text"], "data": [[text]]}}).encode() for text in texts
    ]
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    errors: list[str] = []
    sent = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < requests:
            body = bodies[sent % len(bodies)]
            sent += 1
            began = time.perf_counter()
            try:
                async with session.post(f"{url}/invocations", data=body, headers=headers) as response:
                    payload = await response.read()
                    if response.status != 200:
                        errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                        continue
                    predictions = json.loads(payload)["predictions"]
                    if len(predictions) != 1 or not predictions[0].get("prediction"):
                        errors.append(f"no prediction in {payload[:200]!r}")
                        continue
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(time.perf_counter() - began)

    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "latencies": latencies, "errors": errors}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def _measure(server: Server, texts: list[str], concurrency: int, requests: int, warmup: int) -> dict:
    warm = asyncio.run(_load(server.url, texts, concurrency, max(warmup, concurrency)))
    run = asyncio.run(_load(server.url, texts, concurrency, requests))
    latencies = run["latencies"]

    def ms(q: float) -> float | None:
        value = _percentile(latencies, q)
        return None if value is None else round(value * 1000, 2)

    result = {
        "server": server.name,
        "concurrency": concurrency,
        "requests": requests,
        "rps": round(len(latencies) / run["seconds"], 1),
        "p50_ms": ms(50),
        "p95_ms": ms(95),
        "p99_ms": ms(99),
        "errors": len(run["errors"]),
        "seconds": round(run["seconds"], 3),
        "warmup_answered": len(warm["latencies"]),
        "warmup_errors": len(warm["errors"]),
    }
    if run["errors"]:
        result["first_errors"] = run["errors"][:3]
    print(
        f"  {server.name:<20} c={concurrency:<3} {result['rps']:>8.1f} req/s  p50 {result['p50_ms']} ms  "
        f"p99 {result['p99_ms']} ms  errors {result['errors']}",
        flush=True,
    )
    return result


def _answered(result: dict[str, Any]) -> int:
    """Requests a level's warm-up and run got a 200 with a prediction for."""
    return result["requests"] - result["errors"] + result["warmup_answered"]


def _captured_rows(root: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in root.glob("date=*/part-*.parquet"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=int(os.environ.get("BENCH_SERVE_REQUESTS", "400")))
    parser.add_argument(
        "--concurrency", default=os.environ.get("BENCH_SERVE_CONCURRENCY", "1,8,32"), help="comma-separated"
    )
    parser.add_argument("--warmup", type=int, default=50, help="requests before each measured level")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads per server process")
    parser.add_argument(
        "--mlflow-workers",
        type=int,
        default=int(os.environ.get("BENCH_SERVE_MLFLOW_WORKERS", "1")),
        help="uvicorn worker processes of mlflow models serve (its default: 1)",
    )
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.requests < 1 or not levels or min(levels) < 1:
        parser.error("--requests and every --concurrency must be >= 1")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = _home() / "bench" / "serve"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model = bench_model(work)
    texts = _texts(500)
    print(f"model: {model.description}", flush=True)

    # The same torch threads in both servers' processes (torch reads OMP_NUM_THREADS when it starts).
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": model.tracking_uri,
        "OMP_NUM_THREADS": str(args.torch_threads),
    }
    bin_dir = Path(sys.executable).parent
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # mlflow models serve runs `uvicorn`
    captures = work / "captures"
    project_port, mlflow_port = _free_port(), _free_port()
    servers = {
        PROJECT: Server(
            PROJECT,
            [
                sys.executable,
                "-m",
                "sparktune.serve",
                f"--port={project_port}",
                f"--model-name={model.name}",
                f"--tracking-uri={model.tracking_uri}",
                f"--download-dir={work / 'downloads'}",
                f"--capture-uri={captures}",
            ],
            env,
            project_port,
            work / "project.log",
        ),
        MLFLOW: Server(
            MLFLOW,
            [
                str(bin_dir / "mlflow"),
                "models",
                "serve",
                "-m",
                f"models:/{model.name}/{model.version}",
                "--env-manager",
                "local",
                "-h",
                "127.0.0.1",
                "-p",
                str(mlflow_port),
                "--workers",
                str(args.mlflow_workers),
            ],
            env,
            mlflow_port,
            work / "mlflow_models_serve.log",
        ),
    }
    results: list[dict[str, Any]] = []
    ready: dict[str, float] = {}
    ran = True
    try:
        for name, server in servers.items():
            ready[name] = round(server.wait_ready(), 1)
            print(f"{name} ready in {ready[name]} s ({server.url})", flush=True)
        for i, concurrency in enumerate(levels):
            order = [MLFLOW, PROJECT] if i % 2 == 0 else [PROJECT, MLFLOW]
            for name in order:
                results.append(_measure(servers[name], texts, concurrency, args.requests, args.warmup))
    except Exception as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        ran = False
    finally:
        exit_codes = {name: server.stop() for name, server in servers.items()}
    # Every answered request, warm-ups included, must be in the capture table once the server stopped.
    answered = sum(_answered(r) for r in results if r["server"] == PROJECT)
    captured = _captured_rows(captures) if captures.exists() else 0

    by_key = {(r["server"], r["concurrency"]): r for r in results}
    print(
        f"\n{'server':<22}{'concurrency':>12}{'requests':>10}{'req/s':>10}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'p99 ms':>9}{'errors':>8}{'vs mlflow':>11}"
    )
    for r in sorted(results, key=lambda r: (r["concurrency"], r["server"] != PROJECT)):
        other = by_key.get((MLFLOW, r["concurrency"]))
        ratio = r["rps"] / other["rps"] if other and other["rps"] else None
        r["rps_vs_mlflow"] = round(ratio, 2) if ratio else None
        print(
            f"{r['server']:<22}{r['concurrency']:>12}{r['requests']:>10}{r['rps']:>10.1f}"
            f"{r['p50_ms'] or 0:>9.1f}{r['p95_ms'] or 0:>9.1f}{r['p99_ms'] or 0:>9.1f}{r['errors']:>8}"
            f"{(f'{ratio:.2f}x' if ratio else '-'):>11}"
        )

    project_at, mlflow_at = (
        by_key.get((PROJECT, TARGET_CONCURRENCY)),
        by_key.get((MLFLOW, TARGET_CONCURRENCY)),
    )
    targets = []
    if TARGET_CONCURRENCY in levels:
        speedup = (
            project_at["rps"] / mlflow_at["rps"] if project_at and mlflow_at and mlflow_at["rps"] else None
        )
        targets.append(
            target(
                f"project req/s over mlflow models serve's at concurrency {TARGET_CONCURRENCY}",
                speedup,
                at_least=TARGET_SPEEDUP,
                unit="x",
            )
        )
    else:
        targets.append(
            not_checked("project req/s over mlflow's", f"concurrency {TARGET_CONCURRENCY} not run")
        )
    project_runs = [r for r in results if r["server"] == PROJECT]
    project_errors = sum(r["errors"] + r["warmup_errors"] for r in project_runs) if project_runs else None
    targets.append(target("failed requests to the project server", project_errors, at_most=0))
    targets.append(
        target(
            "answered project requests found in the capture table",
            captured / answered if answered else None,
            at_least=1.0,
            unit="x",
            note=f"{captured} rows captured for {answered} answered requests",
        )
    )
    report = {
        "benchmark": "online serving: project server vs mlflow models serve",
        "results": results,
        "model": model.description,
        "torch_threads_per_process": args.torch_threads,
        "model_uri": f"models:/{model.name}/{model.version}",
        "requests_per_level": args.requests,
        "concurrency": levels,
        "warmup_requests": args.warmup,
        "mlflow_models_serve_workers": args.mlflow_workers,
        # The server's defaults, but for any SPARKTUNE_SERVING_* variable this run passed through.
        "project_settings": {k: v for k, v in os.environ.items() if k.startswith("SPARKTUNE_SERVING_")},
        "ready_seconds": ready,
        "exit_codes": exit_codes,
        "captured_rows": captured,
        "project_answered_requests": answered,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    return finish(_home() / "bench" / "serve.json", report, targets, ran=ran)


if __name__ == "__main__":
    sys.exit(main())
