"""Benchmark: online serving, this project's server vs ``mlflow models serve``, on one model version.

    make bench-serve                               # tiny model (400 requests a level), then SmolLM2 (32)
    BENCH_SERVE_REQUESTS=2000 make bench-serve
    BENCH_SERVE_MODELS=smollm2 BENCH_SERVE_SMOLLM2_REQUESTS=64 make bench-serve
    python benchmarks/bench_serve.py --concurrency 1,8,32 --requests 400

For each model, both servers run side by side in this one run, on 127.0.0.1, serving the same
registered version from the same throwaway SQLite registry (``$SPARKTUNE_HOME/bench/serve/``):

- ``project``: ``python -m sparktune.serve`` with its defaults (micro-batching, the alias
  followed, request capture ON into ``bench/serve/<model>/captures``);
- ``mlflow_models_serve``: ``mlflow models serve -m models:/NAME/VERSION --env-manager local`` with
  its defaults (uvicorn, one worker process, each request predicted on its own in a thread);
  ``--mlflow-workers N`` (``BENCH_SERVE_MLFLOW_WORKERS``) gives it ``--workers N``.

One load generator (aiohttp, keep-alive connections, one text per request, the ``dataframe_split``
format both accept) sends a fixed number of requests at each concurrency to one server at a time,
after a warm-up at that concurrency, alternating which server goes first. Reported per model, server
and concurrency: answered requests per second over the level's wall time, latency p50/p95/p99 (ms),
failed requests (any non-200 answer, or an answer without a prediction for its text) and, where the
texts have labels, the accuracy of the answers and how many texts both servers answered alike.

The models (the ones to change to time another version: :func:`tiny_model`, :func:`smollm2_model`),
each a version the pipeline's training logged as the label pyfunc every version is (a causal LM
scored over its labels), registered and given the ``champion`` alias:

- ``tiny``: the tiny test model fully fine-tuned on four intents; concurrency 1, 8 and 32
  (``--concurrency``, ``BENCH_SERVE_CONCURRENCY``), ``--requests`` (``BENCH_SERVE_REQUESTS``, 400) a level;
- ``smollm2``: SmolLM2-135M-Instruct (built once from its PyPI package) LoRA fine-tuned
  ``BENCH_SERVE_SMOLLM2_STEPS`` (20) steps on the same intents in its chat template and merged, as the
  DAG's train task logs it: bench-inference's SmolLM2 champion, in its folder
  (``$SPARKTUNE_HOME/bench/inference-smollm2/``), trained once for both benches and reused while the
  scoring code is unchanged. Requests are intent texts of a seed of their own (their labels give the
  answers' accuracy); concurrency ``BENCH_SERVE_SMOLLM2_CONCURRENCY`` (1,8),
  ``BENCH_SERVE_SMOLLM2_REQUESTS`` (32) a level (a SmolLM2 text takes about a second on one core here).

``BENCH_SERVE_MODELS`` (``tiny,smollm2``) picks them. Both servers' processes get ``OMP_NUM_THREADS`` =
``--torch-threads`` (default 1: with 2 threads per process on this shared 2-core machine one call took
14x longer).

Overload (tiny model): a third server, the project's with ``--max-queued-requests``
``BENCH_SERVE_OVERLOAD_QUEUE`` (4), gets the top concurrency: how many requests are refused, each
of them a 503 with ``Retry-After`` (its clients go on with their next request), and the latency of
those answered. The measured levels above run with the default queue (256): they never see a 503.

Targets, per model: the project's requests/s at least 2x ``mlflow models serve``'s at concurrency 8,
no failed request, and every answered text in the capture table once the server stopped; under
overload, every refusal a 503 with ``Retry-After`` and no other failure.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import finish, not_checked, smollm2_champion, target, tiny_champion  # noqa: E402

TARGET_SPEEDUP = 2.0  # at TARGET_CONCURRENCY, the issue's
TARGET_CONCURRENCY = 8
PROJECT, MLFLOW, OVERLOAD = "project", "mlflow_models_serve", "project_small_queue"
TINY, SMOLLM2 = "tiny", "smollm2"
READY_TIMEOUT_S = 300
DEFAULT_SMOLLM2_STEPS = 20  # bench-inference's: one champion for both
DEFAULT_SMOLLM2_REQUESTS = 32
DEFAULT_OVERLOAD_QUEUE = 4


def _home() -> Path:
    return Path(os.environ.get("SPARKTUNE_HOME", ROOT / ".local")).expanduser().resolve()


@dataclass(frozen=True)
class BenchModel:
    key: str  # TINY or SMOLLM2
    name: str
    version: str
    tracking_uri: str
    description: str
    texts: list[str]
    # The true label of each text where it has one: the answers' accuracy is reported.
    truth: list[str] = field(default_factory=list)


def tiny_model(work: Path) -> BenchModel:
    """The tiny test model (``tests/unit/tiny_model.py``, the model bench-inference scores with) fully
    fine-tuned by :func:`sparktune.model.training.train` on its four intents, logged as the label pyfunc
    every version is, and registered; support tickets to send it."""
    from sparktune.model.builtin_corpus import generate_support_tickets

    name = "bench-serve-intent"
    uri, version, tiny = tiny_champion(work / "model", name)
    messages = generate_support_tickets(1000, seed=23).column("message").to_pylist()
    return BenchModel(
        TINY,
        name,
        version,
        uri,
        f"{name} v{version}: the tiny LLaMA fully fine-tuned on {len(tiny.LABELS)} intents, "
        "the label pyfunc (causal LM scored over its labels)",
        [m for m in messages if m and m.strip()][:500],
    )


def smollm2_model(work: Path, steps: int) -> BenchModel:
    """SmolLM2-135M-Instruct LoRA fine-tuned ``steps`` steps on the tiny model's intents in its own chat
    template by :func:`sparktune.model.training.train`, logged as the label pyfunc and registered:
    bench-inference's SmolLM2 champion (:func:`bench_common.smollm2_champion`, in the same folder, so
    that one is trained once for both benches and reused while the scoring code is unchanged);
    intent texts of a seed of their own, and their labels, to send it."""
    name = "bench-intent-smollm2"  # bench-inference's: the same folder holds one registry
    started = time.perf_counter()
    uri, version, tiny = smollm2_champion(work, name, steps=steps)
    ready_s = time.perf_counter() - started
    rows = tiny.make_rows(500, seed=23)
    return BenchModel(
        SMOLLM2,
        name,
        version,
        uri,
        f"{name} v{version}: SmolLM2-135M-Instruct, LoRA trained {steps} steps on {len(tiny.LABELS)} intents "
        f"(its chat template) and merged, the label pyfunc ({ready_s:.0f} s to train or find it)",
        [row["text"] for row in rows],
        [tiny.LABELS[row["label"]] for row in rows],
    )


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
    """``requests`` one-text requests from ``concurrency`` clients: latencies, the prediction for each
    text index answered, failures, and refusals (503 with ``Retry-After``, counted apart)."""
    import aiohttp

    bodies = [
        json.dumps({"dataframe_split": {"columns": ["text"], "data": [[text]]}}).encode() for text in texts
    ]
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    predictions: dict[int, str] = {}
    errors: list[str] = []
    refused: list[float] = []  # Retry-After seconds of each 503 that had one
    sent = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < requests:
            index = sent % len(bodies)
            sent += 1
            began = time.perf_counter()
            try:
                async with session.post(
                    f"{url}/invocations", data=bodies[index], headers=headers
                ) as response:
                    payload = await response.read()
                    retry_after = response.headers.get("Retry-After", "")
                    if response.status == 503 and retry_after.isdigit():
                        refused.append(float(retry_after))
                        continue
                    if response.status != 200:
                        errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                        continue
                    answer = json.loads(payload)["predictions"]
                    if len(answer) != 1 or not answer[0].get("prediction"):
                        errors.append(f"no prediction in {payload[:200]!r}")
                        continue
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            latencies.append(time.perf_counter() - began)
            predictions[index] = str(answer[0]["prediction"])

    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "latencies": latencies,
        "predictions": predictions,
        "errors": errors,
        "refused": refused,
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def _measure(
    server: Server, model: BenchModel, concurrency: int, requests: int, warmup: int, answers: dict
) -> dict[str, Any]:
    """One level against one server; what it answered for each text goes into ``answers``."""
    warm = asyncio.run(_load(server.url, model.texts, concurrency, max(warmup, concurrency)))
    run = asyncio.run(_load(server.url, model.texts, concurrency, requests))
    latencies = run["latencies"]
    answers.update(run["predictions"])

    def ms(q: float) -> float | None:
        value = _percentile(latencies, q)
        return None if value is None else round(value * 1000, 2)

    result: dict[str, Any] = {
        "model": model.key,
        "server": server.name,
        "concurrency": concurrency,
        "requests": requests,
        "answered": len(latencies),
        "rps": round(len(latencies) / run["seconds"], 2),
        "p50_ms": ms(50),
        "p95_ms": ms(95),
        "p99_ms": ms(99),
        "errors": len(run["errors"]) + (0 if server.name == OVERLOAD else len(run["refused"])),
        "refused_503": len(run["refused"]),
        "seconds": round(run["seconds"], 3),
        "warmup_answered": len(warm["latencies"]),
        "warmup_errors": len(warm["errors"]) + len(warm["refused"]),
    }
    if run["refused"]:
        result["retry_after_s"] = {"min": min(run["refused"]), "max": max(run["refused"])}
    if run["errors"]:
        result["first_errors"] = run["errors"][:3]
    print(
        f"  {model.key:<8} {server.name:<20} c={concurrency:<3} {result['rps']:>8.2f} req/s  "
        f"p50 {result['p50_ms']} ms  p99 {result['p99_ms']} ms  errors {result['errors']}"
        + (f"  503s {result['refused_503']}" if server.name == OVERLOAD else ""),
        flush=True,
    )
    return result


def _answered(result: dict[str, Any]) -> int:
    """Requests a level's warm-up and run got a 200 with a prediction for."""
    return result["answered"] + result["warmup_answered"]


