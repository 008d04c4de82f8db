"""Per-format tool-call parsers: `parse_tool_calls(text, format, partial) -> (content, calls)`.

`partial` is True while the model is still writing: a call cut off at the end is returned as far
as it got (`ParsedCall.partial`), and a tail that may grow into a format's marker is held back
from the content (`split_at_marker`, the one hold-back rule all formats share). With `partial`
False a call that does not complete stays in the content as text.

A call's arguments are the JSON text exactly as the model wrote it; a JSON string value holding
JSON is unwrapped.
"""
from __future__ import annotations

import json
import re
from typing import Any

from runtime.chat.calls import CutCall, ParsedCall, cut_calls, read_call_object
from runtime.chat.formats import ChatFormat, Marker
from runtime.chat.json_scan import Incomplete, Invalid, scan_value, skip_ws

# ---------------------------------------------------------------------------------------------
# markers

def _partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if k > best and text.endswith(m[:k]):
                best = k
                break
    return best


def split_at_marker(text: str, markers: tuple[str, ...], partial: bool, start: int = 0) -> tuple[str, int, str]:
    """The first of `markers` in `text[start:]`: (the text from `start` up to it, its index, the marker).
    None there: (the rest of the text, -1, ""), less, when `partial`, a tail that may still grow into
    a marker (held back until more text decides)."""
    best, which = -1, ""
    for m in markers:
        j = text.find(m, start)
        if j >= 0 and (best < 0 or j < best):
            best, which = j, m
    if best >= 0:
        return text[start:best], best, which
    rest = text[start:]
    if partial:
        rest = rest[:len(rest) - _partial_marker_len(rest, markers)]
    return rest, -1, ""


# ---------------------------------------------------------------------------------------------
# Hermes 2 Pro: <tool_call>{json}</tool_call> or <function=name>{args}</function>

_HERMES_OPEN = (Marker.HERMES_CALL_OPEN, Marker.HERMES_FUNCTION_OPEN)


def _parse_hermes(text: str, partial: bool) -> tuple[str, list[ParsedCall]]:
    content: list[str] = []
    calls: list[ParsedCall] = []
    pos = 0
    while True:
        before, j, marker = split_at_marker(text, _HERMES_OPEN, partial, pos)
        content.append(before)
        if j < 0:
            break
        try:
            if marker == Marker.HERMES_CALL_OPEN:
                k = skip_ws(text, j + len(marker))
                end, call = read_call_object(text, k)
                close = Marker.HERMES_CALL_CLOSE
            else:
                gt = text.find(">", j)
                if gt < 0:
                    raise Incomplete()
                fname = text[j + len(marker):gt].strip().strip('"')
                k = skip_ws(text, gt + 1)
                if k >= len(text):
                    raise Incomplete()
                if text[k] != "{":
                    raise Invalid("expected arguments object")
                try:
                    end = scan_value(text, k)
                except Incomplete:
                    raise CutCall(ParsedCall(fname, text[k:], None, True)) from None
                call = ParsedCall(fname, text[k:end])
                close = Marker.HERMES_FUNCTION_CLOSE
            e = skip_ws(text, end)
            while marker == Marker.HERMES_CALL_OPEN and text.startswith(",", e):  # b1: several calls, comma-separated
                calls.append(call)
                end, call = read_call_object(text, skip_ws(text, e + 1))
                e = skip_ws(text, end)
            if text.startswith(close, e):
                e += len(close)
            elif e >= len(text) or close.startswith(text[e:]):
                # closing tag not (fully) generated yet; at the end (b1's lenient final parse, e.g.
                # after max_tokens) the call counts as made
                call.partial = partial
                calls.append(call)
                return "".join(content), calls
            else:
                raise Invalid("expected closing tag")
            calls.append(call)
            pos = skip_ws(text, e)
        except Incomplete as exc:
            # the text ends inside a call (streaming, or a final parse after max_tokens): the calls
            # made so far and the cut one once its name is complete, its arguments as far as they
            # go (b1-0c1e570's lenient parse, final or not)
            return "".join(content), calls + cut_calls(exc)
        except Invalid:
            # not a call after all: the marker is plain text
            content.append(marker)
            pos = j + len(marker)
    return "".join(content), calls


