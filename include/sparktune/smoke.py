"""The smoke test between ``staging`` and ``champion``: the model as a user gets it, on sample rows.

``mlflow.pyfunc.load_model("models:/NAME@staging")`` is exactly what a serving job or a notebook
does, so a model whose logged form cannot load, cannot predict, or answers with something that
is not a label stops here, before the champion alias moves. Latency is recorded: the load, and
each sample row predicted alone (p50, p95), the way an online caller would see it.

    python -m sparktune.smoke --model-uri models:/support-intent@staging \\
        --dataset-path /lake/datasets/<fingerprint> --rows 16 --output smoke.json

Exit codes: 0 passed, 2 the model answered outside the label set or the input is unusable
(deterministic: promotion must stop), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("sparktune.smoke")

DEFAULT_ROWS = 16
MAX_NEW_TOKENS = 8


class SmokeTestFailed(ValueError):
    """The model loaded the way users load it did not answer with labels; the message shows how."""


@dataclass
class SmokeResult:
    model_uri: str
    rows: int
    passed: bool
    load_seconds: float
    latency_p50_ms: float
    latency_p95_ms: float
    batch_rows_per_s: float
    labels: list[str]
    n_bad: int = 0
    # (input, answer) of rows whose answer is no label, a few of them.
    bad_answers: list[list[str]] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {
            "smoke_rows": float(self.rows),
            "smoke_load_seconds": self.load_seconds,
            "smoke_latency_p50_ms": self.latency_p50_ms,
            "smoke_latency_p95_ms": self.latency_p95_ms,
            "smoke_batch_rows_per_s": self.batch_rows_per_s,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "metrics": self.metrics()}


def answers_as_text(output: Any) -> list[str]:
    """The pyfunc output of either flavour as one string per row.

    text-generation gives strings (or a one-column DataFrame); text-classification gives a
    DataFrame with ``label`` and ``score``; the adapter pyfunc gives a list of labels.
    """
    if hasattr(output, "columns"):
        column = "label" if "label" in output.columns else output.columns[0]
        return [str(v) for v in output[column]]
    if hasattr(output, "tolist"):
        output = output.tolist()
    if isinstance(output, str):
        return [output]
    return [str(v[0] if isinstance(v, list | tuple) and v else v) for v in output]


def label_of(answer: str, prompt: str, labels: list[str]) -> str | None:
    """The label an answer gives: the answer itself, or its first word after the prompt.

    A model logged without ``return_full_text=False`` echoes the prompt first; decoding may not
    give it back byte for byte (Unicode normalization, spaces), so the prompt is found by its
    last characters, after NFC normalization, rather than by exact prefix.
    """
    answer, prompt = unicodedata.normalize("NFC", answer), unicodedata.normalize("NFC", prompt)
    text = answer
    if prompt and answer.startswith(prompt):
        text = answer[len(prompt) :]
    else:
        # Longest end of the prompt that the answer contains (the template's closing marker last).
        for size in (32, 16, 8):
            tail = prompt.strip()[-size:]
            at = answer.rfind(tail) if tail else -1
            if at >= 0:
                text = answer[at + len(tail) :]
                break
    text = text.strip()
    if text in labels:
        return text
    first = text.split()[0] if text.split() else ""
    return first if first in labels else None


def smoke_passed(n_bad: int, rows: int, max_invalid_rate: float) -> bool:
    """At most ``max_invalid_rate`` of the rows may answer outside the label set (0: none)."""
    return n_bad <= max_invalid_rate * rows


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def smoke_test(
    model_uri: str,
    dataset_path: str,
    *,
    split: str = "test",
    rows: int = DEFAULT_ROWS,
    max_invalid_rate: float = 0.0,
    trust_remote_code: bool = False,
) -> SmokeResult:
    """Load ``model_uri`` with ``mlflow.pyfunc`` and check its answers on ``rows`` sample rows.

    The model folder is downloaded and checked first (:mod:`sparktune.model_safety`): safetensors
    weights only, and no code shipped with the model unless ``trust_remote_code``.
    """
    import mlflow

    from sparktune.evaluation import _label_strings, _load_split
    from sparktune.model_safety import check_model_tree, local_model_dir

    dataset = _load_split(dataset_path, split, rows, required=("label",))
    labels, _ = _label_strings(dataset)
    column = "prompt" if "prompt" in dataset.column_names else "text"
    # A classification head reads the raw text; a causal LM completes the prompt.
    started = time.perf_counter()
    local = local_model_dir(model_uri)
    check_model_tree(local, trust_remote_code=trust_remote_code)
    model = mlflow.pyfunc.load_model(str(local))
    load_seconds = time.perf_counter() - started
    flavors = model.metadata.flavors
    task = flavors.get("transformers", {}).get("task", "")
    if task == "text-classification" and "text" in dataset.column_names:
        column = "text"
    inputs = [str(v) for v in dataset[column]]
    params = {"max_new_tokens": MAX_NEW_TOKENS} if task != "text-classification" else None

    def predict(batch: list[str]) -> list[str]:
        return answers_as_text(model.predict(batch, params=params) if params else model.predict(batch))

    latencies = []
    answers: list[str] = []
    for text in inputs:
        started = time.perf_counter()
        answers.extend(predict([text]))
        latencies.append((time.perf_counter() - started) * 1000.0)
    started = time.perf_counter()
    batch_answers = predict(inputs)
    batch_seconds = time.perf_counter() - started
    if len(answers) != len(inputs) or len(batch_answers) != len(inputs):
        raise SmokeTestFailed(
            f"{model_uri} returned {len(answers)} answers for {len(inputs)} rows one by one and "
            f"{len(batch_answers)} for the batch: a model must answer every row once."
        )
    bad = [
        [text, answer]
        for text, answer in zip(inputs, answers, strict=True)
        if label_of(answer, text, labels) is None
    ]
    result = SmokeResult(
        model_uri=model_uri,
        rows=len(inputs),
        passed=smoke_passed(len(bad), len(inputs), max_invalid_rate),
        load_seconds=load_seconds,
        latency_p50_ms=statistics.median(latencies),
        latency_p95_ms=_percentile(latencies, 0.95),
        batch_rows_per_s=len(inputs) / batch_seconds if batch_seconds > 0 else 0.0,
        labels=labels,
        n_bad=len(bad),
        bad_answers=bad[:5],
    )
    logger.info(
        "smoke test of %s: %d rows, %s; load %.1f s, latency p50 %.0f ms p95 %.0f ms, batch %.1f rows/s",
        model_uri,
        result.rows,
        "every answer is a label" if result.passed else f"{len(bad)} answers are no label",
        result.load_seconds,
        result.latency_p50_ms,
        result.latency_p95_ms,
        result.batch_rows_per_s,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    from sparktune.evaluation import EvaluationInputError
    from sparktune.model_safety import UnsafeModelError
    from sparktune.training import configure_process_logging

    configure_process_logging()
    parser = argparse.ArgumentParser(prog="python -m sparktune.smoke", description=__doc__.split("\n")[0])
    parser.add_argument("--model-uri", required=True, help="models:/NAME@staging, the way users load it")
    parser.add_argument(
        "--dataset-path", required=True, help="The materialized dataset (or prepared Parquet)"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument(
        "--max-invalid-rate", type=float, default=0.0, help="Share of rows that may answer no label"
    )
    parser.add_argument("--output", required=True, help="Where to write the result JSON")
    parser.add_argument(
        "--trust-remote-code",
        choices=("true", "false"),
        default="false",
        help="Let a model that ships its own Python code (auto_map) load; default false: refused.",
    )
    args = parser.parse_args(argv)
    try:
        result = smoke_test(
            args.model_uri,
            args.dataset_path,
            split=args.split,
            rows=args.rows,
            max_invalid_rate=args.max_invalid_rate,
            trust_remote_code=args.trust_remote_code == "true",
        )
    except (EvaluationInputError, SmokeTestFailed, UnsafeModelError) as err:
        logger.error("%s", err)
        return 2
    except Exception:
        logger.exception("Smoke test failed")
        return 1
    Path(args.output).write_text(json.dumps(result.to_dict(), indent=2))
    if not result.passed:
        shown = "; ".join(f"{text[-60:]!r} -> {answer[:60]!r}" for text, answer in result.bad_answers)
        logger.error(
            "%s answered outside the label set %s on %d of %d rows, e.g. %s. The model loads but does not "
            "answer with labels: it stays out of champion; check its training (loss, gate metrics).",
            args.model_uri,
            result.labels,
            result.n_bad,
            result.rows,
            shown,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
