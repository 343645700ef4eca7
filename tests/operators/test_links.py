"""Extra links: each builds its URL from the task's return value (XCom), as the worker does when the
task ends; the operators declare them so the serialized DAG carries their names and XCom keys."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sparktune_airflow import (
    BatchInferenceOperator,
    MaterializeDatasetOperator,
    PrepareDataOperator,
    PromoteModelOperator,
    RegisterModelOperator,
    SparkQualityGateOperator,
    TrainModelOperator,
)
from sparktune_airflow.core import links
from sparktune_airflow.core.links import (
    DatabricksRunLink,
    DataDocsLink,
    MLflowModelVersionLink,
    MLflowRunLink,
    SparkUILink,
    data_docs_url,
    mlflow_ui_base,
    model_version_url,
    spark_ui_url,
)

TI_KEY = SimpleNamespace(dag_id="llm_finetune", task_id="t", run_id="manual__1", map_index=-1)


@pytest.fixture
def xcom(monkeypatch):
    """The task's return value as XCom.get_value would hand it back; records what was asked."""
    asked = []

    def set_value(value):
        def fake(ti_key):
            asked.append(ti_key)
            return value

        monkeypatch.setattr(links, "_task_result", fake)
        return asked

    return set_value


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    for name in (links.MLFLOW_UI_ENV, links.DATA_DOCS_URL_ENV, links.SPARK_UI_ENV):
        monkeypatch.delenv(name, raising=False)


def test_mlflow_run_link_uses_an_http_tracking_server(xcom, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000/")
    asked = xcom({"mlflow_run_id": "abc123", "train_loss": 0.4})
    assert MLflowRunLink().get_link(None, ti_key=TI_KEY) == "http://mlflow:5000/#/runs/abc123"
    assert asked == [TI_KEY]


def test_mlflow_links_on_the_embedded_store_point_at_make_mlflow_ui(xcom, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////home/u/.local/mlflow/mlflow.db")
    xcom({"mlflow_run_id": "abc123"})
    assert MLflowRunLink().get_link(None, ti_key=TI_KEY) == "http://127.0.0.1:5000/#/runs/abc123"
    monkeypatch.setenv(links.MLFLOW_UI_ENV, "https://ml.example.com/")
    assert MLflowRunLink().get_link(None, ti_key=TI_KEY) == "https://ml.example.com/#/runs/abc123"


def test_model_version_link_from_register_and_promote_results(xcom, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    xcom({"model_name": "support tickets", "version": "3", "alias_move": {}})
    url = MLflowModelVersionLink().get_link(None, ti_key=TI_KEY)
    assert url == "http://mlflow:5000/#/models/support%20tickets/versions/3"
    promoted = {"model_name": "tickets", "alias": "champion", "from_version": "2", "to_version": "3"}
    assert model_version_url(promoted, "http://m") == "http://m/#/models/tickets/versions/3"


def test_links_of_a_task_without_a_result_are_empty(xcom):
    xcom(None)  # the task failed before returning: the button is disabled
    for link in (MLflowRunLink(), MLflowModelVersionLink(), DataDocsLink()):
        assert link.get_link(None, ti_key=TI_KEY) == ""


def test_data_docs_link_is_the_validation_page(xcom, tmp_path, monkeypatch):
    docs = tmp_path / "gx" / "uncommitted" / "data_docs" / "local_site"
    page = (docs / "validations" / "prepared_rows" / "run.html").as_uri()
    summary = {
        "success": True,
        "data_docs_uri": page,
        "data_docs_dir": str(docs),
        "data_docs_index_uri": (docs / "index.html").as_uri(),
    }
    xcom(summary)
    assert DataDocsLink().get_link(None, ti_key=TI_KEY) == page
    # published by a web server: the same page under its URL
    monkeypatch.setenv(links.DATA_DOCS_URL_ENV, "http://docs.internal/gx/")
    assert (
        DataDocsLink().get_link(None, ti_key=TI_KEY)
        == "http://docs.internal/gx/validations/prepared_rows/run.html"
    )
    assert data_docs_url({"data_docs_index_uri": "file:///x/index.html"}, env={}) == "file:///x/index.html"


def test_databricks_link_is_the_run_page_or_nothing(monkeypatch):
    """The provider's link gives None without a Databricks run, stored as "None": a broken button."""
    from airflow.sdk.execution_time import xcom

    pushed = {}
    monkeypatch.setattr(xcom.XCom, "get_value", staticmethod(lambda *, ti_key, key: pushed.get(key)))
    link = DatabricksRunLink()
    assert link.get_link(None, ti_key=TI_KEY) == ""  # train_backend=local: no button
    pushed["run_page_url"] = "https://dbc.example.cloud.databricks.com/#job/1/run/2"
    assert link.get_link(None, ti_key=TI_KEY) == pushed["run_page_url"]


def test_spark_ui_link_from_the_master_the_task_submitted_to(monkeypatch):
    operator = SimpleNamespace(_hook=SimpleNamespace(_connection={"master": "spark://10.0.0.5:7077"}))
    assert SparkUILink().get_link(operator, ti_key=TI_KEY) == "http://10.0.0.5:8080"
    assert SparkUILink().get_link(SimpleNamespace(), ti_key=TI_KEY) == ""  # failed before submitting
    assert spark_ui_url("spark://m1:7077,m2:7077", env={}) == "http://m1:8080"
    assert spark_ui_url("local[*]", env={}) == ""
    assert spark_ui_url("yarn", env={}) == ""
    assert (
        spark_ui_url("local[*]", env={links.SPARK_UI_ENV: "http://history:18080"}) == "http://history:18080"
    )


def test_mlflow_ui_base():
    assert mlflow_ui_base("https://mlflow.example.com/", env={}) == "https://mlflow.example.com"
    assert mlflow_ui_base("databricks", env={}) == links.EMBEDDED_MLFLOW_UI


@pytest.mark.parametrize(
    ("operator", "names"),
    [
        (
            TrainModelOperator(task_id="train", dataset_uri="d", base_model="b", data_fingerprint="f"),
            {"MLflow run", "Databricks run"},
        ),
        (RegisterModelOperator(task_id="register", run_id="r", model_name="m"), {"MLflow model version"}),
        (
            PromoteModelOperator(task_id="promote", model_name="m", version="1", alias="champion"),
            {"MLflow model version"},
        ),
        (SparkQualityGateOperator(task_id="validate_data"), {"GX Data Docs"}),
        (PrepareDataOperator(task_id="prepare_data", tokenizer="t"), {"Spark UI"}),
        (MaterializeDatasetOperator(task_id="materialize", source="s"), {"Spark UI"}),
        (
            BatchInferenceOperator(task_id="score", source_uri="s", output_uri="o", model_name="m"),
            {"Spark UI"},
        ),
    ],
    ids=lambda value: getattr(value, "task_id", ""),
)
def test_operators_declare_their_links(operator, names):
    assert names <= {link.name for link in operator.operator_extra_links}
