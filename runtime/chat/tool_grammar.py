"""Grammars that force (tool_choice required) or, lazily triggered, permit (tool_choice auto) the
format's tool-call syntax, each call naming a declared tool with arguments valid for its
`parameters` JSON schema (via `grammar.json_schema_to_gbnf`).

`tool_grammar_for(...)` is what a chat request needs: which grammar, whether it waits for a trigger
word, which words, and what of the prompt the grammar has already seen. `tool_call_grammar(tools,
format, ...)` is the per-format builder; the Hermes / Qwen2.5 syntax gets `hermes_grammar(...)`,
b1-0c1e570's generated grammar for it (common/chat-auto-parser-generator.cpp, the tools' PEG parser
as GBNF, read from its `generation_settings.grammar`):

* every call `<tool_call>\n`, whitespace, the call object `{"name": "<tool>", "arguments": {...}}`
  (with `parallel`, several objects separated by commas), whitespace, `</tool_call>`; one or more
  such blocks with whitespace between and after them;
* required (`required=True`): any text that does not contain `<tool_call>\n` may come first
  (`until-tool-call`); b1 primes the grammar with the generation prompt and a prefilled assistant
  turn, so the request's grammar continues after its prefill (`ToolGrammar.prefix`);
* auto: lazy, from the trigger `<tool_call>\n`;
* a tool without `parameters` takes `{}`.
The text differs from b1's only where b1 writes its own context into it (the generation prompt at
the start of the required root, its numbering of the `until` rule, JSON rules it lists but does not
use) and in the lazy grammar's `tool-calls`, spelled so that no repeated item may be empty
(tests/test_chat_tool_grammar.py compares with grammars recorded from b1).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from runtime.chat.formats import ChatFormat, Marker, ToolChoice

_GBNF_SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
# b1-0c1e570's Hermes call marker: the opening tag and its newline (grammar literal, lazy trigger, `until`)
_HERMES_OPEN = Marker.HERMES_CALL_OPEN + "\n"

# words that start a tool call (grammar_triggers of a lazy grammar); formats not listed have none
_TRIGGERS: Mapping[ChatFormat, tuple[str, ...]] = MappingProxyType({
    ChatFormat.HERMES_2_PRO: (_HERMES_OPEN,),
    ChatFormat.MISTRAL_NEMO: (Marker.MISTRAL_CALLS,),
    ChatFormat.DEEPSEEK_R1: (Marker.DS_CALLS_BEGIN,),
    ChatFormat.LLAMA_3X: ('{"',),
    ChatFormat.LLAMA_3X_BUILTIN: ('{"',),
})


class ToolGrammarError(ValueError):
    """No grammar can be built for these tools; the message is the client's (400) error text."""


@dataclass(frozen=True)
class ToolGrammar:
    """The grammar of a chat request with tools. `lazy`: wait for one of `triggers`; None leaves the
    request's own grammar_lazy / grammar_triggers as they are (the required Hermes grammar).
    `prefix`: generated text the grammar has already seen (a prefilled assistant turn)."""
    grammar: str
    lazy: bool | None
    triggers: tuple[str, ...] = ()
    prefix: str = ""


def tool_call_triggers(format: str) -> list[str]:
    """Words that start a tool call in `format` (grammar_triggers for a lazy grammar)."""
    return [str(w) for w in _TRIGGERS.get(format, ())]


