"""The small decisions the operators make: which failures retry, which environment a DAG run sees."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from sparktune.core.params import PipelineParams, config_hash, parse_params
from sparktune_airflow.core.domain_cli import raise_for_exit_code
from sparktune_airflow.core.params import form_params
from sparktune_dev.embedded.environment import embedded_env


def test_bad_input_exit_code_fails_at_once_and_others_retry():
    raise_for_exit_code("training", 0, "ok")  # success: nothing raised
    with pytest.raises(AirflowFailException, match="training rejected its input: no such column"):
        raise_for_exit_code("training", 2, "no such column")
    with pytest.raises(AirflowException) as info:
        raise_for_exit_code("training", 1, "executor lost")
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


def test_the_embedded_runner_turns_deadlines_off_and_a_dag_then_has_none(tmp_path, monkeypatch):
    """`airflow dags test` has no scheduler to fire a deadline, and Airflow 3.3's dag.test() fails
    the run at its end on a DAG that has one."""
    from sparktune_airflow.core.dag_defaults import run_deadline

    env = embedded_env(tmp_path, base={"PATH": "/usr/bin", "SPARKTUNE_RUN_DEADLINE_MINUTES": "30"})
    assert env["SPARKTUNE_RUN_DEADLINE_MINUTES"] == "off"
    monkeypatch.setenv("SPARKTUNE_RUN_DEADLINE_MINUTES", "off")
    assert run_deadline() is None
    monkeypatch.setenv("SPARKTUNE_RUN_DEADLINE_MINUTES", "0")
    with pytest.raises(ValueError, match="must be more than 0 minutes"):
        run_deadline()


def test_task_retries_come_from_the_environment_with_a_clear_error_when_wrong(monkeypatch):
    from sparktune_airflow.core.dag_defaults import task_defaults

    monkeypatch.delenv("SPARKTUNE_TASK_RETRIES", raising=False)
    assert task_defaults()["retries"] == 2
    monkeypatch.setenv("SPARKTUNE_TASK_RETRIES", "4")
    assert task_defaults()["retries"] == 4
    for wrong in ("-1", "two"):
        monkeypatch.setenv("SPARKTUNE_TASK_RETRIES", wrong)
        with pytest.raises(ValueError, match=f"SPARKTUNE_TASK_RETRIES='{wrong}' is not a number of retries"):
            task_defaults()


def test_the_retry_delay_comes_from_the_environment_with_a_clear_error_when_wrong(monkeypatch):
    from datetime import timedelta

    from sparktune_airflow.core.dag_defaults import task_defaults

    monkeypatch.delenv("SPARKTUNE_TASK_RETRY_DELAY_SECONDS", raising=False)
    defaults = task_defaults()
    assert defaults["retry_delay"] == timedelta(seconds=30) and defaults["retry_exponential_backoff"]
    monkeypatch.setenv("SPARKTUNE_TASK_RETRY_DELAY_SECONDS", "2.5")
    assert task_defaults()["retry_delay"] == timedelta(seconds=2.5)
    for wrong in ("-1", "soon"):
        monkeypatch.setenv("SPARKTUNE_TASK_RETRY_DELAY_SECONDS", wrong)
        with pytest.raises(ValueError, match=f"SPARKTUNE_TASK_RETRY_DELAY_SECONDS='{wrong}' is not a number"):
            task_defaults()


def test_the_longest_retry_delay_comes_from_the_environment_with_a_clear_error_when_wrong(monkeypatch):
    from datetime import timedelta

    from sparktune_airflow.core.dag_defaults import task_defaults

    monkeypatch.delenv("SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS", raising=False)
    assert task_defaults()["max_retry_delay"] == timedelta(minutes=10)
    monkeypatch.setenv("SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS", "10")
    assert task_defaults()["max_retry_delay"] == timedelta(seconds=10)
    for wrong in ("-5", "later"):
        monkeypatch.setenv("SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS", wrong)
        expected = f"SPARKTUNE_TASK_MAX_RETRY_DELAY_SECONDS='{wrong}' is not a number"
        with pytest.raises(ValueError, match=expected):
            task_defaults()


def test_trigger_form_carries_every_spec_with_bounds_and_enums():
    params = form_params()
    assert set(params) == set(PipelineParams.model_fields)
    assert params["gate_mode"].schema["enum"] == ["enabled", "dry_run", "disabled"]
    assert params["lora_r"].schema["minimum"] == 1
    assert params["prompt_template"].schema["format"] == "multiline"
    assert set(form_params(names=["model_name"])) == {"model_name"}


def test_trigger_form_requires_only_the_strings_that_must_not_be_empty():
    # The form marks a field required unless its type allows null, and sends an emptied field as null.
    params = form_params()
    assert params["source_uri"].schema["type"] == ["string", "null"]
    assert params["lora_modules_to_save"].schema["type"] == ["string", "null"]
    assert params["text_column"].schema["type"] == "string"
    assert params["text_column"].schema["minLength"] == 1
    assert params["gate_mode"].schema["type"] == "string"  # an enum: one of its values
    # A recipe number may stay empty: training takes it from the base model's recipe.
    assert params["learning_rate"].schema["type"] == ["number", "null"]
    assert (
        params["learning_rate"].value is None and "base model's recipe" in params["learning_rate"].description
    )
    assert params["lora_r"].schema["type"] == "integer"


def test_config_hash_follows_every_param():
    base = parse_params({})
    assert config_hash(base) == config_hash(parse_params({}))
    assert config_hash(base) != config_hash(parse_params({"lora_r": 8}))
    # Run switches say whether to train, not what: flipping them must not look like a new config.
    assert config_hash(base) == config_hash(parse_params({"force_retrain": True, "merge_feedback": False}))


def _published_dataset(root, fingerprint: str) -> None:
    """A finished dataset as materialize leaves it: the marker is what makes it trusted."""
    from sparktune.data.published_dataset import MARKER

    folder = root / fingerprint
    folder.mkdir(parents=True)
    record = {"rows": {"train": 8}, "labels": ["a", "b"], "shards": {"train": 1}, "num_bytes": 10}
    (folder / MARKER).write_text(json.dumps(record))


def test_materialize_reuses_a_published_version_without_spark_submit(tmp_path):
    from sparktune_airflow import MaterializeDatasetOperator

    _published_dataset(tmp_path, "fp1")
    operator = MaterializeDatasetOperator(
        task_id="materialize",
        source=str(tmp_path / "nowhere"),  # never read: the fingerprint is already published
        datasets_root=str(tmp_path),
        data_fingerprint="fp1",
        spark_binary="/nonexistent/spark-submit",  # would fail loudly if it were called
    )
    summary = operator.execute(context={})
    assert summary["reused"] and summary["dataset_uri"] == str(tmp_path / "fp1")
    assert summary["rows"] == {"train": 8} and summary["labels"] == ["a", "b"]


def _write_split(prepared, split: str, columns: dict[str, list]) -> None:
    """One Parquet file under ``split=<split>``, the layout prepare_data writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (prepared / f"split={split}").mkdir(parents=True)
    pq.write_table(pa.table(columns), prepared / f"split={split}" / "part-0.parquet")


