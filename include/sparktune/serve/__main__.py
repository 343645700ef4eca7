"""``python -m sparktune.serve``: serve ``models:/NAME@champion`` on http://127.0.0.1:5001.

Every flag defaults to its ``SPARKTUNE_SERVING_<FLAG>`` variable, else to the value in
:class:`sparktune.serve.settings.ServingSettings`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from sparktune.serve.settings import ServingSettings, ServingSettingsError, env_name, settings_from_env


def build_parser(defaults: ServingSettings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sparktune.serve",
        description=(
            "Serve a registered model's alias over HTTP in MLflow's scoring protocol (POST /invocations), "
            "micro-batched, following the alias as it moves, every answer captured to the lake."
        ),
    )

    def add(flag: str, field: str, kind: type, help_text: str) -> None:
        value = getattr(defaults, field)
        default = f"default {value!r}; " if value is not None else ""
        parser.add_argument(
            flag, dest=field, type=kind, default=None, help=f"{help_text} ({default}{env_name(field)})"
        )

    add("--host", "host", str, "interface to listen on; 0.0.0.0 opens it to the network")
    add("--port", "port", int, "port to listen on")
    add("--model-name", "model_name", str, "registered model to serve")
    add("--alias", "alias", str, "alias to serve and follow")
    add("--tracking-uri", "tracking_uri", str, "MLflow registry; unset: MLFLOW_TRACKING_URI, else the home's")
    add("--download-dir", "download_dir", str, "version downloads; unset: SPARKTUNE_HOME/models/serving")
    add("--poll-seconds", "poll_seconds", float, "how often the alias is checked")
    add("--max-batch-rows", "max_batch_rows", int, "texts per predict call at most")
    add("--max-wait-ms", "max_wait_ms", float, "how long a batch waits for more requests")
    add("--max-length-ratio", "max_length_ratio", float, "longest/shortest text in one predict call")
    add("--max-queued-requests", "max_queued_requests", int, "requests waiting at most; more get a 503")
    add("--predict-workers", "predict_workers", int, "batches predicted at once; 0: one per free core")
    add("--max-rows-per-request", "max_rows_per_request", int, "texts one request may hold")
    add("--max-text-chars", "max_text_chars", int, "characters one text may have")
    add("--max-body-bytes", "max_body_bytes", int, "request body size limit")
    add("--capture-uri", "capture_uri", str, "capture table root; unset: <lake>/serving_captures")
    add("--capture-flush-rows", "capture_flush_rows", int, "write captures every this many rows")
    add("--capture-flush-seconds", "capture_flush_seconds", float, "or every this many seconds")
    parser.add_argument(
        "--no-capture",
        dest="capture",
        action="store_false",
        default=None,
        help=f"do not write the capture table ({env_name('capture')}=off)",
    )
    parser.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        defaults = settings_from_env()
        args = vars(build_parser(defaults).parse_args(argv))
        access_log, log_level = args.pop("access_log"), args.pop("log_level")
        config = defaults.with_overrides(**args)
    except ServingSettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    import uvicorn
    from sparktune.serve.app import create_app

    # One process: batching needs every request in the same queue. Scale out with replicas.
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=30,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