def tool_grammar_for(tools: list[dict], format: str, tool_choice: str, parallel: bool, prefill: str = "",
                     thinking_forced_open: bool = False) -> ToolGrammar | None:
    """The grammar a chat request with `tools` gets, None for none.

    tool_choice required forces a call: on a Hermes template, or after a prefilled `<tool_call>`,
    with b1-0c1e570's required Hermes grammar (text may come first) primed with the prefill, else
    with the format's grammar from the start. auto adds the format's grammar lazily, active once the
    model writes a trigger word, so free text stays possible before it (formats without triggers get
    none). Raises ToolGrammarError with the message llama-server answers bad tools with.
    """
    if not tools or tool_choice not in (ToolChoice.REQUIRED, ToolChoice.AUTO):
        return None
    if format == ChatFormat.GPT_OSS:  # b1 builds gpt-oss's from its PEG parser: not here (unconstrained)
        return None
    opened = prefill.rstrip().endswith(Marker.HERMES_CALL_OPEN)
    if tool_choice == ToolChoice.REQUIRED and (format == ChatFormat.HERMES_2_PRO or opened):
        try:
            fns = _functions(tools)
        except ValueError:
            raise ToolGrammarError("Missing tool function name") from None
        try:
            grammar = hermes_grammar(fns, parallel, required=True)
        except Exception as e:  # GrammarError, or a malformed schema: as for a request's json_schema
            raise ToolGrammarError(f"JSON schema conversion failed: {e}") from e
        return ToolGrammar(grammar, None, prefix=prefill)
    lazy = tool_choice == ToolChoice.AUTO
    triggers = tuple(tool_call_triggers(format))
    if lazy and not triggers:
        return None
    try:
        grammar = tool_call_grammar(tools, format, parallel, thinking_forced_open=thinking_forced_open)
    except (KeyError, TypeError, ValueError) as e:
        raise ToolGrammarError(f"Invalid tools: {e}") from e
    return ToolGrammar(grammar, lazy, triggers if lazy else ())


# ---------------------------------------------------------------------------------------------
# GBNF pieces

