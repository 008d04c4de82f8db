"""A JSON schema is validated as llama-server b1-0c1e570 validates it (grammar/json_schema_check.py,
a port of common/json-schema.cpp) before it is converted, and the refusal is worded as there.

Every message below was recorded from the reference server (the b1-0c1e570 llama-server binary on
Qwen2.5 0.5B) on 2026-12-05: POST /completion {"prompt": "x", "n_predict": 1, "json_schema": S}
answers 400 invalid_request_error `Field 'json_schema': "json_schema": JSON schema conversion
failed:\\n<message>`; a chat response_format (json_schema or json_object) answers `Unable to generate
parser for this template. Automatic parser generation failed: <message>`.
"""
from __future__ import annotations

import pytest

from grammar import GrammarError, json_schema_to_gbnf, parse_gbnf
from grammar.json_schema_check import JsonSchemaError, check_json_schema

BAD = "JSON schema error at "
# (schema, the reference's message), recorded 2026-12-05
REFUSED = [
    ({"type": "bogus"}, "#: unrecognized type bogus"),
    ("str", "#: schema must be an object"),
    (True, "#: schema must be an object"),
    ([], "#: schema must be an object"),
    ({"type": ["string", 5]}, "#/type/1: type must be a string or an array of strings"),
    ({"type": 5}, "#: type must be a string or an array of strings"),
    ({"type": {}}, "#: type must be a string or an array of strings"),
    ({"type": []}, "#: type must not be empty"),
    ({"type": [[]]}, "#/type/0: type must not be empty"),
    ({"type": [["string", 5]]}, "#/type/0/type/1: type must be a string or an array of strings"),
    ({"type": ["string", "bogus"]}, "#/type/1: unrecognized type bogus"),
    ({"type": ["string", 5], "enum": []}, "#/type/0: enum must be a non-empty array"),
    ({"type": ["integer", "string"], "minimum": "a"}, "#/type/0: minimum must be a number"),
    ({"type": ["null", "integer"], "minimum": "a"}, "#/type/1: minimum must be a number"),
    ({"type": ["object", "array"], "items": 5, "properties": 5}, "#/type/0: properties must be an object"),
    ({"type": ["array", "object"], "items": 5, "properties": 5}, "#/type/0/items: schema must be an object"),
    ({"type": "Object"}, "#: unrecognized type Object"),
    ({"type": 5, "enum": 5}, "#: enum must be a non-empty array"),
    ({"enum": []}, "#: enum must be a non-empty array"),
    ({"enum": 5}, "#: enum must be a non-empty array"),
    ({"enum": {}}, "#: enum must be a non-empty array"),
    ({"enum": None}, "#: enum must be a non-empty array"),
    ({"properties": 5}, "#: properties must be an object"),
    ({"type": "object", "properties": []}, "#: properties must be an object"),
    ({"type": "object", "properties": None}, "#: properties must be an object"),
    ({"type": "object", "properties": {"a": 5}}, "#/properties/a: schema must be an object"),
    ({"type": "object", "properties": {"a": True}}, "#/properties/a: schema must be an object"),
    ({"type": "object", "properties": {"a": {}, "b": 5, "c": {"type": "bogus"}}},
     "#/properties/b: schema must be an object"),
    ({"type": "object", "properties": {"c": {"type": "bogus"}, "b": 5}}, "#/properties/c: unrecognized type bogus"),
    ({"properties": {"a b/c~d": 5}}, "#/properties/a b/c~d: schema must be an object"),
    ({"properties": {"é": 5}}, "#/properties/é: schema must be an object"),
    ({"type": "object", "properties": 5, "additionalProperties": 5}, "#: properties must be an object"),
    ({"type": "object", "additionalProperties": 5}, "#: additionalProperties must be a boolean or a schema"),
    ({"type": "object", "additionalProperties": None}, "#: additionalProperties must be a boolean or a schema"),
    ({"type": "object", "additionalProperties": 1}, "#: additionalProperties must be a boolean or a schema"),
    ({"type": "object", "additionalProperties": []}, "#: additionalProperties must be a boolean or a schema"),
    ({"additionalProperties": 5}, "#: additionalProperties must be a boolean or a schema"),
    ({"type": "object", "additionalProperties": {"type": "bogus"}}, "#/additionalProperties: unrecognized type bogus"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {
        "b": {"enum": []}}}}}}, "#/properties/a/items/properties/b: enum must be a non-empty array"),
    ({"$ref": "#/x"}, "#: cannot resolve $ref #/x, x not found"),
    ({"$ref": "http://x"}, "#: unsupported $ref http://x, only references into the same document are supported"),
    ({"$ref": "#"}, "#: unsupported $ref #, only references into the same document are supported"),
    ({"$ref": ""}, "#: unsupported $ref , only references into the same document are supported"),
    ({"$ref": 5}, "#: $ref must be a string"),
    ({"$ref": None}, "#: $ref must be a string"),
    ({"$ref": "#/$defs/a", "$defs": {"a": 5}}, "#/$defs/a: schema must be an object"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}}},
     "#/$defs/a: cannot resolve $ref #/$defs/b, b not found"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"type": ["string", 5]}}},
     "#/$defs/a/type/1: type must be a string or an array of strings"),
    ({"$ref": "#/$defs/a/b", "$defs": {"a": 5}}, "#: cannot resolve $ref #/$defs/a/b, b not found"),
    ({"$ref": "#/$defs/a~1b", "$defs": {"a/b": {"type": "string"}}},  # no JSON-pointer unescaping
     "#: cannot resolve $ref #/$defs/a~1b, a~1b not found"),
    ({"$ref": "#/x/5", "x": [{"type": "string"}]}, "#: cannot resolve $ref #/x/5, 5 is out of range"),
    ({"$ref": "#/x/-1", "x": [{"type": "string"}]}, "#: cannot resolve $ref #/x/-1, -1 is out of range"),
    ({"$ref": "#/x/a", "x": [{"type": "string"}]}, "#: cannot resolve $ref #/x/a, a is out of range"),
    ({"$ref": "#/x/", "x": [{"type": "string"}]}, "#: cannot resolve $ref #/x/,  is out of range"),
    ({"$ref": "#/x/99999999999999999999999", "x": [{}]},
     "#: cannot resolve $ref #/x/99999999999999999999999, 99999999999999999999999 is out of range"),
    ({"$ref": "#/x/0/y", "x": [{"type": "string"}]}, "#: cannot resolve $ref #/x/0/y, y not found"),
    ({"$ref": "#/x/0", "x": [5]}, "#/x/0: schema must be an object"),
    ({"$ref": "#/", "": {"type": "bogus"}}, "#/: unrecognized type bogus"),
    ({"type": "object", "properties": {"a": {"$ref": "#/nope"}}},
     "#/properties/a: cannot resolve $ref #/nope, nope not found"),
    ({"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "bogus"}}},
     "#/$defs/a: unrecognized type bogus"),
    ({"properties": {"a": {"$ref": "#/properties/b"}, "b": {"type": "bogus"}}},
     "#/properties/b: unrecognized type bogus"),  # a $ref's target is checked at the reference's path
    ({"anyOf": []}, "#/anyOf: must not be empty"),
    ({"oneOf": []}, "#/oneOf: must not be empty"),
    ({"anyOf": 5}, "#/anyOf: must be an array of schemas"),
    ({"anyOf": {}}, "#/anyOf: must be an array of schemas"),
    ({"oneOf": 5, "anyOf": [{}]}, "#/oneOf: must be an array of schemas"),
    ({"anyOf": [{}, 5]}, "#/anyOf/1: schema must be an object"),
    ({"anyOf": [{"type": "bogus"}]}, "#/anyOf/0: unrecognized type bogus"),
    ({"allOf": 5}, "#/allOf: must be an array of schemas"),
    ({"allOf": []}, "#/allOf: must not be empty"),
    ({"allOf": [5]}, "#/allOf/0: schema must be an object"),
    ({"type": "object", "allOf": 5}, "#/allOf: must be an array of schemas"),
    ({"type": "string", "allOf": 5}, "#/allOf: must be an array of schemas"),
    ({"allOf": 5, "items": 5}, "#/allOf: must be an array of schemas"),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                {"type": "object", "properties": {"b": {"type": "bogus"}}}]},
     "#/allOf/1/properties/b: unrecognized type bogus"),
    ({"oneOf": [{"type": "object", "properties": {"x": {"type": "integer", "maximum": {}}}}]},
     "#/oneOf/0/properties/x: maximum must be a number"),
    ({"items": 5, "type": "array"}, "#/items: schema must be an object"),
    ({"type": "array", "items": True}, "#/items: schema must be an object"),
    ({"type": "array", "items": [{}, {"type": "bogus"}]}, "#/items/1: unrecognized type bogus"),
    ({"type": "array", "prefixItems": 5}, "#/prefixItems: schema must be an object"),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer", "minimum": "x"}]},
     "#/prefixItems/1: minimum must be a number"),
    ({"type": "array", "prefixItems": [{}], "items": 5}, "#/items: schema must be an object"),
    ({"items": {}, "minItems": -1}, "#: minItems must be a non-negative integer"),
    ({"type": "array", "minItems": -1}, "#: minItems must be a non-negative integer"),
    ({"type": "array", "minItems": "1"}, "#: minItems must be a non-negative integer"),
    ({"type": "array", "minItems": 1.0}, "#: minItems must be a non-negative integer"),
    ({"type": "array", "maxItems": None}, "#: maxItems must be a non-negative integer"),
    ({"type": "array", "maxItems": True}, "#: maxItems must be a non-negative integer"),
    ({"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": "3"},
     "#: maxItems must be a non-negative integer"),
    ({"type": "string", "pattern": 5}, "#: pattern must be a string"),
    ({"type": "string", "pattern": None}, "#: pattern must be a string"),
    ({"pattern": 5}, "#: pattern must be a string"),
    ({"type": "string", "format": 5}, "#: format must be a string"),
    ({"type": "string", "pattern": "^a$", "format": 5}, "#: format must be a string"),
    ({"type": "string", "format": 5, "minLength": -1}, "#: format must be a string"),
    ({"format": 5}, "#: format must be a string"),
    ({"format": None}, "#: format must be a string"),
    ({"type": "array", "items": [{"type": "object", "additionalProperties": {"type": "string", "format": ["x"]}}]},
     "#/items/0/additionalProperties: format must be a string"),
    ({"type": "string", "minLength": -1}, "#: minLength must be a non-negative integer"),
    ({"type": "string", "format": "email", "minLength": -1}, "#: minLength must be a non-negative integer"),
    ({"minLength": -1}, "#: minLength must be a non-negative integer"),
    ({"format": "date", "minLength": -1}, "#: minLength must be a non-negative integer"),
    ({"type": "string", "minLength": -1, "maxLength": -1}, "#: minLength must be a non-negative integer"),
    ({"type": "string", "minLength": False}, "#: minLength must be a non-negative integer"),
    ({"maxLength": "x"}, "#: maxLength must be a non-negative integer"),
    ({"type": "string", "maxLength": 2.5}, "#: maxLength must be a non-negative integer"),
    ({"type": "string", "maxLength": 2.0}, "#: maxLength must be a non-negative integer"),
    ({"type": "string", "maxLength": 1e2}, "#: maxLength must be a non-negative integer"),
    # read as a C++ int (the low 32 bits): negative there
    ({"type": "string", "maxLength": 2147483648}, "#: maxLength must be a non-negative integer"),
    ({"type": "string", "maxLength": 4294967295}, "#: maxLength must be a non-negative integer"),
    ({"type": "string", "maxLength": 18446744073709551615}, "#: maxLength must be a non-negative integer"),
    ({"type": "string", "maxLength": -2147483648}, "#: maxLength must be a non-negative integer"),
    ({"type": "integer", "minimum": "a"}, "#: minimum must be a number"),
    ({"type": "integer", "minimum": None}, "#: minimum must be a number"),
    ({"type": "integer", "minimum": True}, "#: minimum must be a number"),
    ({"type": "integer", "exclusiveMinimum": "a"}, "#: exclusiveMinimum must be a number"),
    ({"type": "integer", "maximum": "a"}, "#: maximum must be a number"),
    ({"type": "integer", "exclusiveMaximum": "a"}, "#: exclusiveMaximum must be a number"),
    ({"type": "integer", "minimum": 1, "maximum": "b"}, "#: maximum must be a number"),
]

