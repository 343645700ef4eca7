"""What every benchmark ends with: its targets judged, printed and written to its JSON, and an exit code.

A target compares one measured number with a threshold: ``at_least`` (a speed-up, a ratio of
rows/s) or ``at_most`` (seconds over a baseline, a peak in MB). Targets are ratios measured side
by side in one run wherever they can be, never absolute seconds: the machine is shared and noisy.
A target that could not be measured in this run (a method failed) is missed; one that does not
apply to this run's sizes is reported as not checked and fails nothing.

``BENCH_TARGET_FACTOR`` (default 1) makes every target that many times harder (an ``at_least``
threshold is multiplied by it, an ``at_most`` one divided by it): ``BENCH_TARGET_FACTOR=100``
checks that a missed target fails the run, without editing a bench.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

FACTOR_ENV = "BENCH_TARGET_FACTOR"


def target_factor() -> float:
    """How many times harder every target is (``BENCH_TARGET_FACTOR``, default 1)."""
    raw = os.environ.get(FACTOR_ENV, "").strip()
    try:
        factor = float(raw) if raw else 1.0
    except ValueError:
        raise SystemExit(f"{FACTOR_ENV} must be a positive number, got {raw!r}") from None
    if factor <= 0:
        raise SystemExit(f"{FACTOR_ENV} must be a positive number, got {raw!r}")
    return factor


def _fmt(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "s":
        return f"{value:.3f} s"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}" if unit else text


def target(
    name: str,
    value: float | None,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    unit: str = "",
    note: str = "",
) -> dict[str, Any]:
    """One target: ``value`` against ``at_least`` or ``at_most`` (made harder by ``BENCH_TARGET_FACTOR``).

    ``value`` None means the number could not be measured in this run: the target is missed.
    """
    if (at_least is None) == (at_most is None):
        raise ValueError("give exactly one of at_least and at_most")
    factor = target_factor()
    if at_least is not None:
        threshold, op = at_least * factor, ">="
        met = value is not None and value >= threshold
    else:
        threshold, op = at_most / factor, "<="
        met = value is not None and value <= threshold
    shown = "not measured" if value is None else _fmt(value, unit)
    text = f"{name}: {shown} (target {op} {_fmt(threshold, unit)})"
    record: dict[str, Any] = {
        "name": name,
        "value": value,
        "op": op,
        "threshold": threshold,
        "unit": unit,
        "met": met,
        "text": f"{text}: {'met' if met else 'MISSED'}" + (f" ({note})" if note else ""),
    }
    if note:
        record["note"] = note
    return record


def not_checked(name: str, why: str) -> dict[str, Any]:
    """A target this run cannot judge (its sizes are outside where the target applies): fails nothing."""
    return {"name": name, "value": None, "met": None, "note": why, "text": f"{name}: not checked ({why})"}


def write_report(path: Path, report: dict[str, Any]) -> Path:
    """The bench's JSON report at ``path`` (its folder created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def finish(path: Path, report: dict[str, Any], targets: list[dict[str, Any]], *, ran: bool = True) -> int:
    """Print the targets, write ``report`` with ``measured_at`` and the targets to ``path``, and return
    the exit code: 1 when a target was missed or the run itself failed (``ran`` False), else 0."""
    missed = [t for t in targets if t["met"] is False]
    passed = ran and not missed
    report = {
        **report,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target_factor": target_factor(),
        "targets": targets,
        "run_completed": ran,
        "targets_met": passed,
    }
    print("\ntargets:")
    for t in targets:
        print(f"  {t['text']}")
    if not targets:
        print("  (none)")
    write_report(path, report)
    print(f"\nwritten to {path}")
    if not ran:
        print("FAILED: the run did not complete (see above)")
    elif missed:
        print(f"FAILED: {len(missed)} of {len(targets)} targets missed")
    else:
        print("all targets met")
    return 0 if passed else 1


def tiny_champion(work: Path, model_name: str) -> tuple[str, str, Any]:
    """The tiny test model (``tests/unit/tiny_model.py``) fully fine-tuned in ``work`` and registered
    as ``model_name@champion``: (tracking URI, version, the ``tiny_model`` module)."""
    import sys

    # tiny_model lives in tests/unit and imports from the tests folder (as ``tests.<module>``).
    root_dir = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root_dir / "tests" / "unit"), str(root_dir)]
    import tiny_model
    from mlflow.tracking import MlflowClient
    from sparktune.model.process_setup import using_tracking_uri
    from sparktune.release.registry import register_run_model

    # A model carries the scoring code it was logged with: one trained before that code changed
    # would time the old code, so each version of it gets a workspace of its own.
    root = tiny_model.workspace(work / f"scoring-{scoring_code_digest()}")
    result = tiny_model.trained(root, "full")
    uri = tiny_model.tracking_uri(root)
    client = MlflowClient(tracking_uri=uri)
    with using_tracking_uri(uri):
        version = register_run_model(
            client, model_name, result.mlflow_run_id, {"data_fingerprint": "fp-bench"}
        )
    client.set_registered_model_alias(model_name, "champion", version)
    return uri, str(version), tiny_model


