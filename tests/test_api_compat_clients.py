"""The Responses API, the Anthropic Messages API and the token-counting routes through the official
`openai` and `anthropic` Python clients, unmodified, against a real tritium server (the lesson's
tiny model, the Qwen 2.5 template with --jinja): text, streaming, tool calls with a round trip,
token counting. Greedy decoding makes each route's text comparable with `/v1/chat/completions`
on the same conversation.

Tool calls are forced as in lesson Example 13: the conversation ends with an assistant turn that
starts `<tool_call>` (a prefill) and the tool choice is required, so the grammar makes the tiny
model write a valid call.
"""
from __future__ import annotations

import json

import httpx
import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

GREEDY = {"temperature": 0}
# the lesson's Example 13: the random model closes a tool call as soon as the grammar lets it ("</" and
# <|im_end|> favoured), within 200 tokens of the whitespace b1-0c1e570's tool grammar allows
CLOSE_CALLS = {"logit_bias": {"151645": 100, "522": 100}}
READ_FILE = {"name": "read_file", "description": "Read a file from the workspace",
             "parameters": {"type": "object", "properties": {"path": {"type": "string",
                                                                      "enum": ["pom.xml", "src/Main.java"]}},
                            "required": ["path"]}}


@pytest.fixture(scope="module")
def server(start_server, lesson_model, shared_dir):
    s = start_server("-m", str(lesson_model), "-a", "tiny", "-np", "2", "--jinja",
                     "--chat-template-file", str(shared_dir / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(api_key="unused", base_url=server.url, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def chat(http, messages, **kw) -> dict:
    r = http.post("/v1/chat/completions", json={"messages": messages, **GREEDY, **kw})
    assert r.status_code == 200, r.text
    return r.json()


# ---- OpenAI Responses ---------------------------------------------------------------------

def test_responses_text(oai, http):
    r = oai.responses.create(model="tiny", instructions="Be brief.", input="Say hello", max_output_tokens=8,
                             temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    (item,) = r.output
    assert item.type == "message" and item.id.startswith("msg_") and item.role == "assistant"
    ref = chat(http, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}],
               max_tokens=8)
    assert r.output_text == ref["choices"][0]["message"]["content"] != ""
    assert r.usage.output_tokens == ref["usage"]["completion_tokens"] == 8
    assert r.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.total_tokens == r.usage.input_tokens + 8
    n = oai.responses.input_tokens.count(model="tiny", instructions="Be brief.", input="Say hello")
    assert (n.input_tokens, n.object) == (r.usage.input_tokens, "response.input_tokens")


def test_responses_stream_text(oai):
    kw = {"model": "tiny", "input": [{"role": "user", "content": "Say hello"}], "max_output_tokens": 8,
          "temperature": 0}
    whole = oai.responses.create(**kw).output_text
    with oai.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text == whole
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {final.output[0].id}
    assert final.id == events[0].response.id and final.usage.output_tokens == 8


def test_responses_function_call_round_trip(oai):
    tools = [{"type": "function", **READ_FILE}]
    conv = [{"role": "user", "content": "Show me pom.xml"}]
    prefill = {"type": "message", "role": "assistant", "content": "<tool_call>\n"}
    r = oai.responses.create(model="tiny", input=conv + [prefill], tools=tools, tool_choice="required",
                             parallel_tool_calls=False, max_output_tokens=200, temperature=0, extra_body=CLOSE_CALLS)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "read_file" and call.call_id.startswith("call_") and call.id == "fc_" + call.call_id[5:]
    assert json.loads(call.arguments)["path"] in ("pom.xml", "src/Main.java")

    with oai.responses.stream(model="tiny", input=conv + [prefill], tools=tools, tool_choice="required",
                              parallel_tool_calls=False, max_output_tokens=200, temperature=0,
                              extra_body=CLOSE_CALLS) as s:
        events = list(s)
        final = s.get_final_response()
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[0].item.type == "function_call" and added[0].item.name == "read_file"
    assert any(e.type == "response.function_call_arguments.delta" for e in events)
    (scall,) = [o for o in final.output if o.type == "function_call"]
    assert scall.arguments == call.arguments

    # the call and its output go back; the model answers in text
    follow = conv + [{"type": "function_call", "call_id": call.call_id, "name": call.name,
                      "arguments": call.arguments},
                     {"type": "function_call_output", "call_id": call.call_id, "output": "<project/>"}]
    r2 = oai.responses.create(model="tiny", input=follow, tools=tools, max_output_tokens=6, temperature=0)
    assert r2.status == "completed" and r2.usage.output_tokens > 0
    n = oai.responses.input_tokens.count(model="tiny", input=follow, tools=tools)
    assert n.input_tokens == r2.usage.input_tokens


def test_responses_errors(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="tiny", input="x", previous_response_id="resp_1")
    assert e.value.body["message"] == "llama.cpp does not support 'previous_response_id'."
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="tiny", input=[{"type": "nonsense"}])
    assert e.value.body == {"code": 400, "message": "Cannot determine type of 'item'", "type": "invalid_request_error"}


# ---- Anthropic Messages -------------------------------------------------------------------

def test_messages_text(claude, http):
    conv = [{"role": "user", "content": "Say hello"}]
    m = claude.messages.create(model="tiny", max_tokens=8, system="Be brief.", messages=conv, extra_body=GREEDY)
    assert m.id.startswith("chatcmpl-") and m.type == "message" and m.role == "assistant"
    ref = chat(http, [{"role": "system", "content": "Be brief."}, *conv], max_tokens=8)
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == ref["choices"][0]["message"]["content"]
    assert (m.stop_reason, m.stop_sequence, m.usage.output_tokens) == ("max_tokens", None, 8)
    n = claude.messages.count_tokens(model="tiny", system="Be brief.", messages=conv)
    assert n.input_tokens == ref["usage"]["prompt_tokens"]
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n.input_tokens


def test_messages_stream_text(claude):
    kw = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Count to three"}],
          "extra_body": GREEDY}
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    # the raw events, in llama-server's order
    with httpx.stream("POST", str(claude.base_url) + "/v1/messages", timeout=300,
                      json={"model": "tiny", "max_tokens": 4, "stream": True, "temperature": 0,
                            "messages": [{"role": "user", "content": "Count to three"}]}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    names = [ln[7:] for ln in lines if ln.startswith("event: ")]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}


