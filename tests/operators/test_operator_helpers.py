"""The small decisions the operators make: which failures retry, which environment a DAG run sees."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sparktune.params import PARAM_SPECS, parse_params
from sparktune_airflow.embedded import embedded_env
from sparktune_airflow.operators import _raise_for_exit_code, config_hash
from sparktune_airflow.params import trigger_form_params


def test_bad_input_exit_code_fails_at_once_and_others_retry():
    _raise_for_exit_code("training", 0, "ok")  # success: nothing raised
    with pytest.raises(AirflowFailException, match="training rejected its input: no such column"):
        _raise_for_exit_code("training", 2, "no such column")
    with pytest.raises(AirflowException) as info:
        _raise_for_exit_code("training", 1, "executor lost")
    assert not isinstance(info.value, AirflowFailException)  # transient: retried


def test_embedded_env_defaults_and_user_values_win(tmp_path):
    env = embedded_env(tmp_path, base={"PATH": "/usr/bin"})
    assert env["AIRFLOW_HOME"] == str(tmp_path / "airflow")
    assert env["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {"conn_type": "spark", "host": "local[*]"}
    assert (tmp_path / "lineage").is_dir()
    custom = embedded_env(
        tmp_path,
        base={
            "PATH": "/usr/bin",
            "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
            "AIRFLOW_CONN_SPARK_DEFAULT": "x",
        },
    )
    assert custom["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert custom["AIRFLOW_CONN_SPARK_DEFAULT"] == "x"


def test_trigger_form_carries_every_spec_with_bounds_and_enums():
    params = trigger_form_params()
    assert set(params) == {spec.name for spec in PARAM_SPECS}
    assert params["gate_mode"].schema["enum"] == ["enabled", "dry_run", "disabled"]
    assert params["lora_r"].schema["minimum"] == 1
    assert params["prompt_template"].schema["format"] == "multiline"
    assert set(trigger_form_params(["model_name"])) == {"model_name"}


def test_config_hash_follows_every_param():
    base = parse_params({})
    assert config_hash(base) == config_hash(parse_params({}))
    assert config_hash(base) != config_hash(parse_params({"lora_r": 8}))
