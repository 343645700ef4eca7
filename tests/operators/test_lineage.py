"""OpenLineage inputs/outputs of the operators: the chain source -> splits -> dataset -> model version
connects by name, and every dataset of the chain carries the data fingerprint as its version.

The operators are built as a DAG file builds them and given the result their ``execute`` returned
(the shapes below are copied from the summaries of a real run); the provider calls
``get_openlineage_facets_on_complete`` exactly like this after ``execute``.
"""

from __future__ import annotations

import pytest
from openlineage.client.serde import Serde
from sparktune_airflow import (
    BatchInferenceOperator,
    MaterializeDatasetOperator,
    PrepareDataOperator,
    RegisterModelOperator,
    TrainModelOperator,
)
from sparktune_airflow.core.lineage import dataset_name, has_split_folders, mlflow_namespace

FP = "3f9c2a7d51e04b8a"
RUN_ID = "0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f"
TRACKING = "http://mlflow.internal:5000"


def _prepare_summary(lake: str) -> dict:
    return {
        "data_fingerprint": FP,
        "prepared_uri": f"{lake}/prepared/{FP}",
        "quarantine_uri": f"{lake}/quarantine/{FP}",
        "rows_in": 1200,
        "rows_out": 1130,
        "steps": [{"step": "read", "rows_in": 1200, "rows_out": 1200, "dropped": 0, "skipped": False}],
        "split_counts": {"train": 904, "validation": 113, "test": 113},
        "labels": ["billing", "bug", "feature"],
        "rows_per_label": {"billing": 400, "bug": 380, "feature": 350},
        "warnings": [],
        "reused": False,
        "tokenizer": "/home/u/.local/models/base/tiny-llama",
        "source_uri": "/home/u/data/tickets.csv",
        "source_format": "csv",
    }


def _materialize_summary(lake: str) -> dict:
    return {
        "dataset_uri": f"{lake}/datasets/{FP}",
        "data_fingerprint": FP,
        "rows": {"train": 904, "validation": 113, "test": 113},
        "labels": ["billing", "bug", "feature"],
        "reused": False,
        "seconds": 3.2,
        "dataset_mode": "materialized",
        "shards": {"train": 1, "validation": 1, "test": 1},
        "num_bytes": 181_000,
    }


TRAIN_RESULT = {
    "mlflow_run_id": RUN_ID,
    "model_uri": "models:/m-9a8b7c6d5e4f",
    "trainable_params": 16_384,
    "total_params": 1_200_000,
    "trainable_percent": 1.37,
    "train_loss": 0.42,
    "initial_loss": 2.3,
    "tokens_per_second": 14000.0,
    "padding_efficiency": 0.91,
    "train_seconds": 38.0,
    "global_steps": 300,
    "reused": False,
    "val_loss": 0.5,
    "adapter_model_uri": "",
}


@pytest.fixture
def lake(tmp_path):
    root = tmp_path / "lake"
    for split in ("train", "validation", "test"):
        (root / "prepared" / FP / f"split={split}").mkdir(parents=True)
    return str(root)