def test_messages_tool_use_round_trip(claude):
    tools = [{"name": READ_FILE["name"], "description": READ_FILE["description"],
              "input_schema": READ_FILE["parameters"]}]
    conv = [{"role": "user", "content": "Show me pom.xml"}]
    prefill = {"role": "assistant", "content": "<tool_call>\n"}
    # the Messages API passes no logit_bias on (as b1-0c1e570), so the random model keeps adding calls
    # to the block (comma-separated, parallel being the template's default) until max_tokens; the
    # final parse keeps the calls made and the cut one, as b1's does for the same request
    kw = {"model": "tiny", "max_tokens": 120, "tools": tools, "tool_choice": {"type": "any"}, "extra_body": GREEDY}
    m = claude.messages.create(messages=conv + [prefill], **kw)
    assert m.stop_reason == "max_tokens" and len(m.content) >= 2
    assert all(u.type == "tool_use" and u.name == "read_file" and len(u.id) == 32 for u in m.content)
    assert all(u.input["path"] in ("pom.xml", "src/Main.java") for u in m.content[:-1])  # the last one was cut
    assert len({u.id for u in m.content}) == len(m.content)
    use = m.content[0]

    with claude.messages.stream(messages=conv + [prefill], **kw) as s:
        events = list(s)
        final = s.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert [(e.index, e.content_block.type) for e in starts] == [(i, "tool_use") for i in range(len(m.content))]
    assert any(e.type == "input_json" for e in events)
    assert final.stop_reason == "max_tokens" and [u.input for u in final.content] == [u.input for u in m.content]

    # the tool result goes back; the model answers in text
    follow = conv + [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                         "input": use.input}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "<project/>"}]}]
    m2 = claude.messages.create(model="tiny", max_tokens=6, tools=tools, messages=follow, extra_body=GREEDY)
    assert m2.content and m2.content[0].type == "text" and m2.stop_reason in ("end_turn", "max_tokens")
    n = claude.messages.count_tokens(model="tiny", tools=tools, messages=follow)
    assert m2.usage.input_tokens + m2.usage.cache_read_input_tokens == n.input_tokens


