"""The checks b1-0c1e570 makes of a chat request's messages and tools, in its order and with its
messages (tools/server/server-common.cpp `oaicompat_chat_params_parse`, then common/chat.cpp
`common_chat_msgs_parse_oaicompat` and `common_chat_tools_parse_oaicompat`).

The first pass answers 400 (std::invalid_argument); the parses of common/chat.cpp wrap their
errors as "Failed to parse messages: ..." / "Failed to parse tools: ...; tools = ..." and answer
500 (std::runtime_error). JSON in messages is nlohmann's `dump()` (compact) or `dump(2)`.
"""
from __future__ import annotations

import json
from typing import Any

from api.errors import ApiError, dumps, json_type_name
from api.media import MEDIA_KINDS, content_load_media


def _dump2(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, indent=2)


def _string(v: Any) -> str:
    """`get<std::string>()` of a JSON value: its type error otherwise."""
    if not isinstance(v, str):
        raise ValueError(f"[json.exception.type_error.302] type must be string, but is {json_type_name(v)}")
    return v


def _at(obj: dict, key: str) -> Any:
    """`at(key)`: nlohmann's out_of_range error when absent."""
    if key not in obj:
        raise ValueError(f"[json.exception.out_of_range.403] key '{key}' not found")
    return obj[key]


def check_message_shapes(messages: list, media: dict | None = None) -> tuple[list, list[bytes]]:
    """oaicompat_chat_params_parse's pass over the messages (400s; a media part the server cannot
    take, 500). `media` (a server with --mmproj): {"modalities", "media_path", "marker"}; each
    media part's file is loaded (api/media.py) and the part becomes a media marker. Returns the
    messages (copies where a part was replaced) and the files, in order."""
    out, files = [], []
    for m in messages:
        out.append(m)
        role = m.get("role") if isinstance(m, dict) and isinstance(m.get("role"), str) else ""
        has = isinstance(m, dict)
        if role != "assistant" and not (has and "content" in m):
            raise ApiError("All non-assistant messages must contain 'content'")
        if role == "assistant":
            if "content" not in m and "tool_calls" not in m:
                raise ApiError("Assistant message must contain either 'content' or 'tool_calls'!")
            if "content" not in m:
                continue
        content = m["content"]
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise ApiError("Expected 'content' to be a string or an array")
        if media is not None:  # oaicompat_content_load_media
            parts = content_load_media(content, media["modalities"], media["media_path"], files, media["marker"])
            if any(p is not q for p, q in zip(parts, content)):
                out[-1] = dict(m, content=parts)
            continue
        for p in content:  # oaicompat_content_load_media: no projector here, so a media part is its 500
            kind = p.get("type") if isinstance(p, dict) and isinstance(p.get("type"), str) else ""
            if kind in MEDIA_KINDS:
                raise ApiError(f"{MEDIA_KINDS[kind]} input is not supported - hint: if this is unexpected, "
                               "you may need to provide the mmproj", "server_error", 500)
            if kind != "text":
                raise ApiError("unsupported content[].type")
    return out, files


def _function_of(entry: Any, what: str) -> Any:
    """The `function` of a tool ("tool") or of a message's tool call ("tool call"), after b1's checks
    of its `type` (both parses word them alike)."""
    if not isinstance(entry, dict) or "type" not in entry:
        raise ValueError(f"Missing {what} type: {dumps(entry)}")
    if entry["type"] != "function":
        raise ValueError(f"Unsupported {what} type: {dumps(entry)}")
    if "function" not in entry:
        raise ValueError(f"Missing {what} function: {dumps(entry)}")
    return entry["function"]


def _parse_message(m: Any) -> None:
    if not isinstance(m, dict):
        raise ValueError(f"Expected 'message' to be an object, got {dumps(m)}")
    if "role" not in m:
        raise ValueError(f"Missing 'role' in message: {dumps(m)}")
    _string(m["role"])
    content = m.get("content")
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict) or "type" not in part:
                raise ValueError(f"Missing content part type: {dumps(part)}")
            if part["type"] not in ("text", "media_marker"):
                raise ValueError(f"Unsupported content part type: {dumps(part['type'])}")
            _string(_at(part, "text"))
    elif "content" in m and content is not None and not isinstance(content, str):
        raise ValueError(f"Invalid 'content' type: expected string or array, got {dumps(content)} "
                         "(ref: https://github.com/ggml-org/llama.cpp/issues/8367)")
    if "tool_calls" in m:
        calls = m["tool_calls"]  # nlohmann iterates an object's values, a scalar as itself, null as nothing
        items = list(calls.values()) if isinstance(calls, dict) else calls if isinstance(calls, list) else \
            [] if calls is None else [calls]
        for tc in items:
            fc = _function_of(tc, "tool call")
            if not isinstance(fc, dict) or "name" not in fc:
                raise ValueError(f"Missing tool call name: {dumps(tc)}")
            _string(fc["name"])
            _at(fc, "arguments")
            if "id" in tc:
                _string(tc["id"])
    if "content" not in m and "tool_calls" not in m:
        raise ValueError("Expected 'content' or 'tool_calls' (ref: https://github.com/ggml-org/llama.cpp/issues/8367 & "
                         "https://github.com/ggml-org/llama.cpp/issues/12279)")
    for key in ("reasoning_content", "name", "tool_call_id"):
        if key in m:
            _string(m[key])


def parse_messages(messages: list) -> None:
    """common_chat_msgs_parse_oaicompat's checks (500s)."""
    try:
        for m in messages:
            _parse_message(m)
    except ValueError as e:
        raise ApiError(f"Failed to parse messages: {e}", "server_error", 500) from None


def parse_tools(tools: Any) -> None:
    """common_chat_tools_parse_oaicompat's checks (500s); null is no tools."""
    try:
        if tools is None:
            return
        if not isinstance(tools, list):
            raise ValueError(f"Expected 'tools' to be an array, got {dumps(tools)}")
        for t in tools:
            fn = _function_of(t, "tool")
            if not isinstance(fn, dict):
                raise ValueError(f"[json.exception.type_error.304] cannot use at() with {json_type_name(fn)}")
            _string(_at(fn, "name"))
            if "description" in fn:
                _string(fn["description"])
    except ValueError as e:
        raise ApiError(f"Failed to parse tools: {e}; tools = {_dump2(tools)}", "server_error", 500) from None