def _captured_rows(root: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in root.glob("date=*/part-*.parquet"))


def _project_command(model: BenchModel, port: int, work: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sparktune.serve",
        f"--port={port}",
        f"--model-name={model.name}",
        f"--tracking-uri={model.tracking_uri}",
        f"--download-dir={work / 'downloads'}",
        *extra,
    ]


def serve_model(
    model: BenchModel, work: Path, args: argparse.Namespace, levels: list[int], requests: int, warmup: int
) -> dict[str, Any]:
    """Both servers (and, for the tiny model, the small-queue one) on ``model``, every level measured;
    the results, readiness times, exit codes and what the capture table holds."""
    # The same torch threads in all servers' processes (torch reads OMP_NUM_THREADS when it starts).
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": model.tracking_uri,
        "OMP_NUM_THREADS": str(args.torch_threads),
    }
    bin_dir = Path(sys.executable).parent
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # mlflow models serve runs `uvicorn`
    captures = work / "captures"
    ports = {name: _free_port() for name in (PROJECT, MLFLOW, OVERLOAD)}
    servers = {
        PROJECT: Server(
            PROJECT,
            _project_command(model, ports[PROJECT], work, f"--capture-uri={captures}"),
            env,
            ports[PROJECT],
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
                str(ports[MLFLOW]),
                "--workers",
                str(args.mlflow_workers),
            ],
            env,
            ports[MLFLOW],
            work / "mlflow_models_serve.log",
        ),
    }
    if model.key == TINY and args.overload_queue:
        servers[OVERLOAD] = Server(
            OVERLOAD,
            _project_command(
                model, ports[OVERLOAD], work, "--no-capture", f"--max-queued-requests={args.overload_queue}"
            ),
            env,
            ports[OVERLOAD],
            work / "project_small_queue.log",
        )
    results: list[dict[str, Any]] = []
    answers: dict[str, dict[int, str]] = {PROJECT: {}, MLFLOW: {}, OVERLOAD: {}}
    ready: dict[str, float] = {}
    error = None
    try:
        for name, server in servers.items():
            ready[name] = round(server.wait_ready(), 1)
            print(f"{model.key}: {name} ready in {ready[name]} s ({server.url})", flush=True)
        for i, concurrency in enumerate(levels):
            order = [MLFLOW, PROJECT] if i % 2 == 0 else [PROJECT, MLFLOW]
            for name in order:
                results.append(_measure(servers[name], model, concurrency, requests, warmup, answers[name]))
        if OVERLOAD in servers:
            results.append(
                _measure(servers[OVERLOAD], model, max(levels), requests, warmup, answers[OVERLOAD])
            )
    except Exception as exc:
        print(f"FAILED: {model.key}: {exc}", file=sys.stderr)
        error = f"{type(exc).__name__}: {exc}"
    finally:
        exit_codes = {name: server.stop() for name, server in servers.items()}
    # Every answered request, warm-ups included, must be in the capture table once the server stopped.
    answered = sum(_answered(r) for r in results if r["server"] == PROJECT)
    quality: dict[str, Any] = {}
    both = sorted(set(answers[PROJECT]) & set(answers[MLFLOW]))
    if both:
        same = sum(answers[PROJECT][i] == answers[MLFLOW][i] for i in both)
        quality["texts_answered_by_both"] = len(both)
        quality["same_prediction_by_both"] = same
    if model.truth:
        for name in (PROJECT, MLFLOW):
            got = answers[name]
            if got:
                right = sum(got[i] == model.truth[i] for i in got)
                quality[f"{name}_accuracy"] = round(right / len(got), 4)
                quality[f"{name}_texts_scored"] = len(got)
    return {
        "results": results,
        "ready_seconds": ready,
        "exit_codes": exit_codes,
        "captured_rows": _captured_rows(captures) if captures.exists() else 0,
        "project_answered_requests": answered,
        "answers": quality,
        "error": error,
    }