def test_materialize_streaming_mode_reads_footers_and_builds_nothing(tmp_path):
    from sparktune_airflow import MaterializeDatasetOperator

    for split, n in (("train", 7), ("validation", 2), ("test", 3)):
        _write_split(
            tmp_path / "prepared", split, {"prompt": ["p"] * n, "completion": [" a"] * n, "label": ["a"] * n}
        )
    operator = MaterializeDatasetOperator(
        task_id="materialize",
        source=str(tmp_path / "prepared"),
        datasets_root=str(tmp_path / "datasets"),
        data_fingerprint="fp1",
        label_names=["a"],
        dataset_mode="streaming",
    )
    summary = operator.execute(context={})
    assert summary["dataset_mode"] == "streaming"
    assert summary["dataset_uri"] == str(tmp_path / "prepared")
    assert summary["rows"] == {"train": 7, "validation": 2, "test": 3}
    assert not (tmp_path / "datasets").exists()

    operator.source = str(tmp_path / "missing")
    with pytest.raises(AirflowFailException, match="no Parquet files for split 'train'"):
        operator.execute(context={})
    operator.dataset_mode = "in-memory"
    with pytest.raises(AirflowFailException, match="dataset_mode must be one of"):
        operator.execute(context={})


def test_materialize_converts_small_parquet_in_process_and_fails_bad_labels_at_once(tmp_path):
    import datasets
    from sparktune_airflow import MaterializeDatasetOperator

    for split in ("train", "test"):
        _write_split(tmp_path / "prepared", split, {"text": ["a", "b", "c"], "label": ["x", "y", "x"]})
    operator = MaterializeDatasetOperator(
        task_id="materialize",
        source=str(tmp_path / "prepared"),
        datasets_root=str(tmp_path / "datasets"),
        data_fingerprint="fp1",
        label_names=["x", "y"],
        spark_binary="/nonexistent/spark-submit",  # small Parquet needs no Spark job
    )
    summary = operator.execute(context={})
    assert not summary["reused"] and summary["rows"] == {"test": 3, "train": 3}
    assert datasets.load_from_disk(summary["dataset_uri"])["train"].features["label"].names == ["x", "y"]

    operator.data_fingerprint, operator.label_names = "fp2", ["x"]
    with pytest.raises(AirflowFailException, match=r"labels \['y'\] are not among the declared label names"):
        operator.execute(context={})


