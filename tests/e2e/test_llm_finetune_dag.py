"""The whole llm_finetune DAG through `airflow dags test` on embedded defaults, then checked in MLflow.

This is what `make demo` does, on a smaller generated dataset: real Spark (local), a real GX
suite, a real Arrow dataset, real LoRA training, a real MLflow registry in SQLite. The home starts
with the session's built-in base model (tests/conftest.py). The failure paths run beside this
chain, in a home of their own: tests/e2e/test_llm_finetune_failures.py.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

try:
    from tests.e2e.dag_runs import assert_same_predictions, evaluated_split, pyfunc_answers, served_answers
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from dag_runs import assert_same_predictions, evaluated_split, pyfunc_answers, served_answers

pytestmark = pytest.mark.e2e

# Variables the test session set for unit tests; the DAG run must get the embedded defaults instead.
_SESSION_ONLY = ("AIRFLOW_HOME", "MLFLOW_TRACKING_URI", "SPARKTUNE_LAKE_URI")
DEMO_ROWS = 2500
# What make demo runs: no training params, so the recipe comes from the built-in base model.
FAST_TRAINING: dict = {}


@pytest.fixture(scope="module")
def home(embedded_home, install_base_model) -> Path:
    home = embedded_home("e2e-home")
    install_base_model(home)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sparktune_dev.demo_data",
            "--rows",
            str(DEMO_ROWS),
            "--out",
            str(home / "data" / "support_tickets.jsonl"),
        ],
        check=True,
    )
    _mislabel(home / "data" / "support_tickets.jsonl", home / "mislabelled.json")
    return home


# Texts of the source whose label the home fixture makes wrong: the feedback loop has to fix them.
MISLABELLED = 12


def _mislabel(source: Path, record: Path) -> None:
    """Give MISLABELLED good, unique texts of ``source`` a wrong label; record text -> true label."""
    from sparktune.model.builtin_corpus import INTENTS

    rows = [json.loads(line) for line in source.read_text().splitlines()]
    copies: dict[str, int] = {}
    for row in rows:
        key = " ".join(str(row["message"]).lower().split())
        copies[key] = copies.get(key, 0) + 1
    candidates = [
        row
        for row in rows
        if row["intent_label"]
        and row["quality_score"] >= 0.9
        and 40 <= len(row["message"].strip()) <= 300
        and copies[" ".join(row["message"].lower().split())] == 1
    ]
    truth = {}
    for n, row in enumerate(candidates[:: len(candidates) // MISLABELLED][:MISLABELLED]):
        truth[row["message"]] = row["intent_label"]
        right = INTENTS.index(row["intent_label"])
        row["intent_label"] = INTENTS[(right + 1 + n % (len(INTENTS) - 1)) % len(INTENTS)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    record.write_text(json.dumps(truth))


def run_dag(home: Path, conf: dict, dag: str = "llm_finetune") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _SESSION_ONLY}
    env["SPARKTUNE_HOME"] = str(home)
    result = subprocess.run(
        [sys.executable, "-m", "sparktune_dev.embedded", "run", "--dag", dag, "--conf", json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    (home / f"dags-test-{len(list(home.glob('dags-test-*')))}.log").write_text(result.stdout + result.stderr)
    return result


def _client(home: Path):
    """A client of the DAG's store; MLflow's global tracking URI stays as it was."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")


@pytest.fixture(scope="module")
def happy_run(home):
    result = run_dag(home, FAST_TRAINING)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    return result


def test_the_airflow_database_is_migrated_once_and_stamped_with_its_schema(home, happy_run):
    # run_dag skips `airflow db migrate` (about 5 s a run) while this stamp matches the database.
    from sparktune_dev.embedded.environment import MIGRATED_STAMP

    [(revision,)] = _airflow_db(home, "select version_num from alembic_version")
    stamp = (home / "airflow" / MIGRATED_STAMP).read_text()
    assert stamp.startswith("apache-airflow 3.") and stamp.endswith(f" schema {revision}")


