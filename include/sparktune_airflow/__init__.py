"""Thin, reusable Airflow operators over the ``sparktune`` domain package, by pipeline stage.

Every operator is importable from here (``from sparktune_airflow import TrainModelOperator``); each
lives in the module of its stage:

- ``core``: ``ValidateParamsOperator`` (``core.validate``), and what every stage's operators share:
  per-task helpers (``core.task_context``), submitting a Spark job (``core.spark_jobs``), running a
  domain CLI (``core.domain_cli``), the MLflow connection, lineage, extra links, assets, params,
  and the notifier every DAG uses (``core.notify``).
- ``data``: ``PrepareDataOperator`` (``data.prepare``), ``SparkQualityGateOperator``
  (``data.quality``), ``MaterializeDatasetOperator`` (``data.materialize``).
- ``model``: ``ResolveBaseModelOperator`` (``model.base_model``), ``TrainModelOperator`` (``model.train``).
- ``release``: ``SkipUnchangedOperator`` (``release.retrain``), ``RegisterModelOperator``
  (``release.register``), ``EvaluateModelOperator`` (``release.evaluate``), ``PromotionGateOperator``
  (``release.gate``), ``PromoteModelOperator`` (``release.promote``), ``SmokeTestOperator``
  (``release.smoke``), ``ChampionApprovalOperator`` (``release.approve``),
  ``RollbackChampionOperator`` (``release.rollback``), ``ChampionGuardOperator``
  (``release.champion_guard``).
- ``serve``: ``BatchInferenceOperator`` (``serve.batch_inference``), ``RecordCorrectionsOperator``
  and ``MergeFeedbackOperator`` (``serve.feedback``), ``ReviewQueueOperator`` (``serve.review_queue``),
  ``MonitorChampionOperator`` (``serve.monitor``).

Conventions (after the Airflow providers): keyword-only arguments, ``template_fields`` for every
value that comes from XCom or params, nothing computed from templated values in ``__init__``,
heavy imports inside ``execute``, small JSON-able return values (ids, URIs, fingerprints and
counts; never data). Deterministic failures (invalid params, bad data, a failed rule) raise
``AirflowFailException`` so they fail at once instead of waiting out retries.

Importing this package is cheap: every heavy library (pyspark, torch, mlflow, datasets,
great_expectations) is imported inside ``execute``, so DAG files that use these operators
parse fast and the DAG processor never loads them.
"""

from sparktune_airflow.core.validate import ValidateParamsOperator
from sparktune_airflow.data.materialize import MaterializeDatasetOperator
from sparktune_airflow.data.prepare import PrepareDataOperator
from sparktune_airflow.data.quality import SparkQualityGateOperator
from sparktune_airflow.model.base_model import ResolveBaseModelOperator
from sparktune_airflow.model.train import TrainModelOperator
from sparktune_airflow.release.approve import ChampionApprovalOperator
from sparktune_airflow.release.champion_guard import ChampionGuardOperator
from sparktune_airflow.release.evaluate import EvaluateModelOperator
from sparktune_airflow.release.gate import PromotionGateOperator
from sparktune_airflow.release.promote import PromoteModelOperator
from sparktune_airflow.release.register import RegisterModelOperator
from sparktune_airflow.release.retrain import SkipUnchangedOperator
from sparktune_airflow.release.rollback import RollbackChampionOperator
from sparktune_airflow.release.smoke import SmokeTestOperator
from sparktune_airflow.serve.batch_inference import BatchInferenceOperator
from sparktune_airflow.serve.feedback import MergeFeedbackOperator, RecordCorrectionsOperator
from sparktune_airflow.serve.monitor import MonitorChampionOperator
from sparktune_airflow.serve.review_queue import ReviewQueueOperator

__all__ = [
    "BatchInferenceOperator",
    "ChampionApprovalOperator",
    "ChampionGuardOperator",
    "EvaluateModelOperator",
    "MaterializeDatasetOperator",
    "MergeFeedbackOperator",
    "MonitorChampionOperator",
    "PrepareDataOperator",
    "PromoteModelOperator",
    "PromotionGateOperator",
    "RecordCorrectionsOperator",
    "RegisterModelOperator",
    "ResolveBaseModelOperator",
    "ReviewQueueOperator",
    "RollbackChampionOperator",
    "SkipUnchangedOperator",
    "SmokeTestOperator",
    "SparkQualityGateOperator",
    "TrainModelOperator",
    "ValidateParamsOperator",
]
