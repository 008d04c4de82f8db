"""Behaviours llama.cpp's own server tests check (tools/server/tests of b1-0c1e570), pinned here in
process so that they hold without the external suite: `n` > 1 choices, logprobs in the OpenAI shape,
`return_progress` / `timings_per_token` streams, a disconnecting client cancelling its tasks,
metrics semantics, chat request rules and the token count route. The real app and engine on the
tiny model of conftest's `api_engine` (2 slots).
"""
from __future__ import annotations

import asyncio
import json
import math

import pytest

from api.errors import ApiError
from api.results import ClientGone, collect_all
from runtime.tasks import CompletionResult, Timings, TokenOut

MSGS = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


@pytest.fixture(scope="module")
def client(api_engine, api_client):
    with api_client(api_engine, metrics=True) as c:
        yield c


def sse_json(body: bytes) -> list[dict]:
    return [json.loads(p[len("data: "):]) for p in body.decode().split("\n\n")
            if p.startswith("data: ") and p != "data: [DONE]"]


def test_chat_n_choices(client):
    for _ in range(2):  # the second time the slots hold the first request's cache
        r = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4, "n": 2, "id_slot": 0})
        assert r.status_code == 200, r.text
        d = r.json()
        assert [c["index"] for c in d["choices"]] == [0, 1]
        assert all(c["message"]["role"] == "assistant" and c["finish_reason"] == "length" for c in d["choices"])
        assert d["usage"]["completion_tokens"] == 4
    r = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2, "n": 3})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "Field 'n': Value must be between 1 <= value <= 2, but got 3"
    d = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "n": 2, "temperature": 0}).json()
    assert [c["index"] for c in d["choices"]] == [0, 1] and d["choices"][0]["text"] == d["choices"][1]["text"]
    d = client.post("/completion", json={"prompt": ["a", "b"], "n_predict": 1, "n_cmpl": 2}).json()
    assert [x["index"] for x in d] == [0, 1, 2, 3]


def test_extra_choices_leave_their_slot_empty(client, api_engine):
    """llama.cpp's slot release: the slot of one of the `n - 1` extra completions keeps no cache (the
    parent's is enough), so the next request with a similar prompt goes to the parent's slot."""
    d = client.post("/v1/completions", json={"prompt": "The best book", "max_tokens": 2, "n": 2,
                                             "temperature": 0}).json()
    assert len(d["choices"]) == 2
    held = sorted(len(s.tokens) > 0 for s in api_engine.slots)
    assert held == [False, True]  # the parent's slot keeps the prompt, the child's is empty
    parent = next(s.id for s in api_engine.slots if s.tokens)
    d = client.post("/completion", json={"prompt": "The best book, said", "n_predict": 1, "temperature": 0}).json()
    assert d["id_slot"] == parent and d["timings"]["cache_n"] > 0