def _print_table(results: list[dict[str, Any]]) -> None:
    by_key = {(r["model"], r["server"], r["concurrency"]): r for r in results}
    print(
        f"\n{'model':<9}{'server':<22}{'concurrency':>12}{'requests':>10}{'req/s':>10}{'p50 ms':>10}"
        f"{'p95 ms':>10}{'p99 ms':>10}{'errors':>8}{'503s':>6}{'vs mlflow':>11}"
    )
    order = {PROJECT: 0, MLFLOW: 1, OVERLOAD: 2}
    for r in sorted(results, key=lambda r: (r["model"] != TINY, r["concurrency"], order[r["server"]])):
        other = by_key.get((r["model"], MLFLOW, r["concurrency"]))
        # The small-queue server answers fewer requests by design: no ratio for it.
        ratio = r["rps"] / other["rps"] if other and other["rps"] and r["server"] != OVERLOAD else None
        r["rps_vs_mlflow"] = round(ratio, 2) if ratio else None
        print(
            f"{r['model']:<9}{r['server']:<22}{r['concurrency']:>12}{r['requests']:>10}{r['rps']:>10.2f}"
            f"{r['p50_ms'] or 0:>10.1f}{r['p95_ms'] or 0:>10.1f}{r['p99_ms'] or 0:>10.1f}{r['errors']:>8}"
            f"{r['refused_503']:>6}{(f'{ratio:.2f}x' if ratio else '-'):>11}"
        )


