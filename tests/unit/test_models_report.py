"""`make models` on a real MLflow registry (SQLite) with two versions and some alias moves."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from sparktune.model.process_setup import using_tracking_uri
from sparktune.release.models_report import format_models_report, main, models_report, registry_missing, table
from sparktune.release.registry import CANDIDATE, CHAMPION, move_alias, register_run_model, rollback_champion

try:
    from tests.mlflow_store import new_store
except ImportError:  # rootdir-relative import, as pytest puts tests/ on sys.path
    from mlflow_store import new_store

MODEL = "report-intent"
# Actors as the operators write them: airflow:<dag>/<run id>/<task>.
REGISTER = "airflow:llm_finetune/manual__2026-11-23T18:40:02+00:00/register"
PROMOTE_1 = "airflow:llm_finetune/manual__2026-11-23T18:02:11+00:00/promote_champion"
PROMOTE_2 = "airflow:llm_finetune/manual__2026-11-23T18:40:02+00:00/promote_champion"
ROLLBACK = "airflow:rollback_champion/manual__2026-11-23T19:44:38+00:00/rollback_champion"


class _EchoModel(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-report")
    uri = new_store(root / "mlflow.db")
    client = MlflowClient(uri)
    experiment = client.create_experiment("report-test", artifact_location=(root / "artifacts").as_uri())
    versions = []
    for accuracy, fingerprint in ((0.8125, "fp-one"), (0.9375, "fp-two")):
        # The fluent calls (start_run, log_model), for this block only.
        with using_tracking_uri(uri), mlflow.start_run(experiment_id=experiment) as run:
            mlflow.pyfunc.log_model(name="model", python_model=_EchoModel(), pip_requirements=[])
            mlflow.log_metrics({"eval_accuracy": accuracy, "eval_macro_f1": accuracy - 0.1, "eval_loss": 0.5})
            mlflow.set_tag("sparktune.data_fingerprint", fingerprint)
        versions.append(register_run_model(client, MODEL, run.info.run_id, {}))
    v1, v2 = versions
    # v1 carries its metrics and fingerprint as version tags (what the evaluate task writes);
    # v2 only in its run: the report reads both.
    client.set_model_version_tag(MODEL, v1, "eval_accuracy", "0.812500")
    client.set_model_version_tag(MODEL, v1, "data_fingerprint", "fp-one")
    client.set_model_version_tag(MODEL, v1, "gate_decision", "promote")
    move_alias(client, MODEL, CANDIDATE, v2, actor=REGISTER, reason="registered")
    move_alias(client, MODEL, CHAMPION, v1, actor=PROMOTE_1, reason="first")
    move_alias(client, MODEL, CHAMPION, v2, actor=PROMOTE_2, reason="passed\nthe gate")
    rollback_champion(client, MODEL, None, actor=ROLLBACK, reason="v2 misroutes")
    return uri, client


def test_report_has_versions_aliases_metrics_and_audit(registry):
    uri, client = registry
    (report,) = models_report(client, MODEL)
    assert [v.version for v in report.versions] == ["1", "2"]
    v1, v2 = report.versions
    assert v1.aliases == ("champion",) and v2.aliases == ("previous_champion", "candidate")
    assert v1.metrics["eval_accuracy"] == pytest.approx(0.8125)
    assert v2.metrics == pytest.approx({"eval_accuracy": 0.9375, "eval_macro_f1": 0.8375, "eval_loss": 0.5})
    assert (v1.data_fingerprint, v2.data_fingerprint) == ("fp-one", "fp-two")
    assert v1.gate_decision == "promote" and v1.created
    assert [(e["alias"], e["from_version"], e["to_version"]) for e in report.audit] == [
        ("candidate", "", "2"),
        ("champion", "", "1"),
        ("champion", "1", "2"),
        ("champion", "2", "1"),
    ]

    text = format_models_report([report], uri)
    lines = text.splitlines()
    assert f"MLflow registry: {uri}" in lines[0]
    assert f"Model {MODEL}: 2 version(s); champion v1, previous_champion v2, candidate v2" in text
    row1 = next(line for line in lines if line.startswith("      1  champion"))
    assert "0.8125" in row1 and "fp-one" in row1 and "promote" in row1
    row2 = next(line for line in lines if line.startswith("      2  previous_champion, candidate"))
    assert "0.9375" in row2 and "0.8375" in row2 and "0.5000" in row2 and "fp-two" in row2
    rollback = next(line for line in lines if "2 -> 1" in line)
    assert "champion" in rollback and "rollback" in rollback
    assert ROLLBACK in rollback and rollback.endswith("v2 misroutes")
    assert any(line.endswith("passed the gate") for line in lines)  # reasons on one line
    assert "-> 1" in next(line for line in lines if PROMOTE_1 in line)


def test_table_aligns_columns():
    lines = table(["n", "name"], [["1", "a"], ["10", "bbb"]], right=(0,))
    assert lines == [" n  name", "--  ----", " 1  a", "10  bbb"]


def test_cli_prints_all_models_and_refuses_an_unknown_one(registry, monkeypatch, capsys):
    uri, _ = registry
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert f"Model {MODEL}" in out and "Audit log of" in out
    assert main(["--model-name", "nope"]) == 1
    assert "no registered model 'nope'; registered: " in capsys.readouterr().err


def test_cli_says_when_there_is_no_registry_and_creates_none(tmp_path, monkeypatch, capsys):
    db = tmp_path / "mlflow" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    assert main([]) == 0
    assert "No MLflow registry yet" in capsys.readouterr().out
    assert not db.exists()
    assert registry_missing("http://127.0.0.1:5000") is None
