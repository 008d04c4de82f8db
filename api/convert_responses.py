"""The OpenAI Responses API as llama-server b1-0c1e570 serves it (tools/server/server-chat.cpp,
server-task.cpp): a request becomes a chat-completions request
(`server_chat_convert_responses_to_chatcmpl`), and the chat output becomes a `response` object
(`to_json_oaicompat_resp`) or the Responses event stream (`to_json_oaicompat_resp[_stream]`).

Stream events are `(event name, data)` pairs written as `event: NAME\\ndata: JSON\\n\\n`. As in that
build, the deltas found only when the output is parsed the last time are not streamed (the `*.done`
events and `response.completed` carry the whole output). One deliberate addition: the item events
carry `output_index` (and the text events `content_index`, always 0), which that build leaves out
and without which the official client's `responses.stream()` cannot place a delta.
"""
from __future__ import annotations

import copy
import time
from typing import Any

from api.context import random_id
from api.errors import ApiError

Event = tuple[str, dict[str, Any]]


def _is_str(d: Any, key: str) -> bool:
    return isinstance(d, dict) and isinstance(d.get(key), str)


def _is_arr(d: Any, key: str) -> bool:
    return isinstance(d, dict) and isinstance(d.get(key), list)


def _str(d: Any, key: str, default: str = "") -> str:
    """llama-server's `json_value(d, key, std::string())`: the default for a missing or mistyped value."""
    return d[key] if _is_str(d, key) else default


# ------------------------------------------------------------------------------------------
# request: Responses -> chat completions

def _input_message(item: dict[str, Any]) -> dict[str, Any]:
    """An input message (role user / system / developer, content parts)."""
    parts = []
    for part in item["content"]:
        kind = _str(part, "type")
        if kind == "input_text":
            if not isinstance(part, dict) or "text" not in part:
                raise ApiError("'Input text' requires 'text'")
            parts.append({"text": part["text"], "type": "text"})
        elif kind == "input_image":
            if "image_url" not in part:
                raise ApiError("'image_url' is required")
            parts.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
        elif kind == "input_file":
            raise ApiError("'input_file' is not supported by llamacpp at this moment")
        else:
            raise ApiError("'type' must be one of 'input_text', 'input_image', or 'input_file'")
    item.pop("type", None)
    item.pop("status", None)
    item["content"] = parts
    return item


def _output_parts(item: dict[str, Any]) -> list[dict[str, Any]]:
    """The content of an output message (assistant) as chat content parts."""
    content = item.get("content")
    if isinstance(content, str):
        return [{"text": content, "type": "text"}]
    parts = []
    for part in content if isinstance(content, list) else []:
        kind = _str(part, "type")
        if kind in ("output_text", "input_text"):
            if not _is_str(part, "text"):
                raise ApiError("'Output text' requires 'text'")
            parts.append({"text": part["text"], "type": "text"})
        elif kind == "refusal":
            if not _is_str(part, "refusal"):
                raise ApiError("'Refusal' requires 'refusal'")
            parts.append({"refusal": part["refusal"], "type": "refusal"})
        else:
            raise ApiError("'type' must be one of 'output_text' or 'refusal'")
    return parts


def _tool_output(item: dict[str, Any]) -> dict[str, Any]:
    out = item["output"]
    if isinstance(out, list):
        out = copy.deepcopy(out)
        for part in out:
            if not isinstance(part, dict) or "type" not in part:
                raise ApiError("Output of tool call missing 'type' field")
            kind = part["type"]
            if kind not in ("input_text", "input_image"):
                raise ApiError("Output of tool call should be 'Input text' or 'Input image'")
            if kind == "input_text":
                part["type"] = "text"
            else:
                if "image_url" not in part:
                    raise ApiError("'image_url' is required")
                part["type"] = "image_url"
                part["image_url"] = {"url": part["image_url"]}
    return {"content": out, "role": "tool", "tool_call_id": item["call_id"]}