def _targets(key: str, levels: list[int], served: dict[str, Any]) -> list[dict[str, Any]]:
    results = served["results"]
    at = {r["server"]: r for r in results if r["concurrency"] == TARGET_CONCURRENCY}
    targets = []
    name = f"{key}: project req/s over mlflow models serve's at concurrency {TARGET_CONCURRENCY}"
    if TARGET_CONCURRENCY in levels:
        project, mlflow = at.get(PROJECT), at.get(MLFLOW)
        speedup = project["rps"] / mlflow["rps"] if project and mlflow and mlflow["rps"] else None
        targets.append(target(name, speedup, at_least=TARGET_SPEEDUP, unit="x"))
    else:
        targets.append(not_checked(name, f"concurrency {TARGET_CONCURRENCY} not run"))
    project_runs = [r for r in results if r["server"] == PROJECT]
    errors = sum(r["errors"] + r["warmup_errors"] for r in project_runs) if project_runs else None
    targets.append(target(f"{key}: failed requests to the project server", errors, at_most=0))
    answered, captured = served["project_answered_requests"], served["captured_rows"]
    targets.append(
        target(
            f"{key}: answered project requests found in the capture table",
            captured / answered if answered else None,
            at_least=1.0,
            unit="x",
            note=f"{captured} rows captured for {answered} answered requests",
        )
    )
    overload = next((r for r in results if r["server"] == OVERLOAD), None)
    if overload is not None:
        targets.append(
            target(
                f"{key}: overload, requests that failed otherwise than a 503 with Retry-After",
                overload["errors"],
                at_most=0,
                note=f"{overload['refused_503']} refused with a 503 and Retry-After, "
                f"{overload['answered']} answered",
            )
        )
    return targets


