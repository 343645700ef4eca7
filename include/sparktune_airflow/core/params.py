"""The trigger forms: Airflow ``Param`` objects built from the domain's param specs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow.sdk import Param
from airflow.sdk.definitions.param import NOTSET
from sparktune.core.params import PARAM_SPECS, ParamSpec

# Airflow validates a Param with ``jsonschema.validate``, which first checks the schema itself
# against its dialect's metaschema, and does so for every param of every task each time a DAG is
# serialized (``airflow dags test`` three times a run, the DAG processor at every parse): about
# 6,000 checks per llm_finetune serialization. Against draft 2020-12, jsonschema's default, the
# check costs 2.5 times what it costs against draft-07, whose keywords cover everything below.
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"


def form_param(default: Any = NOTSET, description: str | None = None, **schema: Any) -> Param:
    """``airflow.sdk.Param`` checked against :data:`SCHEMA_DIALECT`: what every DAG here uses."""
    return Param(default, description=description, **{"$schema": SCHEMA_DIALECT, **schema})


def _param(spec: ParamSpec) -> Param:
    # An optional string is nullable: the form sends an emptied field as null (parse_params reads
    # it as ""), while a plain "string" field counts as required and an empty one blocks the form.
    optional_string = spec.type == "string" and not spec.enum and not spec.min_length
    # A number left to the base model's recipe: empty in the form, null in the conf. A required
    # string without a default (corrections_uri) must be given: no default at all.
    required_without_default = spec.default is None and bool(spec.min_length)
    nullable = optional_string or (spec.default is None and not required_without_default)
    schema: dict[str, Any] = {
        "type": [spec.type, "null"] if nullable else spec.type,
        "title": spec.name,
        "section": spec.section,
    }
    if spec.min_length:
        schema["minLength"] = spec.min_length
    if spec.enum:
        schema["enum"] = list(spec.enum)
    if spec.pattern:
        schema["pattern"] = spec.pattern
    if spec.minimum is not None:
        schema["minimum"] = spec.minimum
    if spec.maximum is not None:
        schema["maximum"] = spec.maximum
    if spec.type == "string" and (spec.multiline or "\n" in str(spec.default)):
        schema["format"] = "multiline"
    default = NOTSET if required_without_default else spec.default
    return form_param(default, description=spec.description, **schema)


def trigger_form_params(names: list[str] | None = None) -> dict[str, Param]:
    """Params for a DAG's trigger form: every pipeline param, or the ``names`` given."""
    return {spec.name: _param(spec) for spec in PARAM_SPECS if names is None or spec.name in names}


def form_params(specs: Iterable[ParamSpec]) -> dict[str, Param]:
    """Params for a DAG's trigger form from its own specs (``sparktune.core.dag_params``)."""
    return {spec.name: _param(spec) for spec in specs}
