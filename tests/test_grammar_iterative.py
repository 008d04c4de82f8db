"""Issue 38 (request isolation): no client grammar or JSON schema leans on Python's recursion.

The GBNF parser's groups, the whole-grammar checks (nullable rules, left recursion), the pushdown
automaton's expansion and the JSON-schema check are iterative; what stays recursive (the schema
converter) or would cost without bound is refused past a named constant (MAX_GRAMMAR_NESTING,
MAX_SCHEMA_DEPTH, MAX_PATTERN_NESTING) with a message naming it. Each deep input is tried with the
recursion limit lowered to 200, where a recursive walk would fail.
"""
from __future__ import annotations

import sys
import time

import pytest

from grammar import GrammarError, compile_grammar, json_schema_to_gbnf, parse_gbnf
from grammar.gbnf import MAX_GRAMMAR_NESTING, GrammarTooLarge
from grammar.json_schema_check import MAX_SCHEMA_DEPTH, JsonSchemaError, SchemaTooDeep, check_json_schema
from grammar.schema_pattern import MAX_PATTERN_NESTING
from tests.test_grammar_helpers import small_vocab

LOW_RECURSION_LIMIT = 200
CHAIN = 20000


@pytest.fixture(scope="module")
def vocab():
    return small_vocab()[0]


