"""Run the project's DAGs on embedded defaults: one folder of state, no servers (``ui``: Airflow's UI on it).

``make demo``, ``make run`` and the end-to-end tests all come through here, so the
environment a DAG sees in CI is the one a user sees on their laptop:

- Airflow metadata in SQLite under ``$SPARKTUNE_HOME/airflow`` (``airflow dags test``);
- Spark ``local[*]`` through the ``spark_default`` connection, defined from the environment;
- MLflow tracking and registry in SQLite with local artifacts;
- OpenLineage events appended to ``$SPARKTUNE_HOME/lineage/events.jsonl``.

Every variable is only a default: a value already in the environment wins, which is how a
user points the same command at a Spark cluster or an MLflow server.

``run`` exits 0 when the DAG run succeeded, 1 when it failed, and 3 when it succeeded but its
promotion gate blocked the challenger (``enabled`` mode; the last line names the model version
and the failed rules). A failed run ends with a summary on stderr: each failed task, the message of
the exception it failed with (the operators' messages name the cause and the fix), and its log.

``airflow dags test`` runs every task inside the CLI's process and writes no task log file: the runner
copies its output to the terminal and to ``<base log folder>/dags_test/<dag>-<time>.log``, then
splits each task's part out into Airflow's layout,
``<base log folder>/dag_id=<dag>/run_id=<run>/task_id=<task>/attempt=<n>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sparktune.core.config import HOME_ENV
from sparktune_dev.embedded.environment import embedded_env, embedded_secret_files
from sparktune_dev.embedded.runner import run_dag
from sparktune_dev.secret_files import shell_exports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparktune_dev.embedded", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a DAG once with airflow dags test")
    run.add_argument("--dag", default="llm_finetune")
    run.add_argument("--conf", default="{}", help="DAG run conf as a JSON object")
    sub.add_parser("env", help="print the embedded environment as shell exports (secrets as _CMD variables)")
    sub.add_parser(
        "ui",
        help="Airflow's api-server, scheduler, dag-processor and triggerer on this state, on 127.0.0.1:8080 "
        "(AIRFLOW__API__HOST / AIRFLOW__API__PORT to change)",
    )
    args = parser.parse_args(argv)
    home = Path(os.environ.get(HOME_ENV, ".local")).expanduser().resolve()
    if args.command == "env":
        # The generated secrets are named by file, never printed (sparktune_dev.secret_files).
        prefixes = ("AIRFLOW", "SPARKTUNE", "MLFLOW", "PYSPARK", "OPENLINEAGE", "SPARK_LOCAL_IP")
        print("\n".join(shell_exports(embedded_env(home), prefixes, embedded_secret_files(home))))
        return 0
    if args.command == "ui":
        from sparktune_dev.embedded.ui import run_ui

        return run_ui(home)
    try:
        conf = json.loads(args.conf)
    except json.JSONDecodeError as exc:
        parser.error(f"--conf is not valid JSON ({exc}); pass an object like '{{\"min_chars\": 30}}'")
    if not isinstance(conf, dict):
        parser.error('--conf must be a JSON object, e.g. \'{"source_uri": "data/tickets.csv"}\'')
    return run_dag(args.dag, conf, home)


if __name__ == "__main__":
    sys.exit(main())