# accepted by the reference (200), recorded 2026-12-05
ACCEPTED = [
    {}, {"type": "object"}, {"const": 1}, {"const": None}, {"enum": [None]}, {"type": "object", "required": 5},
    {"type": "object", "required": [5], "properties": {"a": {}}},
    {"type": "object", "required": 5, "properties": {"a": {}}},
    {"type": "object", "required": [5, {}], "properties": {"a": {"type": "string"}}},
    {"type": "object", "required": "a", "properties": {"a": {"type": "string"}}},
    {"type": None}, {"type": ""}, {"type": [None]},
    {"type": ["string", None]}, {"type": ["string", 5], "enum": [1]}, {"type": ["string", 5], "const": 1},
    {"type": 5, "const": 1}, {"enum": [1], "type": "bogus"}, {"const": 1, "enum": []},
    {"type": "number", "minimum": "a"}, {"type": "boolean", "enum": [1]}, {"type": "null", "properties": 5},
    {"anyOf": [{}], "type": "bogus"}, {"oneOf": [{}], "anyOf": 5},
    {"$ref": "#/$defs/a", "type": "bogus", "$defs": {"a": {}}},
    {"$ref": "#/x", "x": {"type": "string"}}, {"$ref": "#/", "": {"type": "string"}},
    {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}}},
    {"$defs": {"unused": {"$ref": "#/nope"}}, "type": "string"}, {"const": {"$ref": "http://x"}},
    {"enum": [{"$ref": "#/nope"}]},
    # std::stoull reads an array index: leading blanks, a sign and trailing junk are fine
    {"$ref": "#/x/ 0", "x": [{"type": "string"}]}, {"$ref": "#/x/+0", "x": [{"type": "string"}]},
    {"$ref": "#/x/0abc", "x": [{"type": "string"}]}, {"$ref": "#/x/-0", "x": [{"type": "string"}]},
    {"$ref": "#/x/-18446744073709551615", "x": [{"type": "string"}, {"type": "integer"}]},
    {"type": "object", "allOf": 5, "properties": {}}, {"type": "object", "allOf": 5, "additionalProperties": False},
    {"type": "string", "allOf": [{}], "pattern": 5}, {"type": "array", "allOf": 5}, {"type": "integer", "allOf": 5},
    {"allOf": 5, "properties": {}}, {"additionalProperties": True, "items": {}},
    {"additionalProperties": False, "items": 5}, {"type": "object", "additionalProperties": False},
    {"type": "object", "properties": {}, "minProperties": "x"}, {"type": "array", "items": [], "minItems": -1},
    {"type": "array", "prefixItems": 5, "items": {}}, {"type": "array", "uniqueItems": 5},
    {"type": "string", "maxLength": 2147483647}, {"type": "string", "maxLength": 4294967296},
    {"type": "string", "maxLength": -4294967296}, {"type": "string", "maxLength": -0},
    {"type": "string", "format": "uuid7"},
    {"format": "email"}, {"format": "date"},
    {"type": "integer", "minimum": 1.5}, {"type": "integer", "minimum": 1, "exclusiveMinimum": "a"},
    {"type": "integer", "maximum": 1, "exclusiveMaximum": "a"}, {"type": "integer", "minimum": 18446744073709551615},
    {"type": "integer", "minimum": 9223372036854775808}, {"type": "integer", "minimum": 1e30},
    {"type": "integer", "minimum": -9223372036854775809}, {"type": "integer", "multipleOf": "x"},
    {"minimum": "a"}, {"minimum": 5}, {"type": "number", "maximum": "x"},
    {"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "object", "properties": {"x": {"type": "string"}}}}},
]