def test_airflow_parsed_the_dags_own_file_not_the_folder_before_the_run(happy_run):
    # The embedded runner passes --dagfile-path; dag.test() then syncs the whole folder once.
    parsed = re.findall(r"Filling up the DagBag from (\S+)", happy_run.stdout + happy_run.stderr)
    assert parsed and parsed[0].endswith("/dags/llm_finetune.py"), parsed


def test_run_ends_with_a_champion_with_metrics(home, happy_run):
    client = _client(home)
    champion = client.get_model_version_by_alias("support-intent", "champion")
    assert "candidate" in champion.aliases and "staging" in champion.aliases
    run = client.get_run(champion.run_id)
    for metric in ("eval_loss", "eval_accuracy", "eval_macro_f1", "train_loss", "tokens_per_second"):
        assert metric in run.data.metrics, metric
    assert 0.0 <= run.data.metrics["eval_accuracy"] <= 1.0
    # The run set no training param: the recipe came from the built-in base model, and with it the
    # model is as good as the cheap baseline scored on the same test rows.
    assert run.data.params["recipe"] == "built-in-causal-lm"
    assert run.data.params["recipe_set_by_user"] == "(none)"
    assert run.data.params["learning_rate"] == "0.003"
    assert run.data.metrics["eval_accuracy"] >= run.data.metrics["baseline_accuracy"] - 0.05
    assert run.data.tags["sparktune.gate.decision"] == "promote"
    fingerprint = run.data.tags["sparktune.data_fingerprint"]
    assert champion.tags["data_fingerprint"] == fingerprint
    assert champion.tags["fine_tuned_on"].endswith(fingerprint)
    assert run.data.metrics["rows_out.read"] == DEMO_ROWS
    pages = [a.path for a in client.list_artifacts(champion.run_id, "data_docs")]
    assert pages and all(p.endswith(".html") for p in pages), pages
    assert {a.path for a in client.list_artifacts(champion.run_id, "pipeline")} >= {
        "pipeline/prepare_summary.json",
        "pipeline/quality_summary.json",
    }
    # Between staging and champion the model was loaded as users load it and answered with labels.
    assert float(champion.tags["smoke_latency_p50_ms"]) > 0
    assert champion.tags["code_version"] == run.data.tags["sparktune.code_version"]
    assert len(json.loads(champion.tags["labels"])) == 10  # the demo data's intents, in label order
    from sparktune.release.registry import audit_log

    [promotion] = [m for m in audit_log(client, "support-intent") if m["alias"] == "champion"]
    assert promotion["reason"].startswith("passed the gate (enabled)")


def test_dataset_on_disk_is_the_fingerprinted_arrow_dataset(home, happy_run):
    import datasets

    client = _client(home)
    champion = client.get_model_version_by_alias("support-intent", "champion")
    fingerprint = champion.tags["data_fingerprint"]
    dataset = datasets.load_from_disk(str(home / "lake" / "datasets" / fingerprint))
    assert set(dataset) == {"train", "validation", "test"}
    assert isinstance(dataset["train"].features["label"], datasets.ClassLabel)
    assert len(dataset["train"].features["label"].names) >= 8
    total = sum(len(split) for split in dataset.values())
    assert 0.8 * total <= len(dataset["train"]) + 20  # about 80/10/10
    assert 0 < total < DEMO_ROWS  # every filter had work to do on the demo data
    assert (home / "lake" / "quarantine" / fingerprint).is_dir()
    assert any((home / "gx").rglob("index.html")), "Great Expectations Data Docs were not written"


