"""Tool-call grammars (runtime/chat/tool_grammar.py): every format's grammar accepts its calls, the
Hermes grammars for tool_choice required and auto are llama-server b1-0c1e570's (recorded from it
into tests/data/b1_hermes_grammars.json by scripts/record_b1_tool_grammars.py), and what a chat
request with tools gets (grammar, laziness, triggers, the prefill it has seen, errors)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from runtime.chat import (
    ToolGrammar,
    ToolGrammarError,
    parse_chat_output,
    tool_call_grammar,
    tool_call_triggers,
    tool_grammar,
    tool_grammar_for,
)

DATA = Path(__file__).resolve().parent / "data"


# -- grammars ----------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "enum": ["pom.xml", "src/Main.java"]}},
        "required": ["path"]}}},
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}},
]


def _accepts(gbnf: str, text: str) -> bool:
    grammar = pytest.importorskip("grammar")
    try:
        vocab = grammar.Vocab([bytes([b]) for b in range(256)] + [b""], [256])
        m = grammar.compile_grammar(gbnf, vocab).matcher()
    except (NotImplementedError, ImportError) as e:  # pragma: no cover - grammar/ not ready
        pytest.skip(f"grammar package not ready: {e}")
    try:
        for b in text.encode():
            m.advance(b)
    except grammar.GrammarError:
        return False
    return m.is_complete()


GOOD = {
    "Hermes 2 Pro": ('<tool_call>\n{"name": "read_file", "arguments": {"path": "pom.xml"}}\n</tool_call>',
                     '<tool_call>\n{"name": "read_file", "arguments": {"path": "README"}}</tool_call>'),
    "Llama 3.x": ('{"name": "ls", "parameters": {}}', '{"name": "rm", "parameters": {}}'),
    "Mistral Nemo": ('[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "src/Main.java"}, "id": "abcDEF123"}]',
                     '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "src/Main.java"}, "id": "abc"}]'),
    "DeepSeek R1": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n"
                    '{"path": "pom.xml"}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>cat\n```json\n"
                    '{"path": "pom.xml"}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "Generic": ('{"tool_call": {"name": "read_file", "arguments": {"path": "pom.xml"}}}',
                '{"tool_call": {"name": "read_file", "arguments": {}}}'),
}


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_tool_call_grammar_accepts_calls_and_rejects_bad_ones(fmt):
    gbnf = tool_call_grammar(TOOLS, fmt, parallel=False)
    good, bad = GOOD[fmt]
    assert _accepts(gbnf, good)
    assert not _accepts(gbnf, bad)
    m = parse_chat_output(good, format=fmt)
    assert m.tool_calls and m.tool_calls[0]["function"]["name"] in {"read_file", "ls"}
    if tool_call_triggers(fmt):
        assert any(good.startswith(t) for t in tool_call_triggers(fmt))


def test_tool_call_grammar_parallel_and_think():
    one = '<tool_call>\n{"name": "ls", "arguments": {}}</tool_call>'
    two = '<tool_call>\n{"name": "ls", "arguments": {}}, {"name": "ls", "arguments": {}}\n</tool_call>'
    # b1-0c1e570: blocks follow each other either way; several calls in one block only when parallel
    for parallel in (False, True):
        assert _accepts(tool_call_grammar(TOOLS, "Hermes 2 Pro", parallel=parallel), one + "\n\n\n" + one + "\n")
        assert _accepts(tool_call_grammar(TOOLS, "Hermes 2 Pro", parallel=parallel), two) is parallel
    g = tool_call_grammar(TOOLS, "Hermes 2 Pro", thinking_forced_open=True)
    assert _accepts(g, "</think>\n" + one) and _accepts(g, one)
    assert _accepts(tool_call_grammar(TOOLS, "Generic", allow_response=True), '{"response": "no tool"}')
    with pytest.raises(ValueError):
        tool_call_grammar([], "Hermes 2 Pro")


def test_required_hermes_tool_grammar_allows_free_text_before_the_call():
    """tool_choice required on a Hermes/Qwen template: as llama-server b1-0c1e570 (and the lesson's
    Example 13 says), any text without the `<tool_call>\n` marker may come before the first call;
    a prefilled `<tool_call>\n` is text the grammar has already seen (`ToolGrammar.prefix`)."""
    tools = [TOOLS[0]]
    call = '<tool_call>\n{"name": "read_file", "arguments": {"path": "pom.xml"}}\n</tool_call>'
    g = _required_hermes(tools, opened=False)
    assert _accepts(g, call)
    assert _accepts(g, "Let me look at it. " + call)
    assert not _accepts(g, "Let me look at it.")  # the call itself stays required
    assert _accepts(g, "a <b> tag, a <tool_call> without its newline: " + call)
    assert not _accepts(g, "<tool_call>\nnot json " + call)  # the marker starts a call
    tg = tool_grammar_for(tools, "Hermes 2 Pro", "required", parallel=False, prefill="<tool_call>\n")
    assert tg.prefix == "<tool_call>\n" and tg.grammar == g
    assert tool_grammar_for(tools, "Hermes 2 Pro", "required", parallel=False, prefill="Sure").prefix == "Sure"


def _required_hermes(tools, opened):
    return tool_grammar_for(tools, "Hermes 2 Pro", "required", parallel=False,
                            prefill="<tool_call>\n" if opened else "").grammar


# -- the Hermes grammars are b1-0c1e570's; the other formats' texts as before the chat room ------------

B1 = json.loads((DATA / "b1_hermes_grammars.json").read_text(encoding="utf-8"))
HERMES = json.loads((DATA / "chat_hermes_grammars.json").read_text(encoding="utf-8"))  # the pinned tool sets


def _rules(text: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in text.strip().splitlines())


def _reachable(rules: dict[str, str]) -> dict[str, str]:
    """The rules the root reaches (b1 lists JSON rules its tool grammars do not use)."""
    seen, todo = set(), ["root"]
    while todo:
        k = todo.pop()
        if k in seen or k not in rules:
            continue
        seen.add(k)
        body = re.sub(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|\{\d+(?:,\d*)?\}', " ", rules[k])
        todo += re.findall(r"[A-Za-z][A-Za-z0-9-]*", body)
    return {k: rules[k] for k in sorted(seen)}


@pytest.mark.parametrize("case", B1["cases"], ids=lambda c: c["name"])
def test_hermes_grammars_are_b1s(case):
    """Rule for rule what b1-0c1e570 sends for the same tools, except what it writes of its own
    context (the generation prompt it primes the required root with, its numbering of the `until`
    rule) and the lazy grammar's `tool-calls`, which b1 writes as `(tool-call? space)+` (an item
    that may be empty, which this engine refuses) and here `(tool-call | space-some)*` (the same
    strings: calls and whitespace in any order)."""
    parallel = case["parallel_tool_calls"] is not False  # the Qwen2.5 template's default: parallel
    tg = tool_grammar_for(case["tools"], "Hermes 2 Pro", case["tool_choice"], parallel)
    theirs = re.sub(r"until-\d+", "until-tool-call", case["grammar"])
    theirs = theirs.replace('root ::= "<|im_start|>assistant\\n" space', "root ::= space")
    want, got = _reachable(_rules(theirs)), _reachable(_rules(tg.grammar))
    if case["tool_choice"] == "auto":
        assert want.pop("tool-calls") == "(tool-call? space)+"
        assert got.pop("tool-calls") == "(tool-call | space-some)*" and got.pop("space-some") == want["space"][2:]
        assert (tg.lazy, list(tg.triggers)) == (True, [t["value"] for t in case["grammar_triggers"]])
    else:
        assert tg.lazy is None and case["grammar_lazy"] is False
    assert got == want


def test_every_format_grammar_text_is_unchanged():
    """The other formats' grammars keep the texts they had before runtime/chat/ (Hermes: above)."""
    pinned = json.loads((DATA / "chat_tool_grammar_sha256.json").read_text(encoding="utf-8"))["sha256"]
    assert len(pinned) == 216
    for key, digest in pinned.items():
        tools, fmt, parallel, think, response = key.split("|")
        if fmt == "Hermes 2 Pro":
            continue
        g = tool_call_grammar(HERMES["tools"][tools], fmt, parallel == "True", thinking_forced_open=think == "True",
                              allow_response=response == "True")
        assert hashlib.sha256(g.encode()).hexdigest()[:16] == digest, key


