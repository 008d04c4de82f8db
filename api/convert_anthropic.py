"""The Anthropic Messages API as llama-server b1-0c1e570 serves it (tools/server/server-chat.cpp,
server-task.cpp): a request becomes a chat-completions request (`server_chat_convert_anthropic_to_oai`),
the chat output becomes a `message` object (`to_json_anthropic`) or the Messages event stream
(`to_json_anthropic[_stream]`): message_start, content_block_start / _delta / _stop per block
(thinking first, then text, then one tool_use block per call), message_delta, message_stop.

One deliberate difference: llama-server's last event batch forgets which blocks the earlier ones
opened, so a delta that only the final parse finds (e.g. the closing `}` of a tool call's
arguments) opens its block a second time; here a block is opened once per stream.
"""
from __future__ import annotations

import json
from typing import Any

from api.errors import ApiError

Event = tuple[str, dict[str, Any]]

BILLING_PREFIX = "x-anthropic-billing-header:"


def _get(d: Any, key: str, kind: type, default: Any) -> Any:
    """llama-server's `json_value`: the default for a missing, null or mistyped value."""
    v = d.get(key) if isinstance(d, dict) else None
    if v is None or not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        return default
    return v


def normalize_billing_header(text: str) -> str:
    """Claude Code's system prompt carries a per-request `cch=xxxxx;` stamp that defeats the
    prompt cache; llama-server rewrites it to `cch=fffff;`."""
    if not text.startswith(BILLING_PREFIX):
        return text
    i = text.find("cch=", len(BILLING_PREFIX))
    if i < 0:
        return text
    j = i + 4
    if j + 5 < len(text) and text[j + 5] == ";":
        return text[:j] + "fffff" + text[j + 5:]
    return text


def _image_part(source: Any) -> dict[str, Any] | None:
    kind = _get(source, "type", str, "")
    if kind == "base64":
        media = _get(source, "media_type", str, "image/jpeg")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{_get(source, 'data', str, '')}"}}
    if kind == "url":
        return {"type": "image_url", "image_url": {"url": _get(source, "url", str, "")}}
    return None


def _tool_result(block: dict[str, Any]) -> dict[str, Any]:
    tool_use_id = _get(block, "tool_use_id", str, "")
    content = block.get("content")
    if isinstance(content, str):
        return {"role": "tool", "tool_call_id": tool_use_id, "content": content}
    if not isinstance(content, list):
        return {"role": "tool", "tool_call_id": tool_use_id, "content": ""}
    text, parts, has_images = "", [], False
    for c in content:
        kind = _get(c, "type", str, "")
        if kind == "text":
            t = _get(c, "text", str, "")
            text += t
            parts.append({"type": "text", "text": t})
        elif kind == "image":
            has_images = True
            part = _image_part(_get(c, "source", dict, {}))
            if part is not None:
                parts.append(part)
    return {"role": "tool", "tool_call_id": tool_use_id, "content": parts if has_images else text}


def _convert_message(msg: Any, out: list[Any]) -> None:
    role = _get(msg, "role", str, "")
    if not isinstance(msg, dict) or "content" not in msg:
        if role != "assistant":
            out.append(msg)
        return
    content = msg["content"]
    if not isinstance(content, list):
        out.append(msg)
        return
    calls: list[dict[str, Any]] = []
    parts: list[Any] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for block in content:
        kind = _get(block, "type", str, "")
        if kind == "text":
            parts.append(block)
        elif kind == "thinking":
            reasoning += _get(block, "thinking", str, "")
        elif kind == "image":
            part = _image_part(_get(block, "source", dict, {}))
            if part is not None:
                parts.append(part)
        elif kind == "tool_use":
            args = block.get("input")
            args = {} if args is None else args
            calls.append({"id": _get(block, "id", str, ""), "type": "function",
                          "function": {"name": _get(block, "name", str, ""),
                                       "arguments": json.dumps(args, ensure_ascii=False, separators=(",", ":"))}})
        elif kind == "tool_result":
            results.append(_tool_result(block))
    if parts or calls or reasoning:
        new: dict[str, Any] = {"role": role}
        if parts:
            new["content"] = parts
        else:
            new["content"] = ""
        if calls:
            new["tool_calls"] = calls
        if reasoning:
            new["reasoning_content"] = reasoning
        out.append(new)
    out.extend(results)


def anthropic_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """`server_chat_convert_anthropic_to_oai`: only the fields named here reach the chat request.
    A missing `messages` is llama-server's 500 (a runtime_error there)."""
    messages: list[Any] = []
    system = body.get("system")
    if system is not None:
        text = ""
        if isinstance(system, str):
            text = normalize_billing_header(system)
        elif isinstance(system, list):
            for block in system:
                if _get(block, "type", str, "") == "text":
                    text += normalize_billing_header(_get(block, "text", str, ""))
        messages.append({"role": "system", "content": text})
    if "messages" not in body:
        raise ApiError("'messages' is required", "server_error", 500)
    if isinstance(body["messages"], list):
        for msg in body["messages"]:
            _convert_message(msg, messages)
    out: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [{"type": "function",
                         "function": {"name": _get(t, "name", str, ""), "description": _get(t, "description", str, ""),
                                      "parameters": t["input_schema"] if isinstance(t, dict) and "input_schema" in t
                                      else {}}}
                        for t in tools]
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = _get(tc, "type", str, "")
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind in ("any", "tool"):
            out["tool_choice"] = "required"
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    out["max_tokens"] = body["max_tokens"] if "max_tokens" in body else 4096
    for key in ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs"):
        if key in body:
            out[key] = body[key]
    if "thinking" in body:
        thinking = _get(body, "thinking", dict, {})
        if _get(thinking, "type", str, "") == "enabled":
            out["thinking_budget_tokens"] = _get(thinking, "budget_tokens", int, 10000)
    if "metadata" in body:
        user_id = _get(_get(body, "metadata", dict, {}), "user_id", str, "")
        if user_id:
            out["__metadata_user_id"] = user_id
    return out


