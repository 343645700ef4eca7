"""A text summary of the newest model version: data counts, fingerprint, run, aliases, metrics.

``make demo`` and ``make run`` print it after the DAG run, from MLflow alone (the record a user
would consult), so what it shows is what was actually logged.
"""

from __future__ import annotations

import argparse
import json
import sys

from sparktune.core.config import DEFAULT_MODEL_NAME, settings


def model_summary(model_name: str) -> dict:
    """The newest version of ``model_name`` with its run's pipeline record; raises LookupError if none."""
    from mlflow.tracking import MlflowClient
    from sparktune.release import base_model_eval

    uri = settings().mlflow_tracking_uri
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    versions = client.search_model_versions(f"name = '{model_name}'")
    if not versions:
        raise LookupError(f"no registered model {model_name!r} in {uri}; run `make demo` first")
    newest = max(versions, key=lambda v: int(v.version))
    aliases = {
        alias: v.version
        for v in versions
        for alias in client.get_model_version(model_name, v.version).aliases
    }
    run = client.get_run(newest.run_id)
    prepare = _load_json_artifact(client, newest.run_id, "pipeline/prepare_summary.json")
    trained = _load_json_artifact(client, newest.run_id, "train_result.json")
    return {
        "model_name": model_name,
        "version": newest.version,
        "version_aliases": sorted(a for a, v in aliases.items() if v == newest.version),
        "all_aliases": aliases,
        "mlflow_run_id": newest.run_id,
        "data_fingerprint": run.data.tags.get("sparktune.data_fingerprint"),
        "gate_decision": run.data.tags.get("sparktune.gate.decision"),
        "gate_reasons": run.data.tags.get("sparktune.gate.reasons", ""),
        # Whether evaluate scored the base model before fine-tuning, and why not (its numbers are metrics).
        "base_model_eval": {
            "status": run.data.tags.get(base_model_eval.RUN_TAG, ""),
            "reason": run.data.tags.get(base_model_eval.RUN_REASON_TAG, ""),
            "base_model": run.data.tags.get(base_model_eval.TRAINED_FROM_TAG, ""),
        },
        "metrics": {k: v for k, v in sorted(run.data.metrics.items()) if not k.startswith("rows_out.")},
        "prepare_steps": (prepare or {}).get("steps", []),
        "split_counts": (prepare or {}).get("split_counts", {}),
        "label_conflicts": (prepare or {}).get("label_conflicts") or {},
        "feedback": _load_json_artifact(client, newest.run_id, "pipeline/feedback_summary.json") or {},
        "recipe": (trained or {}).get("recipe", {}),
    }


def _load_json_artifact(client, run_id: str, path: str) -> dict | None:
    import tempfile
    from pathlib import Path

    try:
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(client.download_artifacts(run_id, path, tmp)).read_text())
    except Exception:  # an older run without the record: the summary just omits it
        return None


def format_summary(summary: dict) -> str:
    lines = ["", "=" * 72, f"Model {summary['model_name']} version {summary['version']}", "=" * 72]
    if summary["prepare_steps"]:
        lines.append("Data preparation (rows in -> out):")
        for step in summary["prepare_steps"]:
            skipped = "  (skipped)" if step.get("skipped") else ""
            lines.append(f"  {step['step']:<18} {step['rows_in']:>9} -> {step['rows_out']:>9}{skipped}")
        lines.append(f"  splits: {json.dumps(summary['split_counts'])}")
    conflicts = summary.get("label_conflicts") or {}
    if conflicts.get("texts"):
        lines.append(
            f"Label conflicts:   {conflicts['texts']} text(s) labelled differently, "
            f"{conflicts['rows']} row(s) set aside (label_conflicts={conflicts['policy']})"
        )
    feedback = summary.get("feedback") or {}
    if feedback.get("labels_changed") or feedback.get("added_rows"):
        lines.append(
            f"Feedback:          corrections relabelled {feedback['labels_changed']} source row(s) and added "
            f"{feedback['added_rows']} text(s); list: {feedback.get('overrides_uri') or '(none)'}"
        )
    lines += [
        f"Data fingerprint:  {summary['data_fingerprint']}",
        f"MLflow run id:     {summary['mlflow_run_id']}",
        f"Aliases of v{summary['version']}:    {', '.join(summary['version_aliases']) or '(none)'}",
        f"All aliases:       {json.dumps(summary['all_aliases'])}",
    ]
    if summary.get("recipe"):
        from sparktune.model.recipes import format_recipe

        lines += format_recipe(summary["recipe"])
    lines += [f"Gate decision:     {summary['gate_decision']}"]
    lines += [f"  {reason}" for reason in summary["gate_reasons"].splitlines()]
    lines.append("Metrics:")
    wanted = (
        "eval_loss",
        "eval_accuracy",
        "eval_macro_f1",
        "eval_perplexity",
        "train_loss",
        "tokens_per_second",
    )
    for name in wanted:
        if name in summary["metrics"]:
            lines.append(f"  {name:<24} {summary['metrics'][name]:.4f}")
    lines += reference_lines(summary["metrics"], summary.get("base_model_eval") or {})
    lines += [
        "",
        "Open the UIs on this state:",
        "  make mlflow-ui    # MLflow at http://127.0.0.1:5000",
        "  make airflow-ui   # Airflow at http://127.0.0.1:8080 (login: see README)",
        "",
    ]
    return "\n".join(lines)


def _interval(metrics: dict, value: str, low: str, high: str, sign: str = "") -> str:
    shown = f"{metrics[value]:{sign}.3f}"
    if low in metrics and high in metrics:
        shown += f" [{metrics[low]:{sign}.3f}, {metrics[high]:{sign}.3f}]"
    return shown


def reference_lines(metrics: dict, base_model: dict) -> list[str]:
    """The challenger's test accuracy beside the TF-IDF baseline's and the base model's before
    fine-tuning, each with the paired (challenger - it) difference on the same rows; the base
    model's status and reason when it has no numbers (a classifier's base: not applicable)."""
    from sparktune.release import base_model_eval

    if "eval_accuracy" not in metrics:
        return []
    lines = [
        "Test accuracy [95% interval], and challenger minus each on the same rows:",
        f"  {'challenger (fine-tuned)':<30} "
        + _interval(metrics, "eval_accuracy", "eval_accuracy_ci_low", "eval_accuracy_ci_high"),
    ]
    for label, name in (("TF-IDF baseline", "baseline"), ("base model (not fine-tuned)", "base_model")):
        if f"{name}_accuracy" in metrics:
            own = _interval(
                metrics, f"{name}_accuracy", f"{name}_accuracy_ci_low", f"{name}_accuracy_ci_high"
            )
            line = f"  {label:<30} {own:<22}"
            if f"vs_{name}_accuracy_diff" in metrics:
                vs = f"vs_{name}_accuracy"
                line += "  diff " + _interval(metrics, f"{vs}_diff", f"{vs}_ci_low", f"{vs}_ci_high", "+")
            lines.append(line.rstrip())
        elif name == "base_model" and base_model.get("status") in base_model_eval.STATUSES:
            outcome = base_model_eval.BaseModelOutcome(
                base_model["status"], reason=base_model.get("reason", "")
            )
            lines.append(f"  {label:<30} {base_model_eval.status_text(outcome)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparktune_dev.report", description=__doc__)
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    try:
        summary = model_summary(args.model_name)
    except LookupError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
