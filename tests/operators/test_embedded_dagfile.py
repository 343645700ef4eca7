"""The embedded runner points ``airflow dags test`` at the DAG's own file when it can."""

from __future__ import annotations

from pathlib import Path

from sparktune_dev.embedded.environment import PROJECT_ROOT
from sparktune_dev.embedded.runner import dagfile_args


def test_every_project_dag_is_run_from_its_own_file():
    env = {"AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags")}
    for dag_file in sorted((PROJECT_ROOT / "dags").glob("*.py")):
        assert dagfile_args(dag_file.stem, env) == ["--dagfile-path", str(dag_file)], dag_file.name


def test_a_dag_without_a_file_of_its_name_is_looked_up_in_the_whole_folder(tmp_path: Path):
    env = {"AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path)}
    assert dagfile_args("absent", env) == []
    # A file of that name that defines another DAG: Airflow would not find the DAG in it.
    (tmp_path / "nightly.py").write_text('DAG(dag_id="weekly")\n')
    assert dagfile_args("nightly", env) == []
    assert dagfile_args("nightly", {}) == []
