"""Model output -> (content, reasoning_content, tool_calls), as llama-server's chat parser does.

The parser reads `prefix + generated`, where `prefix` is the part of the assistant message that the
prompt already holds: the `<think>\\n` a generation prompt ends with when thinking is forced open
(DeepSeek R1, QwQ; lesson Example 14) and a prefilled assistant message (Example 13's
`<tool_call>\\n`). So with reasoning_format "none" the content starts with that `<think>`, and a
prefilled tool-call opener is completed by the generated text.

reasoning_format (llama.cpp --reasoning-format):
  * "none": no extraction, the raw text stays in content.
  * "auto" / "deepseek": text between `<think>` and `</think>` (or from the start when thinking is
    forced open) goes to reasoning_content, unstripped; the content after `</think>` loses its
    leading whitespace.
  * "deepseek-legacy": reasoning_content is filled the same way and content keeps the raw text
    including the tags.
Reasoning is only extracted for formats whose templates think (Hermes 2 Pro, DeepSeek R1).

Tool calls are returned as OpenAI dicts `{"type": "function", "function": {"name", "arguments"},
"id"}`; arguments is the JSON text exactly as the model wrote it (a JSON string value holding JSON is
unwrapped), the id 32 random alphanumerics unless the model gave one (Mistral).

`StreamingChatParser` turns text deltas into OpenAI delta dicts, holding back text that may be the
start of a marker; the deltas joined equal the final parse for well-formed output. An output cut off
inside a tool call keeps the half call as content in the final parse, while the stream may already
have sent its name (llama-server has the same limitation).

`tool_call_grammar(tools, format, parallel)` builds a GBNF grammar for the format's call syntax with
arguments constrained by each tool's JSON schema (via `grammar.json_schema_to_gbnf`).
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from runtime.chat_template import (
    FORMAT_CONTENT_ONLY,
    FORMAT_DEEPSEEK_R1,
    FORMAT_GENERIC,
    FORMAT_HERMES_2_PRO,
    FORMAT_LLAMA_3X,
    FORMAT_LLAMA_3X_BUILTIN,
    FORMAT_MISTRAL_NEMO,
)

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
THINK_START = "<think>"
THINK_END = "</think>"
_REASONING_FORMATS_WITH_THINK = (FORMAT_HERMES_2_PRO, FORMAT_DEEPSEEK_R1)

_ALNUM = string.ascii_letters + string.digits


def random_tool_call_id(n: int = 32) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


@dataclass
class ParsedMessage:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def to_openai(self) -> dict:
        """The `message` object of a chat completion (content "" rather than null, as the lesson shows)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [dict(tc) for tc in self.tool_calls]
        return msg


# ---------------------------------------------------------------------------------------------
# a small JSON scanner that reports value spans and tolerates a cut-off end

class _Incomplete(Exception):
    """The text ended inside the value. `spans`: the object's complete (key -> span) so far,
    `open_key`/`open_start`: the key whose value was being read and where that value starts."""

    def __init__(self, spans: dict | None = None, open_key: str | None = None, open_start: int = -1):
        super().__init__("incomplete JSON")
        self.spans = spans or {}
        self.open_key = open_key
        self.open_start = open_start


class _Invalid(Exception):
    pass


_WS = " \t\n\r"
_NUM_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _scan_string(s: str, i: int) -> int:
    if i >= len(s):
        raise _Incomplete()
    if s[i] != '"':
        raise _Invalid(f"expected string at {i}")
    i += 1
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"':
            return i + 1
        if c == "\\":
            if i + 1 >= n:
                raise _Incomplete()
            if s[i + 1] == "u":
                if i + 6 > n:
                    raise _Incomplete()
                i += 6
            else:
                i += 2
        else:
            i += 1
    raise _Incomplete()


