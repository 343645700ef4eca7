"""make bench-overhead's floor (benchmarks/overhead_floor.py): the no-op DAG it writes has the tasks
and dependencies it was given, and the floor is each part's mean over its measurements."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead_floor import FLOOR_DAG_ID, dag_shape, mean_floor, write_noop_dag  # noqa: E402


def test_the_noop_dag_has_the_shape_it_was_given(tmp_path):
    shape = {"first": [], "second": ["first"], "third": ["first", "second"], "apart": []}
    path = write_noop_dag(tmp_path / "dags", shape, "some_dag")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow")}
    assert path.name == f"{FLOOR_DAG_ID}.py"
    assert dag_shape(env, path, FLOOR_DAG_ID) == shape


def test_the_floor_is_the_mean_of_its_measurements():
    before = {"dags_test_s": 10.0, "spark_submit_s": 8.0, "imports_s": 2.0, "noop_dag_exit_code": 0}
    after = {"dags_test_s": 14.0, "spark_submit_s": 12.0, "imports_s": 3.0, "noop_dag_exit_code": 0}
    floor = mean_floor([before, after])
    assert (floor["dags_test_s"], floor["spark_submit_s"], floor["imports_s"]) == (12.0, 10.0, 2.5)
    assert floor["total_s"] == 24.5
    assert floor["ran"] is True
    assert mean_floor([before, {**after, "noop_dag_exit_code": 1}])["ran"] is False
