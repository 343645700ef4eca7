"""What an operator's ``execute`` reads from its task and the deployment: its typed params,
templated booleans, the allowed roots, a per-try scratch folder and the audit actor."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException
from sparktune.core.config import settings
from sparktune.core.params import G, InvalidParamsError, validated
from sparktune.core.paths import path_segment


def typed_params(group: type[G], value: G | Mapping[str, Any] | None, argument: str) -> G:
    """An operator's ``argument`` as its typed section (a model instance, or a dict whose missing
    names take their defaults; None: all defaults); invalid values fail the task at once, every
    problem in one message.

    Explicit on purpose: an operator never reads the DAG run's params on its own, so one reused in
    another DAG does not pick up that DAG's form. The pipeline's DAG hands each operator its
    sections from ``ValidateParamsOperator``'s output (``validate_params.output["training"]``).
    """
    if isinstance(value, str):
        raise AirflowFailException(
            f"{argument} rendered to a string ({value[:80]!r}): pass a dict or a {group.__name__}, "
            "or an XComArg such as validate_params.output['{argument}']"
        )
    try:
        return validated(group, value)
    except InvalidParamsError as exc:
        raise AirflowFailException(f"{argument}: {exc}") from exc


def templated_bool(value: Any) -> bool:
    """A templated boolean: True/False, or the strings a non-native render gives ("True", "false")."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise AirflowFailException(f"expected true or false, got {value!r}")


def check_allowed_location(param: str, value: Any, source_format: str | None = None) -> None:
    """Fail at once when ``value`` lies outside ``SPARKTUNE_ALLOWED_ROOTS`` (when the deployment sets
    it), ``..`` and symlinks resolved; ``source_format`` given: ``value`` may be a catalog table name.
    Empty values pass (each operator has its own default for them)."""
    from sparktune.core.paths import check_allowed_uri, check_source

    roots = settings().allowed_roots
    text = str(value or "").strip()
    if not roots or not text:
        return
    try:
        if source_format is None:
            check_allowed_uri(param, text, roots)
        else:
            check_source(param, text, source_format, roots)
    except ValueError as exc:
        raise AirflowFailException(str(exc)) from exc


def task_scratch_dir(context: Any) -> Path:
    """A per-try scratch folder for request/result files exchanged with subprocesses."""
    ti = context["ti"]
    path = settings().home / "runs" / ti.dag_id / path_segment(ti.run_id) / ti.task_id / str(ti.try_number)
    path.mkdir(parents=True, exist_ok=True)
    return path


def audit_actor(context: Any) -> str:
    """Who moves an alias, as the audit log records it: ``airflow:<dag_id>/<run_id>/<task_id>``."""
    ti = context["ti"]
    return f"airflow:{ti.dag_id}/{ti.run_id}/{ti.task_id}"