def _scan_object(s: str, i: int) -> tuple[int, dict[str, tuple[int, int]]]:
    """`s[i] == "{"`; returns (end, {key: (value_start, value_end)})."""
    spans: dict[str, tuple[int, int]] = {}
    i = _skip_ws(s, i + 1)
    if i >= len(s):
        raise _Incomplete(spans)
    if s[i] == "}":
        return i + 1, spans
    while True:
        i = _skip_ws(s, i)
        try:
            k_end = _scan_string(s, i)
        except _Incomplete:
            raise _Incomplete(spans) from None
        key = json.loads(s[i:k_end])
        i = _skip_ws(s, k_end)
        if i >= len(s):
            raise _Incomplete(spans)
        if s[i] != ":":
            raise _Invalid("expected ':'")
        v_start = _skip_ws(s, i + 1)
        if v_start >= len(s):
            raise _Incomplete(spans, key, v_start)
        try:
            v_end = _scan_value(s, v_start)
        except _Incomplete:
            raise _Incomplete(spans, key, v_start) from None
        spans[key] = (v_start, v_end)
        i = _skip_ws(s, v_end)
        if i >= len(s):
            raise _Incomplete(spans)
        if s[i] == ",":
            i += 1
            continue
        if s[i] == "}":
            return i + 1, spans
        raise _Invalid("expected ',' or '}'")


def _scan_array(s: str, i: int) -> tuple[int, list[tuple[int, int]]]:
    items: list[tuple[int, int]] = []
    i = _skip_ws(s, i + 1)
    if i >= len(s):
        raise _Incomplete()
    if s[i] == "]":
        return i + 1, items
    while True:
        v_start = _skip_ws(s, i)
        v_end = _scan_value(s, v_start)
        items.append((v_start, v_end))
        i = _skip_ws(s, v_end)
        if i >= len(s):
            raise _Incomplete()
        if s[i] == ",":
            i += 1
            continue
        if s[i] == "]":
            return i + 1, items
        raise _Invalid("expected ',' or ']'")


def _scan_value(s: str, i: int) -> int:
    i = _skip_ws(s, i)
    if i >= len(s):
        raise _Incomplete()
    c = s[i]
    if c == "{":
        return _scan_object(s, i)[0]
    if c == "[":
        return _scan_array(s, i)[0]
    if c == '"':
        return _scan_string(s, i)
    for lit in ("true", "false", "null"):
        if s.startswith(lit, i):
            return i + len(lit)
        if lit.startswith(s[i:]):
            raise _Incomplete()
    m = _NUM_RE.match(s, i)
    if m:
        if m.end() >= len(s):
            raise _Incomplete()  # the number may go on
        return m.end()
    if c == "-" and i + 1 >= len(s):
        raise _Incomplete()
    raise _Invalid(f"unexpected {c!r}")


# ---------------------------------------------------------------------------------------------
# one tool call read from a JSON object

@dataclass
class _Call:
    name: str | None
    arguments: str  # complete or (when partial) the text so far
    id: str | None = None
    partial: bool = False


def _args_text(s: str, span: tuple[int, int]) -> str:
    raw = s[span[0]:span[1]]
    if raw.startswith('"'):
        # arguments given as a JSON string (holding JSON): unwrap it
        return json.loads(raw)
    return raw


def _read_call_object(s: str, i: int, name_key: str = "name", args_keys: tuple[str, ...] = ("arguments",),
                      name: str | None = None) -> tuple[int, _Call]:
    """Read `{"name": ..., "arguments": {...}}` at s[i]. Raises _Incomplete carrying a partial
    `_Call` in `.call` (or None when not even the name is known), _Invalid when it is not a call."""
    if i >= len(s):
        exc = _Incomplete()
        exc.call = None  # type: ignore[attr-defined]
        raise exc
    if s[i] != "{":
        raise _Invalid("expected '{'")
    try:
        end, spans = _scan_object(s, i)
    except _Incomplete as e:
        call_name = name
        if call_name is None and name_key in e.spans:
            call_name = json.loads(s[slice(*e.spans[name_key])])
        args = None
        for k in args_keys:
            if k in e.spans:
                args = _args_text(s, e.spans[k])
            elif e.open_key == k and e.open_start >= 0 and e.open_start < len(s) and s[e.open_start] != '"':
                args = s[e.open_start:]
        exc = _Incomplete()
        exc.call = (_Call(call_name if isinstance(call_name, str) else None, args or "", None, True)  # type: ignore[attr-defined]
                    if call_name is not None and args else None)
        raise exc from None
    try:
        obj = json.loads(s[i:end])
    except json.JSONDecodeError as e:
        raise _Invalid(str(e)) from None
    if not isinstance(obj, dict):
        raise _Invalid("not an object")
    call_name = name if name is not None else obj.get(name_key)
    if not isinstance(call_name, str):
        raise _Invalid("no name")
    args = "{}"
    for k in args_keys:
        if k in spans:
            args = _args_text(s, spans[k])
            break
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return end, _Call(call_name, args, call_id)