def _convert_items(items: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for item in items:
        item = copy.deepcopy(item)
        merge_prev = bool(messages) and messages[-1].get("role", "") == "assistant"
        if _is_str(item, "content"):
            item["content"] = [{"text": item["content"], "type": "input_text"}]
        if _is_arr(item, "content") and _is_str(item, "role") and item["role"] in ("user", "system", "developer"):
            messages.append(_input_message(item))
        elif _is_str(item, "role") and item["role"] == "assistant" and _str(item, "type") == "message":
            parts = _output_parts(item)
            if merge_prev:
                prev = messages[-1]
                if not isinstance(prev.get("content"), list):
                    prev["content"] = []
                prev["content"].extend(parts)
            else:
                item.pop("status", None)
                item.pop("type", None)
                item["content"] = parts
                messages.append(item)
        elif (_is_str(item, "arguments") and _is_str(item, "call_id") and _is_str(item, "name")
              and _str(item, "type") == "function_call"):
            call = {"function": {"arguments": item["arguments"], "name": item["name"]},
                    "id": item["call_id"], "type": "function"}
            if merge_prev:
                prev = messages[-1]
                if not isinstance(prev.get("tool_calls"), list):
                    prev["tool_calls"] = []
                prev["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif (_is_str(item, "call_id") and (_is_str(item, "output") or _is_arr(item, "output"))
              and _str(item, "type") == "function_call_output"):
            messages.append(_tool_output(item))
        elif _is_arr(item, "summary") and _str(item, "type") == "reasoning":
            if not _is_arr(item, "content"):
                raise ApiError("item['content'] is not an array")
            if not item["content"]:
                raise ApiError("item['content'] is empty")
            if not _is_str(item["content"][0], "text"):
                raise ApiError("item['content']['text'] is not a string")
            text = item["content"][0]["text"]
            if merge_prev:
                messages[-1]["reasoning_content"] = text
            else:
                messages.append({"role": "assistant", "content": [], "reasoning_content": text})
        else:
            raise ApiError("Cannot determine type of 'item'")
    return messages


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """`server_chat_convert_responses_to_chatcmpl`: every other field is passed on unchanged."""
    if "input" not in body:
        raise ApiError("'input' is required")
    if _str(body, "previous_response_id"):
        raise ApiError("llama.cpp does not support 'previous_response_id'.")
    inp = body["input"]
    out = {k: v for k, v in body.items() if k != "input"}
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": _str(body, "instructions")})
        out.pop("instructions")
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        messages.extend(_convert_items(inp))
    else:
        raise ApiError("'input' must be a string or array of objects")
    out["messages"] = messages

    if "tools" in body:
        if not isinstance(body["tools"], list):
            raise ApiError("'tools' must be an array of objects")
        tools = []
        for tool in body["tools"]:
            if _str(tool, "type") != "function":
                continue  # non-function Responses tools have no chat-completions equivalent
            fn = {k: v for k, v in tool.items() if k != "type"}
            fn.setdefault("strict", True)
            tools.append({"type": "function", "function": fn})
        out.pop("tools")
        if tools:
            out["tools"] = tools
    if "max_output_tokens" in body:
        out.pop("max_output_tokens")
        out["max_tokens"] = body["max_output_tokens"]
    if "reasoning" in body:
        reasoning = body["reasoning"]
        if isinstance(reasoning, dict) and "effort" in reasoning:
            out["reasoning_effort"] = reasoning["effort"]
        out.pop("reasoning")
    return out


# ------------------------------------------------------------------------------------------
# response: chat output -> Responses

def usage(n_prompt: int, n_decoded: int, n_cached: int) -> dict[str, Any]:
    return {"input_tokens": n_prompt, "output_tokens": n_decoded, "total_tokens": n_decoded + n_prompt,
            "input_tokens_details": {"cached_tokens": n_cached}}


def _call_item(tc: dict[str, Any]) -> dict[str, Any]:
    fn = tc.get("function") or {}
    return {"id": "fc_" + tc["id"], "type": "function_call", "status": "completed",
            "arguments": fn.get("arguments", ""), "call_id": "call_" + tc["id"], "name": fn.get("name", "")}


def response_json(msg: dict[str, Any], resp_id: str, model: str, use: dict[str, Any]) -> dict[str, Any]:
    """The whole `response` object of a non-streamed request (`to_json_oaicompat_resp`)."""
    output: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        output.append({"id": "rs_" + random_id(), "summary": [], "type": "reasoning",
                       "content": [{"text": msg["reasoning_content"], "type": "reasoning_text"}],
                       "encrypted_content": "", "status": "completed"})
    if msg.get("content"):
        output.append({"content": [{"type": "output_text", "annotations": [], "logprobs": [],
                                    "text": msg["content"]}],
                       "id": "msg_" + random_id(), "role": "assistant", "status": "completed", "type": "message"})
    for tc in msg.get("tool_calls") or []:
        output.append(_call_item(tc))
    t = int(time.time())
    return {"completed_at": t, "created_at": t, "id": resp_id, "model": model, "object": "response",
            "output": output, "status": "completed", "usage": use}


class ResponsesStream:
    """Chat deltas -> Responses events (`to_json_oaicompat_resp` of the partial and final results)."""

    def __init__(self, model: str):
        self.model = model
        self.resp_id = "resp_" + random_id()
        self.reasoning_id = "rs_" + random_id()
        self.message_id = "msg_" + random_id()
        self.created = False
        self.thinking_started = False
        self.text_started = False
        self.fc_id = ""
        self.index: dict[str, int] = {}  # output item id -> output_index, in the order items were added

    def _add(self, item_id: str) -> int:
        return self.index.setdefault(item_id, len(self.index))

    def _stub(self, kind: str) -> Event:
        return kind, {"type": kind, "response": {"id": self.resp_id, "object": "response", "status": "in_progress"}}

    def begin(self, progress: bool = False) -> list[Event]:
        """`response.created` + `response.in_progress` once; later a progress update is one
        `response.in_progress`."""
        if not self.created:
            self.created = True
            return [self._stub("response.created"), self._stub("response.in_progress")]
        return [self._stub("response.in_progress")] if progress else []

    def deltas(self, deltas: list[dict[str, Any]]) -> list[Event]:
        events: list[Event] = []
        for d in deltas:
            if d.get("reasoning_content"):
                if not self.thinking_started:
                    self.thinking_started = True
                    events.append(("response.output_item.added", {
                        "type": "response.output_item.added",
                        "item": {"id": self.reasoning_id, "summary": [], "type": "reasoning", "content": [],
                                 "encrypted_content": "", "status": "in_progress"},
                        "output_index": self._add(self.reasoning_id)}))
                events.append(("response.reasoning_text.delta", {
                    "type": "response.reasoning_text.delta", "delta": d["reasoning_content"],
                    "item_id": self.reasoning_id, "output_index": self.index[self.reasoning_id],
                    "content_index": 0}))
            if d.get("content"):
                if not self.text_started:
                    self.text_started = True
                    events.append(("response.output_item.added", {
                        "type": "response.output_item.added",
                        "item": {"content": [], "id": self.message_id, "role": "assistant",
                                 "status": "in_progress", "type": "message"},
                        "output_index": self._add(self.message_id)}))
                    events.append(("response.content_part.added", {
                        "type": "response.content_part.added", "item_id": self.message_id,
                        "part": {"type": "output_text", "text": ""},
                        "output_index": self.index[self.message_id], "content_index": 0}))
                events.append(("response.output_text.delta", {
                    "type": "response.output_text.delta", "item_id": self.message_id, "delta": d["content"],
                    "output_index": self.index[self.message_id], "content_index": 0}))
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if fn.get("name"):
                    events.append(("response.output_item.added", {
                        "type": "response.output_item.added",
                        "item": {"id": "fc_" + tc["id"], "arguments": "", "call_id": "call_" + tc["id"],
                                 "name": fn["name"], "type": "function_call", "status": "in_progress"},
                        "output_index": self._add("fc_" + tc["id"])}))
                    self.fc_id = tc["id"]
                if fn.get("arguments"):
                    events.append(("response.function_call_arguments.delta", {
                        "type": "response.function_call_arguments.delta", "delta": fn["arguments"],
                        "item_id": "fc_" + self.fc_id, "output_index": self.index.get("fc_" + self.fc_id, 0)}))
        return events

    def _done(self, item: dict[str, Any]) -> Event:
        return "response.output_item.done", {"type": "response.output_item.done", "item": item,
                                             "output_index": self._add(item["id"])}

    def final(self, msg: dict[str, Any], use: dict[str, Any]) -> list[Event]:
        """The `*.done` events and `response.completed` (`to_json_oaicompat_resp_stream`)."""
        events: list[Event] = []
        output: list[dict[str, Any]] = []
        if msg.get("reasoning_content"):
            item = {"id": self.reasoning_id, "summary": [], "type": "reasoning",
                    "content": [{"text": msg["reasoning_content"], "type": "reasoning_text"}],
                    "encrypted_content": ""}
            events.append(self._done(item))
            output.append(item)
        if msg.get("content"):
            n = self._add(self.message_id)
            events.append(("response.output_text.done", {
                "type": "response.output_text.done", "item_id": self.message_id, "text": msg["content"],
                "output_index": n, "content_index": 0}))
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": msg["content"]}
            events.append(("response.content_part.done", {
                "type": "response.content_part.done", "item_id": self.message_id, "part": part,
                "output_index": n, "content_index": 0}))
            item = {"type": "message", "status": "completed", "id": self.message_id, "content": [part],
                    "role": "assistant"}
            events.append(self._done(item))
            output.append(item)
        for tc in msg.get("tool_calls") or []:
            item = _call_item(tc)
            events.append(self._done(item))
            output.append(item)
        events.append(("response.completed", {
            "type": "response.completed",
            "response": {"id": self.resp_id, "object": "response", "created_at": int(time.time()),
                         "status": "completed", "model": self.model, "output": output, "usage": use}}))
        return events