# -- what a chat request with tools gets ----------------------------------------------------------------

def test_tool_grammar_for_picks_grammar_laziness_and_triggers():
    assert tool_grammar_for([], "Hermes 2 Pro", "required", False) is None
    assert tool_grammar_for(TOOLS, "Hermes 2 Pro", "none", False) is None
    assert tool_grammar_for(TOOLS, "Generic", "auto", False) is None  # no trigger word: no lazy grammar
    tg = tool_grammar_for(TOOLS, "Generic", "required", True)
    assert tg == ToolGrammar(tool_call_grammar(TOOLS, "Generic", True), False, ())
    tg = tool_grammar_for(TOOLS, "Llama 3.x", "auto", False, thinking_forced_open=True)
    assert tg == ToolGrammar(tool_call_grammar(TOOLS, "Llama 3.x", thinking_forced_open=True), True, ('{"',))
    assert tool_call_triggers("Llama 3.x") == ['{"'] and tool_call_triggers("Generic") == []
    # a prefilled <tool_call> gets the required Hermes grammar whatever the format, continuing inside the call
    tg = tool_grammar_for(TOOLS, "Llama 3.x", "required", False, prefill="<tool_call>\n")
    assert tg.lazy is None and tg.grammar.startswith("root ::= space until-tool-call? tool-calls")
    assert tg.prefix == "<tool_call>\n"  # the grammar continues after the prefill, as b1 primes it
    # ... but not for tool_choice auto
    assert tool_grammar_for(TOOLS, "Llama 3.x", "auto", False, prefill="<tool_call>\n").lazy is True