def _partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if k > best and text.endswith(m[:k]):
                best = k
                break
    return best


# ---------------------------------------------------------------------------------------------
# per-format tool-call parsers: (text, partial) -> (content, calls)

def _find_first(text: str, markers: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    best, which = -1, ""
    for m in markers:
        j = text.find(m, start)
        if j >= 0 and (best < 0 or j < best):
            best, which = j, m
    return best, which


_HERMES_OPEN = ("<tool_call>", "<function=")


def _parse_hermes(text: str, partial: bool) -> tuple[str, list[_Call]]:
    content: list[str] = []
    calls: list[_Call] = []
    pos = 0
    while True:
        j, marker = _find_first(text, _HERMES_OPEN, pos)
        if j < 0:
            rest = text[pos:]
            if partial:
                rest = rest[:len(rest) - _partial_marker_len(rest, _HERMES_OPEN)]
            content.append(rest)
            break
        content.append(text[pos:j])
        try:
            if marker == "<tool_call>":
                k = _skip_ws(text, j + len(marker))
                end, call = _read_call_object(text, k)
                close = "</tool_call>"
            else:
                gt = text.find(">", j)
                if gt < 0:
                    raise _Incomplete()
                fname = text[j + len(marker):gt].strip().strip('"')
                k = _skip_ws(text, gt + 1)
                if k >= len(text):
                    raise _Incomplete()
                if text[k] != "{":
                    raise _Invalid("expected arguments object")
                try:
                    end = _scan_value(text, k)
                except _Incomplete:
                    exc = _Incomplete()
                    exc.call = _Call(fname, text[k:], None, True)  # type: ignore[attr-defined]
                    raise exc from None
                call = _Call(fname, text[k:end])
                close = "</function>"
            e = _skip_ws(text, end)
            if text.startswith(close, e):
                e += len(close)
            elif e >= len(text) or close.startswith(text[e:]):
                # closing tag not (fully) generated yet
                if not partial:
                    raise _Invalid("unterminated tool call")
                call.partial = True
                calls.append(call)
                return "".join(content), calls
            else:
                raise _Invalid("expected closing tag")
            calls.append(call)
            pos = _skip_ws(text, e)
        except _Incomplete as exc:
            if partial:
                c = getattr(exc, "call", None)
                if c is not None:
                    calls.append(c)
                return "".join(content), calls
            content.append(text[j:])
            break
        except _Invalid:
            # not a call after all: the marker is plain text
            content.append(marker)
            pos = j + len(marker)
    return "".join(content), calls


_LLAMA_START_RE = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"([^"]+)"\s*,\s*"parameters"\s*:\s*')
_PYTHON_TAG = "<|python_tag|>"


def _could_start_llama_call(text: str) -> bool:
    """True while `text` may still grow into the start of a Llama 3.x JSON call."""
    t = re.sub(r"\s+", "", text)  # whitespace is free between tokens (not inside the name)
    for form in ('{"name":"', '{"type":"function","name":"'):
        if form.startswith(t):
            return True
        if t.startswith(form):
            rest = t[len(form):]
            m = re.match(r'[^"]*', rest)
            if m.end() == len(rest):
                return True
            return ',"parameters":'.startswith(rest[m.end() + 1:])
    return False


def _parse_llama3(text: str, partial: bool, builtin: bool) -> tuple[str, list[_Call]]:
    if builtin:
        j = text.find(_PYTHON_TAG)
        if j >= 0:
            return _parse_python_tag(text, j, partial)
        if partial:
            hold = _partial_marker_len(text, (_PYTHON_TAG,))
            if hold:
                return text[:len(text) - hold], []
    m = _LLAMA_START_RE.match(text)
    if not m:
        if partial and _could_start_llama_call(text):
            return "", []
        return text, []
    k = text.index("{", m.start())  # object start
    try:
        end, call = _read_call_object(text, k, args_keys=("parameters", "arguments"))
    except _Incomplete as exc:
        if partial:
            c = getattr(exc, "call", None)
            return "", [c] if c is not None else []
        return text, []
    except _Invalid:
        return text, []
    rest = text[end:]
    return rest.strip() if rest.strip() else "", [call]