def _levels(text: str) -> list[int]:
    return [int(c) for c in text.split(",") if c.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    env = os.environ.get
    parser.add_argument(
        "--models", default=env("BENCH_SERVE_MODELS", f"{TINY},{SMOLLM2}"), help="comma-separated"
    )
    parser.add_argument("--requests", type=int, default=int(env("BENCH_SERVE_REQUESTS", "400")))
    parser.add_argument(
        "--concurrency", default=env("BENCH_SERVE_CONCURRENCY", "1,8,32"), help="tiny model, comma-separated"
    )
    parser.add_argument(
        "--smollm2-requests",
        type=int,
        default=int(env("BENCH_SERVE_SMOLLM2_REQUESTS", str(DEFAULT_SMOLLM2_REQUESTS))),
    )
    parser.add_argument("--smollm2-concurrency", default=env("BENCH_SERVE_SMOLLM2_CONCURRENCY", "1,8"))
    parser.add_argument(
        "--smollm2-steps", type=int, default=int(env("BENCH_SERVE_SMOLLM2_STEPS", str(DEFAULT_SMOLLM2_STEPS)))
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=50,
        help="tiny model: requests before each level (SmolLM2: its concurrency)",
    )
    parser.add_argument(
        "--overload-queue",
        type=int,
        default=int(env("BENCH_SERVE_OVERLOAD_QUEUE", str(DEFAULT_OVERLOAD_QUEUE))),
        help="--max-queued-requests of the overload server (tiny model, top concurrency); 0: no overload run",
    )
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads per server process")
    parser.add_argument(
        "--mlflow-workers",
        type=int,
        default=int(env("BENCH_SERVE_MLFLOW_WORKERS", "1")),
        help="uvicorn worker processes of mlflow models serve (its default: 1)",
    )
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    plans = {
        TINY: (_levels(args.concurrency), args.requests, args.warmup),
        # A SmolLM2 warm-up: one request per client (its first batch).
        SMOLLM2: (_levels(args.smollm2_concurrency), args.smollm2_requests, 0),
    }
    unknown = sorted(set(models) - set(plans))
    if unknown or not models:
        parser.error(f"--models: {unknown or 'none'}; choose from {sorted(plans)}")
    for key in models:
        levels, requests, _ = plans[key]
        if requests < 1 or not levels or min(levels) < 1:
            parser.error(f"{key}: every request count and concurrency must be >= 1")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    root = _home() / "bench" / "serve"
    shutil.rmtree(root, ignore_errors=True)
    results: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    per_model: dict[str, Any] = {}
    ran = True
    for key in models:
        levels, requests, warmup = plans[key]
        work = root / key
        work.mkdir(parents=True)
        try:
            model = (
                tiny_model(work)
                if key == TINY
                else smollm2_model(_home() / "bench" / "inference-smollm2", args.smollm2_steps)
            )
        except Exception as exc:
            print(f"FAILED: {key}: the model could not be trained and registered: {exc}", file=sys.stderr)
            ran = False
            continue
        print(f"\n{key}: {model.description}", flush=True)
        served = serve_model(model, work, args, levels, requests, warmup)
        ran = ran and served["error"] is None
        results.extend(served["results"])
        targets.extend(_targets(key, levels, served))
        per_model[key] = {
            "model": model.description,
            "model_uri": f"models:/{model.name}/{model.version}",
            "concurrency": levels,
            "requests_per_level": requests,
            **{k: v for k, v in served.items() if k != "results"},
        }
        if served["answers"]:
            print(f"{key}: answers {served['answers']}", flush=True)
    _print_table(results)
    report = {
        "benchmark": "online serving: project server vs mlflow models serve",
        "results": results,
        "models": per_model,
        "torch_threads_per_process": args.torch_threads,
        "warmup_requests": args.warmup,
        "overload_queue": args.overload_queue,
        "mlflow_models_serve_workers": args.mlflow_workers,
        # The server's defaults, but for any SPARKTUNE_SERVING_* variable this run passed through.
        "project_settings": {k: v for k, v in os.environ.items() if k.startswith("SPARKTUNE_SERVING_")},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    return finish(_home() / "bench" / "serve.json", report, targets, ran=ran)


if __name__ == "__main__":
    sys.exit(main())
