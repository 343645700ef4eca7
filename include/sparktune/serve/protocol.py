"""MLflow's scoring protocol, read into texts: what ``POST /invocations`` accepts and refuses.

The request formats are those of ``mlflow.pyfunc.scoring_server`` (what ``mlflow models serve``
and a Databricks serving endpoint take), for a model whose input is one ``text`` column:

- ``application/json`` with exactly one of ``dataframe_split`` (``{"columns": [...], "data":
  [[...]]}``), ``dataframe_records`` (``[{"text": ...}]``), ``inputs`` or ``instances`` (a string,
  a list of strings, a list of ``{"text": ...}`` records, or ``{"text": [...]}``);
- ``text/csv`` with a header row that has a ``text`` column.

Columns other than ``text`` are ignored, as the model ignores them. Everything a client can get
wrong is a :class:`BadRequest` whose message says what to send instead; one message lists every
bad row (up to :data:`MAX_LISTED_PROBLEMS`), so a client fixes its batch in one round trip.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparktune.serve.settings import env_name

JSON_TYPE, CSV_TYPE = "application/json", "text/csv"
DF_SPLIT, DF_RECORDS, INPUTS, INSTANCES = "dataframe_split", "dataframe_records", "inputs", "instances"
FORMATS = (DF_SPLIT, DF_RECORDS, INPUTS, INSTANCES)
TEXT_COLUMN = "text"
MAX_LISTED_PROBLEMS = 10

EXAMPLE_BODY = '{"dataframe_split": {"columns": ["text"], "data": [["I was charged twice"]]}}'
WHAT_TO_SEND = (
    f"Send Content-Type: {JSON_TYPE} with a body like {EXAMPLE_BODY} (or "
    '{"dataframe_records": [{"text": "..."}]}, {"inputs": ["...", "..."]}, {"instances": ["..."]}), '
    f"or Content-Type: {CSV_TYPE} with a header row naming a '{TEXT_COLUMN}' column."
)


class BadRequest(ValueError):
    """A client's mistake: ``status`` is the 4xx to answer, the message what to send instead."""

    def __init__(self, message: str, status: int = 400, error_code: str = "BAD_REQUEST") -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


@dataclass(frozen=True)
class RequestLimits:
    max_rows: int
    max_text_chars: int
    max_body_bytes: int


def body_too_large(size: int, limits: RequestLimits) -> BadRequest:
    return BadRequest(
        f"The request body has {size} bytes, more than the limit of {limits.max_body_bytes} "
        f"({env_name('max_body_bytes')}): send fewer or shorter texts per request.",
        status=413,
        error_code="REQUEST_LIMIT_EXCEEDED",
    )


def parse_texts(body: bytes, content_type: str | None, limits: RequestLimits) -> list[str]:
    """The texts of one ``/invocations`` request, in order; raises :class:`BadRequest`."""
    if len(body) > limits.max_body_bytes:
        raise body_too_large(len(body), limits)
    mime = _media_type(content_type)
    if not body.strip():
        raise BadRequest(f"The request body is empty. {WHAT_TO_SEND}")
    values = _csv_values(body) if mime == CSV_TYPE else _json_values(body)
    return _checked_texts(values, limits)


def _media_type(content_type: str | None) -> str:
    """``application/json`` or ``text/csv``; no header at all is taken as JSON (``curl -d`` users)."""
    if not content_type or not content_type.strip():
        return JSON_TYPE
    mime, *parameters = (part.strip() for part in content_type.split(";"))
    for parameter in parameters:
        key, _, value = parameter.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise BadRequest(
                f"Only UTF-8 is accepted, got charset={value.strip()!r}: encode the body as UTF-8.",
                status=415,
                error_code="UNSUPPORTED_MEDIA_TYPE",
            )
    mime = mime.lower()
    if mime not in (JSON_TYPE, CSV_TYPE):
        raise BadRequest(
            f"Unsupported Content-Type {content_type!r}. {WHAT_TO_SEND}",
            status=415,
            error_code="UNSUPPORTED_MEDIA_TYPE",
        )
    return mime


def _json_values(body: bytes) -> list[Any]:
    try:
        payload = json.loads(body)
    except UnicodeDecodeError:
        raise BadRequest(f"The request body is not UTF-8 text. {WHAT_TO_SEND}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"The request body is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}). "
            f"{WHAT_TO_SEND}"
        ) from None
    if isinstance(payload, list):
        raise BadRequest(
            f'The body is a JSON list; wrap it in an object: {{"inputs": [...]}}. {WHAT_TO_SEND}'
        )
    if not isinstance(payload, dict):
        raise BadRequest(f"The body is a JSON {type(payload).__name__}, not an object. {WHAT_TO_SEND}")
    present = [key for key in FORMATS if key in payload]
    others = sorted(key for key in payload if key not in FORMATS)
    if len(present) != 1:
        found = f"found {present}" if present else f"found only {others}" if others else "found none"
        raise BadRequest(
            f"The body must have exactly one of the fields {list(FORMATS)} ({found}). {WHAT_TO_SEND}"
        )
    if others:
        hint = " (this model takes no params)" if "params" in others else ""
        raise BadRequest(f"Unexpected field(s) {others} beside {present[0]!r}{hint}. {WHAT_TO_SEND}")
    key = present[0]
    value = payload[key]
    if key == DF_SPLIT:
        return _split_values(value)
    if key == DF_RECORDS:
        if not isinstance(value, list):
            raise BadRequest(f'"{DF_RECORDS}" must be a list of {{"text": ...}} objects. {WHAT_TO_SEND}')
        return _record_values(value, DF_RECORDS)
    return _tensor_values(value, key)


