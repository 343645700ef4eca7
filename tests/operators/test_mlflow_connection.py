"""The MLflow-facing operators reach MLflow through the ``mlflow_default`` Airflow connection."""

from __future__ import annotations

import json
import os

import pytest
from airflow.sdk import Connection
from sparktune_airflow.core.mlflow import MLflowHook, tracking_env


def test_http_connection_gives_the_server_and_its_credentials():
    conn = Connection(
        conn_id="mlflow_default", conn_type="https", host="mlflow.example.com", port=443,
        login="svc", password="s3cret", extra=json.dumps({"token": "tok"}),
    )  # fmt: skip
    assert tracking_env(conn) == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.com:443",
        "MLFLOW_TRACKING_USERNAME": "svc",
        "MLFLOW_TRACKING_PASSWORD": "s3cret",
        "MLFLOW_TRACKING_TOKEN": "tok",
    }


def test_tracking_uri_in_the_extra_wins_and_a_missing_host_names_the_fix():
    conn = Connection(conn_id="m", conn_type="generic", extra=json.dumps({"tracking_uri": "databricks"}))
    assert tracking_env(conn) == {"MLFLOW_TRACKING_URI": "databricks"}
    with pytest.raises(ValueError, match="AIRFLOW_CONN_MLFLOW_DEFAULT"):
        tracking_env(Connection(conn_id="m", conn_type="http"))


def test_operator_points_its_process_at_the_connection_before_execute(monkeypatch, restore_mlflow_globals):
    # An environment-variable connection, as the native stack and docker-compose define it.
    conn = {"conn_type": "http", "host": "127.0.0.1", "port": 5999}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "from-another-server")
    from sparktune_airflow import PromoteModelOperator

    operator = PromoteModelOperator(task_id="promote", model_name="m", version="1", alias="staging")
    operator.pre_execute({})
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5999"
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ
    assert operator.mlflow_hook.get_conn().tracking_uri == "http://127.0.0.1:5999"
    operator.post_execute({})
    # Still so after execute: the extra links and lineage computed then name the same server.
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5999"


def test_activated_puts_the_environment_back_after_the_block(monkeypatch):
    conn = {"conn_type": "http", "host": "127.0.0.1", "port": 5999}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps(conn))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "from-another-server")
    with MLflowHook().activated() as uri:
        assert uri == "http://127.0.0.1:5999" and "MLFLOW_TRACKING_PASSWORD" not in os.environ
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///elsewhere.db"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "from-another-server"


def test_without_the_connection_the_environment_decides(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///kept.db")
    assert MLflowHook().tracking_env() == {}
    with MLflowHook().activated() as uri:
        assert uri == "sqlite:///kept.db" == os.environ["MLFLOW_TRACKING_URI"]
    assert MLflowHook(None).tracking_env() == {}


def test_generic_connection_takes_its_scheme_from_the_schema():
    # What `make stack` and docker-compose.yaml define: no HTTP provider is installed.
    conn = Connection(conn_id="mlflow_default", conn_type="generic", host="mlflow", port=5000, schema="http")
    assert tracking_env(conn) == {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}