_CALL_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*\.\s*call\(")
_ARG_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")


def _parse_python_tag(text: str, j: int, partial: bool) -> tuple[str, list[_Call]]:
    content = text[:j]
    body = text[j + len(_PYTHON_TAG):]
    m = _CALL_RE.match(body)
    if not m:
        if partial:
            return content, []
        # raw code for the code interpreter
        return content, [_Call("python", json.dumps({"code": body}, ensure_ascii=False))]
    i = m.end()
    args: dict[str, Any] = {}
    try:
        while True:
            am = _ARG_RE.match(body, i)
            if not am:
                break
            v_end = _scan_value(body, am.end())
            args[am.group(1)] = json.loads(body[_skip_ws(body, am.end()):v_end])
            i = _skip_ws(body, v_end)
            if i < len(body) and body[i] == ",":
                i += 1
                continue
            break
        i = _skip_ws(body, i)
        if i >= len(body):
            raise _Incomplete()
        if body[i] != ")":
            raise _Invalid("expected ')'")
    except (_Incomplete, _Invalid, json.JSONDecodeError):
        if partial:
            return content, []
        return text, []
    return content, [_Call(m.group(1), json.dumps(args, ensure_ascii=False))]


_MISTRAL_PREFIX = "[TOOL_CALLS]"


def _parse_mistral(text: str, partial: bool) -> tuple[str, list[_Call]]:
    j = text.find(_MISTRAL_PREFIX)
    if j < 0:
        if partial:
            return text[:len(text) - _partial_marker_len(text, (_MISTRAL_PREFIX,))], []
        return text, []
    content = text[:j]
    i = _skip_ws(text, j + len(_MISTRAL_PREFIX))
    calls: list[_Call] = []
    try:
        if i >= len(text):
            raise _Incomplete()
        if text[i] != "[":
            raise _Invalid("expected '['")
        i += 1
        while True:
            i = _skip_ws(text, i)
            end, call = _read_call_object(text, i)
            calls.append(call)
            i = _skip_ws(text, end)
            if i >= len(text):
                raise _Incomplete()
            if text[i] == ",":
                i += 1
                continue
            if text[i] == "]":
                i += 1
                break
            raise _Invalid("expected ',' or ']'")
    except _Incomplete:
        # a half call is not reported: its id (which the template needs back) comes last
        if partial:
            return content, calls
        return text, []
    except _Invalid:
        return text, []
    return content + text[i:].strip(), calls


_DS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_END = "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS_CALL_END = "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"


def _parse_deepseek_r1(text: str, partial: bool) -> tuple[str, list[_Call]]:
    j = text.find(_DS_BEGIN)
    if j < 0:
        if partial:
            return text[:len(text) - _partial_marker_len(text, (_DS_BEGIN,))], []
        return text, []
    content = text[:j]
    i = j + len(_DS_BEGIN)
    calls: list[_Call] = []
    try:
        while True:
            i = _skip_ws(text, i)
            if text.startswith(_DS_END, i):
                i += len(_DS_END)
                break
            if i >= len(text) or _DS_END.startswith(text[i:]) or _DS_CALL_BEGIN.startswith(text[i:]):
                raise _Incomplete()
            if text.startswith(_DS_CALL_BEGIN, i):
                i += len(_DS_CALL_BEGIN)
            sep = text.find(_DS_SEP, i)
            if sep < 0:
                raise _Incomplete()
            nl = text.find("\n", sep)
            if nl < 0:
                raise _Incomplete()
            fname = text[sep + len(_DS_SEP):nl].strip()
            k = nl + 1
            fence = "```json\n"
            if text.startswith(fence, k):
                k += len(fence)
            elif fence.startswith(text[k:]):
                raise _Incomplete()
            k = _skip_ws(text, k)
            try:
                end = _scan_value(text, k)
            except _Incomplete:
                exc = _Incomplete()
                exc.call = _Call(fname, text[k:], None, True) if k < len(text) else None  # type: ignore[attr-defined]
                raise exc from None
            call = _Call(fname, text[k:end])
            e = _skip_ws(text, end)
            if text.startswith("```", e):
                e = _skip_ws(text, e + 3)
            if text.startswith(_DS_CALL_END, e):
                e += len(_DS_CALL_END)
            elif e >= len(text) or _DS_CALL_END.startswith(text[e:]) or "```".startswith(text[e:]):
                exc = _Incomplete()
                call.partial = True
                exc.call = call  # type: ignore[attr-defined]
                raise exc
            else:
                raise _Invalid("expected tool call end")
            calls.append(call)
            i = e
    except _Incomplete as exc:
        if partial:
            c = getattr(exc, "call", None)
            return content, calls + ([c] if c is not None else [])
        return text, []
    except _Invalid:
        return text, []
    return content + text[i:].lstrip(), calls


def _parse_generic(text: str, partial: bool) -> tuple[str, list[_Call]]:
    s = text.strip()
    if not s.startswith("{"):
        if partial and not s:
            return "", []
        return text, []
    try:
        obj = json.loads(s)
    except json.JSONDecodeError:
        return ("", []) if partial else (text, [])
    if not isinstance(obj, dict):
        return text, []
    calls: list[_Call] = []
    raw = []
    if isinstance(obj.get("tool_calls"), list):
        raw = obj["tool_calls"]
    elif isinstance(obj.get("tool_call"), dict):
        raw = [obj["tool_call"]]
    elif "response" in obj:
        r = obj["response"]
        return (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)), []
    else:
        return text, []
    for c in raw:
        if isinstance(c, dict) and isinstance(c.get("name"), str):
            a = c.get("arguments", {})
            calls.append(_Call(c["name"], a if isinstance(a, str) else json.dumps(a, ensure_ascii=False),
                               c.get("id") if isinstance(c.get("id"), str) else None))
    return "", calls


