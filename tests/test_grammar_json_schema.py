"""JSON Schema -> GBNF: llama.cpp rule shapes, integer ranges, and random schemas whose random
token walks must produce JSON that validates against the schema."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from grammar import JSON_OBJECT_GBNF, GrammarError, compile_grammar, json_schema_to_gbnf, parse_gbnf
from tests.test_grammar_helpers import qwen2_vocab, random_walk, recognizes, small_vocab

VOCAB, PIECES, EOS = small_vocab()
_STRUCT_CHARS = set(b'"{}[],:0123456789-')
STRUCTURAL = frozenset(i for i, p in enumerate(PIECES)
                       if p and (all(c in _STRUCT_CHARS for c in p) or p in (b"true", b"false", b"null")))

FILE_INFO = {
    "type": "object",
    "properties": {"file": {"type": "string", "maxLength": 12},
                   "lines": {"type": "integer", "minimum": 0, "maximum": 99999}},
    "required": ["file", "lines"], "additionalProperties": False,
}


def test_file_info_rules_match_llama_server():
    text = json_schema_to_gbnf(FILE_INFO)
    lines = set(text.splitlines())
    for expected in [
        'file ::= "\\"" char{0,12} "\\""',
        'file-kv ::= "\\"file\\"" space ":" space file',
        'lines-kv ::= "\\"lines\\"" space ":" space lines',
        'root ::= "{" space file-kv "," space lines-kv space "}"',
        'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}',
    ]:
        assert expected in lines, (expected, text)
    assert text.splitlines() == sorted(text.splitlines())  # rules are listed by name
    cg = compile_grammar(text, VOCAB)
    # the lesson's real output is accepted, Hangul counted as characters
    real = '{\n\n \t\t \t\t \t\t \t\t \t\t \t\t  "file":\n\n"For(res쎅쎅쎅쎅쎅",\n\n \t\t \t\t\t\t\t    \t \t\t\t  "lines":\n\n \t\t\t \t\t\t \t\t\t \t\t\t \t\t\t33333 }'
    assert cg.accepts_bytes(real.encode())
    assert not cg.accepts_bytes('{"file":"0123456789abc","lines":1}'.encode())  # 13 chars
    assert cg.accepts_bytes('{"file":"쎅쎅쎅쎅쎅쎅쎅쎅쎅쎅쎅쎅","lines":99999}'.encode())
    assert not cg.accepts_bytes('{"file":"a","lines":100000}'.encode())
    assert not cg.accepts_bytes('{"file":"a","lines":-1}'.encode())
    assert not cg.accepts_bytes('{"file":"a","lines":01}'.encode())


def test_json_object_grammar_accepts_any_object_only():
    g = parse_gbnf(JSON_OBJECT_GBNF)
    assert "root ::= object" in JSON_OBJECT_GBNF.splitlines()
    assert recognizes(g, '{"a": [1, 2.5e+3, {"b": null}], "c": "\\u00e9"}')
    assert not recognizes(g, "[1]")
    cg = compile_grammar(JSON_OBJECT_GBNF, VOCAB)
    rng = random.Random(1)
    done = 0
    for _ in range(15):
        out, finished = random_walk(cg, PIECES, rng, max_steps=300, bias_structural=0.5, structural=STRUCTURAL)
        if finished:
            done += 1
            assert isinstance(json.loads(out.decode()), dict)
    assert done >= 5


@pytest.mark.parametrize("lo, hi", [(0, 99999), (-5, 17), (-120, -7), (3, None), (None, 42), (-15, None),
                                    (None, -3), (10, 10), (7, 1234), (0, None), (95, 305), (123, None)])
def test_integer_ranges_are_exact(lo, hi):
    schema = {"type": "integer"}
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    g = parse_gbnf(json_schema_to_gbnf(schema))
    rng = random.Random(f"{lo},{hi}")
    probes = set(range(-130, 320)) | {rng.randint(-10**7, 10**7) for _ in range(100)} | {10**15, -10**15}
    for v in probes:
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert recognizes(g, str(v)) == ok, (v, lo, hi)
    assert not recognizes(g, "007")  # (like llama.cpp, an open lower bound below -9 admits "-01")


def test_string_formats_and_patterns():
    cases = [
        ({"type": "string", "format": "date"}, ['"2024-01-31"'], ['"2024-13-01"', '"24-01-01"']),
        ({"type": "string", "format": "time"}, ['"12:30:59Z"', '"23:00:00.123+05:30"'], ['"24:00:00Z"']),
        ({"type": "string", "format": "date-time"}, ['"2024-01-31T12:00:00Z"'], ['"2024-01-31 12:00:00Z"']),
        ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567"']),
        ({"type": "string", "pattern": "^[a-c]+-[0-9]{2,3}$"}, ['"ab-12"', '"c-123"'], ['"ab-1"', '"d-12"']),
        ({"type": "string", "pattern": "^(foo|ba[rz])\\.x?$"}, ['"foo."', '"baz.x"'], ['"bax."']),
        ({"type": "string", "pattern": "ab"}, ['"ab"', '"xxabyy"'], ['"ba"']),
        ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"', '"a\\nc"'], ['"a"', '"abcd"']),
        ({"enum": ["red", 1, None, {"k": [True]}]}, ['"red"', "1", "null", '{"k": [true]}'], ['"blue"']),
        ({"const": "x\"y"}, ['"x\\"y"'], ['"xy"']),
    ]
    for schema, good, bad in cases:
        g = parse_gbnf(json_schema_to_gbnf(schema))
        for s in good:
            assert recognizes(g, s), (schema, s)
        for s in bad:
            assert not recognizes(g, s), (schema, s)


def test_additional_properties_and_optional_order():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["b"], "additionalProperties": {"type": "string"}}
    g = parse_gbnf(json_schema_to_gbnf(schema))
    assert recognizes(g, '{"b": true}')
    assert recognizes(g, '{"b": false, "a": 3, "zz": "q", "c": "r"}')
    assert not recognizes(g, '{"a": 3}')  # b is required
    assert not recognizes(g, '{"b": true, "a": "str"}')  # a is an integer, not an extra key


def test_recursive_ref_and_errors():
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}
    text = json_schema_to_gbnf(schema)
    g = parse_gbnf(text)
    assert g.is_recursive()
    assert recognizes(g, '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}')
    assert not recognizes(g, '{"v": 1, "kids": [{"kids": []}]}')
    with pytest.raises(GrammarError):
        json_schema_to_gbnf({"$ref": "https://example.com/schema.json"})
    with pytest.raises(GrammarError):
        json_schema_to_gbnf({"$ref": "#/$defs/missing"})
    with pytest.raises(GrammarError):
        json_schema_to_gbnf({"type": "string", "pattern": "^(?=a)b$"})
    with pytest.raises(GrammarError):
        json_schema_to_gbnf({"type": "frobnicate"})


# --- random schemas ------------------------------------------------------------------------------
def random_schema(rng: random.Random, depth: int = 0) -> dict:
    leaf = [
        lambda: {"type": "string", **({"maxLength": rng.randint(0, 4)} if rng.random() < 0.7 else {}),
                 **({"minLength": rng.randint(0, 2)} if rng.random() < 0.3 else {})},
        lambda: {"type": "integer", **({"minimum": rng.randint(-50, 50)} if rng.random() < 0.5 else {}),
                 **({"maximum": rng.randint(50, 5000)} if rng.random() < 0.5 else {})},
        lambda: {"type": "number"},
        lambda: {"type": "boolean"},
        lambda: {"type": "null"},
        lambda: {"enum": rng.sample(["a", "b c", 1, 2.5, None, True, [1]], rng.randint(1, 3))},
        lambda: {"const": rng.choice(["k", 7, False, {"z": 1}])},
        lambda: {"type": "string", "format": rng.choice(["date", "time", "date-time", "uuid"])},
        lambda: {"type": "string", "pattern": rng.choice(["^[a-c]{1,3}-[0-9]+$", "^(x|yz)*$", "^[0-9]{2}$"])},
    ]
    if depth >= 2 or rng.random() < 0.4:
        return rng.choice(leaf)()
    kind = rng.choice(["object", "object", "array", "tuple", "anyOf"])
    if kind == "object":
        names = rng.sample(["a", "b", "c", "dd", "e-f"], rng.randint(1, 3))
        schema = {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
                  "required": [n for n in names if rng.random() < 0.6]}
        if rng.random() < 0.5:
            schema["additionalProperties"] = False
        return schema
    if kind == "array":
        lo = rng.randint(0, 2)
        schema = {"type": "array", "items": random_schema(rng, depth + 1), "minItems": lo}
        if rng.random() < 0.6:
            schema["maxItems"] = lo + rng.randint(0, 2)
        return schema
    if kind == "tuple":
        return {"type": "array", "prefixItems": [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]}
    return {"anyOf": [random_schema(rng, depth + 1) for _ in range(2)]}


@pytest.mark.parametrize("seed", range(24))
def test_random_schema_walks_validate(seed):
    rng = random.Random(seed)
    schema = random_schema(rng)
    cg = compile_grammar(json_schema_to_gbnf(schema), VOCAB)
    finished = 0
    for _ in range(6):
        out, done = random_walk(cg, PIECES, rng, max_steps=250, bias_structural=0.6, structural=STRUCTURAL)
        if done:
            finished += 1
            value = json.loads(out.decode("utf-8"))
            jsonschema.validate(value, schema)
    assert finished >= 1, schema


# --- the real qwen2 vocabulary ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen2():
    v = qwen2_vocab()
    if v is None:
        pytest.skip("qwen2 vocab not available")
    return v


def test_qwen2_yes_no(qwen2):
    vocab, pieces, eog = qwen2
    cg = compile_grammar('root ::= ("yes" | "no") "\\n"', vocab)
    m = cg.matcher()
    allowed = {pieces[i] for i in m.allowed_mask().nonzero().flatten().tolist()}
    assert {b"yes", b"no", b"y", b"n"} <= allowed
    assert all(b"yes\n".startswith(p) or b"no\n".startswith(p) for p in allowed)
    for piece in (b"yes", b"\n"):
        m.advance(pieces.index(piece))
    assert set(m.allowed_mask().nonzero().flatten().tolist()) == set(eog)


def test_qwen2_file_info_walks(qwen2):
    vocab, pieces, eog = qwen2
    cg = compile_grammar(json_schema_to_gbnf(FILE_INFO), vocab)
    rng = random.Random(0)
    structural = frozenset(i for i, p in enumerate(pieces) if p in (b'"', b",", b"}", b'",', b"0", b"7"))
    for _ in range(3):
        out, done = random_walk(cg, pieces, rng, max_steps=200, bias_structural=0.5, structural=structural)
        assert done, out
        value = json.loads(out.decode("utf-8"))
        jsonschema.validate(value, FILE_INFO)