@pytest.mark.parametrize("schema,message", REFUSED)
def test_refused_schemas_get_llamas_message(schema, message):
    with pytest.raises(JsonSchemaError) as e:
        check_json_schema(schema)
    assert str(e.value) == BAD + message
    assert isinstance(e.value, GrammarError)
    with pytest.raises(JsonSchemaError) as e:  # the converter validates first
        json_schema_to_gbnf(schema)
    assert str(e.value) == BAD + message


@pytest.mark.parametrize("schema", ACCEPTED)
def test_accepted_schemas_convert(schema):
    check_json_schema(schema)
    parse_gbnf(json_schema_to_gbnf(schema))


def test_without_a_type_integer_bounds_constrain_nothing_and_huge_ones_wrap_as_int64():
    # b1-0c1e570's grammars (generation_settings.grammar), 2026-12-05
    assert "root ::= value" in json_schema_to_gbnf({"minimum": 5})
    assert "root ::= (\"-\" ([0-1]) | [0] | [1-9] [0-9]{0,15})" in json_schema_to_gbnf(
        {"type": "integer", "minimum": 18446744073709551615})  # -1
    for big in (9223372036854775808, 1e30):  # INT64_MIN: no lower bound
        assert "root ::= (\"-\"? integral-part)" in json_schema_to_gbnf({"type": "integer", "minimum": big})
    assert 'root ::= "\\""  "\\""' in json_schema_to_gbnf({"type": "string", "maxLength": 4294967296})  # 0


