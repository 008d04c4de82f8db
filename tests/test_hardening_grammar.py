"""Issue #13 item 1: repetition bounds compile to counters (never m copies), a compiled-size limit
answered with a 400 naming it, and memory back where it was after a huge-bound request."""
from __future__ import annotations

import resource

import pytest

from grammar import GrammarError, compile_grammar, json_schema_to_gbnf, parse_gbnf
from grammar.gbnf import MAX_GRAMMAR_ELEMENTS, MAX_NULLABLE_REPEAT
from grammar.vocab import Vocab

BYTE_VOCAB = Vocab([bytes([i]) for i in range(256)] + [b""], [256])


def size(g) -> int:
    return sum(len(alt) + 1 for alts in g.rule_alts for alt in alts)


@pytest.mark.parametrize("text", ['root ::= "a"{100000}', 'root ::= "ab"{3,100000}', 'root ::= [0-9]{0,100000}',
                                  'root ::= ("x" | "y"){100000,}'])
def test_repetition_bound_costs_constant_size(text):
    assert size(parse_gbnf(text)) < 20


def test_counter_semantics_match_the_bounds():
    g = compile_grammar('root ::= "a"{3,5} "b"{2,} ("c" "d"?){0,2}', BYTE_VOCAB)
    ok = ["aaabb", "aaaaabbbbbb", "aaabbc", "aaabbcdc", "aaabbcdcd"]
    bad = ["aabb", "aaaaaabb", "aaab", "aaabbcdcdc", "aaabbd"]
    assert all(g.accepts_bytes(s.encode()) for s in ok)
    assert not any(g.accepts_bytes(s.encode()) for s in bad)


def test_issue_schemas_compile_in_constant_memory():
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    arr = compile_grammar(json_schema_to_gbnf({"type": "array", "minItems": 1000000000,
                                               "items": {"type": "integer"}}), BYTE_VOCAB)
    assert arr.accepts_bytes(b"[" + b",".join(b"1" for _ in range(3)) + b"]") is False
    st = arr.step_bytes(arr.initial_state, b"[" + b",".join(b"7" for _ in range(500)))
    assert st != 0 and not arr.is_complete(st)
    s = compile_grammar(json_schema_to_gbnf({"type": "string", "minLength": 10000000}), BYTE_VOCAB)
    assert not s.accepts_bytes(b'"abc"')
    s2 = compile_grammar(json_schema_to_gbnf({"type": "string", "pattern": "^a{2,1000000000}$"}), BYTE_VOCAB)
    assert s2.accepts_bytes(b'"aaaa"') and not s2.accepts_bytes(b'"a"')
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown_mb < 50, grown_mb


def test_grammar_over_the_size_limit_is_refused_naming_it():
    text = 'root ::= "' + "a" * (MAX_GRAMMAR_ELEMENTS + 10) + '"'
    with pytest.raises(GrammarError, match=f"limit is {MAX_GRAMMAR_ELEMENTS}"):
        parse_gbnf(text)


def test_nullable_item_repeated_past_the_limit_is_refused():
    parse_gbnf('root ::= ("a"?){0,8} "b"')  # small bounds keep working
    with pytest.raises(GrammarError, match=str(MAX_NULLABLE_REPEAT)):
        parse_gbnf('root ::= ("a"?){0,100000} "b"')


def test_deeply_nested_grammar_is_a_grammar_error():
    with pytest.raises(GrammarError, match="nests too deeply"):
        parse_gbnf("root ::= " + "(" * 5000 + '"a"' + ")" * 5000)
