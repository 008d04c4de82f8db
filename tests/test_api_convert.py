"""The request and event conversions of the Responses and Anthropic Messages APIs
(api/convert_responses.py, api/convert_anthropic.py), checked against what llama-server
b1-0c1e570's `server_chat_convert_responses_to_chatcmpl` / `server_chat_convert_anthropic_to_oai`
and its `to_json_oaicompat_resp*` / `to_json_anthropic*` produce for the same input (read off
tools/server/server-chat.cpp and server-task.cpp)."""
from __future__ import annotations

import pytest

from api.convert_anthropic import AnthropicStream, anthropic_to_chat, message_json, normalize_billing_header
from api.convert_responses import ResponsesStream, response_json, responses_to_chat, usage
from api.errors import ApiError


# ---- Responses -> chat ----------------------------------------------------------------------

def test_responses_string_input_and_fields():
    body = {"model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 7, "temperature": 0.5,
            "reasoning": {"effort": "low", "summary": "auto"}, "stream": True, "text": {"format": {"type": "text"}}}
    assert responses_to_chat(body) == {
        "model": "m", "temperature": 0.5, "stream": True, "text": {"format": {"type": "text"}},
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 7, "reasoning_effort": "low"}


def test_responses_items_round_trip():
    items = [
        {"role": "developer", "content": "sys"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
         "content": [{"type": "output_text", "text": "let me see", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get", "arguments": "{\"a\":1}", "id": "fc_1"},
        {"type": "function_call", "call_id": "call_2", "name": "get", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "t"}, {"type": "input_image", "image_url": "data:x"}]},
    ]
    msgs = responses_to_chat({"input": items})["messages"]
    assert msgs == [
        {"role": "developer", "content": [{"text": "sys", "type": "text"}]},
        {"role": "user", "content": [{"text": "weather?", "type": "text"}]},
        {"role": "assistant", "content": [{"text": "let me see", "type": "text"}], "reasoning_content": "think",
         "tool_calls": [{"function": {"arguments": "{\"a\":1}", "name": "get"}, "id": "call_1", "type": "function"},
                        {"function": {"arguments": "{}", "name": "get"}, "id": "call_2", "type": "function"}]},
        {"content": "sunny", "role": "tool", "tool_call_id": "call_1"},
        {"content": [{"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "data:x"}}],
         "role": "tool", "tool_call_id": "call_2"},
    ]
    assert items[1]["type"] == "message"  # the request itself is not modified


def test_responses_tools():
    body = {"input": "x", "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
        {"type": "web_search"},
        {"type": "function", "name": "g", "strict": False}]}
    assert responses_to_chat(body)["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}},
        {"type": "function", "function": {"name": "g", "strict": False}}]
    assert "tools" not in responses_to_chat({"input": "x", "tools": [{"type": "file_search"}]})


@pytest.mark.parametrize("body, message", [
    ({}, "'input' is required"),
    ({"input": 3}, "'input' must be a string or array of objects"),
    ({"input": "x", "previous_response_id": "resp_1"}, "llama.cpp does not support 'previous_response_id'."),
    ({"input": [{"foo": 1}]}, "Cannot determine type of 'item'"),
    ({"input": ["text"]}, "Cannot determine type of 'item'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "'input_file' is not supported by llamacpp at this moment"),
    ({"input": [{"role": "user", "content": [{"type": "bogus"}]}]},
     "'type' must be one of 'input_text', 'input_image', or 'input_file'"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "'Input text' requires 'text'"),
    ({"input": [{"type": "message", "role": "assistant", "content": [{"type": "x"}]}]},
     "'type' must be one of 'output_text' or 'refusal'"),
    ({"input": [{"type": "reasoning", "summary": [], "content": []}]}, "item['content'] is empty"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"text": "x"}]}]},
     "Output of tool call missing 'type' field"),
    ({"input": "x", "tools": {}}, "'tools' must be an array of objects"),
])
def test_responses_errors(body, message):
    with pytest.raises(ApiError) as e:
        responses_to_chat(body)
    assert (e.value.message, e.value.code, e.value.type) == (message, 400, "invalid_request_error")


# ---- chat output -> Responses -------------------------------------------------------------