def test_deep_nesting_is_a_grammar_error_not_a_crash():
    deep: dict = {"type": "integer"}
    for _ in range(20000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError, match="nests too deeply"):
        check_json_schema(deep)
    bad_inside = {"type": "bogus"}
    for _ in range(20000):
        bad_inside = {"anyOf": [bad_inside]}
    with pytest.raises(GrammarError, match="nests too deeply"):
        json_schema_to_gbnf(bad_inside)


def test_an_array_index_too_long_for_python_is_out_of_range():
    index = "9" * 5000  # int() refuses strings this long: std::stoull's out_of_range all the same
    with pytest.raises(JsonSchemaError, match=f"^{BAD}#: cannot resolve \\$ref #/x/9+, 9+ is out of range$"):
        check_json_schema({"$ref": "#/x/" + index, "x": [{}]})
    check_json_schema({"$ref": "#/x/" + "0" * 5000 + "1", "x": [{}, {}]})  # leading zeros: index 1


# --- through the HTTP API -------------------------------------------------------------------------
U = [{"role": "user", "content": "x"}]
FIELD = "Field 'json_schema': \"json_schema\": JSON schema conversion failed:\n"
CHAT = "Unable to generate parser for this template. Automatic parser generation failed: "


@pytest.fixture(scope="module")
def client(api_engine, api_client):
    with api_client(api_engine) as c:
        yield c


