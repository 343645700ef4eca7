"""sparktune: fine-tune language models on labelled text that lives in Spark.

The domain package: Spark preparation, quality suites, materialization, training, evaluation,
registry and reporting as plain functions. It never imports Airflow; importing it is cheap
(heavy libraries are imported by the modules that need them).
"""

__version__ = "0.1.0"