def test_the_quality_gate_ran_in_the_preparation_job_and_validate_data_decided_on_it(home, happy_run):
    client = _client(home)
    run_id = client.get_model_version_by_alias("support-intent", "champion").run_id
    folder = Path(client.download_artifacts(run_id, "pipeline", str(home / "pipeline-artifacts")))
    prepared = json.loads((folder / "prepare_summary.json").read_text())
    decided = json.loads((folder / "quality_summary.json").read_text())
    # validate_data's result is the report the prepare job wrote, and it started no Spark session.
    assert prepared["quality"] == decided and decided["success"] is True and decided["evaluated"] > 20
    assert "deciding on its report, no Spark session here" in happy_run.stdout + happy_run.stderr


def test_every_task_emitted_lineage(home, happy_run):
    events = [json.loads(line) for line in (home / "lineage" / "events.jsonl").read_text().splitlines()]
    completed = {e["job"]["name"] for e in events if e.get("eventType") == "COMPLETE"}
    for task in ("prepare_data", "validate_data", "materialize_dataset", "train", "promote_champion"):
        assert f"llm_finetune.{task}" in completed, sorted(completed)


def _started_tasks(output: str) -> set[str]:
    return {
        line.split("task_id=")[1].split()[0] for line in output.splitlines() if "starting task_id=" in line
    }


# --------------------------------------------------------------------------------------------
# One prediction path: what evaluation scored (and the gate promoted on) is what users get.


@pytest.fixture(scope="module")
def evaluated_test_split(home, happy_run, tmp_path_factory) -> dict:
    """The champion's evaluation of the test split, row by row (its logged predictions.csv),
    beside the split's texts."""
    split = evaluated_split(home, "support-intent", tmp_path_factory.mktemp("parity"))
    assert len(split["texts"]) > 100
    return split


def test_the_registered_pyfunc_predicts_what_evaluation_scored(home, evaluated_test_split):
    ids = list(evaluated_test_split["texts"])
    answers = pyfunc_answers(
        home, "models:/support-intent@champion", [evaluated_test_split["texts"][i] for i in ids]
    )
    assert_same_predictions(
        "mlflow.pyfunc.load_model('models:/support-intent@champion')",
        evaluated_test_split["rows"],
        dict(zip(ids, answers["prediction"], strict=True)),
        dict(zip(ids, answers["score"], strict=True)),
    )


def test_the_serving_endpoint_answers_what_evaluation_scored_and_captures_it(home, evaluated_test_split):
    """make serve's server over the champion, sent the test split over HTTP in requests of 16 texts."""
    import pyarrow.dataset as ds

    captures = evaluated_test_split["folder"] / "serving_captures"
    ids = list(evaluated_test_split["texts"])
    answers = served_answers(home, [evaluated_test_split["texts"][i] for i in ids], captures)
    champion = evaluated_test_split["champion"]
    assert {(a["model_name"], a["model_version"]) for a in answers} == {
        ("support-intent", str(champion.version))
    }
    assert_same_predictions(
        "the serving endpoint",
        evaluated_test_split["rows"],
        {i: a["prediction"] for i, a in zip(ids, answers, strict=True)},
        {i: a["score"] for i, a in zip(ids, answers, strict=True)},
    )
    captured = ds.dataset(captures, format="parquet", partitioning="hive").to_table().to_pandas()
    assert len(captured) == len(ids) and set(captured["text"]) == set(evaluated_test_split["texts"].values())


# The loop runs last: the runs above then neither merge its corrections nor prepare a new data version.


def test_a_retrain_on_unchanged_data_skips_training_before_any_spark_job(home, happy_run):
    # The weekly or asset-triggered run on the same source files, config and code trains nothing,
    # and finds that out from the files' listing before prepare_data submits anything.
    client = _client(home)
    versions_before = len(client.search_model_versions("name = 'support-intent'"))
    champion = client.get_model_version_by_alias("support-intent", "champion")
    result = run_dag(home, FAST_TRAINING)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    output = result.stdout + result.stderr
    assert (
        f"skipping training: nothing changed since champion v{champion.version}: same source files" in output
    )
    assert champion.tags["source_signature"] in output
    assert not {"prepare_data", "validate_data", "train"} & _started_tasks(output)
    assert "Spark-Submit cmd" not in output
    assert len(client.search_model_versions("name = 'support-intent'")) == versions_before