@pytest.fixture
def tracking(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", TRACKING)
    return TRACKING


def _names(datasets) -> set[tuple[str, str]]:
    return {(d.namespace, d.name) for d in datasets}


def _versions(datasets) -> set[str]:
    return {Serde.to_dict(d)["facets"]["version"]["datasetVersion"] for d in datasets}


def _facets(operator, result, **state):
    operator._lineage_result = result
    for key, value in state.items():
        setattr(operator, key, value)
    return operator.get_openlineage_facets_on_complete(task_instance=None)


def test_chain_source_splits_dataset_model_version(lake, tracking):
    prepared = _prepare_summary(lake)
    dataset = _materialize_summary(lake)
    prepare = _facets(PrepareDataOperator(task_id="prepare_data", tokenizer="t"), prepared)
    materialize = _facets(
        MaterializeDatasetOperator(task_id="materialize_dataset", source=prepared["prepared_uri"]), dataset
    )
    train = _facets(
        TrainModelOperator(
            task_id="train", dataset_uri=dataset["dataset_uri"], base_model="b", data_fingerprint=FP
        ),
        TRAIN_RESULT,
    )
    register = _facets(
        RegisterModelOperator(task_id="register", run_id=RUN_ID, model_name="tickets"),
        {"model_name": "tickets", "version": "3", "alias_move": {}},
        _data_fingerprint=FP,
    )

    # source -> splits
    assert _names(prepare.inputs) == {("file", "/home/u/data/tickets.csv")}
    splits = {("file", f"{lake}/prepared/{FP}/split={s}") for s in ("train", "validation", "test")}
    assert _names(prepare.outputs) == splits
    # splits -> dataset: the outputs of one task are the inputs of the next
    assert _names(materialize.inputs) == splits
    assert _names(materialize.outputs) == {("file", f"{lake}/datasets/{FP}")}
    # dataset -> the run's model -> model version
    assert _names(train.inputs) == _names(materialize.outputs)
    assert _names(train.outputs) == {("mlflow://mlflow.internal:5000", f"runs/{RUN_ID}/model")}
    assert _names(register.inputs) == _names(train.outputs)
    assert _names(register.outputs) == {("mlflow://mlflow.internal:5000", "models/tickets/3")}

    # every dataset of the chain carries the fingerprint as its version
    for lineage in (prepare, materialize, train, register):
        assert _versions(lineage.inputs) == {FP}
        assert _versions(lineage.outputs) == {FP}


def test_events_serialize_the_fingerprint_as_dataset_version(lake):
    prepare = _facets(PrepareDataOperator(task_id="prepare_data", tokenizer="t"), _prepare_summary(lake))
    event_dataset = Serde.to_dict(prepare.outputs[0])
    assert event_dataset["facets"]["version"]["datasetVersion"] == FP
    assert event_dataset["facets"]["version"]["_schemaURL"].endswith("DatasetVersionDatasetFacet")


def test_batch_inference_reads_source_and_model_version_writes_predictions(tracking):
    summary = {
        "model": {
            "name": "tickets",
            "version": "3",
            "alias": "champion",
            "data_fingerprint": FP,
            "local_path": "/x",
            "task": "causal-lm",
            "labels": ["bug"],
        },
        "output_uri": "s3://preds/tickets",
        "partition": "date=2026-03-02",
        "rows_written": 10,
        "feedback_uri": "s3://lake/feedback",
        "review_rows": 10,
        "min_score": 0.0,
        "seconds": 4.0,
    }
    operator = BatchInferenceOperator(
        task_id="score", source_uri="db.tickets", output_uri="s3://preds/tickets", model_name="tickets"
    )
    lineage = _facets(operator, summary, _scored_source="db.tickets")
    # the model version input is the dataset register wrote
    assert _names(lineage.inputs) == {
        ("spark_catalog", "db.tickets"),
        ("mlflow://mlflow.internal:5000", "models/tickets/3"),
    }
    assert _names(lineage.outputs) == {("s3://preds", "tickets"), ("s3://lake", "feedback/predictions")}
    assert _versions(lineage.outputs) == {FP}


def test_materialize_of_a_source_without_split_folders_names_the_source(tmp_path):
    source = tmp_path / "tickets.parquet"
    source.write_bytes(b"PAR1")
    operator = MaterializeDatasetOperator(task_id="to_arrow", source=str(source))
    summary = {**_materialize_summary(str(tmp_path)), "rows": {"train": 10}}
    lineage = _facets(operator, summary)
    assert _names(lineage.inputs) == {("file", str(source))}
    assert not has_split_folders("db.tickets")


def test_a_task_that_returned_nothing_reports_no_datasets():
    lineage = PrepareDataOperator(task_id="p", tokenizer="t").get_openlineage_facets_on_complete(None)
    assert lineage.inputs == [] and lineage.outputs == []


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("/data/tickets.csv", ("file", "/data/tickets.csv")),
        ("file:///data/lake/prepared/abc/", ("file", "/data/lake/prepared/abc")),
        ("s3://bucket/lake/datasets/abc", ("s3://bucket", "lake/datasets/abc")),
        ("gs://bucket/x", ("gs://bucket", "x")),
        ("hdfs://nn:8020/lake/x", ("hdfs://nn:8020", "/lake/x")),
        ("dbfs:/Volumes/main/lake/x", ("dbfs", "/Volumes/main/lake/x")),
        ("catalog.db.tickets", ("spark_catalog", "catalog.db.tickets")),
    ],
)
def test_dataset_names_follow_the_openlineage_naming_spec(uri, expected):
    assert dataset_name(uri) == expected


def test_mlflow_namespace():
    assert mlflow_namespace("http://127.0.0.1:5000") == "mlflow://127.0.0.1:5000"
    assert mlflow_namespace("https://mlflow.example.com/") == "mlflow://mlflow.example.com"
    assert mlflow_namespace("databricks") == "mlflow://databricks"
    assert mlflow_namespace("sqlite:////home/u/.local/mlflow/mlflow.db") == "mlflow://local"
    assert mlflow_namespace(None) == "mlflow://local"