def _parse_tool_calls(text: str, fmt: str, partial: bool) -> tuple[str, list[_Call]]:
    if fmt == FORMAT_HERMES_2_PRO:
        return _parse_hermes(text, partial)
    if fmt in (FORMAT_LLAMA_3X, FORMAT_LLAMA_3X_BUILTIN):
        return _parse_llama3(text, partial, builtin=(fmt == FORMAT_LLAMA_3X_BUILTIN or _PYTHON_TAG in text))
    if fmt == FORMAT_MISTRAL_NEMO:
        return _parse_mistral(text, partial)
    if fmt == FORMAT_DEEPSEEK_R1:
        return _parse_deepseek_r1(text, partial)
    if fmt == FORMAT_GENERIC:
        return _parse_generic(text, partial)
    return text, []


# ---------------------------------------------------------------------------------------------
# public parse

@dataclass
class _Parse:
    content: str
    reasoning: str
    calls: list[_Call]


def _parse(text: str, fmt: str, reasoning_format: str, thinking_forced_open: bool,
           parse_tool_calls: bool, partial: bool) -> _Parse:
    if reasoning_format not in REASONING_FORMATS:
        raise ValueError(f"unknown reasoning_format {reasoning_format!r}")
    reasoning = ""
    raw_head = ""  # deepseek-legacy keeps the reasoning section in content
    body = text
    if reasoning_format != "none" and fmt in _REASONING_FORMATS_WITH_THINK:
        start = 0
        opened = False
        if text.startswith(THINK_START):
            start, opened = len(THINK_START), True
        elif thinking_forced_open:
            opened = True
        elif partial and THINK_START.startswith(text):
            return _Parse("", "", [])  # may become "<think>"
        if opened:
            end = text.find(THINK_END, start)
            if end >= 0:
                reasoning = text[start:end]
                after = end + len(THINK_END)
                body_start = _skip_ws(text, after)
                if partial and body_start >= len(text):
                    body_start = len(text)
                raw_head = text[:body_start]
                body = text[body_start:]
            else:
                rest = text[start:]
                if partial:
                    rest = rest[:len(rest) - _partial_marker_len(rest, (THINK_END,))]
                reasoning = rest
                raw_head = text[:start] + rest
                body = ""
    if parse_tool_calls:
        content, calls = _parse_tool_calls(body, fmt, partial)
    else:
        content, calls = body, []
    if reasoning_format == "deepseek-legacy" and reasoning:
        content = raw_head + content
    return _Parse(content, reasoning, calls)


def _to_openai_calls(calls: list[_Call], ids: list[str] | None) -> list[dict]:
    out = []
    for n, c in enumerate(calls):
        if ids is not None and n < len(ids):
            call_id = ids[n]
        else:
            call_id = c.id or random_tool_call_id()
            if ids is not None:
                ids.append(call_id)
        out.append({"type": "function", "function": {"name": c.name, "arguments": c.arguments}, "id": call_id})
    return out