def error(r) -> tuple[int, str, str]:
    e = r.json()["error"]
    return r.status_code, e["type"], e["message"]


@pytest.mark.parametrize("schema,message", [
    ({"type": "bogus"}, "#: unrecognized type bogus"),
    ("str", "#: schema must be an object"),
    (True, "#: schema must be an object"),
    ({"properties": 5}, "#: properties must be an object"),
    ({"enum": []}, "#: enum must be a non-empty array"),
    ({"type": "object", "additionalProperties": 5}, "#: additionalProperties must be a boolean or a schema"),
    ({"type": "string", "maxLength": 2.5}, "#: maxLength must be a non-negative integer"),
    ({"type": ["string", 5]}, "#/type/1: type must be a string or an array of strings"),
    ({"$ref": "#/x"}, "#: cannot resolve $ref #/x, x not found"),
])
def test_completion_answers_as_llama_server(client, schema, message):
    for route in ("/completion", "/v1/completions"):
        r = client.post(route, json={"prompt": "x", "n_predict": 1, "json_schema": schema})
        assert error(r) == (400, "invalid_request_error", FIELD + BAD + message)


@pytest.mark.parametrize("schema,message", [
    ({"type": "bogus"}, "#: unrecognized type bogus"),
    ({"properties": 5}, "#: properties must be an object"),
    ({"anyOf": []}, "#/anyOf: must not be empty"),
    ({"type": "object", "properties": {"a": 5}}, "#/properties/a: schema must be an object"),
])
def test_chat_response_format_answers_as_llama_server(client, schema, message):
    for rf in ({"type": "json_schema", "json_schema": {"schema": schema}}, {"type": "json_object", "schema": schema}):
        r = client.post("/v1/chat/completions", json={"messages": U, "max_tokens": 1, "response_format": rf})
        assert error(r) == (400, "invalid_request_error", CHAT + BAD + message)


@pytest.mark.parametrize("schema", ["str", True, [], 5])
def test_chat_ignores_a_schema_that_is_not_an_object(client, schema):
    # b1's generated parser has a response format only for an object schema
    for rf in ({"type": "json_schema", "json_schema": {"schema": schema}}, {"type": "json_object", "schema": schema}):
        r = client.post("/v1/chat/completions", json={"messages": U, "max_tokens": 1, "response_format": rf})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("schema", [{"const": 1}, {"type": "object", "required": 5}, {}, {"type": "object"},
                                    {"$defs": {"unused": {"$ref": "#/nope"}}, "type": "string"}])
def test_accepted_schemas_are_served(client, schema):
    r = client.post("/completion", json={"prompt": "x", "n_predict": 1, "json_schema": schema})
    assert r.status_code == 200, r.text


def test_a_null_json_schema_is_no_schema(client):
    r = client.post("/completion", json={"prompt": "x", "n_predict": 1, "json_schema": None})
    assert r.status_code == 200 and r.json()["generation_settings"]["grammar"] == ""
