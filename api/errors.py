"""llama-server's error envelope: `{"error": {"code", "message", "type"}}`.

Most errors come from `format_error_response` (server-common.cpp) with the key order code, message,
type. The three produced by the HTTP layer itself (server-http.cpp: 401 Invalid API Key,
404 File Not Found, 503 Loading model) put `message` first and `code` last; `message_first`
reproduces that order.
"""
from __future__ import annotations

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


def dumps(obj: Any) -> str:
    """Compact JSON with raw UTF-8, as llama-server's `safe_json_to_str` writes it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = dumps(obj).encode("utf-8", "replace")
    return Response(body, status_code=status, media_type="application/json; charset=utf-8", headers=headers)


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