INCOMING_ROWS = 300


def _predictions(home: Path):
    import pyarrow.dataset as ds

    return ds.dataset(home / "lake" / "predictions", format="parquet", partitioning="hive").to_table()


# Test-split rows among the new tickets carry this id prefix: their ids cannot meet the tickets'.
TEST_SPLIT_ID = "test-split:"
# The mislabelled training texts come back among the new tickets (a customer writing again).
MISLABELLED_ID = "mislabelled:"


@pytest.fixture(scope="module")
def first_scoring(home, evaluated_test_split) -> Path:
    """batch_inference on the DAG's defaults with the first champion, over new tickets and the
    champion's test split (as rows of the same source); returns the tickets file.

    One run serves two checks: the new tickets are scored as a user's new data would be, and the
    test split's rows must get what evaluation scored (one prediction path)."""
    incoming = home / "data" / "incoming_tickets.jsonl"  # the DAG's default source
    subprocess.run(
        [sys.executable, "-m", "sparktune_dev.demo_data", "--rows", str(INCOMING_ROWS), "--seed", "11"]
        + ["--out", str(incoming)],
        check=True,
    )
    with incoming.open("a") as source:
        for example_id, text in evaluated_test_split["texts"].items():
            source.write(json.dumps({"message_hash": TEST_SPLIT_ID + example_id, "message": text}) + "\n")
        for n, text in enumerate(json.loads((home / "mislabelled.json").read_text())):
            source.write(json.dumps({"message_hash": f"{MISLABELLED_ID}{n}", "message": text}) + "\n")
    result = run_dag(home, {}, dag="batch_inference")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    return incoming


def test_batch_inference_over_spark_predicts_what_evaluation_scored(
    home, evaluated_test_split, first_scoring
):
    table = _predictions(home).to_pandas()
    table = table[table["id"].str.startswith(TEST_SPLIT_ID)]
    ids = table["id"].str.removeprefix(TEST_SPLIT_ID)
    assert set(table["model_version"]) == {str(evaluated_test_split["champion"].version)}
    assert_same_predictions(
        "the batch_inference DAG",
        evaluated_test_split["rows"],
        dict(zip(ids, table["prediction"], strict=True)),
        dict(zip(ids, table["score"], strict=True)),
    )


def test_batch_inference_scores_new_data_with_the_champion(home, first_scoring):
    incoming = first_scoring
    champion = _client(home).get_model_version_by_alias("support-intent", "champion")
    table = _predictions(home).to_pandas()
    table = table[~table["id"].str.startswith((TEST_SPLIT_ID, MISLABELLED_ID))]
    assert len(table) == INCOMING_ROWS  # one prediction per input row
    assert set(table.columns) >= {
        "id", "prediction", "score", "model_name", "model_version", "model_alias", "data_fingerprint",
        "scored_at", "date",
    }  # fmt: skip
    assert set(table["model_version"]) == {str(champion.version)}
    assert set(table["data_fingerprint"]) == {champion.tags["data_fingerprint"]}
    labels = set(json.loads(champion.tags["labels"]))
    assert set(table["prediction"]) <= labels and table["score"].between(0, 1).all()
    # The tiny champion is good on data like its training data.
    truth = {}
    for line in incoming.read_text().splitlines():
        row = json.loads(line)
        truth.setdefault(row["message_hash"], row.get("intent_label"))
    agree = (table["prediction"] == table["id"].map(truth)).mean()
    assert agree > 0.7, agree
    review = list((home / "lake" / "feedback" / "predictions").rglob("*.parquet"))
    assert review, "the scored rows did not reach the feedback table"