# ---------------------------------------------------------------------------------------------
# Llama 3.x: {"name": ..., "parameters": {...}}, builtin tools after <|python_tag|>

_LLAMA_START_RE = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"([^"]+)"\s*,\s*"parameters"\s*:\s*')


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


def _parse_llama3(text: str, partial: bool, builtin: bool) -> tuple[str, list[ParsedCall]]:
    if builtin:
        before, j, _ = split_at_marker(text, (Marker.PYTHON_TAG,), partial)
        if j >= 0:
            return _parse_python_tag(text, j, partial)
        if len(before) < len(text):
            return before, []  # a held-back start of the tag
    m = _LLAMA_START_RE.match(text)
    if not m:
        if partial and _could_start_llama_call(text):
            return "", []
        return text, []
    k = text.index("{", m.start())  # object start
    try:
        end, call = read_call_object(text, k, args_keys=("parameters", "arguments"))
    except Incomplete as exc:
        if partial:
            return "", cut_calls(exc)
        return text, []
    except Invalid:
        return text, []
    rest = text[end:]
    return rest.strip() if rest.strip() else "", [call]


_CALL_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*\.\s*call\(")
_ARG_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")


def _parse_python_tag(text: str, j: int, partial: bool) -> tuple[str, list[ParsedCall]]:
    content = text[:j]
    body = text[j + len(Marker.PYTHON_TAG):]
    m = _CALL_RE.match(body)
    if not m:
        if partial:
            return content, []
        # raw code for the code interpreter
        return content, [ParsedCall("python", json.dumps({"code": body}, ensure_ascii=False))]
    i = m.end()
    args: dict[str, Any] = {}
    try:
        while True:
            am = _ARG_RE.match(body, i)
            if not am:
                break
            v_end = scan_value(body, am.end())
            args[am.group(1)] = json.loads(body[skip_ws(body, am.end()):v_end])
            i = skip_ws(body, v_end)
            if i < len(body) and body[i] == ",":
                i += 1
                continue
            break
        i = skip_ws(body, i)
        if i >= len(body):
            raise Incomplete()
        if body[i] != ")":
            raise Invalid("expected ')'")
    except (Incomplete, Invalid, json.JSONDecodeError):
        if partial:
            return content, []
        return text, []
    return content, [ParsedCall(m.group(1), json.dumps(args, ensure_ascii=False))]


# ---------------------------------------------------------------------------------------------
# Mistral Nemo: [TOOL_CALLS][{...}, ...]

def _parse_mistral(text: str, partial: bool) -> tuple[str, list[ParsedCall]]:
    content, j, _ = split_at_marker(text, (Marker.MISTRAL_CALLS,), partial)
    if j < 0:
        return content, []
    i = skip_ws(text, j + len(Marker.MISTRAL_CALLS))
    calls: list[ParsedCall] = []
    try:
        if i >= len(text):
            raise Incomplete()
        if text[i] != "[":
            raise Invalid("expected '['")
        i += 1
        while True:
            i = skip_ws(text, i)
            end, call = read_call_object(text, i)
            calls.append(call)
            i = skip_ws(text, end)
            if i >= len(text):
                raise Incomplete()
            if text[i] == ",":
                i += 1
                continue
            if text[i] == "]":
                i += 1
                break
            raise Invalid("expected ',' or ']'")
    except Incomplete:
        # a half call is not reported: its id (which the template needs back) comes last
        if partial:
            return content, calls
        return text, []
    except Invalid:
        return text, []
    return content + text[i:].strip(), calls


# ---------------------------------------------------------------------------------------------
# DeepSeek R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}```...

def _parse_deepseek_r1(text: str, partial: bool) -> tuple[str, list[ParsedCall]]:
    content, j, _ = split_at_marker(text, (Marker.DS_CALLS_BEGIN,), partial)
    if j < 0:
        return content, []
    i = j + len(Marker.DS_CALLS_BEGIN)
    calls: list[ParsedCall] = []
    try:
        while True:
            i = skip_ws(text, i)
            if text.startswith(Marker.DS_CALLS_END, i):
                i += len(Marker.DS_CALLS_END)
                break
            if i >= len(text) or Marker.DS_CALLS_END.startswith(text[i:]) or Marker.DS_CALL_BEGIN.startswith(text[i:]):
                raise Incomplete()
            if text.startswith(Marker.DS_CALL_BEGIN, i):
                i += len(Marker.DS_CALL_BEGIN)
            sep = text.find(Marker.DS_SEP, i)
            if sep < 0:
                raise Incomplete()
            nl = text.find("\n", sep)
            if nl < 0:
                raise Incomplete()
            fname = text[sep + len(Marker.DS_SEP):nl].strip()
            k = nl + 1
            fence = "```json\n"
            if text.startswith(fence, k):
                k += len(fence)
            elif fence.startswith(text[k:]):
                raise Incomplete()
            k = skip_ws(text, k)
            try:
                end = scan_value(text, k)
            except Incomplete:
                raise CutCall(ParsedCall(fname, text[k:], None, True) if k < len(text) else None) from None
            call = ParsedCall(fname, text[k:end])
            e = skip_ws(text, end)
            if text.startswith("```", e):
                e = skip_ws(text, e + 3)
            if text.startswith(Marker.DS_CALL_END, e):
                e += len(Marker.DS_CALL_END)
            elif e >= len(text) or Marker.DS_CALL_END.startswith(text[e:]) or "```".startswith(text[e:]):
                call.partial = True
                raise CutCall(call)
            else:
                raise Invalid("expected tool call end")
            calls.append(call)
            i = e
    except Incomplete as exc:
        if partial:
            return content, calls + cut_calls(exc)
        return text, []
    except Invalid:
        return text, []
    return content + text[i:].lstrip(), calls


# ---------------------------------------------------------------------------------------------
# Generic: {"tool_calls": [...]}, {"tool_call": {...}} or {"response": ...}

def _parse_generic(text: str, partial: bool) -> tuple[str, list[ParsedCall]]:
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
    calls: list[ParsedCall] = []
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
            calls.append(ParsedCall(c["name"], a if isinstance(a, str) else json.dumps(a, ensure_ascii=False),
                                    c.get("id") if isinstance(c.get("id"), str) else None))
    return "", calls


_FENCE = "```json"


def parse_json_response(text: str, partial: bool) -> str:
    """The content of a `peg-native` JSON response (`tool_grammar.json_response_grammar`): the JSON
    value alone, without the whitespace around it or the ```json fence the model may write; while
    `partial`, what of the value has come (nothing while the text may still become the fence).
    Text that is not such a value stays as it is."""
    i = skip_ws(text, 0)
    if text.startswith(_FENCE, i):
        i = skip_ws(text, i + len(_FENCE))
    elif partial and _FENCE.startswith(text[i:]):
        return ""
    try:
        return text[i:scan_value(text, i)]
    except Incomplete:
        return text[i:] if partial else text
    except Invalid:
        return text


def parse_tool_calls(text: str, fmt: str, partial: bool) -> tuple[str, list[ParsedCall]]:
    """(content, calls) of `text` in `fmt`'s syntax; formats without a parser keep it all as content."""
    if fmt == ChatFormat.HERMES_2_PRO:
        return _parse_hermes(text, partial)
    if fmt in (ChatFormat.LLAMA_3X, ChatFormat.LLAMA_3X_BUILTIN):
        return _parse_llama3(text, partial, builtin=(fmt == ChatFormat.LLAMA_3X_BUILTIN or Marker.PYTHON_TAG in text))
    if fmt == ChatFormat.MISTRAL_NEMO:
        return _parse_mistral(text, partial)
    if fmt == ChatFormat.DEEPSEEK_R1:
        return _parse_deepseek_r1(text, partial)
    if fmt == ChatFormat.GENERIC:
        return _parse_generic(text, partial)
    return text, []
