"""What an unexpected exception of one sequence becomes: a client message without Python names.

As llama-server b1-0c1e570 (server_context::iterate catches an exception of one slot, answers it
with a 500 `got exception: ...` and releases that slot), the engine isolates failures per sequence (scheduler: admission, the books after a forward,
sampling, stop rules; engine: the forward itself fails only its batch). The sequence that failed
gets a 500 in llama-server's envelope whose text says what went wrong in words, never a module,
class or function name, nor a Python repr (`(34, 'Numerical result out of range')`); the full
traceback goes to the server log.
"""
from __future__ import annotations

import re
import traceback
from typing import Callable

# `pkg.mod.Class.method()`, `Class.method()`, `<class 'x'>`, `<function f at 0x..>`, `0x7f..`
_DOTTED = re.compile(r"\b[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
_CALL = re.compile(r"\b[A-Za-z_]\w*\(\)")
_ANGLE = re.compile(r"<[^<>]*(?:class|function|object|module|built-in)[^<>]*>")
_ERRNO = re.compile(r"^\(\d+, '([^']*)'\)$")
_MAX_LEN = 300

# exception classes whose text is Python's own wording: say what happened instead
_PLAIN = {
    "RecursionError": "the request nests too deeply",
    "MemoryError": "out of memory",
    "OverflowError": "numerical overflow",
    "ZeroDivisionError": "division by zero",
}


def client_message(e: BaseException, what: str = "") -> str:
    """llama-server's text for an exception in one slot's step (server_context::iterate:
    `got exception: <what()>`), the description in words; `what` (the phase) goes to the log."""
    return f"got exception: {describe(e)}"


def describe(e: BaseException) -> str:
    """A short description of `e` in words (no Python names, bounded length)."""
    plain = _PLAIN.get(type(e).__name__)
    if plain is not None:
        return plain
    text = str(e).strip()
    m = _ERRNO.match(text)
    if m:
        text = m.group(1)
    text = re.sub(r"^\[Errno \d+\] ", "", text)
    text = _ANGLE.sub("", text)
    text = _DOTTED.sub(lambda m: _last_name(m.group(0)), text)
    text = _CALL.sub(lambda m: m.group(0)[:-2], text)
    text = " ".join(text.split())
    if not text:
        return "unexpected failure"
    return text if len(text) <= _MAX_LEN else text[:_MAX_LEN] + "..."


def _last_name(dotted: str) -> str:
    """`a.b.C.f()` -> `f`; a number like `1.5` or a file name like `x.gguf` stays."""
    if dotted[0].isdigit() or re.fullmatch(r"[\w-]+\.(?:gguf|json|txt|bin|jinja)", dotted):
        return dotted
    return dotted.rstrip("()").rsplit(".", 1)[-1]


def log_failure(log: Callable[[str, str], None], where: str, e: BaseException) -> None:
    """The traceback of an isolated failure, to the server log (level E)."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    log("E", f"srv  {where}: {type(e).__name__}: {e}\n{tb}")
