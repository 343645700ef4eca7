"""The embedded runner behind ``make demo`` and ``make run``: the project's DAGs on one folder of
state, no servers (``python -m sparktune_dev.embedded run|env``; :mod:`.__main__` says more), and
``make airflow-ui``'s Airflow on the same state (``ui``).

- :mod:`.environment`: the embedded environment and the Airflow metadata database's migration;
- :mod:`.airflow_cli`: the ``airflow`` CLI, its output passed on and copied to a file;
- :mod:`.run_record`: what the metadata database says about a run (its failed tasks, its gate);
- :mod:`.failure_summary`: each task's log split out of the output, and a failed run's summary;
- :mod:`.runner`: one DAG run, from the environment to the exit code;
- :mod:`.ui`: Airflow's four long-running components on this state, listening on loopback.
"""
