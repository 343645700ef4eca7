"""``DecidingShortCircuit``: Airflow's ``ShortCircuitOperator`` whose condition is a method of the
operator, for the tasks that decide whether the rest of a run goes on (the promotion gate, the
skip of an unchanged retrain)."""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk.bases.xcom import BaseXCom


class DecidingShortCircuit(ShortCircuitOperator):
    """Subclasses implement :meth:`decide`: a truthy summary lets the run go on (and is the return
    value); :meth:`stop` pushes the summary and returns False, which skips everything downstream
    (teardowns excepted) and ends the task as a success, the summary readable in XCom."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(python_callable=type(self).decide, **kwargs)
        self._ti: Any = None

    def decide(self, ti: Any = None) -> Any:
        raise NotImplementedError

    @staticmethod
    def stop(ti: Any, summary: dict[str, Any]) -> bool:
        # The skip raises to end the task before a return value is pushed: push the summary (the
        # one worth reading) first.
        if ti is not None:
            ti.xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=summary)
        return False

    def execute(self, context: Any) -> Any:
        self._ti = context.get("ti")
        return super().execute(context)

    def determine_kwargs(self, context: Any) -> dict[str, Any]:
        return {}

    def execute_callable(self) -> Any:
        # decide runs on this task: the copy Airflow rendered the templates on (the callable bound
        # at __init__ would see the unrendered XComArgs).
        return self.decide(self._ti)