def test_response_json():
    msg = {"role": "assistant", "content": "hello", "reasoning_content": "hmm",
           "tool_calls": [{"id": "abc", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    d = response_json(msg, "resp_X", "tiny", usage(10, 3, 4))
    assert list(d) == ["completed_at", "created_at", "id", "model", "object", "output", "status", "usage"]
    assert d["usage"] == {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13,
                          "input_tokens_details": {"cached_tokens": 4}}
    rs, m, fc = d["output"]
    assert rs["id"].startswith("rs_") and rs["content"] == [{"text": "hmm", "type": "reasoning_text"}]
    assert m["id"].startswith("msg_") and m["content"][0] == {"type": "output_text", "annotations": [],
                                                              "logprobs": [], "text": "hello"}
    assert fc == {"id": "fc_abc", "type": "function_call", "status": "completed", "arguments": "{}",
                  "call_id": "call_abc", "name": "f"}


def test_responses_stream_events():
    rs = ResponsesStream("tiny")
    ev = rs.begin() + rs.deltas([{"content": "he"}])
    assert [n for n, _ in ev] == ["response.created", "response.in_progress", "response.output_item.added",
                                  "response.content_part.added", "response.output_text.delta"]
    assert ev[0][1] == {"type": "response.created",
                        "response": {"id": rs.resp_id, "object": "response", "status": "in_progress"}}
    assert ev[4][1] == {"type": "response.output_text.delta", "item_id": rs.message_id, "delta": "he",
                        "output_index": 0, "content_index": 0}
    ev = rs.begin() + rs.deltas([{"content": "llo"},
                                 {"tool_calls": [{"index": 0, "id": "k", "type": "function",
                                                  "function": {"name": "f", "arguments": "{\"a\""}}]},
                                 {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}])
    assert [n for n, _ in ev] == ["response.output_text.delta", "response.output_item.added",
                                  "response.function_call_arguments.delta", "response.function_call_arguments.delta"]
    assert ev[1][1]["item"] == {"id": "fc_k", "arguments": "", "call_id": "call_k", "name": "f",
                                "type": "function_call", "status": "in_progress"}
    assert ev[3][1] == {"type": "response.function_call_arguments.delta", "delta": ":1}", "item_id": "fc_k",
                        "output_index": 1}
    msg = {"role": "assistant", "content": "hello",
           "tool_calls": [{"id": "k", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}
    ev = rs.final(msg, usage(5, 4, 0))
    assert [n for n, _ in ev] == ["response.output_text.done", "response.content_part.done",
                                  "response.output_item.done", "response.output_item.done", "response.completed"]
    assert [d.get("output_index") for _, d in ev] == [0, 0, 0, 1, None]
    done = ev[-1][1]["response"]
    assert done["id"] == rs.resp_id and done["status"] == "completed" and len(done["output"]) == 2
    assert rs.begin() == []
    assert rs.begin(progress=True) == [("response.in_progress", {
        "type": "response.in_progress", "response": {"id": rs.resp_id, "object": "response", "status": "in_progress"}})]


# ---- Anthropic -> chat --------------------------------------------------------------------

def test_anthropic_request():
    body = {"model": "claude", "max_tokens": 20,
            "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "stop_sequences": ["END"], "temperature": 0.1, "top_k": 5, "stream": True, "seed": 3,
            "thinking": {"type": "enabled", "budget_tokens": 64}, "metadata": {"user_id": "u"},
            "tool_choice": {"type": "any"},
            "tools": [{"name": "get", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "tu1", "name": "get", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "sun"},
                                                                               {"type": "text", "text": "ny"}]},
                    {"type": "tool_result", "tool_use_id": "tu2", "is_error": True},
                    {"type": "text", "text": "thanks"}]},
                {"role": "assistant"}]}
    assert anthropic_to_chat(body) == {
        "messages": [
            {"role": "system", "content": "ab"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}],
             "tool_calls": [{"id": "tu1", "type": "function",
                             "function": {"name": "get", "arguments": "{\"city\":\"Paris\"}"}}],
             "reasoning_content": "t"},
            {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
            {"role": "tool", "tool_call_id": "tu1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "tu2", "content": ""}],
        "tools": [{"type": "function",
                   "function": {"name": "get", "description": "", "parameters": {"type": "object"}}}],
        "tool_choice": "required", "stop": ["END"], "max_tokens": 20, "temperature": 0.1, "top_k": 5, "stream": True,
        "thinking_budget_tokens": 64, "__metadata_user_id": "u"}


def test_anthropic_request_defaults_and_images():
    out = anthropic_to_chat({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}},
        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}], "tool_choice": {"type": "none"}})
    assert out == {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}], "max_tokens": 4096}
    with pytest.raises(ApiError) as e:
        anthropic_to_chat({"max_tokens": 5})
    assert (e.value.code, e.value.type, e.value.message) == (500, "server_error", "'messages' is required")


def test_billing_header():
    s = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are Claude Code"
    assert normalize_billing_header(s) == "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are Claude Code"
    assert normalize_billing_header("plain cch=a5145;") == "plain cch=a5145;"


# ---- chat output -> Anthropic -------------------------------------------------------------

def test_message_json():
    msg = {"role": "assistant", "content": "hi", "reasoning_content": "r",
           "tool_calls": [{"id": "abc", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                          {"id": "def", "type": "function", "function": {"name": "g", "arguments": "{bad"}}]}
    d = message_json(msg, "chatcmpl-1", "tiny", "eos", "", {"cache_read_input_tokens": 2, "input_tokens": 8,
                                                            "output_tokens": 5})
    assert d == {"id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [
        {"type": "thinking", "thinking": "r", "signature": ""}, {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "abc", "name": "f", "input": {"x": 1}},
        {"type": "tool_use", "id": "def", "name": "g", "input": {}}],
        "model": "tiny", "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"cache_read_input_tokens": 2, "input_tokens": 8, "output_tokens": 5}}
    d = message_json({"content": "x"}, "i", "m", "word", "END", {})
    assert (d["stop_reason"], d["stop_sequence"]) == ("end_turn", "END")
    assert message_json({"content": "x"}, "i", "m", "limit", "", {})["stop_reason"] == "max_tokens"


def test_anthropic_stream_blocks():
    st = AnthropicStream("chatcmpl-1", "tiny")
    ev = st.message_start(12, 4) + st.deltas([{"reasoning_content": "hm"}])
    ev += st.message_start(12, 4)  # once
    ev += st.deltas([{"content": "A"}, {"tool_calls": [{"index": 0, "id": "k", "type": "function",
                                                         "function": {"name": "f", "arguments": "{\"a\""}}]}])
    last = [{"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}]
    msg = {"content": "A", "reasoning_content": "hm",
           "tool_calls": [{"id": "k", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}
    ev += st.final(last, msg, "eos", "", 7)
    seq = [(n, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type")) for n, d in ev]
    assert seq == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_stop", 1, None), ("content_block_stop", 2, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert ev[0][1]["message"]["usage"] == {"cache_read_input_tokens": 4, "input_tokens": 8, "output_tokens": 0}
    assert ev[5][1]["content_block"] == {"type": "tool_use", "id": "k", "name": "f"}
    assert ev[-2][1] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                         "usage": {"output_tokens": 7}}