def _split_values(value: Any) -> list[Any]:
    if not isinstance(value, dict) or not isinstance(value.get("columns"), list):
        raise BadRequest(
            f'"{DF_SPLIT}" must be an object with "columns" (a list naming a "{TEXT_COLUMN}" column) '
            f'and "data" (a list of rows). {WHAT_TO_SEND}'
        )
    columns, data = value["columns"], value.get("data")
    if TEXT_COLUMN not in columns:
        raise BadRequest(
            f'"{DF_SPLIT}" has the columns {columns}, none named "{TEXT_COLUMN}". {WHAT_TO_SEND}'
        )
    if not isinstance(data, list):
        raise BadRequest(f'"{DF_SPLIT}" needs "data": a list of rows, one value per column. {WHAT_TO_SEND}')
    at = columns.index(TEXT_COLUMN)
    values: list[Any] = []
    for row in data:
        if isinstance(row, list) and len(row) == len(columns):
            values.append(row[at])
        elif len(columns) == 1 and not isinstance(row, list | dict):
            values.append(row)  # [["a"], ["b"]] written as ["a", "b"]: unambiguous with one column
        else:
            values.append(_Malformed(f"has {_describe(row)} for the {len(columns)} columns {columns}"))
    return values


def _record_values(records: Sequence[Any], where: str) -> list[Any]:
    values: list[Any] = []
    for record in records:
        if not isinstance(record, dict):
            problem = f'is {_describe(record)} in "{where}", not an object with "{TEXT_COLUMN}"'
            values.append(_Malformed(problem))
        elif TEXT_COLUMN not in record:
            values.append(_Malformed(f'has no "{TEXT_COLUMN}" field (fields: {sorted(record)})'))
        else:
            values.append(record[TEXT_COLUMN])
    return values


def _tensor_values(value: Any, key: str) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        if TEXT_COLUMN not in value:
            raise BadRequest(
                f'"{key}" is an object without a "{TEXT_COLUMN}" field (fields: {sorted(value)}). '
                + WHAT_TO_SEND
            )
        column = value[TEXT_COLUMN]
        return column if isinstance(column, list) else [column]
    if isinstance(value, list):
        if any(isinstance(item, dict) for item in value):
            return _record_values(value, key)
        return value
    raise BadRequest(f'"{key}" is {_describe(value)}; send a list of texts. {WHAT_TO_SEND}')


def _csv_values(body: bytes) -> list[Any]:
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BadRequest(f"The CSV body is not UTF-8 text. {WHAT_TO_SEND}") from None
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise BadRequest(f"The CSV body cannot be read ({exc}). {WHAT_TO_SEND}") from None
    header = [name.strip() for name in rows[0]] if rows else []
    if TEXT_COLUMN not in header:
        raise BadRequest(f"The CSV header {header} has no '{TEXT_COLUMN}' column. {WHAT_TO_SEND}")
    at = header.index(TEXT_COLUMN)
    return [
        row[at] if len(row) == len(header) else _Malformed(f"has {len(row)} fields, the header {len(header)}")
        for row in rows[1:]
        if row  # a trailing blank line is no row
    ]


@dataclass(frozen=True)
class _Malformed:
    """A row that has no text value at all; kept in place so problems name the right row."""

    problem: str


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__} ({json.dumps(value)[:40]})"


def _checked_texts(values: list[Any], limits: RequestLimits) -> list[str]:
    if not values:
        raise BadRequest(f"The request holds no texts. {WHAT_TO_SEND}")
    if len(values) > limits.max_rows:
        raise BadRequest(
            f"The request holds {len(values)} texts, more than the limit of {limits.max_rows} per request "
            f"({env_name('max_rows_per_request')}): split it into several requests.",
            status=413,
            error_code="REQUEST_LIMIT_EXCEEDED",
        )
    problems: list[str] = []
    too_long = 0
    for row, value in enumerate(values):
        if isinstance(value, _Malformed):
            problems.append(f"row {row} {value.problem}")
        elif not isinstance(value, str):
            problems.append(f'row {row}: "{TEXT_COLUMN}" must be a string, got {_describe(value)}')
        elif not value.strip():
            problems.append(f'row {row}: "{TEXT_COLUMN}" is empty')
        elif len(value) > limits.max_text_chars:
            too_long += 1
            problems.append(
                f"row {row}: the text has {len(value)} characters, more than the limit of "
                f"{limits.max_text_chars} ({env_name('max_text_chars')}); shorten or split it"
            )
    if not problems:
        return values
    listed = "; ".join(problems[:MAX_LISTED_PROBLEMS])
    more = f"; and {len(problems) - MAX_LISTED_PROBLEMS} more" if len(problems) > MAX_LISTED_PROBLEMS else ""
    only_size = too_long == len(problems)
    raise BadRequest(
        f"{len(problems)} of {len(values)} rows cannot be scored: {listed}{more}."
        + ("" if only_size else f" {WHAT_TO_SEND}"),
        status=413 if only_size else 400,
        error_code="REQUEST_LIMIT_EXCEEDED" if only_size else "BAD_REQUEST",
    )


def predictions_body(rows: Sequence[dict[str, Any]], request_id: str) -> bytes:
    """MLflow's answer shape, ``{"predictions": [...]}``, one object per text, plus the request id."""
    return json.dumps({"predictions": list(rows), "request_id": request_id}).encode()


def error_body(error_code: str, message: str) -> bytes:
    """MLflow's error shape (``MlflowException.serialize_as_json``)."""
    return json.dumps({"error_code": error_code, "message": message}).encode()
