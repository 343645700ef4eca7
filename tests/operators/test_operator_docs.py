"""Every operator documents each of its own parameters in its class docstring (``:param name:``),
and the package exports every operator it defines.

docs/stages.md's "Use the operators in your own DAG" sends users to these docstrings; a parameter added
without its line fails here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import sparktune_airflow
from airflow.sdk import BaseOperator

MODULES = [
    importlib.import_module(info.name)
    for info in pkgutil.walk_packages(sparktune_airflow.__path__, f"{sparktune_airflow.__name__}.")
]
OPERATORS = sorted(
    (
        cls
        for module in MODULES
        for _, cls in inspect.getmembers(module, inspect.isclass)
        # Operators are named so; a base class of some of them (DecidingShortCircuit) is not one.
        if issubclass(cls, BaseOperator)
        and cls.__module__ == module.__name__
        and cls.__name__.endswith("Operator")
    ),
    key=lambda cls: cls.__name__,
)


def test_the_operators_are_found_and_each_is_exported():
    names = {cls.__name__ for cls in OPERATORS}
    assert {"SparkQualityGateOperator", "MaterializeDatasetOperator", "RollbackChampionOperator"} <= names
    assert len(names) >= 16
    # `from sparktune_airflow import XOperator` works for every operator, wherever its stage keeps it.
    assert names == set(sparktune_airflow.__all__)


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda cls: cls.__name__)
def test_every_own_parameter_has_a_param_line(operator):
    own = [
        name
        for name, parameter in inspect.signature(operator.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert own, f"{operator.__name__} takes no keyword-only parameters"
    doc = inspect.getdoc(operator) or ""
    missing = [name for name in own if f":param {name}:" not in doc]
    assert not missing, f"{operator.__name__} docstring lacks :param lines for {missing}"
