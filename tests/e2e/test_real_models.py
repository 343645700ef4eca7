"""Real pretrained checkpoints through the whole llm_finetune DAG, as a user runs them.

- SmolLM2-135M-Instruct given as a path to its ``.gguf`` file (converted once, keyed by content):
  trained a few steps in its own chat template, evaluated, smoke-tested and promoted; then the
  prediction path users get answers what evaluation scored, row by row: the registered pyfunc by
  alias, the batch_inference DAG over Spark and the HTTP server.

The SmolLM2 run is also the suite's dry run: three steps fail the gate, which records it and lets
the promotion go ahead saying so. all-MiniLM-L6-v2 by name (an encoder without an eos token, a new
classification head) is the bad model of tests/e2e/test_llm_finetune_failures.py: its blocked run
proves it end to end.

A few optimizer steps each: these tests are about the pipeline on real checkpoints, not about
their accuracy (``make bench-quality`` measures that). The GGUF conversion is shared with the
unit tests (tests/conftest.py ``real_base_model``) and linked into the home, as a machine that
converted the file before would have it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from tests.e2e.dag_runs import (
        assert_same_predictions,
        evaluated_split,
        output_tail,
        pyfunc_answers,
        run_dag,
        served_answers,
    )
except ImportError:  # tests/ is not a package: pytest put this folder on sys.path
    from dag_runs import (
        assert_same_predictions,
        evaluated_split,
        output_tail,
        pyfunc_answers,
        run_dag,
        served_answers,
    )

pytestmark = pytest.mark.e2e

ROWS = 300  # enough for the quality gate's 100 train rows after the demo data's dirty rows
SMOLLM2_MODEL = "support-intent-smollm2"
# A few steps of small batches: every stage runs, on a real model, in minutes.
FEW_STEPS = {"max_steps": 3, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    from sparktune.model.packaged_models import PACKAGED_MODELS, packaged_file

    return packaged_file(PACKAGED_MODELS["smollm2-135m-instruct"])


@pytest.fixture(scope="module")
def home(embedded_home, real_base_model, gguf_path) -> Path:
    home = embedded_home("real-models-home")
    converted = real_base_model(str(gguf_path))
    linked = home / "models" / "base" / "gguf" / converted.name
    linked.parent.mkdir(parents=True)
    linked.symlink_to(converted, target_is_directory=True)
    subprocess.run(
        [sys.executable, "-m", "sparktune_dev.demo_data", "--rows", str(ROWS)]
        + ["--out", str(home / "data" / "support_tickets.jsonl")],
        check=True,
    )
    return home


def _client(home: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")


@pytest.fixture(scope="module")
def smollm2_run(home, gguf_path):
    # The gate is a dry run: a model trained three steps is not meant to beat the baseline, and the
    # stages after the gate (smoke test, champion, serving) are what this run is for; it is also
    # the suite's proof of dry_run (the failing gate recorded, promotion saying so).
    conf = {"base_model": str(gguf_path), "model_name": SMOLLM2_MODEL, "gate_mode": "dry_run", **FEW_STEPS}
    result = run_dag(home, "llm_finetune", conf, timeout=1500)
    assert result.returncode == 0, output_tail(result)
    return result


def test_smollm2_from_its_gguf_file_trains_in_its_own_chat_template(home, smollm2_run, gguf_path):
    client = _client(home)
    champion = client.get_model_version_by_alias(SMOLLM2_MODEL, "champion")
    run = client.get_run(champion.run_id)
    assert run.data.params["recipe"] == "small-causal-lm"
    assert run.data.params["base_model"] == str(gguf_path)
    converted = run.data.params["base_model_resolved"]
    assert converted.startswith(str(home / "models" / "base" / "gguf" / "SmolLM2-135M-Instruct.Q4_1-"))
    labels = json.loads(champion.tags["labels"])
    import mlflow
    from sparktune.model.process_setup import using_tracking_uri

    with using_tracking_uri(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"):  # models:/ reads the globals
        info = mlflow.models.get_model_info(f"models:/{SMOLLM2_MODEL}@champion")
    template = info.flavors["python_function"]["config"]["prompt_template"]
    assert template.startswith("<|im_start|>system\n")
    assert f"exactly one of these labels: {', '.join(sorted(labels))}." in template
    assert template.endswith("<|im_start|>assistant\n{label}")
    # the rows it trained on were built with that very template
    import datasets
    from sparktune.core.label_scoring import format_example

    dataset = datasets.load_from_disk(str(home / "lake" / "datasets" / champion.tags["data_fingerprint"]))
    names = dataset["train"].features["label"].names
    for row in dataset["train"].select(range(5)):
        prompt, completion = format_example(template, row["text"], names[row["label"]])
        assert (row["prompt"], row["completion"]) == (prompt, completion)
    for metric in ("eval_accuracy", "baseline_accuracy", "tokens_per_second"):
        assert metric in run.data.metrics, metric
    assert float(champion.tags["smoke_latency_p50_ms"]) > 0


def test_a_dry_run_records_the_failing_gate_and_promotes_saying_so_at_each_alias(home, smollm2_run):
    """Three steps do not make a model that passes the gate: in ``dry_run`` the failing decision is
    recorded, the runner exits 0 (dry_run never blocks), and each alias move says it went ahead
    despite the gate."""
    from sparktune.release.registry import audit_log

    client = _client(home)
    champion = client.get_model_version_by_alias(SMOLLM2_MODEL, "champion")
    assert "staging" in champion.aliases
    tags = client.get_run(champion.run_id).data.tags
    assert tags["sparktune.gate.mode"] == "dry_run" and "min_accuracy: FAIL" in tags["sparktune.gate.reasons"]
    assert f"smoke test of models:/{SMOLLM2_MODEL}@staging" in smollm2_run.stdout + smollm2_run.stderr
    for alias in ("staging", "champion"):
        last = [m for m in audit_log(client, SMOLLM2_MODEL) if m["alias"] == alias][-1]
        assert last["to_version"] == str(champion.version)
        assert "dry_run" in last["reason"] and "FAILED" in last["reason"] and "min_accuracy" in last["reason"]


@pytest.fixture(scope="module")
def smollm2_evaluated(home, smollm2_run, tmp_path_factory) -> dict:
    return evaluated_split(home, SMOLLM2_MODEL, tmp_path_factory.mktemp("smollm2-parity"))


def test_smollm2_pyfunc_and_server_answer_what_evaluation_scored(home, smollm2_evaluated):
    ids = list(smollm2_evaluated["texts"])
    texts = [smollm2_evaluated["texts"][i] for i in ids]
    answers = pyfunc_answers(home, f"models:/{SMOLLM2_MODEL}@champion", texts)
    assert_same_predictions(
        "the SmolLM2 pyfunc by alias",
        smollm2_evaluated["rows"],
        dict(zip(ids, answers["prediction"], strict=True)),
        dict(zip(ids, answers["score"], strict=True)),
    )
    served = served_answers(
        home, texts, smollm2_evaluated["folder"] / "serving_captures", model_name=SMOLLM2_MODEL
    )
    assert_same_predictions(
        "the SmolLM2 serving endpoint",
        smollm2_evaluated["rows"],
        {i: a["prediction"] for i, a in zip(ids, served, strict=True)},
        {i: a["score"] for i, a in zip(ids, served, strict=True)},
    )


def test_smollm2_batch_inference_over_spark_answers_what_evaluation_scored(home, smollm2_evaluated):
    import pyarrow.dataset as ds

    source = home / "data" / "smollm2_test_split.jsonl"
    source.write_text(
        "".join(
            json.dumps({"message_hash": example_id, "message": text}) + "\n"
            for example_id, text in smollm2_evaluated["texts"].items()
        )
    )
    output = home / "lake" / "smollm2_predictions"
    conf = {"model_name": SMOLLM2_MODEL, "source_uri": str(source), "output_uri": str(output)}
    result = run_dag(home, "batch_inference", conf, timeout=1200)
    assert result.returncode == 0, output_tail(result)
    table = ds.dataset(output, format="parquet", partitioning="hive").to_table().to_pandas()
    assert set(table["model_version"]) == {str(smollm2_evaluated["champion"].version)}
    assert_same_predictions(
        "the SmolLM2 batch_inference DAG",
        smollm2_evaluated["rows"],
        dict(zip(table["id"], table["prediction"], strict=True)),
        dict(zip(table["id"], table["score"], strict=True)),
    )
