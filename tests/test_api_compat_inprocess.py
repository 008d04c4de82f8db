"""The Responses and Anthropic Messages routes in process (conftest's `api_engine` and `api_client`,
no server process): the official clients' headers (`x-api-key`, `anthropic-version`, Bearer keys),
errors inside a stream in each API's framing, and llama-server's telemetry on the Responses stream
(`return_progress`, `timings_per_token`)."""
from __future__ import annotations

import json

import pytest

from tests.test_api_inprocess import error_second, scripted

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MSG = {"model": "x", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}


def named_events(body: bytes) -> list[tuple[str, dict]]:
    """`event: NAME\\ndata: JSON\\n\\n` blocks, checking the framing."""
    assert body.endswith(b"\n\n")
    out = []
    for block in body.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        out.append((name[7:], json.loads(data[6:])))
    return out


def test_official_clients_send_their_keys(api_engine, api_client):
    with api_client(api_engine, api_keys=["k1"]) as c:
        claude = anthropic.Anthropic(api_key="k1", base_url=str(c.base_url), http_client=c, max_retries=0)
        m = claude.messages.create(model="x", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert m.type == "message" and m.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(api_key="nope", base_url=str(c.base_url), http_client=c, max_retries=0).messages.create(
                model="x", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert e.value.body == {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
        r = c.post("/v1/messages/count_tokens", json=MSG, headers={"x-api-key": "k1", "anthropic-version": "2023-06-01",
                                                                   "anthropic-beta": "token-counting-2024-11-01"})
        assert r.status_code == 200 and set(r.json()) == {"input_tokens"}
        oai = openai.OpenAI(api_key="k1", base_url=str(c.base_url) + "/v1", http_client=c, max_retries=0)
        assert oai.responses.create(model="x", input="hi", max_output_tokens=2).usage.output_tokens == 2


def test_anthropic_stream_error_is_an_error_event(api_engine, api_client):
    with scripted(api_client, api_engine, error_second, 30) as c:
        r = c.post("/v1/messages", json={**MSG, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = named_events(r.content)
    assert evs[0][0] == "message_start"
    assert evs[-1] == ("error", {"code": 500, "message": "lost it", "type": "server_error"})


def test_responses_stream_error_is_a_data_event(api_engine, api_client):
    with scripted(api_client, api_engine, error_second, 30) as c:
        r = c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 3, "stream": True})
    blocks = r.content.decode().split("\n\n")[:-1]
    assert blocks[0].startswith("event: response.created\n")
    assert blocks[-1] == 'data: {"error":{"code":500,"message":"lost it","type":"server_error"}}'


def test_responses_stream_telemetry(api_engine, api_client):
    """llama.cpp's test_responses_stream_with_llama_telemetry, on the in-process engine."""
    body = {"input": "This is a test" * 10, "max_output_tokens": 4, "temperature": 0.8, "stream": True,
            "timings_per_token": True, "return_progress": True}
    with api_client(api_engine) as c:
        evs = named_events(c.post("/responses", json=body).content)
    progress = [d for _, d in evs if "prompt_progress" in d]
    assert progress and all(d["type"] == "response.in_progress" for d in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"] > 0
    assert all(d["prompt_progress"]["processed"] >= d["prompt_progress"]["cache"] for d in progress)
    assert [n for n, _ in evs[:2]] == ["response.created", "response.in_progress"]
    deltas = [d for n, d in evs if n == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in d["timings"] for d in deltas)
    name, done = evs[-1]
    assert name == "response.completed" and done["response"]["usage"]["output_tokens"] == 4
    assert done["timings"]["predicted_n"] == 4
    # without the flags: no telemetry but on the last event
    with api_client(api_engine) as c:
        evs = named_events(c.post("/responses", json={**body, "timings_per_token": False,
                                                      "return_progress": False}).content)
    assert [n for n, d in evs if "timings" in d or "prompt_progress" in d] == ["response.completed"]