def _airflow_db(home: Path, query: str) -> list[tuple]:
    import sqlite3

    with sqlite3.connect(home / "airflow" / "airflow.db") as db:
        return db.execute(query).fetchall()


def test_monitor_champion_compares_what_was_scored_with_the_training_data(home, first_scoring):
    """monitor_champion (what make monitor runs) after batch_inference: the scoring emitted the asset
    the monitor is scheduled on, and the run writes Evidently's report and the summary; new tickets
    from the training data's own generator are no text drift."""
    events = _airflow_db(
        home,
        "select e.source_dag_id from asset_event e join asset a on a.id = e.asset_id "
        "where a.name = 'sparktune_scored_traffic'",
    )
    assert events and {dag for (dag,) in events} == {"batch_inference"}
    result = run_dag(home, {}, dag="monitor_champion")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    summary = json.loads(
        (home / "lake" / "monitoring" / "support-intent" / "latest_summary.json").read_text()
    )
    assert summary["texts"] >= 100 and summary["model_version"] == str(
        _client(home).get_model_version_by_alias("support-intent", "champion").version
    )
    assert Path(summary["report_uri"]).stat().st_size > 100_000  # Evidently's self-contained page
    checks = {check["name"]: check for check in summary["checks"]}
    assert set(checks) == {"texts", "label_mix", "scores"} and all(
        c["value"] is not None for c in checks.values()
    )
    assert not checks["texts"]["drifted"], checks["texts"]
    assert summary["message"] in result.stdout + result.stderr