def parse_chat_output(text: str, format: str = FORMAT_CONTENT_ONLY, reasoning_format: str = "auto",
                      thinking_forced_open: bool = False, parse_tool_calls: bool = True,
                      prefix: str = "", tool_call_ids: list[str] | None = None) -> ParsedMessage:
    """Parse a complete generation. `prefix`: assistant text already in the prompt (see module doc).
    `tool_call_ids`: ids to use for the calls in order (extended with new random ones)."""
    p = _parse(prefix + text, format, reasoning_format, thinking_forced_open, parse_tool_calls, False)
    return ParsedMessage(p.content, p.reasoning, _to_openai_calls(p.calls, tool_call_ids))


class StreamingChatParser:
    """Feed text deltas, get OpenAI `delta` dicts. Usage::

        sp = StreamingChatParser(format, reasoning_format, thinking_forced_open, parse_tool_calls, prefix)
        for piece in pieces: send(sp.feed(piece))
        deltas, message = sp.finish()
    """

    def __init__(self, format: str = FORMAT_CONTENT_ONLY, reasoning_format: str = "auto",
                 thinking_forced_open: bool = False, parse_tool_calls: bool = True, prefix: str = ""):
        self.format = format
        self.reasoning_format = reasoning_format
        self.thinking_forced_open = thinking_forced_open
        self.parse_tool_calls = parse_tool_calls
        self.text = prefix
        self._content = ""
        self._reasoning = ""
        self._calls: list[tuple[str, str]] = []  # (name, arguments sent so far)
        self._ids: list[str] = []
        self._done = False

    def _diff(self, p: _Parse) -> list[dict]:
        out: list[dict] = []
        if p.reasoning.startswith(self._reasoning) and len(p.reasoning) > len(self._reasoning):
            out.append({"reasoning_content": p.reasoning[len(self._reasoning):]})
            self._reasoning = p.reasoning
        if p.content.startswith(self._content) and len(p.content) > len(self._content):
            out.append({"content": p.content[len(self._content):]})
            self._content = p.content
        for n, c in enumerate(p.calls):
            if c.name is None:
                break
            if n >= len(self._calls):
                if c.partial and not c.arguments:
                    break
                if n >= len(self._ids):
                    self._ids.append(c.id or random_tool_call_id())
                out.append({"tool_calls": [{"index": n, "id": self._ids[n], "type": "function",
                                            "function": {"name": c.name, "arguments": c.arguments}}]})
                self._calls.append((c.name, c.arguments))
            else:
                sent = self._calls[n][1]
                if c.arguments.startswith(sent) and len(c.arguments) > len(sent):
                    out.append({"tool_calls": [{"index": n, "function": {"arguments": c.arguments[len(sent):]}}]})
                    self._calls[n] = (c.name, c.arguments)
        return out

    def feed(self, delta: str) -> list[dict]:
        if self._done:
            raise RuntimeError("feed() after finish()")
        self.text += delta
        p = _parse(self.text, self.format, self.reasoning_format, self.thinking_forced_open,
                   self.parse_tool_calls, True)
        return self._diff(p)

    def finish(self) -> tuple[list[dict], ParsedMessage]:
        """The remaining deltas and the final message (tool call ids as streamed)."""
        self._done = True
        p = _parse(self.text, self.format, self.reasoning_format, self.thinking_forced_open,
                   self.parse_tool_calls, False)
        deltas = self._diff(p)
        return deltas, ParsedMessage(p.content, p.reasoning, _to_openai_calls(p.calls, self._ids))


def merge_deltas(deltas: list[dict]) -> ParsedMessage:
    """Join OpenAI deltas the way a client does (for tests and for logging)."""
    msg = ParsedMessage()
    calls: dict[int, dict] = {}
    for d in deltas:
        msg.content += d.get("content") or ""
        msg.reasoning_content += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls") or []:
            cur = calls.setdefault(tc["index"], {"type": "function", "function": {"name": "", "arguments": ""}, "id": ""})
            if "id" in tc:
                cur["id"] = tc["id"]
            fn = tc.get("function") or {}
            cur["function"]["name"] += fn.get("name") or ""
            cur["function"]["arguments"] += fn.get("arguments") or ""
    msg.tool_calls = [calls[k] for k in sorted(calls)]
    return msg


# ---------------------------------------------------------------------------------------------
# grammars that force (or, lazily triggered, permit) the format's tool-call syntax

_GBNF_SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'


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


def _functions(tools: list[dict]) -> list[dict]:
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


