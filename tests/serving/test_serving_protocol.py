"""MLflow's request formats read into texts, without a server (the HTTP side: test_serving_server.py)."""

from __future__ import annotations

import json

import pytest
from sparktune.serve.protocol import BadRequest, RequestLimits, parse_texts

LIMITS = RequestLimits(max_rows=50, max_text_chars=200, max_body_bytes=100_000)


def _parse(payload, content_type: str | None = "application/json") -> list[str]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return parse_texts(body, content_type, LIMITS)


@pytest.mark.parametrize(
    "payload",
    [
        {"dataframe_split": {"columns": ["text"], "data": [["a b"], ["c"]]}},
        {"dataframe_split": {"columns": ["text"], "data": ["a b", "c"]}},  # one column, rows as scalars
        {"dataframe_split": {"columns": ["text", "n"], "data": [["a b", 1], ["c", 2]], "index": [7, 8]}},
        {"dataframe_records": [{"text": "a b", "extra": True}, {"text": "c"}]},
        {"inputs": ["a b", "c"]},
        {"inputs": {"text": ["a b", "c"], "id": [1, 2]}},
        {"instances": [{"text": "a b"}, {"text": "c"}]},
        {"instances": ["a b", "c"]},
    ],
)
def test_every_json_format_gives_the_texts_in_order(payload):
    assert _parse(payload) == ["a b", "c"]


def test_a_single_text_csv_and_a_request_without_content_type():
    assert _parse({"inputs": "one text"}) == ["one text"]
    assert _parse({"inputs": {"text": "one text"}}) == ["one text"]
    csv_body = b'id,text\n1,"quoted, with a comma"\n2,"a ""quote"""\n\n'
    assert _parse(csv_body, "text/csv") == ["quoted, with a comma", 'a "quote"']
    assert _parse(b"\xef\xbb\xbftext\nwith a BOM\n", "text/csv") == ["with a BOM"]
    assert _parse({"inputs": ["x"]}, None) == ["x"]  # curl -d without -H: taken as JSON
    assert _parse({"inputs": ["x"]}, "Application/JSON; charset=UTF-8") == ["x"]


def test_one_message_lists_every_bad_row_up_to_ten():
    payload = {"inputs": [5] * 12 + ["fine"]}
    with pytest.raises(BadRequest) as info:
        _parse(payload)
    message = str(info.value)
    assert info.value.status == 400
    assert message.startswith("12 of 13 rows cannot be scored: row 0:")
    assert "row 9:" in message and "row 10:" not in message and "; and 2 more." in message
    assert "Send Content-Type: application/json with a body like" in message


def test_only_too_long_texts_is_a_413_with_the_limit_and_its_variable():
    with pytest.raises(BadRequest) as info:
        _parse({"inputs": ["ok", "y" * 201]})
    assert info.value.status == 413 and info.value.error_code == "REQUEST_LIMIT_EXCEEDED"
    assert "row 1: the text has 201 characters, more than the limit of 200" in str(info.value)
    assert "SPARKTUNE_SERVING_MAX_TEXT_CHARS" in str(info.value)


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"dataframe_split": [["a"]]}, '"dataframe_split" must be an object with "columns"'),
        ({"dataframe_split": {"columns": ["text"]}}, 'needs "data"'),
        ({"dataframe_records": {"text": "a"}}, '"dataframe_records" must be a list'),
        ({"inputs": 3}, '"inputs" is a int (3); send a list of texts'),
        ({"instances": {"body": ["a"]}}, "without a \"text\" field (fields: ['body'])"),
        ({"inputs": [["nested"]]}, 'row 0: "text" must be a string, got a list of 1'),
        ({"instances": [{"text": "a"}, "b"]}, 'row 1 is a str ("b") in "instances"'),
        ("just a string", "The body is a JSON str, not an object"),
    ],
)
def test_malformed_json_shapes_say_what_is_wrong(payload, says):
    with pytest.raises(BadRequest) as info:
        _parse(payload)
    assert info.value.status == 400
    assert says in str(info.value)


def test_a_csv_row_with_the_wrong_number_of_fields_is_named():
    with pytest.raises(BadRequest) as info:
        _parse(b"id,text\n1,fine\n2\n", "text/csv")
    assert "row 1 has 1 fields, the header 2" in str(info.value)
