"""``ValidateParamsOperator``: a run's first task, which checks every param before any work starts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from sparktune_airflow.core.task_context import config_hash, pipeline_params


class ValidateParamsOperator(BaseOperator):
    """Checks every param before any work starts; the error lists all problems at once.

    Returns ``{"config_hash": ...}``: the hash of what the run trains with.

    :param pipeline_params: (templated) the params to check, a dict of flat values (in the
        pipeline's DAGs ``"{{ params }}"``); missing names take their defaults from ``sparktune.core.params``.
    """

    template_fields: Sequence[str] = ("pipeline_params",)

    def __init__(self, *, pipeline_params: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline_params = pipeline_params

    def execute(self, context: Any) -> dict[str, Any]:
        params = pipeline_params(self.pipeline_params)
        self.log.info("params are valid: %s", json.dumps(params.to_dict(), sort_keys=True))
        return {"config_hash": config_hash(params)}
