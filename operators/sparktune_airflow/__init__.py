"""Thin, reusable Airflow operators over the ``sparktune`` domain package.

Importing this package is cheap: every heavy library (pyspark, torch, mlflow, datasets,
great_expectations) is imported inside ``execute``, so DAG files that use these operators
parse fast and the DAG processor never loads them.
"""

from sparktune_airflow.operators import (
    EvaluateModelOperator,
    MaterializeDatasetOperator,
    PrepareDataOperator,
    PromoteModelOperator,
    PromotionGateOperator,
    RegisterModelOperator,
    ResolveBaseModelOperator,
    SmokeTestOperator,
    SparkQualityGateOperator,
    TrainModelOperator,
    ValidateParamsOperator,
)
from sparktune_airflow.registry_operators import RollbackChampionOperator

__all__ = [
    "EvaluateModelOperator",
    "MaterializeDatasetOperator",
    "PrepareDataOperator",
    "PromoteModelOperator",
    "PromotionGateOperator",
    "RegisterModelOperator",
    "ResolveBaseModelOperator",
    "RollbackChampionOperator",
    "SmokeTestOperator",
    "SparkQualityGateOperator",
    "TrainModelOperator",
    "ValidateParamsOperator",
]
