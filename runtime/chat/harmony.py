"""gpt-oss's harmony output format, parsed as llama.cpp b1-0c1e570 does (common/parsers/gpt-oss.cpp).

The text parsed is the generation prompt `<|start|>assistant` followed by what the model wrote. Its
parser is a PEG (ordered choices with backtracking); a match that runs into the end of the text stops
the parse there, keeping what was captured so far (the text may still grow while streaming, and a
final message without `<|end|>` is complete):

    root      := (start any)* start (final | unsolicited)              no tools
               | (start any)* start (tool_call | final)                tools, tool_choice auto
               | (start any)* start tool_call                          tools, tool_choice required
               | (start analysis)* start response_format              a JSON schema
    start     := "<|start|>assistant"        end := "<|end|>"        text := up to "<|end|>"
    any       := preamble | analysis
    stray     := ("<|channel|>commentary" (" to=assistant")?)?
    analysis  := stray "<|channel|>analysis<|message|>" REASONING(text) end
                 (reasoning_format none: CONTENT(the whole of it, tags included))
    preamble  := "<|channel|>commentary<|message|>" CONTENT(text) end
    final     := stray "<|channel|>final" constraint "<|message|>" CONTENT(text)
                 (b1 allows the constraint only in response_format; here always, so that a schema's
                 JSON answer is content whichever route the request took)
    unsolicited := channel? " to=" text end             (a builtin tool's call: nothing captured)
    tool_call := " to=functions." NAME channel constraint "<|message|>" ARGS
               | channel " to=functions." NAME constraint "<|message|>" ARGS
    channel   := "<|channel|>" ("commentary" | "analysis")
    constraint := (space "<|constrain|>"? [A-Za-z0-9_-]+)?
    response_format := "<|channel|>final" constraint "<|message|>" CONTENT(json)

NAME: a function name (b1 accepts only the request's tools' names: here any name of [A-Za-z0-9_.-]);
ARGS: a JSON value, the text as written (cut off while streaming: a partial call).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from runtime.chat.calls import ParsedCall
from runtime.chat.json_scan import Incomplete, Invalid, scan_value

START = "<|start|>assistant"
END = "<|end|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")
_CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_\-]+")

OK, FAIL, MORE = 0, 1, 2  # matched; did not match; ran into the end of the text


class HarmonyMismatch(ValueError):
    """A finished output that the grammar does not match (b1 answers the request with this 500)."""

    def __init__(self):
        super().__init__("The model produced output that does not match the expected peg-native format")


@dataclass
class _State:
    s: str
    partial: bool
    caps: list = field(default_factory=list)  # (kind, text) in order: "content", "reasoning", "call"


def _lit(x: str):
    def p(st: _State, i: int):
        if st.s.startswith(x, i):
            return OK, i + len(x)
        rest = st.s[i:]
        return (MORE, len(st.s)) if len(rest) < len(x) and x.startswith(rest) else (FAIL, i)
    return p


def _until_end(st: _State, i: int):
    j = st.s.find(END, i)
    if j >= 0:
        return OK, j
    n = len(st.s)
    if st.partial:  # hold back a tail that may grow into <|end|>
        for k in range(min(len(END) - 1, n - i), 0, -1):
            if st.s.endswith(END[:k]):
                return OK, n - k
    return OK, n


def _seq(*ps):
    def p(st: _State, i: int):
        for q in ps:
            r, i2 = q(st, i)
            if r != OK:
                return r, i2 if r == MORE else i
            i = i2
        return OK, i
    return p


def _choice(*ps):
    def p(st: _State, i: int):
        for q in ps:
            mark = len(st.caps)
            r, i2 = q(st, i)
            if r != FAIL:
                return r, i2
            del st.caps[mark:]
        return FAIL, i
    return p


def _opt(q):
    def p(st: _State, i: int):
        mark = len(st.caps)
        r, i2 = q(st, i)
        if r == FAIL:
            del st.caps[mark:]
            return OK, i
        return r, i2
    return p


def _star(q):
    def p(st: _State, i: int):
        while True:
            mark = len(st.caps)
            r, i2 = q(st, i)
            if r == FAIL or (r == OK and i2 == i):
                del st.caps[mark:]
                return OK, i
            if r == MORE:
                return r, i2
            i = i2
    return p


def _cap(kind: str, q):
    def p(st: _State, i: int):
        mark = len(st.caps)
        r, i2 = q(st, i)
        if r != FAIL:
            st.caps.insert(mark, (kind, st.s[i:i2]))
        return r, i2
    return p


def _re(rx: re.Pattern):
    def p(st: _State, i: int):
        m = rx.match(st.s, i)
        if m is None:
            return (MORE, i) if i >= len(st.s) else (FAIL, i)
        return (MORE, m.end()) if m.end() == len(st.s) and st.partial else (OK, m.end())
    return p


def _space(st: _State, i: int):
    while i < len(st.s) and st.s[i] in " \t\n\r":
        i += 1
    return OK, i


def _json(st: _State, i: int):
    try:
        return OK, scan_value(st.s, i)
    except Incomplete:
        return MORE, len(st.s)
    except Invalid:
        return FAIL, i


def _tool_call(st: _State, i: int):
    channel = _seq(_lit(CHANNEL), _choice(_lit("commentary"), _lit("analysis")))
    constraint = _opt(_seq(_space, _opt(_lit(CONSTRAIN)), _re(_CONSTRAINT_RE)))
    name = _seq(_lit(" to=functions."), _cap("name", _re(_NAME_RE)))
    head = _choice(_seq(name, channel, constraint, _lit(MESSAGE)), _seq(channel, name, constraint, _lit(MESSAGE)))
    return _seq(head, _cap("args", _json))(st, i)


def _grammar(reasoning: bool, tools: bool, required: bool, schema: bool):
    start, end, text = _lit(START), _lit(END), _until_end
    stray = _opt(_seq(_lit(CHANNEL + "commentary"), _opt(_lit(" to=assistant"))))
    open_analysis = _seq(stray, _lit(CHANNEL + "analysis" + MESSAGE))
    if reasoning:
        analysis = _seq(open_analysis, _cap("reasoning", text), end)
    else:
        analysis = _cap("content", _seq(open_analysis, text, end))
    preamble = _seq(_lit(CHANNEL + "commentary" + MESSAGE), _cap("content", text), end)
    constraint = _opt(_seq(_space, _opt(_lit(CONSTRAIN)), _re(_CONSTRAINT_RE)))
    final = _seq(stray, _lit(CHANNEL + "final"), constraint, _lit(MESSAGE), _cap("content", text))
    channel = _seq(_lit(CHANNEL), _choice(_lit("commentary"), _lit("analysis")))
    unsolicited = _seq(_opt(channel), _lit(" to="), text, end)
    any_ = _choice(preamble, analysis)
    if schema:
        response = _seq(_lit(CHANNEL + "final"), constraint, _lit(MESSAGE), _cap("content", _json))
        return _seq(_star(_seq(start, analysis)), start, response)
    if tools:
        tail = _tool_call if required else _choice(_tool_call, final)
        return _seq(_star(_seq(start, any_)), start, tail)
    return _seq(_star(_seq(start, any_)), start, _choice(final, unsolicited))


@dataclass
class HarmonyParse:
    content: str
    reasoning: str
    calls: list[ParsedCall]


def parse_harmony(text: str, extract_reasoning: bool, tools: bool, partial: bool, tool_required: bool = False,
                  json_schema: bool = False) -> HarmonyParse:
    """Split gpt-oss's output `text` (what followed the generation prompt; a text that already starts
    with `<|start|>` is taken as it is) into content, reasoning and tool calls. A finished text
    (`partial` False) that the grammar does not match raises `HarmonyMismatch`, as b1's
    common_chat_peg_parse throws; while streaming such a text gives what was captured (nothing)."""
    s = text if text.startswith("<|start|>") else START + text
    st = _State(s, partial)
    r, _ = _grammar(extract_reasoning, tools, tool_required, json_schema)(st, 0)
    if r == FAIL and not partial:
        raise HarmonyMismatch()
    content, reasoning, calls = [], [], []
    name = None
    for kind, val in st.caps:
        if kind == "content":
            content.append(val)
        elif kind == "reasoning":
            reasoning.append(val)
        elif kind == "name":
            name = val
        elif kind == "args":
            try:
                scan_value(val, 0)
                whole = True
            except (Incomplete, Invalid):
                whole = False
            calls.append(ParsedCall(name, val, partial=not whole))
    if name is not None and not calls and partial:  # the name is written, the arguments not yet
        calls.append(ParsedCall(name, "", partial=True))
    return HarmonyParse("".join(content), "".join(reasoning), calls)


def is_harmony_template(source: str) -> bool:
    """b1-0c1e570 takes a template with `<|channel|>` as gpt-oss's (common_chat_try_specialized_template)."""
    return "<|channel|>" in source


def template_messages(messages: list) -> list:
    """The messages as b1's gpt-oss route gives them to the template: a string `reasoning_content`
    copied to `thinking` (what the template prints), and an assistant turn's content dropped where it
    also carries tool calls."""
    out = []
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("reasoning_content"), str):
            m = dict(m, thinking=m["reasoning_content"])
            if isinstance(m.get("tool_calls"), list) and m["tool_calls"]:
                m.pop("content", None)
        out.append(m)
    return out
