"""llama-server's error envelope: `{"error": {"code", "message", "type"}}`.

Most errors come from `format_error_response` (server-common.cpp) with the key order code, message,
type. The three produced by the HTTP layer itself (server-http.cpp: 401 Invalid API Key,
404 File Not Found, 503 Loading model) put `message` first and `code` last; `message_first`
reproduces that order.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi.responses import Response

STATUS = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}


def json_type_name(v: Any) -> str:
    """nlohmann::json::type_name() of a decoded JSON value (its type errors name it)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), "discarded")


CHUNK_ITEMS = 1024  # a list longer than this is encoded a slice at a time
CHUNK_CHARS = 1 << 20  # a string longer than this, a slice at a time
OFF_LOOP_CHARS = 64 << 10  # an error message longer than this is serialised in a worker thread


def _one(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_NESTED = (dict, list, tuple, str)


def _large(obj: Any, budget: int = 4 * CHUNK_ITEMS) -> bool:
    """Whether `obj` holds more than about `budget` values (a string counts a value per KiB). An
    estimate in a few steps: a list is judged by its first item times its length, so a per-token
    stream chunk costs microseconds (a list whose first item is small and a later one huge is
    judged small: encoded in one call, correct and only slower to yield the GIL)."""
    stack = [(obj, 1)]
    while stack:
        v, w = stack.pop()
        t = type(v)
        if t is dict:
            budget -= w * len(v)
            stack += [(x, w) for x in v.values() if isinstance(x, _NESTED)]
        elif t is list or t is tuple:
            budget -= w * len(v)
            if v and isinstance(v[0], _NESTED):
                stack.append((v[0], w * len(v)))
        elif t is str:
            budget -= w * (1 + len(v) // 1024)
        if budget < 0:
            return True
    return False


def _parts(obj: Any):
    """JSON text of `obj` in pieces, each a bounded call of the C encoder: the encoder holds the GIL
    for a whole call (a 38 MB /tokenize answer froze every other thread for 2 s); between calls the
    event loop's thread gets it back."""
    if isinstance(obj, dict) and obj:
        sep = "{"
        for k, v in obj.items():
            key = _one(k if isinstance(k, str) else _one(k)) + ":"
            if _large(v):
                yield sep + key
                yield from _parts(v)
            else:
                yield sep + key + _one(v)
            sep = ","
        yield "}"
    elif isinstance(obj, (list, tuple)) and len(obj) > CHUNK_ITEMS:
        yield "["
        for i in range(0, len(obj), CHUNK_ITEMS):
            if i:
                yield ","
            part = obj[i:i + CHUNK_ITEMS]
            if any(isinstance(v, _NESTED) and len(v) > CHUNK_ITEMS for v in part):
                yield from _inner(part)
            else:
                yield _one(list(part))[1:-1]
        yield "]"
    elif isinstance(obj, str) and len(obj) > CHUNK_CHARS:
        yield '"'
        for i in range(0, len(obj), CHUNK_CHARS):
            yield _one(obj[i:i + CHUNK_CHARS])[1:-1]
        yield '"'
    else:
        yield _one(obj)


def _inner(items: Any):
    for j, v in enumerate(items):
        if j:
            yield ","
        yield from _parts(v)


def dumps(obj: Any) -> str:
    """Compact JSON with raw UTF-8, as llama-server's `safe_json_to_str` writes it."""
    return "".join(_parts(obj)) if _large(obj) else _one(obj)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if _large(obj):  # encoded a piece at a time too: no single long hold of the GIL
        body = b"".join(part.encode("utf-8", "replace") for part in _parts(obj))
    else:
        body = _one(obj).encode("utf-8", "replace")
    return Response(body, status_code=status, media_type="application/json; charset=utf-8", headers=headers)


async def answer(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """`json_response` from an async handler: a large answer is serialised in a worker thread."""
    if _large(obj):
        return await asyncio.to_thread(json_response, obj, status, headers)
    return json_response(obj, status, headers)


class ApiError(Exception):
    """An error answered with llama-server's envelope; raise it anywhere inside a handler."""

    def __init__(self, message: str, type: str = "invalid_request_error", code: int | None = None,
                 extra: dict[str, Any] | None = None, message_first: bool = False):
        super().__init__(message)
        self.message = message
        self.type = type
        self.code = code if code is not None else STATUS.get(type, 500)
        self.extra = extra or {}
        self.message_first = message_first

    def body(self) -> dict[str, Any]:
        return {"error": error_object(self.message, self.type, self.code, self.extra, self.message_first)}

    def response(self) -> Response:
        return json_response(self.body(), self.code)

    async def response_async(self) -> Response:
        """`response()` from the event loop: a long message (and its extra fields) off it."""
        if len(self.message) > OFF_LOOP_CHARS or _large(self.extra):
            return await asyncio.to_thread(self.response)
        return self.response()


def error_object(message: str, type: str, code: int | None = None, extra: dict[str, Any] | None = None,
                 message_first: bool = False) -> dict[str, Any]:
    code = code if code is not None else STATUS.get(type, 500)
    if message_first:
        err = {"message": message, "type": type, "code": code}
    else:
        err = {"code": code, "message": message, "type": type}
    err.update(extra or {})
    return err


def context_exceeded(n_prompt_tokens: int, n_ctx: int) -> ApiError:
    return ApiError(
        f"request ({n_prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
        "exceed_context_size_error", 400, {"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx})


def invalid_api_key() -> ApiError:
    return ApiError("Invalid API Key", "authentication_error", 401, message_first=True)


def not_found() -> ApiError:
    return ApiError("File Not Found", "not_found_error", 404, message_first=True)


def loading_model() -> ApiError:
    return ApiError("Loading model", "unavailable_error", 503, message_first=True)


def not_supported(message: str) -> ApiError:
    return ApiError(message, "not_supported_error", 501)
