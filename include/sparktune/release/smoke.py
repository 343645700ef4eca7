"""The smoke test between ``staging`` and ``champion``: the model as a user gets it, on sample rows.

``mlflow.pyfunc.load_model("models:/NAME@staging")`` is exactly what a serving job or a notebook
does, so a model whose logged form cannot load, cannot predict, answers with something that is
not a label, or answers a text differently alone than within a batch stops here, before the
champion alias moves. Latency is recorded: the load, and
each sample row predicted alone (p50, p95), the way an online caller would see it.

    python -m sparktune.jobs.smoke_test --model-uri models:/support-intent@staging \\
        --dataset-path /lake/datasets/<fingerprint> --rows 16 --output smoke.json

Exit codes: 0 passed, 2 the model answered outside the label set or the input is unusable
(deterministic: promotion must stop), 1 anything else.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger("sparktune.release.smoke")

DEFAULT_ROWS = 16
# A text scored alone and within a padded batch: float noise only.
BATCH_SCORE_TOLERANCE = 1e-4


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

    The model folder is downloaded and checked first (:mod:`sparktune.core.model_safety`): safetensors
    weights only, and no code shipped with the model unless ``trust_remote_code``.
    """
    from sparktune.release.eval_inputs import label_strings, load_label_model, load_split

    dataset = load_split(dataset_path, split, rows, required=("label", "text"))
    labels, _ = label_strings(dataset)
    inputs = [str(v) for v in dataset["text"]]
    started = time.perf_counter()
    # Downloaded, checked (safetensors only, no unapproved code) and loaded with mlflow.pyfunc.
    scorer = load_label_model(model_uri, labels=labels, trust_remote_code=trust_remote_code)
    load_seconds = time.perf_counter() - started
    known = set(scorer.spec.labels)

    latencies = []
    answers: list[tuple[str, float]] = []
    for text in inputs:
        started = time.perf_counter()
        predicted, scores = scorer.predict([text])
        latencies.append((time.perf_counter() - started) * 1000.0)
        answers.extend(zip(predicted, scores, strict=True))
    started = time.perf_counter()
    batch_labels, batch_scores = scorer.predict(inputs)
    batch_seconds = time.perf_counter() - started
    if len(answers) != len(inputs) or len(batch_labels) != len(inputs):
        raise SmokeTestFailed(
            f"{model_uri} returned {len(answers)} answers for {len(inputs)} rows one by one and "
            f"{len(batch_labels)} for the batch: a model must answer every row once."
        )
    bad = []
    for text, (label, score), batch_label, batch_score in zip(
        inputs, answers, batch_labels, batch_scores, strict=True
    ):
        if label not in known or not 0.0 <= score <= 1.0:
            bad.append([text, f"{label!r} with score {score!r}: not a label of {sorted(known)}"])
        elif label != batch_label or abs(score - batch_score) > BATCH_SCORE_TOLERANCE:
            # Padding must not change an answer: a text alone and in a batch get the same label.
            bad.append([text, f"{label} ({score:.4f}) alone, {batch_label} ({batch_score:.4f}) in a batch"])
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