def test_invalid_params_fail_validate_params_at_once_listing_every_problem():
    # Values each inside their schema bounds, wrong together. validate_params is the first task of
    # llm_finetune (tests/dags/test_dag_integrity.py), so nothing after it runs or is submitted.
    from sparktune_airflow import ValidateParamsOperator

    conf = {"min_chars": 3000, "max_chars": 100, "prompt_template": "{label}: {text}"}
    with pytest.raises(AirflowFailException) as error:  # a fail exception: no retries
        ValidateParamsOperator(task_id="validate_params", run_params=conf).execute({})
    assert "min_chars (3000) is above max_chars (100)" in str(error.value)
    assert "{label} must come after {text}" in str(error.value)


def test_a_job_that_recorded_bad_input_fails_at_once_and_one_that_died_is_retried(tmp_path, monkeypatch):
    # What the preparation job records when a column is missing (tests/unit/test_bad_inputs.py
    # checks the job writes it), as PrepareDataOperator reads it after spark-submit exits 2.
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from sparktune_airflow.core.spark_jobs import submit_and_read_summary

    summary = tmp_path / "prepare_summary.json"
    message = (
        "Source 'tickets.jsonl' is missing column(s): label_column 'category'. Columns found: 'intent_label'."
    )

    def exits_with_a_record(operator, context):
        summary.write_text(json.dumps({"error": message, "kind": "MissingColumnsError"}))
        raise AirflowException("Cannot execute: spark-submit ... Error code is: 2.")

    monkeypatch.setattr(SparkSubmitOperator, "execute", exits_with_a_record)
    with pytest.raises(
        AirflowFailException, match="prepare_data rejected its input: Source 'tickets.jsonl' is"
    ):
        submit_and_read_summary(
            SparkSubmitOperator(task_id="t", application="a"), {}, summary, "prepare_data"
        )

    def dies(operator, context):
        summary.unlink(missing_ok=True)
        raise AirflowException("Cannot execute: spark-submit ... Error code is: 1.")

    monkeypatch.setattr(SparkSubmitOperator, "execute", dies)
    with pytest.raises(AirflowException) as error:
        submit_and_read_summary(
            SparkSubmitOperator(task_id="t", application="a"), {}, summary, "prepare_data"
        )
    assert not isinstance(error.value, AirflowFailException)  # a lost executor or JVM: retried


def test_operators_take_pipeline_params_only_as_given_never_from_the_run(tmp_path):
    # An operator reused in another DAG must not pick up that DAG's form: the run's params are
    # ignored unless passed, and a non-native render (a string) names the fix.
    from sparktune_airflow import ValidateParamsOperator

    run_params = {"min_chars": 3000, "max_chars": 100}  # invalid together, but not passed
    result = ValidateParamsOperator(task_id="v").execute({"params": run_params})
    defaults = ValidateParamsOperator(task_id="v", run_params={}).execute({})
    assert result == defaults
    with pytest.raises(AirflowFailException, match="render_template_as_native_obj=True"):
        ValidateParamsOperator(task_id="v", run_params="{'min_chars': 3}").execute({})
    # Each section by name, for the tasks that take it (validate_params.output["training"]).
    assert set(defaults) == {"config_hash", "source", "preparation", "quality", "training", "backend",
                             "promotion", "approval"}  # fmt: skip
    assert defaults["promotion"]["gate_mode"] == "enabled" and "lora_r" in defaults["training"]