def test_messages_errors(claude):
    with pytest.raises(anthropic.InternalServerError) as e:  # llama-server: a runtime_error, so 500
        claude.post("/v1/messages", cast_to=object, body={"model": "tiny", "max_tokens": 4})
    assert e.value.body == {"error": {"code": 500, "message": "'messages' is required", "type": "server_error"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.InternalServerError) as e:
        claude.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert e.value.body["error"]["message"].startswith("image input is not supported - hint: ")


def test_chat_media_parts_are_refused_as_llama_server_does(oai):
    """A model without a multimodal projector: b1-0c1e570 answers a chat request with an image or
    audio part with its runtime_error (500 server_error), checked against the reference binary;
    tritium used to drop the part and answer from the text alone."""
    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    for part, kind in ((img, "image"), (audio, "audio")):
        with pytest.raises(openai.InternalServerError) as e:
            oai.chat.completions.create(model="tiny", max_tokens=2,
                                        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}])
        assert e.value.body == {"code": 500, "type": "server_error",
                                "message": f"{kind} input is not supported - hint: if this is unexpected, "
                                           "you may need to provide the mmproj"}


# ---- token counting -----------------------------------------------------------------------

def test_chat_input_tokens(http):
    body = {"messages": [{"role": "user", "content": "Show me pom.xml"}],
            "tools": [{"type": "function", "function": READ_FILE}]}
    ref = chat(http, body["messages"], tools=body["tools"], max_tokens=1)
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        r = http.post(path, json=body)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json; charset=utf-8"
        assert r.text == '{"input_tokens":%d,"object":"response.input_tokens"}' % ref["usage"]["prompt_tokens"]
    # a Responses function tool becomes a chat tool with "strict": true added, which the template does not
    # print: it sees name, description and parameters only, as llama-server re-serializes tools
    strict = chat(http, body["messages"], tools=[{"type": "function", "function": {**READ_FILE, "strict": True}}],
                  max_tokens=1)["usage"]["prompt_tokens"]
    assert strict == ref["usage"]["prompt_tokens"]
    r = http.post("/responses/input_tokens", json={"input": "Show me pom.xml",
                                                   "tools": [{"type": "function", **READ_FILE}]})
    assert r.json() == {"input_tokens": strict, "object": "response.input_tokens"}
    r = http.post("/v1/chat/completions/input_tokens", json={})
    assert (r.status_code, r.json()["error"]["message"]) == (400, "'messages' is required")


# ---- reasoning models: thinking blocks / reasoning items ---------------------------------

@pytest.fixture(scope="module")
def r1_server(start_server, lesson_model, shared_dir):
    """The DeepSeek R1 template opens `<think>` in the generation prompt: the tiny model's output is
    all reasoning until it writes `</think>` (it does not within a few tokens)."""
    s = start_server("-m", str(lesson_model), "-a", "tiny", "-np", "1", "--jinja", "--chat-template-file",
                     str(shared_dir / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"))
    yield s
    s.stop()


def test_reasoning_as_thinking_blocks_and_reasoning_items(r1_server):
    conv = [{"role": "user", "content": "Is 7 prime?"}]
    ref = httpx.post(r1_server.url + "/v1/chat/completions", timeout=300,
                     json={"messages": conv, "max_tokens": 6, **GREEDY}).json()["choices"][0]["message"]
    assert ref["reasoning_content"] and ref["content"] == ""

    claude = anthropic.Anthropic(api_key="unused", base_url=r1_server.url, max_retries=0, timeout=300)
    m = claude.messages.create(model="tiny", max_tokens=6, messages=conv, extra_body=GREEDY)
    assert [(b.type, b.thinking, b.signature) for b in m.content] == [("thinking", ref["reasoning_content"], "")]
    with claude.messages.stream(model="tiny", max_tokens=6, messages=conv, extra_body=GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    assert final.content[0].thinking == ref["reasoning_content"]
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert set(deltas[:-1]) == {"thinking_delta"} and deltas[-1] == "signature_delta"

    oai = openai.OpenAI(api_key="unused", base_url=r1_server.url + "/v1", max_retries=0, timeout=300)
    r = oai.responses.create(model="tiny", input=conv, max_output_tokens=6, temperature=0)
    (item,) = r.output
    assert item.type == "reasoning" and item.id.startswith("rs_")
    assert item.content[0].text == ref["reasoning_content"] and item.content[0].type == "reasoning_text"
    with oai.responses.stream(model="tiny", input=conv, max_output_tokens=6, temperature=0) as s:
        events = list(s)
        final = s.get_final_response()
    text = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert text == final.output[0].content[0].text == ref["reasoning_content"]
