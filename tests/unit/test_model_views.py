"""The Models page's data (sparktune.release.model_views) from a real MLflow registry (SQLite) with
what the pipeline records of its versions (tests/models_registry.py)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from sparktune.release.model_views import Estimate, model_views

try:
    from tests import models_registry
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import models_registry

MODEL = models_registry.MODEL


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    built = models_registry.build(tmp_path_factory.mktemp("mlflow-page"))
    return built, MlflowClient(built.uri)


def test_each_version_has_its_aliases_figures_intervals_and_references(registry):
    built, client = registry
    (view,) = model_views(client, MODEL)
    assert view.name == MODEL and view.champion == "1"
    assert view.aliases == {"champion": "1", "previous_champion": "2", "candidate": "3"}
    assert [v.version for v in view.versions] == ["3", "2", "1"]  # newest first
    v3, v2, v1 = view.versions
    assert (
        v1.aliases == ("champion",) and v2.aliases == ("previous_champion",) and v3.aliases == ("candidate",)
    )
    assert v1.run_id == built.run_ids["1"]
    assert v1.figures == {
        "accuracy": Estimate(0.8125, 0.75, 0.875),
        "macro_f1": Estimate(0.8, 0.7, 0.86),
        "loss": Estimate(0.5, 0.45, 0.55),
    }
    # A figure without an interval (v2's macro F1) keeps its value.
    assert v2.figures["macro_f1"] == Estimate(0.93) and v2.figures["accuracy"] == Estimate(0.9375, 0.9, 0.97)

    baseline, base_model = v1.references
    assert baseline.kind == "baseline"
    assert baseline.figures == {"accuracy": Estimate(0.7, 0.62, 0.77), "macro_f1": Estimate(0.68)}
    assert baseline.versus == {"accuracy": Estimate(0.1125, 0.05, 0.17)}
    # Not scored: no figures, and the reason why.
    assert base_model.kind == "base_model" and not base_model.figures
    assert base_model.note == "not applicable: task=sequence_classification: no trained head"

    kinds = {r.kind: r for r in v2.references}
    assert list(kinds) == ["baseline", "base_model", "champion"]
    assert kinds["base_model"].figures == {"accuracy": Estimate(0.25, 0.2, 0.3)}
    assert kinds["base_model"].versus == {"accuracy": Estimate(0.6875, 0.62, 0.75)}
    assert kinds["base_model"].note == "/models/base/tiny-llama-2"  # scored: which base model
    assert kinds["champion"].figures == {"accuracy": Estimate(0.8125)}
    assert kinds["champion"].versus == {"accuracy": Estimate(0.125, 0.06, 0.19)}
    # Registered only: nothing evaluated, nothing to compare.
    assert v3.figures == {} and v3.references == () and v3.gate.decision == ""


def test_gate_data_approval_and_smoke_are_what_the_tasks_recorded(registry):
    built, client = registry
    (view,) = model_views(client, MODEL)
    v3, v2, v1 = view.versions
    assert v1.gate.decision == "promote" and v1.gate.mode == "enabled"
    assert v1.gate.reasons == (
        "min_accuracy: 0.8125 >= 0.6 holds",
        f"max_regression: no champion to compare against {models_registry.MARKUP}",
    )
    assert (v1.row.data_fingerprint, v2.row.data_fingerprint, v3.row.data_fingerprint) == (
        "fp-one",
        "fp-two",
        "",
    )
    docs = built.data_docs_dir
    assert v1.data_quality == {
        "data_docs_uri": (docs / models_registry.DATA_DOCS_PAGE).as_uri(),
        "data_docs_index_uri": (docs / "index.html").as_uri(),
        "data_docs_dir": str(docs),
        "success": True,
        "evaluated": 23,
        "failed": 0,
        "warned": 1,
    }
    assert v3.data_quality == {}  # a run without the summary
    assert v2.approval["approval_by"] == "alice" and v2.approval["approval_decision"] == "approved"
    assert v1.approval == {} and v2.smoke == {"smoke_latency_p50_ms": "12.500"}
    assert v1.base_model == "/models/base/tiny-llama-1"


def test_the_audit_log_is_newest_first_and_both_lists_are_capped(registry):
    _, client = registry
    (view,) = model_views(client, MODEL)
    assert [(e["alias"], e["from_version"], e["to_version"], e.get("kind")) for e in view.audit] == [
        ("champion", "2", "1", "rollback"),
        ("champion", "1", "2", "move"),
        ("champion", "", "1", "move"),
        ("candidate", "", "3", "move"),
    ]
    assert view.audit[0]["actor"] == models_registry.ROLLBACK
    assert view.audit_not_shown == 0 and view.versions_not_shown == 0

    (capped,) = model_views(client, MODEL, max_versions=2, max_audit=1)
    assert [v.version for v in capped.versions] == ["3", "2"] and capped.versions_not_shown == 1
    assert [e["to_version"] for e in capped.audit] == ["1"] and capped.audit_not_shown == 3


def test_every_model_or_one_and_an_unknown_one_is_refused(registry):
    _, client = registry
    assert [v.name for v in model_views(client)] == [MODEL]
    with pytest.raises(LookupError, match="no registered model 'nope'"):
        model_views(client, "nope")
