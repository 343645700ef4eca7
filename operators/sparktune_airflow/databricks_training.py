"""The databricks backend of TrainModelOperator (being written: see the helper's task)."""

from __future__ import annotations

from typing import Any


class DatabricksTrainingMixin:
    def _execute_databricks(self, context: Any, request: dict[str, Any], params: Any) -> dict[str, Any]:
        raise NotImplementedError

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _cancel_databricks(self) -> None:
        raise NotImplementedError
