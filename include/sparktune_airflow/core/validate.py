"""``ValidateParamsOperator``: a run's first task, which checks the trigger form's params before any
work starts and hands every other task its typed section of them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException


class ValidateParamsOperator(BaseOperator):
    """Checks every param of a run at once (the error lists all problems) and returns them by section.

    The one task that reads the whole form: it returns ``config_hash`` (what the run trains with)
    and each section of :class:`sparktune.core.params.PipelineParams` under its name in
    :data:`sparktune.core.params.SECTIONS` (``source``, ``preparation``, ``quality``,
    ``training``, ``backend``, ``promotion``, ``approval``), each pushed as an XCom of its own
    (``multiple_outputs``), so the DAG wires ``validate_params.output["training"]`` into the train
    task and no other task sees params it does not use.

    :param run_params: (templated) the params to check, a dict of flat values (in the pipeline's
        DAG ``"{{ params }}"``, rendered natively); missing names take their defaults.
    """

    template_fields: Sequence[str] = ("run_params",)

    def __init__(self, *, run_params: dict[str, Any] | str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("multiple_outputs", True)
        super().__init__(**kwargs)
        self.run_params = run_params

    def execute(self, context: Any) -> dict[str, Any]:
        from sparktune.core.params import SECTIONS, InvalidParamsError, config_hash, parse_params

        if isinstance(self.run_params, str):
            raise AirflowFailException(
                f"run_params rendered to a string ({self.run_params[:80]!r}): pass a dict, or set "
                "render_template_as_native_obj=True on the DAG so that '{{ params }}' renders as one"
            )
        try:
            params = parse_params(dict(self.run_params or {}))
        except InvalidParamsError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("params are valid: %s", json.dumps(params.to_dict(), sort_keys=True))
        sections = {key: params.group(group).model_dump() for key, group in SECTIONS.items()}
        return {"config_hash": config_hash(params), **sections}
