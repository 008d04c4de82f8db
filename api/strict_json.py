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


def _check_surrogates(text: str) -> None:
    if "\\u" not in text and "\\U" not in text:
        return
    matches = list(_SURROGATE.finditer(text))
    i = 0
    while i < len(matches):
        m = matches[i]
        cp = int(m.group(2), 16)
        start = m.start(2) - 2
        if cp >= 0xDC00:
            raise _Reject(parse_error(text, m.end(), "invalid string: surrogate U+DC00..U+DFFF must follow "
                                                     "U+D800..U+DBFF", text[max(start - 20, 0):m.end()]))
        nxt = matches[i + 1] if i + 1 < len(matches) else None
        if nxt is None or nxt.start(2) - 2 != m.end() or int(nxt.group(2), 16) < 0xDC00:
            end = min(m.end() + 6, len(text))
            raise _Reject(parse_error(text, end, "invalid string: surrogate U+D800..U+DBFF must be followed by "
                                                 "U+DC00..U+DFFF", text[max(start - 20, 0):end]))
        i += 2


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
        last = (m.group(1)[:2] if m.group(1)[0] == "-" else m.group(1)[0]) if m else "N"
        raise parse_error(text, pos + len(last), "invalid literal", last) from None
    except json.JSONDecodeError as e:
        raise ApiError(f"[json.exception.parse_error.101] parse error at line {e.lineno}, column {e.colno}: "
                       f"syntax error while parsing value - {e.msg}", "server_error", 500) from None
    except RecursionError:
        raise ApiError("request body nests too deeply (arrays or objects inside each other)",
                       "invalid_request_error", 400) from None
    return data
