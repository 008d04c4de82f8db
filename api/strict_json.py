"""Request bodies parsed as strictly as llama-server's parser (nlohmann::json) parses them.

Python's `json` accepts what JSON does not: `NaN`, `Infinity`, `-Infinity`, numbers that overflow
a double (`1e400` becomes inf) and lone UTF-16 surrogates (`"\\ud800"` becomes an unpaired code
point). nlohmann rejects all of them, and llama-server answers its exception text as a 500
server_error; `loads(raw)` does the same with the same `[json.exception...]` texts. A body nested
deeper than Python's stack allows is a 400 (nlohmann has no depth limit, but answering it must not
cost the server a traceback or the connection).
"""
from __future__ import annotations

import json
import re
from typing import Any

from api.errors import ApiError

_LAST_NUMBER = re.compile(r"(-?[0-9][0-9.eE+-]*)[^0-9.eE+-]*$")
_LITERAL = re.compile(r"[:\[,]\s*(-?(?:NaN|Infinity))")
# a \uXXXX escape of a surrogate, not itself escaped (an even number of backslashes before it)
_SURROGATE = re.compile(r"(?<!\\)((?:\\\\)*)\\u([dD][89a-fA-F][0-9a-fA-F]{2})")


class _Reject(Exception):
    def __init__(self, error: ApiError):
        self.error = error


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {col}"


def parse_error(text: str, pos: int, msg: str, last_read: str) -> ApiError:
    return ApiError(f"[json.exception.parse_error.101] parse error at {_where(text, pos)}: syntax error while "
                    f"parsing value - {msg}; last read: '{last_read}'", "server_error", 500)


def _constant(name: str) -> Any:
    raise _Reject(ApiError("", "server_error", 500))  # position filled in by loads()


def _float(s: str) -> float:
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise _Reject(ApiError(f"[json.exception.out_of_range.406] number overflow parsing '{s}'", "server_error", 500))
    return v


def _int(s: str) -> int | float:
    v = int(s) if len(s) <= 20 else None
    if v is not None and -(1 << 63) <= v < (1 << 64):
        return v
    return _float(s)  # nlohmann stores integers beyond 64 bits as doubles


def _string_start(text: str, pos: int) -> int:
    """Index of the unescaped quote that opens the string around `pos` (nlohmann's token start)."""
    q = text.rfind('"', 0, pos)
    while q > 0:
        k = q
        while k > 0 and text[k - 1] == "\\":
            k -= 1
        if (q - k) % 2 == 0:
            return q
        q = text.rfind('"', 0, q)
    return max(q, 0)


def _token_start(text: str, pos: int) -> int:
    """Where nlohmann's `last read` starts for an error at `pos` outside a string: the start of the
    last string or number token before it (structural characters do not reset it)."""
    q = text.rfind('"', 0, pos)
    start = _string_start(text, q) if q >= 0 else 0
    m = _LAST_NUMBER.search(text, q + 1 if q >= 0 else 0, pos)
    return m.start(1) if m else start


def _surrogate_error(text: str, last: int, escape_at: int, msg: str) -> _Reject:
    """nlohmann's error after reading text[last] inside the string holding the escape at escape_at."""
    last = min(last, len(text) - 1)
    return _Reject(parse_error(text, last, f"invalid string: {msg}", text[_string_start(text, escape_at):last + 1]))


def _check_surrogates(text: str) -> None:
    if "\\u" not in text:
        return
    matches = list(_SURROGATE.finditer(text))
    i = 0
    while i < len(matches):
        m = matches[i]
        escape_at = m.start(2) - 2
        if int(m.group(2), 16) >= 0xDC00:
            raise _surrogate_error(text, m.end() - 1, escape_at, "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF")
        nxt = matches[i + 1] if i + 1 < len(matches) else None
        if nxt is None or nxt.start(2) - 2 != m.end() or int(nxt.group(2), 16) < 0xDC00:
            e = m.end()  # nlohmann reads on: '\\', then 'u', then four hex digits, and stops at the first miss
            last = e if text[e:e + 1] != "\\" else e + 1 if text[e + 1:e + 2] != "u" else e + 5
            raise _surrogate_error(text, last, escape_at, "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF")
        i += 2


