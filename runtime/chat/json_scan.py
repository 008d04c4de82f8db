"""A small JSON scanner that reports value spans and tolerates a cut-off end.

The output parsers read tool calls out of text the model is still writing, so a scan either ends
a value (returning the index after it), finds text that is not JSON (`Invalid`), or runs out of
text inside the value (`Incomplete`, which says how far an object got).
"""
from __future__ import annotations

import json
import re


class Incomplete(Exception):
    """The text ended inside the value. `spans`: the object's complete (key -> span) so far,
    `open_key`/`open_start`: the key whose value was being read and where that value starts."""

    def __init__(self, spans: dict | None = None, open_key: str | None = None, open_start: int = -1):
        super().__init__("incomplete JSON")
        self.spans = spans or {}
        self.open_key = open_key
        self.open_start = open_start


class Invalid(Exception):
    """The text is not JSON there."""


_WS = " \t\n\r"
_NUM_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def scan_string(s: str, i: int) -> int:
    if i >= len(s):
        raise Incomplete()
    if s[i] != '"':
        raise Invalid(f"expected string at {i}")
    i += 1
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"':
            return i + 1
        if c == "\\":
            if i + 1 >= n:
                raise Incomplete()
            if s[i + 1] == "u":
                if i + 6 > n:
                    raise Incomplete()
                i += 6
            else:
                i += 2
        else:
            i += 1
    raise Incomplete()


def scan_object(s: str, i: int) -> tuple[int, dict[str, tuple[int, int]]]:
    """`s[i] == "{"`; returns (end, {key: (value_start, value_end)})."""
    spans: dict[str, tuple[int, int]] = {}
    i = skip_ws(s, i + 1)
    if i >= len(s):
        raise Incomplete(spans)
    if s[i] == "}":
        return i + 1, spans
    while True:
        i = skip_ws(s, i)
        try:
            k_end = scan_string(s, i)
        except Incomplete:
            raise Incomplete(spans) from None
        key = json.loads(s[i:k_end])
        i = skip_ws(s, k_end)
        if i >= len(s):
            raise Incomplete(spans)
        if s[i] != ":":
            raise Invalid("expected ':'")
        v_start = skip_ws(s, i + 1)
        if v_start >= len(s):
            raise Incomplete(spans, key, v_start)
        try:
            v_end = scan_value(s, v_start)
        except Incomplete:
            raise Incomplete(spans, key, v_start) from None
        spans[key] = (v_start, v_end)
        i = skip_ws(s, v_end)
        if i >= len(s):
            raise Incomplete(spans)
        if s[i] == ",":
            i += 1
            continue
        if s[i] == "}":
            return i + 1, spans
        raise Invalid("expected ',' or '}'")


def scan_array(s: str, i: int) -> tuple[int, list[tuple[int, int]]]:
    """`s[i] == "["`; returns (end, [(item_start, item_end), ...])."""
    items: list[tuple[int, int]] = []
    i = skip_ws(s, i + 1)
    if i >= len(s):
        raise Incomplete()
    if s[i] == "]":
        return i + 1, items
    while True:
        v_start = skip_ws(s, i)
        v_end = scan_value(s, v_start)
        items.append((v_start, v_end))
        i = skip_ws(s, v_end)
        if i >= len(s):
            raise Incomplete()
        if s[i] == ",":
            i += 1
            continue
        if s[i] == "]":
            return i + 1, items
        raise Invalid("expected ',' or ']'")


def scan_value(s: str, i: int) -> int:
    """The end of the JSON value at `s[i]` (after leading whitespace)."""
    i = skip_ws(s, i)
    if i >= len(s):
        raise Incomplete()
    c = s[i]
    if c == "{":
        return scan_object(s, i)[0]
    if c == "[":
        return scan_array(s, i)[0]
    if c == '"':
        return scan_string(s, i)
    for lit in ("true", "false", "null"):
        if s.startswith(lit, i):
            return i + len(lit)
        if lit.startswith(s[i:]):
            raise Incomplete()
    m = _NUM_RE.match(s, i)
    if m:
        if m.end() >= len(s):
            raise Incomplete()  # the number may go on
        return m.end()
    if c == "-" and i + 1 >= len(s):
        raise Incomplete()
    raise Invalid(f"unexpected {c!r}")