def _gbnf_literal(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{out}"'


def _prefix_rules(gbnf: str, prefix: str) -> str:
    """Rename every rule of `gbnf` (definitions and references) to `prefix + name`, leaving
    string literals, character classes, repetition counts and comments alone."""
    out: list[str] = []
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and gbnf[j] != close:
                j += 2 if gbnf[j] == "\\" else 1
            out.append(gbnf[i:j + 1])
            i = j + 1
        elif c == "{":
            j = gbnf.index("}", i)
            out.append(gbnf[i:j + 1])
            i = j + 1
        elif c == "#":
            j = gbnf.find("\n", i)
            j = n if j < 0 else j
            out.append(gbnf[i:j])
            i = j
        elif c.isalnum() or c in "-_":
            j = i
            while j < n and (gbnf[j].isalnum() or gbnf[j] in "-_"):
                j += 1
            out.append(prefix + gbnf[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _schema_gbnf(schema: dict) -> str:
    from grammar import json_schema_to_gbnf  # lazy: grammar/ is optional for plain chat

    return json_schema_to_gbnf(schema)


def _schema_rules(schema: dict, prefix: str) -> str:
    """The GBNF of a JSON schema with every rule renamed `prefix + name` (its root `prefix + root`)."""
    return _prefix_rules(_schema_gbnf(schema), prefix).strip()


def _functions(tools: list[dict]) -> list[dict]:
    """`{"name", "parameters"}` of each tool. A tool that declares no parameters takes only `{}`."""
    fns = []
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError("each tool needs function.name")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        fns.append({"name": fn["name"], "parameters": params})
    if not fns:
        raise ValueError("tool_call_grammar needs at least one tool")
    return fns


def _call_schema(fn: dict, args_key: str, with_id: dict | None = None) -> dict:
    """JSON schema of one `{"name": ..., args_key: {...}}` call of `fn`."""
    props: dict[str, Any] = {"name": {"const": fn["name"]}, args_key: fn["parameters"]}
    req = ["name", args_key]
    if with_id is not None:
        props["id"] = with_id
        req.append("id")
    return {"type": "object", "properties": props, "required": req}


# ---------------------------------------------------------------------------------------------
# builders

def hermes_grammar(fns: list[dict], parallel: bool, required: bool, thinking_forced_open: bool = False) -> str:
    """b1-0c1e570's grammar of `<tool_call>` blocks (see the module doc): for tool_choice required
    (text without the marker first) or for a lazy grammar from the trigger (`thinking_forced_open`:
    lazy only, a leading `</think>` allowed). Rules sorted by name, as b1 prints them."""
    rules: dict[str, str] = {"space": _GBNF_SPACE}
    names = []
    for fn in fns:
        name = "tool-" + re.sub(r"[^A-Za-z0-9]", "-", fn["name"])
        names.append(name)
        rules[name] = ('"{" space "\\"name\\"" space ":" space ("\\"" ' + _gbnf_literal(fn["name"]) +
                       ' "\\"") space "," space "\\"arguments\\"" space ":" space ' + name + '-schema space "}"')
        rules.update(_tool_schema_rules(fn["parameters"], name + "-schema"))
    alts = "(" + " | ".join(names) + ")"
    more = f' (space "," space {alts})*' if parallel else ""
    rules["tool-call"] = f'{_gbnf_literal(_HERMES_OPEN)} space {alts}{more} space ' \
                         f'{_gbnf_literal(Marker.HERMES_CALL_CLOSE)}'
    if required:
        rules["tool-calls"] = "(tool-call space)+"
        rules["root"] = "space until-tool-call? tool-calls"
        rules.update(_until_rules("until-tool-call", _HERMES_OPEN))
    else:
        # b1 writes (tool-call? space)+, whose repeated item may be empty, which this grammar engine
        # refuses (left recursion); the same strings: calls and non-empty whitespace in any order
        rules["tool-calls"] = "(tool-call | space-some)*"
        rules["space-some"] = _GBNF_SPACE.removeprefix("| ")
        head = _think_head(thinking_forced_open, "space")
        rules["root"] = head + "(tool-call | tool-calls)" if head else "tool-call | tool-calls"
    return "".join(f"{k} ::= {v}\n" for k, v in sorted(rules.items()))


def _tool_schema_rules(schema: dict, name: str) -> dict[str, str]:
    """The rules of a tool's arguments schema as b1 names them: its root `name`, the rules of its own
    parts `name-...`, the primitives shared (`string`, `integer`, ...); `{}` with no properties is
    `"{" space "}"`."""
    if isinstance(schema, dict) and schema.get("type") == "object" and schema.get("properties") == {} \
            and not schema.get("additionalProperties") and not schema.get("required"):
        return {name: '"{" space "}"'}
    from grammar.json_schema import SHARED_RULES  # lazy, as _schema_gbnf

    def rename(rule: str) -> str:  # name-root -> name; name-<primitive> -> the primitive's shared name
        rest = rule[len(name) + 1:] if rule.startswith(name + "-") else None
        return rule if rest is None else name if rest == "root" else rest if rest in SHARED_RULES else rule

    out = {}
    for line in _schema_rules(schema, name + "-").splitlines():
        k, sep, v = line.partition(" ::= ")
        if sep:  # a rule's references are identifiers that start with the prefix (never inside literals)
            out[rename(k)] = re.sub(r"[A-Za-z0-9_-]+", lambda m: rename(m.group(0)), v)
    return out


def _until_rules(name: str, marker: str) -> dict[str, str]:
    """Rules for any text not containing `marker` (b1's `until-N`): state k has matched marker[:k];
    each state may end, or read a character and move as the marker's prefix automaton does."""
    n = len(marker)
    fail = [0] * (n + 1)  # KMP failure function
    for i in range(1, n):
        k = fail[i]
        while k and marker[i] != marker[k]:
            k = fail[k]
        fail[i + 1] = k + 1 if marker[i] == marker[k] else 0

    def state(k: int) -> str:
        return name if k == 0 else f"{name}-{k:02d}"

    def step(k: int, c: str) -> int:
        while k and marker[k] != c:
            k = fail[k]
        return k + 1 if marker[k] == c else 0

    rules = {}
    for k in range(n):
        moves = {c: step(k, c) for c in dict.fromkeys(marker)}  # other characters go back to state 0
        alts = [f"[{_class_char(c)}] {state(to)}" for c, to in sorted(moves.items(), key=lambda m: m[1]) if 0 < to < n]
        stay = "".join(_class_char(c) for c in sorted(c for c, to in moves.items() if to))
        rules[state(k)] = "| " + " | ".join(alts + [f"[^{stay}] {name}"])
    return rules


def _class_char(c: str) -> str:
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "]": "\\]", "^": "\\^", "-": "\\-"}.get(c, c)


def _think_head(thinking_forced_open: bool, space: str = "tc-space") -> str:
    """The start of a root rule: a leading `</think>` (then the grammar's `space` rule) is allowed
    when the prompt left one open."""
    return f'( {_gbnf_literal(Marker.THINK_END)} {space} )? ' if thinking_forced_open else ""


def _with_space(gbnf: str) -> str:
    """`gbnf` ending in a newline, with a `tc-space` rule when the schema rules brought none."""
    if not any(line.startswith("tc-space ::=") for line in gbnf.splitlines()):
        gbnf += f"\ntc-space ::= {_GBNF_SPACE}"
    return gbnf + "\n"


def tool_call_grammar(tools: list[dict], format: str, parallel: bool = False,
                      thinking_forced_open: bool = False, allow_response: bool = False) -> str:
    """GBNF for a tool call (or several when `parallel`) in `format`'s syntax, each call naming a
    declared tool with arguments valid for its `parameters` schema.

    `thinking_forced_open`: allow a leading `</think>` (the prompt ended in an open think block).
    `allow_response`: Generic format only, also allow `{"response": "..."}` (tool_choice auto).
    For lazy use (tool_choice auto) start the grammar at one of `tool_call_triggers(format)`.
    """
    fns = _functions(tools)
    if format == ChatFormat.HERMES_2_PRO:
        return hermes_grammar(fns, parallel, required=False, thinking_forced_open=thinking_forced_open)
    head = _think_head(thinking_forced_open)
    lines: list[str] = []
    if format in (ChatFormat.LLAMA_3X, ChatFormat.LLAMA_3X_BUILTIN):
        lines.append(_schema_rules({"anyOf": [_call_schema(f, "parameters") for f in fns]}, "tc-"))
        lines.append(f"root ::= {head}tc-root")
    elif format == ChatFormat.MISTRAL_NEMO:
        item = {"anyOf": [_call_schema(f, "arguments", {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"})
                          for f in fns]}
        arr: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
        if not parallel:
            arr["maxItems"] = 1
        lines.append(_schema_rules(arr, "tc-"))
        lines.append(f"root ::= {head}{_gbnf_literal(Marker.MISTRAL_CALLS)} tc-root")
    elif format == ChatFormat.DEEPSEEK_R1:
        alts = []
        for k, f in enumerate(fns):
            lines.append(_schema_rules(f["parameters"], f"tc{k}-"))
            alts.append(f"tc-call-{k}")
            lines.append(f"tc-call-{k} ::= {_gbnf_literal(Marker.DS_CALL_BEGIN + 'function' + Marker.DS_SEP)} "
                         f'{_gbnf_literal(f["name"])} "\\n```json\\n" tc{k}-root "\\n"? '
                         f"{_gbnf_literal('```' + Marker.DS_CALL_END)}")
        lines.append("tool-call ::= " + " | ".join(alts))
        calls = 'tool-call ( "\\n"? tool-call )*' if parallel else "tool-call"
        begin, end = _gbnf_literal(Marker.DS_CALLS_BEGIN), _gbnf_literal(Marker.DS_CALLS_END)
        lines.append(f"root ::= {head}{begin} {calls} {end} tc-space")
    else:  # Generic (also what a Content-only template gets once tools are given)
        any_call = {"anyOf": [_call_schema(f, "arguments") for f in fns]}
        if parallel:
            call: dict[str, Any] = {"type": "object", "required": ["tool_calls"], "properties": {
                "tool_calls": {"type": "array", "items": any_call, "minItems": 1}}}
        else:
            call = {"type": "object", "required": ["tool_call"], "properties": {"tool_call": any_call}}
        schema = call
        if allow_response:
            schema = {"anyOf": [call, {"type": "object", "required": ["response"],
                                       "properties": {"response": {"type": "string"}}}]}
        lines.append(_schema_rules(schema, "tc-"))
        lines.append(f"root ::= {head}tc-root")
    return _with_space("\n".join(lines))


def json_response_grammar(schema: Any) -> str:
    """The grammar of a chat request's JSON schema (response_format / json_schema) in the
    `peg-native` format, as b1-0c1e570's generated parser builds it after the generation prompt
    (common/chat-auto-parser-generator.cpp): the JSON, bare or in a ```json fence, whitespace
    around it; `parsers.parse_json_response` gives back the JSON alone. Raises GrammarError for a
    schema the converter rejects."""
    rules = _schema_rules(schema, "response-format-schema-")
    return (f'root ::= space space ("```json" space response-format space "```" | space response-format space)\n'
            f"response-format ::= response-format-schema-root\n{rules}\nspace ::= {_GBNF_SPACE}\n")