@pytest.mark.parametrize("fmt,choice,prefill,tools,message", [
    ("Hermes 2 Pro", "required", "", [{"function": {"parameters": {}}}], "Missing tool function name"),
    ("Generic", "required", "<tool_call>", ["x"], "Missing tool function name"),
    ("Hermes 2 Pro", "auto", "", [{"function": {}}], "Invalid tools: each tool needs function.name"),
    ("Llama 3.x", "required", "", ["x"], "Invalid tools: each tool needs function.name"),
    # (the HTTP route refuses such parameters before, with b1's message: tests/test_chat_checks.py)
    ("Hermes 2 Pro", "required", "", [{"name": "x", "parameters": {"$ref": "#/nope"}}],
     "JSON schema conversion failed: JSON schema error at #: cannot resolve $ref #/nope, nope not found"),
    ("Mistral Nemo", "auto", "", [{"name": "x", "parameters": {"$ref": "#/nope"}}],
     "Invalid tools: JSON schema error at #/items/anyOf/0/properties/arguments: cannot resolve $ref #/nope, nope not found"),
])
def test_tool_grammar_errors_keep_their_messages(fmt, choice, prefill, tools, message):
    with pytest.raises(ToolGrammarError) as e:
        tool_grammar_for(tools, fmt, choice, False, prefill=prefill)
    assert str(e.value) == message


def test_apply_grammar_maps_the_request():
    """api/chat.py only maps a request to tool_grammar_for; the required Hermes grammar leaves the
    request's grammar_lazy / grammar_triggers as they were, the others set them."""
    from types import SimpleNamespace

    from api.chat import ChatPrep, apply_grammar
    from api.errors import ApiError

    def params(**kw):
        return SimpleNamespace(**{"grammar": "", "grammar_lazy": True, "grammar_triggers": ["x"], **kw})

    p = params()
    apply_grammar(None, ChatPrep({}, "", "Hermes 2 Pro", "auto", tools=TOOLS, tool_choice="required"), p)
    assert p.grammar == _required_hermes(TOOLS, opened=False) and (p.grammar_lazy, p.grammar_triggers) == (True, ["x"])
    p = params(grammar_lazy=False, grammar_triggers=[])
    apply_grammar(None, ChatPrep({}, "", "Hermes 2 Pro", "auto", tools=TOOLS, tool_choice="auto"), p)
    assert (p.grammar_lazy, p.grammar_triggers) == (True, ["<tool_call>\n"])
    prep = ChatPrep({}, "", "Hermes 2 Pro", "auto", prefill="<tool_call>\n", tools=TOOLS, tool_choice="required")
    apply_grammar(None, prep, params())
    assert prep.grammar_prefix == "<tool_call>\n"  # the task's grammar_prefix: the grammar has seen the prefill
    p = params(grammar='root ::= "x"')  # the request's own grammar wins
    apply_grammar(None, ChatPrep({}, "", "Hermes 2 Pro", "auto", tools=TOOLS, tool_choice="required"), p)
    assert p.grammar == 'root ::= "x"'
    with pytest.raises(ApiError, match="^Missing tool function name$"):
        apply_grammar(None, ChatPrep({}, "", "Hermes 2 Pro", "auto", tools=["x"], tool_choice="required"), params())