def test_corrections_train_a_new_data_version_whose_promotion_triggers_batch_inference(home, first_scoring):
    """The loop: scored rows -> human corrections -> a new data version -> training (streaming
    mode) -> promotion -> the champion asset event that starts batch_inference."""
    client = _client(home)
    first = client.get_model_version_by_alias("support-intent", "champion")
    marker = home / "lake" / "datasets" / first.tags["data_fingerprint"] / "_SPARKTUNE_COMPLETE.json"
    built_at = marker.stat().st_mtime_ns

    # The reviewer works from the review queue: the training rows whose label looks wrong (the
    # demo source's), then every scored text, least sure first.
    queued = run_dag(home, {"queue_size": 1000}, dag="review_queue")
    assert queued.returncode == 0, queued.stdout[-4000:] + queued.stderr[-4000:]
    [queue_file] = (home / "lake" / "feedback" / "review_queue").rglob("review_queue.csv")
    with queue_file.open(newline="", encoding="utf-8-sig") as handle:
        queue = list(csv.DictReader(handle))
    issues = [row for row in queue if row["origin"] == "label_issue"]
    assert queue[: len(issues)] == issues and 0 < len(issues) <= 50
    qualities = [float(row["label_quality"]) for row in issues]
    scores = [float(row["score"]) for row in queue[len(issues) :]]
    assert qualities == sorted(qualities) and scores == sorted(scores) and len(queue) > INCOMING_ROWS
    assert len({" ".join(row["text"].lower().split()) for row in queue}) == len(queue)  # one row per text

    # They label the mislabelled training texts and 40 new tickets (here: with their true labels;
    # some of those texts are in the training source already) and leave every other row blank.
    truth = json.loads((home / "mislabelled.json").read_text())
    assert set(truth) <= {row["text"] for row in queue}
    incoming = [json.loads(line) for line in first_scoring.read_text().splitlines()]  # test split: no labels
    picked = {r["message_hash"]: r for r in incoming if r.get("intent_label") and r.get("message")}
    picked = dict(list(picked.items())[:40])
    for row in queue:
        row["label"] = truth.get(row["text"]) or picked.get(row["id"], {}).get("intent_label") or ""
    filled = home / "data" / "review_filled.csv"
    with filled.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(queue[0]))
        writer.writeheader()
        writer.writerows(queue)
    recorded = run_dag(home, {"corrections_uri": str(filled)}, dag="record_corrections")
    assert recorded.returncode == 0, recorded.stdout[-4000:] + recorded.stderr[-4000:]

    # The streaming model trains to the recipe (2 epochs) like the first one. With 70 steps it
    # passed the gate (0.90 accuracy) but wrote labels that do not exist on 3 of the smoke test's 16
    # rows here and on 7 in CI: a half-trained tiny model is not a stable base for a test.
    streaming = {"dataset_mode": "streaming", "model_name": "support-intent-stream"}
    result = run_dag(home, {**FAST_TRAINING, **streaming})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    output = result.stdout + result.stderr
    assert marker.stat().st_mtime_ns == built_at  # streaming mode builds no dataset
    champion = client.get_model_version_by_alias("support-intent-stream", "champion")
    run = client.get_run(champion.run_id)
    assert run.data.params["dataset_mode"] == "streaming"
    # The corrected texts the source lacked made a new data version, hence a new fingerprint.
    assert run.data.tags["sparktune.data_fingerprint"] != first.tags["data_fingerprint"]
    assert run.data.params["dataset_path"] == champion.tags["fine_tuned_on"]
    summary = Path(client.download_artifacts(champion.run_id, "pipeline/prepare_summary.json"))
    assert "/lake/sources/" in json.loads(summary.read_text())["source_uri"]
    relabelled = re.search(
        r"feedback: \d+ corrected texts, \d+ already in the source, (\d+) source rows relabelled, "
        r"[1-9]\d* added",
        output,
    )
    assert relabelled and int(relabelled.group(1)) >= MISLABELLED, output[-3000:]
    assert "eval_accuracy" in run.data.metrics

    # The corrections won over the source: the run lists every relabelled row, says how many there
    # were, and trained on the fixed labels.
    assert run.data.metrics["feedback.labels_changed"] == int(relabelled.group(1))
    with open(client.download_artifacts(champion.run_id, "feedback/_label_overrides.csv"), newline="") as f:
        overrides = {row["text"]: row for row in csv.DictReader(f)}
    for text, right in truth.items():
        assert overrides[text]["new_label"] == right and overrides[text]["old_label"] != right
    quality = json.loads(
        Path(client.download_artifacts(champion.run_id, "pipeline/quality_summary.json")).read_text()
    )
    assert quality["statistics"]["feedback"]["labels_changed"] == int(relabelled.group(1))
    prepared = pq.read_table(json.loads(summary.read_text())["prepared_uri"], columns=["text", "label"])
    trained_on = dict(zip(prepared["text"].to_pylist(), prepared["label"].to_pylist(), strict=True))
    assert {text: trained_on.get(text.strip()) for text in truth} == truth
    # ... and the new champion predicts the fixed texts with their new labels.
    import mlflow
    from sparktune.model.process_setup import using_tracking_uri

    with using_tracking_uri(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"):  # models:/ reads the globals
        model = mlflow.pyfunc.load_model("models:/support-intent-stream@champion")
        answers = model.predict(list(truth))
    predicted = dict(zip(truth, answers["prediction"], strict=True))
    print("fixed texts predicted right:", sum(predicted[t] == truth[t] for t in truth), "of", len(truth))
    assert predicted == truth

    # The promotion emitted the champion asset event, naming the model and version...
    [(extra, source_dag)] = _airflow_db(
        home,
        "select e.extra, e.source_dag_id from asset_event e join asset a on a.id = e.asset_id "
        "where a.name = 'sparktune_champion' and e.source_run_id = "
        "(select max(source_run_id) from asset_event where source_dag_id = 'llm_finetune')",
    )
    assert source_dag == "llm_finetune"
    assert json.loads(extra)["model_name"] == "support-intent-stream"
    assert json.loads(extra)["version"] == str(champion.version)
    # That a scheduler turns the event into a batch_inference run scoring with the new champion is
    # shown on the production stack: tests/stack/test_full_stack.py.