def tool_call_grammar(tools: list[dict], format: str, parallel: bool = False,
                      thinking_forced_open: bool = False, allow_response: bool = False) -> str:
    """GBNF for a tool call (or several when `parallel`) in `format`'s syntax, each call naming a
    declared tool with arguments valid for its `parameters` schema.

    `thinking_forced_open`: allow a leading `</think>` (the prompt ended in an open think block).
    `allow_response`: Generic format only, also allow `{"response": "..."}` (tool_choice auto).
    For lazy use (tool_choice auto) start the grammar at one of `tool_call_triggers(format)`.
    """
    from grammar import json_schema_to_gbnf  # lazy: grammar/ is optional for plain chat

    fns = _functions(tools)
    lines: list[str] = []
    head = '( "</think>" tc-space )? ' if thinking_forced_open else ""

    def sub(schema: dict, prefix: str) -> None:
        lines.append(_prefix_rules(json_schema_to_gbnf(schema), prefix).strip())

    def call_schema(fn: dict, args_key: str, with_id: dict | None = None) -> dict:
        props = {"name": {"const": fn["name"]}, args_key: fn["parameters"]}
        req = ["name", args_key]
        if with_id is not None:
            props["id"] = with_id
            req.append("id")
        return {"type": "object", "properties": props, "required": req}

    if format == FORMAT_HERMES_2_PRO:
        sub({"anyOf": [call_schema(f, "arguments") for f in fns]}, "tc-")
        lines.append('tool-call ::= "<tool_call>" tc-space tc-root tc-space "</tool_call>" tc-space')
        lines.append(f"root ::= {head}" + ("tool-call+" if parallel else "tool-call"))
    elif format in (FORMAT_LLAMA_3X, FORMAT_LLAMA_3X_BUILTIN):
        sub({"anyOf": [call_schema(f, "parameters") for f in fns]}, "tc-")
        lines.append(f"root ::= {head}tc-root")
    elif format == FORMAT_MISTRAL_NEMO:
        item = {"anyOf": [call_schema(f, "arguments", {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"})
                          for f in fns]}
        arr: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
        if not parallel:
            arr["maxItems"] = 1
        sub(arr, "tc-")
        lines.append(f'root ::= {head}"[TOOL_CALLS]" tc-root')
    elif format == FORMAT_DEEPSEEK_R1:
        alts = []
        for k, f in enumerate(fns):
            sub(f["parameters"], f"tc{k}-")
            alts.append(f"tc-call-{k}")
            lines.append(f'tc-call-{k} ::= "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" '
                         f'{_gbnf_literal(f["name"])} "\\n```json\\n" tc{k}-root "\\n"? "```<｜tool▁call▁end｜>"')
        lines.append("tool-call ::= " + " | ".join(alts))
        calls = 'tool-call ( "\\n"? tool-call )*' if parallel else "tool-call"
        lines.append(f'root ::= {head}"<｜tool▁calls▁begin｜>" {calls} "<｜tool▁calls▁end｜>" tc-space')
    else:  # Generic (also what a Content-only template gets once tools are given)
        any_call = {"anyOf": [call_schema(f, "arguments") for f in fns]}
        if parallel:
            call: dict[str, Any] = {"type": "object", "required": ["tool_calls"], "properties": {
                "tool_calls": {"type": "array", "items": any_call, "minItems": 1}}}
        else:
            call = {"type": "object", "required": ["tool_call"], "properties": {"tool_call": any_call}}
        schema = call
        if allow_response:
            schema = {"anyOf": [call, {"type": "object", "required": ["response"],
                                       "properties": {"response": {"type": "string"}}}]}
        sub(schema, "tc-")
        lines.append(f"root ::= {head}tc-root")
    if not any(line.startswith("tc-space ::=") for line in "\n".join(lines).splitlines()):
        lines.append(f"tc-space ::= {_GBNF_SPACE}")
    return "\n".join(lines) + "\n"


def tool_call_triggers(format: str) -> list[str]:
    """Words that start a tool call in `format` (grammar_triggers for a lazy grammar)."""
    if format == FORMAT_HERMES_2_PRO:
        return ["<tool_call>"]
    if format == FORMAT_MISTRAL_NEMO:
        return ["[TOOL_CALLS]"]
    if format == FORMAT_DEEPSEEK_R1:
        return ["<｜tool▁calls▁begin｜>"]
    if format in (FORMAT_LLAMA_3X, FORMAT_LLAMA_3X_BUILTIN):
        return ['{"']
    return []