# Python's decoder messages in nlohmann's words (its parser's exception_message): a client never
# reads Python's "Expecting ',' delimiter". (where, expected token) per message; None: the context
_WORDS = [("Expecting ',' delimiter", None),
          ("Expecting ':' delimiter", ("object separator", "':'")),
          ("Expecting property name", ("object key", "string literal")),
          ("Extra data", ("value", "end of input")),
          ("Expecting value", ("value", "'[', '{', or a literal"))]
# lexer errors (no token): their own texts
_LEXER = [("Unterminated string", "value - invalid string: missing closing quote"),
          ("Invalid control character", "value - invalid string: control character must be escaped"),
          ("Invalid \\uXXXX escape", "value - invalid string: '\\u' must be followed by 4 hex digits"),
          ("Invalid \\escape", "value - invalid string: forbidden character after backslash")]


def _token_name(text: str, pos: int) -> str | None:
    """nlohmann's token_type_name of the token at `pos`; None when no token starts there (a lexer
    error: "invalid literal")."""
    if pos >= len(text):
        return "end of input"
    c = text[pos]
    if c in "[]{}:,":
        return f"'{c}'"
    if c == '"':
        return "string literal"
    if c in "-0123456789":
        return "number literal"
    for lit in ("true", "false", "null"):
        if text.startswith(lit, pos):
            return f"{lit} literal"
    return None


def _container(text: str, pos: int) -> str:
    """"object" or "array": the innermost container open at `pos` (strings skipped)."""
    stack, i, n = [], 0, min(pos, len(text))
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "[{":
            stack.append(c)
        elif c in "]}" and stack:
            stack.pop()
        i += 1
    return "object" if stack and stack[-1] == "{" else "array"


def _nlohmann_words(msg: str, pos: int, text: str) -> str:
    for python, words in _LEXER:
        if msg.startswith(python):
            return words
    for python, words in _WORDS:
        if msg.startswith(python):
            if words is None:  # after a value inside a container
                where = _container(text, pos)
                words = (where, "'}'" if where == "object" else "']'")
            where, expected = words
            name = _token_name(text, pos)
            if name is None:  # the lexer fails: its `last read` runs from the last string or number token
                last = f"invalid literal; last read: '{text[_token_start(text, pos):pos + 1]}'"
                return f"{where} - {last}" + ("" if python == "Expecting value" else f"; expected {expected}")
            return f"{where} - unexpected {name}; expected {expected}"
    if pos >= len(text):
        return "value - unexpected end of input; expected '[', '{', or a literal"
    return f"value - invalid literal; last read: '{text[pos]}'"


def loads(raw: bytes) -> Any:
    """The parsed body; ApiError as llama-server answers a body it cannot parse."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(f"[json.exception.parse_error.101] parse error at byte {e.start + 1}: syntax error while "
                       f"parsing value - invalid string: ill-formed UTF-8 byte", "server_error", 500) from None
    try:
        _check_surrogates(text)
        data = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except _Reject as r:
        if r.error.message:
            raise r.error from None
        m = _LITERAL.search(text)
        pos = m.start(1) if m else 0
        if m and m.group(1)[0] == "-":  # '-' starts a number: nlohmann wants a digit next
            raise parse_error(text, pos + 1, "invalid number; expected digit after '-'", "-I") from None
        raise parse_error(text, pos, "invalid literal", text[_token_start(text, pos):pos + 1]) from None
    except json.JSONDecodeError as e:
        raise ApiError(f"[json.exception.parse_error.101] parse error at line {e.lineno}, column {e.colno}: "
                       f"syntax error while parsing {_nlohmann_words(e.msg, e.pos, text)}",
                       "server_error", 500) from None
    except RecursionError:
        raise ApiError("request body nests too deeply (arrays or objects inside each other)",
                       "invalid_request_error", 400) from None
    return data