# ------------------------------------------------------------------------------------------
# response: chat output -> Anthropic

def stop_reason(stop_type: str, has_tool_calls: bool) -> str:
    if stop_type in ("word", "eos"):
        return "tool_use" if has_tool_calls else "end_turn"
    return "max_tokens"


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return {}


def usage(n_prompt: int, n_cached: int, n_decoded: int) -> dict[str, Any]:
    return {"cache_read_input_tokens": n_cached, "input_tokens": n_prompt - n_cached, "output_tokens": n_decoded}


def message_json(msg: dict[str, Any], msg_id: str, model: str, stop_type: str, stopping_word: str,
                 use: dict[str, Any]) -> dict[str, Any]:
    """The whole `message` of a non-streamed request (`to_json_anthropic`)."""
    blocks: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        blocks.append({"type": "text", "text": msg["content"]})
    calls = msg.get("tool_calls") or []
    for tc in calls:
        fn = tc.get("function") or {}
        blocks.append({"type": "tool_use", "id": tc["id"], "name": fn.get("name", ""),
                       "input": _input(fn.get("arguments", ""))})
    return {"id": msg_id, "type": "message", "role": "assistant", "content": blocks, "model": model,
            "stop_reason": stop_reason(stop_type, bool(calls)), "stop_sequence": stopping_word or None,
            "usage": use}


def _start(index: int, block: dict[str, Any]) -> Event:
    return "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def _stop(index: int) -> Event:
    return "content_block_stop", {"type": "content_block_stop", "index": index}


class AnthropicStream:
    """Chat deltas -> Messages stream events. Block indices: thinking 0, then text, then tool calls."""

    def __init__(self, msg_id: str, model: str):
        self.msg_id = msg_id
        self.model = model
        self.started = False
        self.has_reasoning = False  # any reasoning so far: the text block is then index 1
        self.thinking_started = False
        self.text_started = False
        self.calls_started: set[int] = set()

    def message_start(self, n_prompt: int, n_cached: int) -> list[Event]:
        if self.started:
            return []
        self.started = True
        return [("message_start", {"type": "message_start", "message": {
            "id": self.msg_id, "type": "message", "role": "assistant", "content": [], "model": self.model,
            "stop_reason": None, "stop_sequence": None, "usage": usage(n_prompt, n_cached, 0)}})]

    def deltas(self, deltas: list[dict[str, Any]], final_text: bool | None = None) -> list[Event]:
        """`final_text`: in the last batch the tool calls' indices count the text block when the
        whole message has text (llama-server's `has_text`), else when a text block was opened."""
        self.has_reasoning |= any(d.get("reasoning_content") for d in deltas)
        events: list[Event] = []
        for d in deltas:
            if d.get("reasoning_content"):
                if not self.thinking_started:
                    self.thinking_started = True
                    events.append(_start(0, {"type": "thinking", "thinking": ""}))
                events.append(_delta(0, {"type": "thinking_delta", "thinking": d["reasoning_content"]}))
            if d.get("content"):
                index = 1 if self.has_reasoning else 0
                if not self.text_started:
                    self.text_started = True
                    events.append(_start(index, {"type": "text", "text": ""}))
                events.append(_delta(index, {"type": "text_delta", "text": d["content"]}))
            for tc in d.get("tool_calls") or []:
                n = tc["index"]
                text = self.text_started if final_text is None else final_text
                index = (1 if self.has_reasoning else 0) + (1 if text else 0) + n
                fn = tc.get("function") or {}
                if n not in self.calls_started and fn.get("name"):
                    self.calls_started.add(n)
                    events.append(_start(index, {"type": "tool_use", "id": tc.get("id", ""), "name": fn["name"]}))
                if fn.get("arguments"):
                    events.append(_delta(index, {"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return events

    def final(self, last_deltas: list[dict[str, Any]], msg: dict[str, Any], stop_type: str, stopping_word: str,
              n_decoded: int) -> list[Event]:
        """The last deltas, the blocks closed in order, message_delta and message_stop."""
        has_thinking, has_text = bool(msg.get("reasoning_content")), bool(msg.get("content"))
        calls = msg.get("tool_calls") or []
        events = self.deltas(last_deltas, has_text)
        if has_thinking:
            events.append(_delta(0, {"type": "signature_delta", "signature": ""}))
            events.append(_stop(0))
        if has_text:
            events.append(_stop(1 if has_thinking else 0))
        for n in range(len(calls)):
            events.append(_stop((1 if has_thinking else 0) + (1 if has_text else 0) + n))
        events.append(("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(stop_type, bool(calls)), "stop_sequence": stopping_word or None},
            "usage": {"output_tokens": n_decoded}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events
