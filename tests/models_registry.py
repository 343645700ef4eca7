"""A real MLflow registry (SQLite) holding what the pipeline records of its versions, for the tests
of the Models page's data (tests/unit/test_model_views.py) and app (tests/operators/test_models_app.py).

Three versions of one model, written as the operators write them (the same metric, tag and
artifact names; no training): v1 promoted, v2 approved and promoted, rolled back to v1 by
rollback_champion; v3 registered only. Texts a person typed (a gate reason, an approval comment, an
audit reason) carry markup, which the page must show as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store

MODEL = "page-intent"
MARKUP = '<script>alert("x")</script>'
# Actors as the operators write them: airflow:<dag>/<run id>/<task>.
PROMOTE_1 = "airflow:llm_finetune/manual__2026-11-23T18:02:11+00:00/promote_champion"
PROMOTE_2 = "airflow:llm_finetune/manual__2026-11-23T18:40:02+00:00/promote_champion"
ROLLBACK = "airflow:rollback_champion/manual__2026-11-23T19:44:38+00:00/rollback_champion"
DATA_DOCS_PAGE = "validations/rows/20261123/index.html"

# v1: evaluated against the baseline only (the first champion), base model not applicable.
V1_METRICS = {
    "eval_accuracy": 0.8125,
    "eval_accuracy_ci_low": 0.75,
    "eval_accuracy_ci_high": 0.875,
    "eval_macro_f1": 0.8,
    "eval_macro_f1_ci_low": 0.7,
    "eval_macro_f1_ci_high": 0.86,
    "eval_loss": 0.5,
    "eval_loss_ci_low": 0.45,
    "eval_loss_ci_high": 0.55,
    "baseline_accuracy": 0.7,
    "baseline_accuracy_ci_low": 0.62,
    "baseline_accuracy_ci_high": 0.77,
    "baseline_macro_f1": 0.68,
    "vs_baseline_accuracy_diff": 0.1125,
    "vs_baseline_accuracy_ci_low": 0.05,
    "vs_baseline_accuracy_ci_high": 0.17,
}
# v2: also against the base model (scored) and the champion of then (v1).
V2_METRICS = {
    "eval_accuracy": 0.9375,
    "eval_accuracy_ci_low": 0.9,
    "eval_accuracy_ci_high": 0.97,
    "eval_macro_f1": 0.93,
    "eval_loss": 0.31,
    "baseline_accuracy": 0.7,
    "base_model_accuracy": 0.25,
    "base_model_accuracy_ci_low": 0.2,
    "base_model_accuracy_ci_high": 0.3,
    "vs_base_model_accuracy_diff": 0.6875,
    "vs_base_model_accuracy_ci_low": 0.62,
    "vs_base_model_accuracy_ci_high": 0.75,
    "champion_eval_accuracy": 0.8125,
    "vs_champion_accuracy_diff": 0.125,
    "vs_champion_accuracy_ci_low": 0.06,
    "vs_champion_accuracy_ci_high": 0.19,
}


@dataclass(frozen=True)
class PageRegistry:
    uri: str
    root: Path
    run_ids: dict[str, str]  # version -> its training run

    @property
    def data_docs_dir(self) -> Path:
        return self.root / "gx" / "data_docs" / "local_site"


def build(root: Path) -> PageRegistry:
    """The registry under ``root``; MLflow's process-wide state is as before once it returns."""
    import mlflow
    from mlflow.tracking import MlflowClient
    from sparktune.model.process_setup import using_tracking_uri
    from sparktune.release.registry import (
        CANDIDATE,
        CHAMPION,
        move_alias,
        register_run_model,
        rollback_champion,
    )

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return model_input

    uri = new_store(root / "mlflow.db")
    client = MlflowClient(uri)
    experiment = client.create_experiment("page-test", artifact_location=(root / "artifacts").as_uri())
    docs = root / "gx" / "data_docs" / "local_site"
    quality = {
        "success": True,
        "evaluated": 23,
        "failed": 0,
        "warned": 1,
        "data_docs_uri": (docs / DATA_DOCS_PAGE).as_uri(),
        "data_docs_dir": str(docs),
        "data_docs_index_uri": (docs / "index.html").as_uri(),
    }
    run_ids = {}
    versions = (("1", V1_METRICS, "fp-one"), ("2", V2_METRICS, "fp-two"), ("3", {}, ""))
    for version, metrics, fingerprint in versions:
        # The fluent calls, and the registration that resolves the logged model, on this store only.
        with using_tracking_uri(uri):
            with mlflow.start_run(experiment_id=experiment) as run:
                mlflow.pyfunc.log_model(name="model", python_model=Echo(), pip_requirements=[])
                if metrics:
                    mlflow.log_metrics(metrics)
                    mlflow.log_dict(quality, "pipeline/quality_summary.json")
                if fingerprint:
                    mlflow.set_tag("sparktune.data_fingerprint", fingerprint)
                mlflow.set_tag("sparktune.base_model", f"/models/base/tiny-llama-{version}")
            tags = {"data_fingerprint": fingerprint} if fingerprint else {}
            assert register_run_model(client, MODEL, run.info.run_id, tags) == version
        run_ids[version] = run.info.run_id
    # What gate, evaluate, smoke_test and approve_champion write.
    v1, v2 = run_ids["1"], run_ids["2"]
    for run_id, decision in ((v1, "promote"), (v2, "promote")):
        client.set_tag(run_id, "sparktune.gate.decision", decision)
        client.set_tag(run_id, "sparktune.gate.mode", "enabled")
        client.set_tag(
            run_id,
            "sparktune.gate.reasons",
            "min_accuracy: 0.8125 >= 0.6 holds\nmax_regression: no champion to compare against " + MARKUP,
        )
        client.set_model_version_tag(MODEL, "1" if run_id == v1 else "2", "gate_decision", decision)
    client.set_tag(v1, "sparktune.base_model_eval", "not_applicable")
    client.set_tag(v1, "sparktune.base_model_eval.reason", "task=sequence_classification: no trained head")
    client.set_tag(v2, "sparktune.base_model_eval", "scored")
    client.set_model_version_tag(MODEL, "1", "eval_accuracy", "0.812500")
    client.set_model_version_tag(MODEL, "2", "smoke_latency_p50_ms", "12.500")
    for key, value in {
        "approval_decision": "approved",
        "approval_by": "alice",
        "approval_at": "2026-11-23T18:39:00+00:00",
        "approval_comment": f"ship it {MARKUP}",
    }.items():
        client.set_model_version_tag(MODEL, "2", key, value)
    move_alias(client, MODEL, CANDIDATE, "3", actor="airflow:llm_finetune/r3/register", reason="registered")
    move_alias(client, MODEL, CHAMPION, "1", actor=PROMOTE_1, reason="passed the gate")
    move_alias(client, MODEL, CHAMPION, "2", actor=PROMOTE_2, reason="approved by alice")
    rollback_champion(client, MODEL, None, actor=ROLLBACK, reason=f"v2 misroutes refunds {MARKUP}")
    return PageRegistry(uri, root, run_ids)
