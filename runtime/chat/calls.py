"""A tool call as the output parsers read it (`ParsedCall`, `read_call_object`) and as the API
returns it (OpenAI dicts with ids)."""
from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass

from runtime.chat.json_scan import Incomplete, Invalid, scan_object

_ALNUM = string.ascii_letters + string.digits


@dataclass
class ParsedCall:
    name: str | None
    arguments: str  # complete or (when partial) the text so far
    id: str | None = None
    partial: bool = False


class CutCall(Incomplete):
    """The text ended inside a tool call: `call` is what was read of it (None: too little)."""

    def __init__(self, call: ParsedCall | None = None):
        super().__init__()
        self.call = call


def cut_calls(exc: Incomplete) -> list[ParsedCall]:
    """The partial call an `Incomplete` carries, as a list of zero or one."""
    call = getattr(exc, "call", None)
    return [call] if call is not None else []


def _args_text(s: str, span: tuple[int, int]) -> str:
    raw = s[span[0]:span[1]]
    if raw.startswith('"'):
        # arguments given as a JSON string (holding JSON): unwrap it
        return json.loads(raw)
    return raw


def read_call_object(s: str, i: int, name_key: str = "name", args_keys: tuple[str, ...] = ("arguments",),
                     name: str | None = None) -> tuple[int, ParsedCall]:
    """Read `{"name": ..., "arguments": {...}}` at s[i]. Raises CutCall carrying the partial call
    (or None when not even the name is known), Invalid when it is not a call."""
    if i >= len(s):
        raise CutCall()
    if s[i] != "{":
        raise Invalid("expected '{'")
    try:
        end, spans = scan_object(s, i)
    except Incomplete as e:
        call_name = name
        if call_name is None and name_key in e.spans:
            call_name = json.loads(s[slice(*e.spans[name_key])])
        args = None
        for k in args_keys:
            if k in e.spans:
                args = _args_text(s, e.spans[k])
            elif e.open_key == k and e.open_start >= 0 and e.open_start < len(s) and s[e.open_start] != '"':
                args = s[e.open_start:].rstrip()  # as b1-0c1e570's partial parse: no trailing whitespace
        raise CutCall(ParsedCall(call_name if isinstance(call_name, str) else None, args or "", None, True)
                      if call_name is not None and args else None) from None
    try:
        obj = json.loads(s[i:end])
    except json.JSONDecodeError as e:
        raise Invalid(str(e)) from None
    if not isinstance(obj, dict):
        raise Invalid("not an object")
    call_name = name if name is not None else obj.get(name_key)
    if not isinstance(call_name, str):
        raise Invalid("no name")
    args = "{}"
    for k in args_keys:
        if k in spans:
            args = _args_text(s, spans[k])
            break
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return end, ParsedCall(call_name, args, call_id)


def random_tool_call_id(n: int = 32) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def to_openai_calls(calls: list[ParsedCall], ids: list[str] | None) -> list[dict]:
    """OpenAI `tool_calls` entries; the id of call n is `ids[n]` when given, else the model's own
    (Mistral) or a random one, appended to `ids`."""
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