SMOLLM2 = "smollm2-135m-instruct"
# What a bench's champion was built from: a model logged before any of these changed scores with
# the code it carries (the pyfunc logs label_scoring.py), so it is trained again.
_SCORING_CODE = (
    "include/sparktune/core/label_scoring.py",
    "include/sparktune/model/label_pyfunc.py",
    "include/sparktune/model/logged_model.py",
)


def scoring_code_digest() -> str:
    """16 hex digits of the code a logged model carries and scores with (:data:`_SCORING_CODE`)."""
    import hashlib

    root_dir = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in _SCORING_CODE:
        digest.update((root_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def smollm2_champion(work: Path, model_name: str, *, steps: int, rows: int = 256) -> tuple[str, str, Any]:
    """SmolLM2-135M-Instruct (built once from its PyPI package) fine-tuned with LoRA for ``steps``
    steps on the tiny intent rows in its own chat template (``tests/unit/tiny_model.py``'s texts and
    labels, prompts built by the pipeline's functions), through ``sparktune.model.training.train``,
    and registered as ``model_name@champion`` under ``work``: (tracking URI, version, ``tiny_model``).

    Reused while the scoring code, the steps and the rows are those it was built with (a tag on the
    version says them); else trained again (a few minutes on two cores)."""
    import hashlib
    import shutil
    import sys

    root_dir = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root_dir / "tests" / "unit"), str(root_dir)]
    import tiny_model
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    built_from = hashlib.sha256(f"{steps}\0{rows}\0{scoring_code_digest()}".encode()).hexdigest()[:16]
    work.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    try:
        champion = client.get_model_version_by_alias(model_name, "champion")
        if champion.tags.get("bench_built_from") == built_from:
            return uri, str(champion.version), tiny_model
    except MlflowException:  # no such model or alias yet: build it
        pass

    from datasets import Dataset, DatasetDict
    from sparktune.core.label_scoring import format_example
    from sparktune.core.params import default_params
    from sparktune.core.prompt_format import effective_prompt_template
    from sparktune.model.base_model import ensure_base_model
    from sparktune.model.process_setup import using_tracking_uri
    from sparktune.model.train_inputs import load_train_tokenizer
    from sparktune.model.train_request import TrainRequest
    from sparktune.model.training import train
    from sparktune.release.registry import register_run_model

    print(f"{model_name}: LoRA on {SMOLLM2}, {steps} steps (once per scoring code) ...", flush=True)
    base = ensure_base_model(SMOLLM2)
    labels = sorted(tiny_model.LABELS)
    template = effective_prompt_template("", load_train_tokenizer(base), labels)

    def split(n: int, seed: int) -> Dataset:
        out = []
        for row in tiny_model.make_rows(n, seed):
            label = tiny_model.LABELS[row["label"]]
            prompt, completion = format_example(template, row["text"], label)
            out.append({"text": row["text"], "label": label, "prompt": prompt, "completion": completion})
        return Dataset.from_list(out)

    data = work / "smollm2-data"
    shutil.rmtree(data, ignore_errors=True)
    DatasetDict({"train": split(rows, 1), "validation": split(32, 2), "test": split(32, 3)}).save_to_disk(
        str(data)
    )
    params = default_params()
    # A higher rate than the recipe's 2e-4: a few steps teach the four labels.
    params.update(
        max_steps=steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        seed=7,
    )
    result = train(
        TrainRequest(
            dataset_path=str(data),
            base_model=base,
            output_dir=str(work / "smollm2-out"),
            params=params,
            mlflow_tracking_uri=uri,
            experiment_name="bench-smollm2",
            train_key=f"bench-smollm2-{built_from}",
            tags={"data_fingerprint": "fp-bench"},
            run_name="bench-smollm2",
            artifact_location=(work / "artifacts").resolve().as_uri(),
        )
    )
    with using_tracking_uri(uri):
        version = register_run_model(
            client,
            model_name,
            result.mlflow_run_id,
            {"data_fingerprint": "fp-bench", "bench_built_from": built_from},
        )
    client.set_registered_model_alias(model_name, "champion", version)
    return uri, str(version), tiny_model