@pytest.fixture
def low_recursion_limit():
    """The recursion limit at LOW_RECURSION_LIMIT for the test's body (restored afterwards)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(LOW_RECURSION_LIMIT)
    try:
        yield LOW_RECURSION_LIMIT
    finally:
        sys.setrecursionlimit(old)


def chain(tail: str, n: int = CHAIN, step: str = "") -> str:
    """root ::= r0, r0 ::= r1 <step>, ..., r<n> ::= <tail>"""
    return "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}{step}\n" for i in range(n)) + f"r{n} ::= {tail}\n"


def nested(depth: int, inner: str = '"a"') -> str:
    return "root ::= " + "(" * depth + inner + ")" * depth


# --- GBNF: nesting --------------------------------------------------------------------------------
def test_5000_nested_groups_are_refused_by_the_named_bound_quickly():
    limit = sys.getrecursionlimit()
    t0 = time.perf_counter()
    with pytest.raises(GrammarTooLarge, match=f"nests too deeply .*more than {MAX_GRAMMAR_NESTING} groups.*"
                                              f"\\(MAX_GRAMMAR_NESTING\\)") as e:
        parse_gbnf(nested(5000))
    assert time.perf_counter() - t0 < 0.5
    assert "rule 'root' at line 1" in str(e.value) and "recursion" not in str(e.value).lower()
    assert sys.getrecursionlimit() == limit


def test_groups_nested_to_the_bound_parse_and_match_with_a_low_recursion_limit(vocab, low_recursion_limit):
    g = parse_gbnf(nested(MAX_GRAMMAR_NESTING))
    assert len(g.rule_names) == MAX_GRAMMAR_NESTING + 1
    with pytest.raises(GrammarTooLarge, match="MAX_GRAMMAR_NESTING"):
        parse_gbnf(nested(MAX_GRAMMAR_NESTING + 1))
    # groups that are not tail calls: the automaton's stacks are MAX_GRAMMAR_NESTING frames deep
    text = "root ::= " + '("x" ' * MAX_GRAMMAR_NESTING + '"a"' + ' "y")' * MAX_GRAMMAR_NESTING
    cg = compile_grammar(text, vocab)
    word = b"x" * MAX_GRAMMAR_NESTING + b"a" + b"y" * MAX_GRAMMAR_NESTING
    assert cg.accepts_bytes(word)
    assert not cg.accepts_bytes(word[:-1]) and not cg.accepts_bytes(word + b"y")
    m = cg.matcher()
    assert m.allowed_mask().any()


def test_alternatives_inside_deep_groups_keep_their_meaning(low_recursion_limit):
    depth = 800
    text = "root ::= " + '("a" | ' * depth + '"z"' + ")" * depth
    from tests.test_grammar_helpers import recognizes
    g = parse_gbnf(text)
    sys.setrecursionlimit(1000)  # recognizes() is the tests' own recursive oracle; it raises the limit itself
    assert recognizes(g, "a") and recognizes(g, "z") and not recognizes(g, "az")


# --- GBNF: long rule chains -----------------------------------------------------------------------
@pytest.mark.parametrize("tail, yes, no", [
    ('"a"', [b"a"], [b"", b"aa"]),
    ('"a"+', [b"a", b"a" * 400], [b""]),
    ('"a"*', [b"", b"a" * 400], [b"b"]),
    ('"a"{200}', [b"a" * 200], [b"a" * 199, b"a" * 201]),
    ('"a"{1,200}', [b"a", b"a" * 200], [b"", b"a" * 201]),
])
def test_a_20000_rule_chain_parses_and_matches(vocab, low_recursion_limit, tail, yes, no):
    t0 = time.perf_counter()
    cg = compile_grammar(chain(tail), vocab)
    for w in yes:
        assert cg.accepts_bytes(w), w
    for w in no:
        assert not cg.accepts_bytes(w), w
    assert time.perf_counter() - t0 < 30  # linear: about a second on a loaded 2-core machine


def test_a_chain_of_non_tail_calls_stacks_20000_frames(vocab, low_recursion_limit):
    cg = compile_grammar(chain('"a"', step=' "b"'), vocab)
    assert cg.accepts_bytes(b"a" + b"b" * CHAIN)
    assert not cg.accepts_bytes(b"a" + b"b" * (CHAIN - 1))
    bid = cg.step_bytes(cg.initial_state, b"a" + b"b" * 100)
    assert not cg.is_complete(bid) and cg.can_continue(bid)


def test_a_chain_of_nullable_rules_is_checked_in_linear_time(vocab, low_recursion_limit):
    # every rule may be empty only because the last one may: the fixpoint by passes this replaces took
    # one pass per rule (22 s for 5000 rules; the worklist: about 1 s for 20000 on a loaded machine)
    t0 = time.perf_counter()
    parse_gbnf(chain('"a"?', step=' "b"?'))
    assert time.perf_counter() - t0 < 15
    # matching such a grammar is quadratic (every depth may end here: CHAIN stacks per state), so a short one
    cg = compile_grammar(chain('"a"?', n=300, step=' "b"?'), vocab)
    assert cg.accepts_bytes(b"") and cg.accepts_bytes(b"abbb") and not cg.accepts_bytes(b"a" + b"b" * 302)
    # and a left-recursive cycle through the whole chain is found
    text = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1} | \"x\"\n" for i in range(CHAIN)) + f"r{CHAIN} ::= r0 \"a\"\n"
    with pytest.raises(GrammarError, match="left recursion in rule 'r"):
        parse_gbnf(text)


# --- JSON schema ----------------------------------------------------------------------------------
def deep_arrays(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_10000_nested_arrays_are_refused_by_the_named_bound(low_recursion_limit):
    t0 = time.perf_counter()
    for fn in (check_json_schema, json_schema_to_gbnf):
        with pytest.raises(SchemaTooDeep, match=f"nests too deeply: more than {MAX_SCHEMA_DEPTH} levels.*"
                                                f"\\(MAX_SCHEMA_DEPTH\\)") as e:
            fn(deep_arrays(10000))
        assert "#/items/items" in str(e.value) and len(str(e.value)) < 400
    assert time.perf_counter() - t0 < 1


def test_a_schema_at_the_bound_compiles(vocab):
    text = json_schema_to_gbnf(deep_arrays(MAX_SCHEMA_DEPTH - 1))
    cg = compile_grammar(text, vocab)
    assert cg.accepts_bytes(b"[" * (MAX_SCHEMA_DEPTH - 1) + b"1" + b"]" * (MAX_SCHEMA_DEPTH - 1))
    with pytest.raises(SchemaTooDeep):
        json_schema_to_gbnf(deep_arrays(MAX_SCHEMA_DEPTH))
    anyof: dict = {"type": "null"}
    for _ in range(MAX_SCHEMA_DEPTH - 1):
        anyof = {"anyOf": [anyof, {"type": "boolean"}]}
    assert "root ::=" in json_schema_to_gbnf(anyof)


def test_a_deep_ref_chain_is_refused_and_a_ref_cycle_still_compiles(vocab, low_recursion_limit):
    n = 10000
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    with pytest.raises(SchemaTooDeep, match="MAX_SCHEMA_DEPTH"):
        check_json_schema({"$ref": "#/$defs/d0", "$defs": defs})
    sys.setrecursionlimit(1000)  # the converter recurses (bounded), the default limit is enough
    cyclic = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}}, "required": ["next"]}}}
    cg = compile_grammar(json_schema_to_gbnf(cyclic), vocab)
    assert cg.accepts_bytes(b'{"next": {"next": {"next": null}}}')


def test_the_iterative_check_keeps_llamas_order_of_failures():
    # the properties' subtrees are checked before additionalProperties' type, items before minItems
    with pytest.raises(JsonSchemaError, match="^JSON schema error at #/properties/a: unrecognized type bogus$"):
        check_json_schema({"properties": {"a": {"type": "bogus"}}, "additionalProperties": 5})
    with pytest.raises(JsonSchemaError, match="^JSON schema error at #: additionalProperties must be"):
        check_json_schema({"properties": {"a": {"type": "string"}}, "additionalProperties": 5})
    with pytest.raises(JsonSchemaError, match="^JSON schema error at #/items: unrecognized type bogus$"):
        check_json_schema({"type": "array", "items": {"type": "bogus"}, "minItems": -1})
    with pytest.raises(JsonSchemaError, match="^JSON schema error at #: minItems must be a non-negative integer$"):
        check_json_schema({"type": "array", "items": {"type": "string"}, "minItems": -1})
    with pytest.raises(JsonSchemaError, match="^JSON schema error at #/anyOf/1/type/0: unrecognized type x$"):
        check_json_schema({"anyOf": [{"type": "string"}, {"type": ["x", "y"]}]})


def test_deeply_nested_pattern_groups_are_refused_and_moderate_ones_work(vocab, low_recursion_limit):
    with pytest.raises(GrammarTooLarge, match=f"more than {MAX_PATTERN_NESTING} groups.*MAX_PATTERN_NESTING"):
        json_schema_to_gbnf({"type": "string", "pattern": "^" + "(" * 5000 + "a" + ")" * 5000 + "$"})
    depth = 150
    text = json_schema_to_gbnf({"type": "string", "pattern": "^" + "(" * depth + "ab" + ")" * depth + "$"})
    cg = compile_grammar(text, vocab)
    assert cg.accepts_bytes(b'"ab"') and not cg.accepts_bytes(b'"a"')
    # an unclosed group still ends with the pattern, as before
    assert compile_grammar(json_schema_to_gbnf({"type": "string", "pattern": "^(a(b$"}), vocab).accepts_bytes(b'"ab"')


def test_a_long_property_name_beside_additional_properties(vocab, low_recursion_limit):
    name = "k" * 500
    text = json_schema_to_gbnf({"type": "object", "properties": {name: {"type": "integer"}},
                                "additionalProperties": {"type": "integer"}})
    cg = compile_grammar(text, vocab)
    assert cg.accepts_bytes(b'{"' + name.encode() + b'": 1}')
    other = b"k" * 250 + b"j"  # leaves the known key's trie 250 levels down: an additional property
    assert cg.accepts_bytes(b'{"' + other + b'": 1}')
    assert not cg.accepts_bytes(b'{"' + name.encode()[:-1] + b'": 1}')  # a prefix of it: refused, as llama's trie does


def test_many_optional_properties_need_no_recursion(vocab, low_recursion_limit):
    props = {f"p{i}": {"type": "integer"} for i in range(2000)}
    t0 = time.perf_counter()
    text = json_schema_to_gbnf({"type": "object", "properties": props})
    assert time.perf_counter() - t0 < 5 and "p1998-rest ::=" in text and "p1999-rest" not in text
    cg = compile_grammar(text, vocab)
    assert cg.accepts_bytes(b'{"p5": 1, "p1999": 2}') and not cg.accepts_bytes(b'{"p1999": 2, "p5": 1}')
