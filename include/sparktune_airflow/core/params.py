"""The trigger forms: Airflow ``Param`` objects built from the domain's typed params
(:mod:`sparktune.core.params`, :mod:`sparktune.core.dag_params`)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from typing import Any

from airflow.sdk import Param
from airflow.sdk.definitions.param import NOTSET
from annotated_types import Ge, Le
from pydantic.fields import FieldInfo
from sparktune.core.params import ParamGroup, PipelineParams, role

# Airflow validates a Param with ``jsonschema.validate``, which first checks the schema itself
# against its dialect's metaschema, and does so for every param of every task each time a DAG is
# serialized (``airflow dags test`` three times a run, the DAG processor at every parse): about
# 6,000 checks per llm_finetune serialization. Against draft 2020-12, jsonschema's default, the
# check costs 2.5 times what it costs against draft-07, whose keywords cover everything below.
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number"}


def form_param(default: Any = NOTSET, description: str | None = None, **schema: Any) -> Param:
    """``airflow.sdk.Param`` checked against :data:`SCHEMA_DIALECT`: what every DAG here uses."""
    return Param(default, description=description, **{"$schema": SCHEMA_DIALECT, **schema})


def _json_type(annotation: Any) -> tuple[str, list[Any] | None, bool]:
    """The JSON type, enum and nullability of a field's annotation (``int | None``, ``Literal``)."""
    nullable = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        nullable = len(members) < len(typing.get_args(annotation))
        (annotation,) = members
    if typing.get_origin(annotation) is typing.Annotated:  # Integer | None keeps Integer's metadata
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is typing.Literal:
        return "string", list(typing.get_args(annotation)), nullable
    return _JSON_TYPES[annotation], None, nullable


def _param(name: str, field: FieldInfo) -> Param:
    json_type, enum, nullable = _json_type(field.annotation)
    required = bool(role(field, "required"))
    # An optional string is nullable: the form sends an emptied field as null (the model reads it
    # as ""), while a plain "string" field counts as required and an empty one blocks the form.
    if json_type == "string" and not enum and not required:
        nullable = True
    schema: dict[str, Any] = {
        "type": [json_type, "null"] if nullable else json_type,
        "title": name,
        "section": role(field, "section") or "Params",
    }
    if required:
        schema["minLength"] = 1
    if enum:
        schema["enum"] = enum
    for constraint in field.metadata:
        if isinstance(constraint, Ge):
            schema["minimum"] = constraint.ge
        elif isinstance(constraint, Le):
            schema["maximum"] = constraint.le
        elif getattr(constraint, "pattern", None):
            schema["pattern"] = constraint.pattern
    default = NOTSET if field.is_required() else field.get_default(call_default_factory=True)
    if json_type == "string" and (role(field, "multiline") or "\n" in str(default or "")):
        schema["format"] = "multiline"
    return form_param(default, description=field.description, **schema)


def param_refs(group: type[ParamGroup], names: Iterable[str]) -> dict[str, str]:
    """The fields of ``group`` among ``names`` as templates of the run's params
    (``{"min_rows": "{{ params.min_rows }}"}``): an operator's section from a form that holds only
    some of the section's fields (a DAG with ``render_template_as_native_obj=True`` renders them typed)."""
    wanted = set(names)
    return {name: f"{{{{ params.{name} }}}}" for name in group.model_fields if name in wanted}


def form_params(
    group: type[ParamGroup] = PipelineParams, names: Iterable[str] | None = None
) -> dict[str, Param]:
    """A trigger form's params: every field of ``group`` (default: the pipeline's), or ``names``."""
    wanted = None if names is None else set(names)
    return {
        name: _param(name, field)
        for name, field in group.model_fields.items()
        if wanted is None or name in wanted
    }