def test_tools_are_ignored_by_a_template_without_tool_calls(client):
    """b1-0c1e570: a template that cannot render tool calls (here the ChatML fallback of a GGUF
    without one) gets no tool grammar, even for tool_choice required, and its output is content."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    for choice in ("auto", "required"):
        d = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 3, "temperature": 0, "tools": tools,
                                                       "tool_choice": choice, "verbose": True}).json()
        gs = d["__verbose"]["generation_settings"]
        assert gs["grammar"] == "" and gs["grammar_triggers"] == [] and not gs["grammar_lazy"]
        assert "tool_calls" not in d["choices"][0]["message"] and d["choices"][0]["finish_reason"] == "length"


def test_chat_logprobs_openai_shape(client):
    body = {"messages": MSGS, "max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    d = client.post("/v1/chat/completions", json=body).json()
    content = d["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    # the tokens' texts are what each one sent, so that joined they are the message
    assert "".join(t["token"] for t in content) == d["choices"][0]["message"]["content"]
    for t in content:
        assert t["logprob"] <= 0 and t["bytes"] == list(t["token"].encode())
        assert len(t["top_logprobs"]) == 3 and all(p["logprob"] <= 0 for p in t["top_logprobs"])
    chunks = sse_json(client.post("/v1/chat/completions", json={**body, "stream": True}).content)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    text = streamed = ""
    for c in chunks[1:]:
        if c["choices"] and c["choices"][0]["finish_reason"] is None:
            text += c["choices"][0]["delta"].get("content") or ""
            streamed += "".join(t["token"] for t in c["choices"][0]["logprobs"]["content"])
    assert streamed == text == d["choices"][0]["message"]["content"]


def test_return_progress_and_timings_per_token(client):
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    body = {"prompt": prompt, "n_predict": 3, "stream": True, "return_progress": True, "timings_per_token": True,
            "cache_prompt": False}
    chunks = sse_json(client.post("/completion", json=body).content)
    progress = [c for c in chunks if "prompt_progress" in c]
    assert len(progress) >= 2
    first, last = progress[0], progress[-1]
    assert first["prompt_progress"]["processed"] == first["prompt_progress"]["cache"] == 0
    assert first["timings"]["prompt_n"] == 0 and first["timings"]["prompt_ms"] == 0.0
    assert last["prompt_progress"]["processed"] == last["prompt_progress"]["total"] == first["tokens_evaluated"]
    assert last["timings"]["prompt_n"] == last["prompt_progress"]["total"] and last["timings"]["prompt_ms"] > 0
    tokens = [c for c in chunks if "prompt_progress" not in c and not c["stop"]]
    final = [c for c in chunks if "prompt_progress" not in c and c["stop"]]
    assert all("timings" in c for c in tokens + final)
    # one chunk per token as they come; a token whose text is held back (a partial UTF-8 sequence of
    # this random model's vocabulary, as llama-server holds it) arrives with the next token's chunk or
    # the final one instead (sampled tokens: which one is held back, if any, varies from run to run)
    counts = [c["timings"]["predicted_n"] for c in tokens]
    assert counts == sorted(set(counts)) and all(1 <= n <= 3 for n in counts), counts
    assert len(tokens) == len(counts) and final and final[-1]["timings"]["predicted_n"] == 3
    # chat: each progress chunk is a role delta; without return_progress none are sent
    chat = {"messages": MSGS, "max_tokens": 2, "stream": True, "return_progress": True}
    chunks = sse_json(client.post("/v1/chat/completions", json=chat).content)
    prog = [c for c in chunks if "prompt_progress" in c]
    assert prog and all(c["choices"][0]["delta"] == {"role": "assistant", "content": None} for c in prog)
    assert "timings" not in prog[0]
    chunks = sse_json(client.post("/v1/chat/completions", json={**chat, "return_progress": False}).content)
    assert not any("prompt_progress" in c for c in chunks)


def test_metrics_semantics(client):
    def scrape() -> tuple[dict[str, float], dict]:
        r = client.get("/metrics")
        vals = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in r.text.splitlines()
                if ln.startswith("llamacpp:")}
        return vals, r.headers

    before, headers = scrape()
    assert int(headers["process-start-time-unix"]) > 1_600_000_000
    n_processed = n_cached = n_predicted = 0
    for n in (1, 4, 1):
        t = client.post("/completion", json={"prompt": "the quick brown fox", "n_predict": n, "id_slot": 1}).json()
        t = t["timings"]
        n_processed, n_cached, n_predicted = n_processed + t["prompt_n"], n_cached + t["cache_n"], \
            n_predicted + t["predicted_n"]
        if n == 1:  # the first token comes from the prompt's logits: no decode step, no rate
            assert t["predicted_n"] == 1 and t["predicted_per_second"] == 0.0 and t["predicted_per_token_ms"] == 0.0
        else:
            assert t["predicted_per_second"] == pytest.approx(1e3 / t["predicted_ms"] * (n - 1))
    after, _ = scrape()
    assert n_cached > 0  # the same prompt on the same slot
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == n_processed
    assert after["llamacpp:prompt_tokens_cached_total"] - before["llamacpp:prompt_tokens_cached_total"] == n_cached
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == n_predicted
    assert after["llamacpp:requests_processing"] == 0


def test_chat_request_rules_and_token_count(client):
    def err(messages, **extra) -> int:
        return client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, **extra}).status_code

    assert err([{"role": "system", "content": 123}]) == 400
    assert err([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"}]) == 400
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert err(msgs, add_generation_prompt=True, continue_final_message=True) == 400
    assert err(msgs, add_generation_prompt=False, continue_final_message=True) == 200
    d = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 1, "verbose": True}).json()
    assert "Book" in d["__verbose"]["prompt"] and d["__verbose"]["tokens_predicted"] == 1
    assert "__verbose" not in client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 1}).json()
    r = client.post("/v1/chat/completions/input_tokens", json={"messages": MSGS})
    prompt = client.post("/apply-template", json={"messages": MSGS}).json()["prompt"]
    n = len(client.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"])
    assert r.json() == {"input_tokens": n, "object": "response.input_tokens"}


class FakeHandle:
    def __init__(self, events: list | None):
        self.events_list, self.cancelled = events, False

    async def events(self):
        if self.events_list is None:  # a task that never ends
            await asyncio.Event().wait()
        for ev in self.events_list:
            yield ev

    def cancel(self) -> None:
        self.cancelled = True


class FakeRequest:
    def __init__(self, disconnect_after: float | None):
        self.after = disconnect_after

    async def receive(self) -> dict:
        if self.after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.after)
        return {"type": "http.disconnect"}


def test_client_disconnect_cancels_non_streamed_tasks():
    res = CompletionResult("x", [1], 0, "limit", "", False, 1, 1, 2, False, Timings())
    hangs = [FakeHandle(None), FakeHandle(None)]
    with pytest.raises(ClientGone):
        asyncio.run(collect_all(FakeRequest(0.01), hangs))
    assert all(h.cancelled for h in hangs)
    done = FakeHandle([TokenOut(1, "x"), res])
    assert asyncio.run(collect_all(FakeRequest(None), [done])) == [([TokenOut(1, "x")], res)]
    assert isinstance(ClientGone(), ApiError) and not math.isnan(ClientGone().code)


def test_gcp_predict(api_engine, api_client, monkeypatch):
    from api.routes.gcp import gcp_alias

    assert (gcp_alias("/v1/chat/completions"), gcp_alias("/completion"), gcp_alias("/apply-template")) == \
        ("chatCompletions", "completion", "applyTemplate")
    with api_client(api_engine) as c:
        assert c.post("/predict", json={"instances": []}).status_code == 404  # only with AIP_MODE=PREDICTION
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    with api_client(api_engine) as c:
        d = c.post("/predict", json={"instances": [
            {"@requestFormat": "chatCompletions", "max_tokens": 2, "messages": MSGS, "stream": True},
            {"@requestFormat": "/completion", "prompt": "hi", "n_predict": 1},
            {"@requestFormat": "nope"}, 3]}).json()["predictions"]
        assert d[0]["choices"][0]["message"]["role"] == "assistant" and d[1]["tokens_predicted"] == 1
        assert d[2]["error"]["message"] == "no handler registered for @requestFormat: nope"
        assert d[3]["error"]["message"] == "each instance must be a JSON object"
        assert c.post("/predict", json={"x": 1}).status_code == 400


def test_generation_settings_echo_the_reasoning_format(client):
    """b1-0c1e570's default reasoning format prints as "deepseek" in a completion's settings (and a
    chat request's own in its __verbose); /props shows "none" (tests/test_server_lesson.py)."""
    d = client.post("/completion", json={"prompt": "hi", "n_predict": 1}).json()
    assert d["generation_settings"]["reasoning_format"] == "deepseek"
    body = {"messages": MSGS, "max_tokens": 1, "verbose": True}
    d = client.post("/v1/chat/completions", json=body).json()
    assert d["__verbose"]["generation_settings"]["reasoning_format"] == "deepseek"
    d = client.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
    assert d["__verbose"]["generation_settings"]["reasoning_format"] == "none"
