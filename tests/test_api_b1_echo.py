"""What b1-0c1e570 answers that a value-level comparison with it found missing here: a chat request's
`n_probs` (not only `logprobs`) gives logprobs, streamed too, and so do /v1/completions stream chunks;
`tool_choice` that is not a string is "auto" (its json_value default); the debug echo `__verbose`
is on by default under -v (log verbosity > 9), on streams too; chat requests echo the "peg-native"
format with Jinja; probability lists name control tokens "" (no --special); a JSON-schema grammar
continues a prefilled answer. The real app and engine on conftest's tiny model, and one on the same
model with the Qwen2.5 template (tools).
"""
from __future__ import annotations

import json

import pytest

from runtime.serving import Engine, EngineConfig
from runtime.serving.sampling import Vocabulary
from runtime.model.tiny_model import spec_with, write_tiny_model

MSGS = [{"role": "user", "content": "What is the best book"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def sse_json(body: bytes) -> list[dict]:
    return [json.loads(p[len("data: "):]) for p in body.decode().split("\n\n")
            if p.startswith("data: ") and p != "data: [DONE]"]


def _engine(d, **kw) -> Engine:
    path = d / "api-tiny.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=1024,
                                     name="api-tiny", seed=7), vocab="builtin")
    e = Engine(EngineConfig(model_path=str(path), n_ctx=1024, n_parallel=2, verbosity=0, warmup=False, **kw))
    e.load()
    e.start()
    return e


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """conftest's tiny model on an engine of this module's own (the session's api_engine keeps the
    cache state the other modules' tests expect)."""
    e = _engine(tmp_path_factory.mktemp("api-b1-echo"))
    yield e
    e.stop()


@pytest.fixture(scope="module")
def client(engine, api_client):
    with api_client(engine) as c:
        yield c


@pytest.fixture(scope="module")
def verbose_client(engine, api_client):
    with api_client(engine, verbose=True) as c:  # what `-v` (or `-lv 10`) sets
        yield c


def test_chat_n_probs_gives_logprobs(client):
    body = {"messages": MSGS, "max_tokens": 3, "temperature": 0, "n_probs": 2}
    d = client.post("/v1/chat/completions", json=body).json()
    content = d["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(t["top_logprobs"]) == 2 for t in content)
    chunks = sse_json(client.post("/v1/chat/completions", json={**body, "stream": True}).content)
    streamed = [c["choices"][0]["logprobs"]["content"][0] for c in chunks
                if c["choices"] and c["choices"][0].get("logprobs")]
    assert [t["id"] for t in streamed] == [t["id"] for t in content]
    assert "logprobs" not in client.post("/v1/chat/completions", json={**body, "n_probs": 0}).json()["choices"][0]


def test_completions_stream_chunks_carry_logprobs(client):
    body = {"prompt": "The best book", "max_tokens": 3, "temperature": 0, "logprobs": 2}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    chunks = sse_json(client.post("/v1/completions", json={**body, "stream": True}).content)
    streamed = [t for c in chunks for t in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert [t["id"] for t in streamed] == [t["id"] for t in whole]
    assert chunks[-1]["choices"][0]["logprobs"] is None  # the final chunk has none


def test_logprobs_with_tools_and_stream_is_refused(client):
    body = {"messages": MSGS, "max_tokens": 1, "tools": [WEATHER], "logprobs": True, "stream": True}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["message"] == "logprobs is not supported with tools + stream"


def test_verbose_echo_follows_the_log_verbosity(client, verbose_client):
    body = {"messages": MSGS, "max_tokens": 2, "temperature": 0}
    assert "__verbose" not in client.post("/v1/chat/completions", json=body).json()
    d = verbose_client.post("/v1/chat/completions", json=body).json()
    v = d["__verbose"]
    assert v["content"] == d["choices"][0]["message"]["content"] and v["tokens_predicted"] == 2
    assert v["generation_settings"]["chat_format"] == "peg-native"  # with Jinja, as b1-0c1e570
    assert "__verbose" not in verbose_client.post("/v1/chat/completions", json={**body, "verbose": False}).json()
    # streamed chat: on the first chunk of the final ones, without content or tokens (they were streamed)
    chunks = sse_json(verbose_client.post("/v1/chat/completions", json={**body, "stream": True}).content)
    tagged = [c for c in chunks if "__verbose" in c]
    assert len(tagged) == 1 and tagged[0]["__verbose"]["content"] == "" and tagged[0]["__verbose"]["stop"] is True
    # /v1/completions: every streamed chunk, each with its token's native partial
    body = {"prompt": "The best book", "max_tokens": 3, "temperature": 0}
    whole = verbose_client.post("/v1/completions", json=body).json()
    assert whole["__verbose"]["tokens_predicted"] == 3
    chunks = sse_json(verbose_client.post("/v1/completions", json={**body, "stream": True}).content)
    partials = [c["__verbose"] for c in chunks[:-1]]
    assert [p["tokens_predicted"] for p in partials] == list(range(1, len(partials) + 1))
    assert "".join(p["content"] for p in partials) == whole["choices"][0]["text"]
    assert chunks[-1]["__verbose"]["stop"] is True and chunks[-1]["__verbose"]["content"] == ""
    # a native completion's settings name no chat format
    d = verbose_client.post("/completion", json={"prompt": "hi", "n_predict": 1}).json()
    assert d["generation_settings"]["chat_format"] == "Content-only"


def test_control_tokens_are_listed_without_text(engine):
    tok = engine.tokenizer
    eos = tok.eos_id
    assert tok.is_control(eos) and tok.piece(eos) != b""
    vocab = Vocabulary(tok, frozenset(tok.eot_ids), set(tok.control_ids()))
    p = vocab.token_prob(eos, -1.5)
    assert (p.id, p.token, p.bytes, p.logprob) == (eos, "", [], -1.5)


@pytest.fixture(scope="module")
def qwen_client(tmp_path_factory, shared_dir, api_client):
    """The tiny model with the Qwen2.5 template (Hermes tool calls), two slots."""
    e = _engine(tmp_path_factory.mktemp("api-qwen-template"),
                chat_template_file=str(shared_dir / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"))
    try:
        with api_client(e) as c:
            yield c
    finally:
        e.stop()


def test_tool_choice_object_is_auto(qwen_client):
    """b1-0c1e570 reads tool_choice as a string: an object naming a function is its default "auto"
    (a lazy grammar, free to answer in text), not "required"."""
    base = {"messages": MSGS, "max_tokens": 2, "temperature": 0, "tools": [WEATHER], "verbose": True}

    def settings(**extra) -> dict:
        r = qwen_client.post("/v1/chat/completions", json={**base, **extra})
        assert r.status_code == 200, r.text
        return r.json()["__verbose"]["generation_settings"]

    auto = settings(tool_choice="auto")
    assert auto["grammar_lazy"] is True and auto["grammar"]
    named = settings(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (named["grammar"], named["grammar_lazy"]) == (auto["grammar"], True)
    required = settings(tool_choice="required")
    assert required["grammar_lazy"] is False and required["grammar"] != auto["grammar"]
    r = qwen_client.post("/v1/chat/completions", json={**base, "tool_choice": "sometimes"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid tool_choice: sometimes"


def test_tool_choice_needs_jinja(engine, api_client):
    with api_client(engine, jinja=False) as c:
        r = c.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 1, "tool_choice": "none"})
        assert r.status_code == 400 and r.json()["error"]["message"] == "tool_choice param requires --jinja flag"
        d = c.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 1, "verbose": True}).json()
        assert d["__verbose"]["generation_settings"]["chat_format"] == "Content-only"
        assert c.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 1,
                                                    "tool_choice": {"type": "function"}}).status_code == 200


def test_json_schema_grammar_continues_a_prefilled_answer(qwen_client):
    """b1-0c1e570 primes a chat request's JSON-schema grammar with the prefilled assistant turn: the
    model continues the JSON begun there, and the content is the whole JSON (prefill included)."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    body = {"messages": MSGS + [{"role": "assistant", "content": '{"name": "'}], "max_tokens": 60, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}
    d = qwen_client.post("/v1/chat/completions", json=body).json()
    content = d["choices"][0]["message"]["content"]
    assert content.startswith('{"name": "'), content
    obj = json.loads(content)
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


def test_stream_partials_follow_llama_servers_process_token(client):
    """b1-0c1e570 streams a partial for every token except one that leaves an incomplete UTF-8
    character (nor does it list that token's probabilities), with "" while text is held back as a
    possible stop word, and for the end-of-generation token; `tokens_predicted` counts every token.
    Here the grammar spells a 4-byte character that this vocabulary only has as byte tokens."""
    body = {"prompt": "The best book", "n_predict": 12, "temperature": 0, "n_probs": 1,
            "grammar": 'root ::= "\U0001D11E\U0001D11E end"'}
    whole = client.post("/completion", json=body).json()
    assert whole["content"] == "\U0001D11E\U0001D11E end" and whole["stop_type"] == "eos"
    n = whole["tokens_predicted"]  # 8 byte tokens, " ", "end", the end of generation
    listed = [p["token"] for p in whole["completion_probabilities"]]
    assert n >= 10 and len(listed) == n - 6 and listed[:2] == ["\U0001D11E", "\U0001D11E"]
    chunks = sse_json(client.post("/completion", json={**body, "stream": True}).content)
    partials, final = chunks[:-1], chunks[-1]
    assert final["stop"] is True and final["tokens_predicted"] == n
    assert [p["content"] for p in partials[:2]] == ["\U0001D11E", "\U0001D11E"]
    assert [p["tokens_predicted"] for p in partials[:2]] == [4, 8]  # the 3 byte tokens before each: not sent
    assert len(partials) == n - 6 and all(len(p["completion_probabilities"]) == 1 for p in partials)
    assert partials[-1]["content"] == "" and partials[-1]["tokens_predicted"] == n  # the end-of-generation token
    # a possible stop word holds text back: its tokens still stream, with ""
    body = {"prompt": "The best book", "n_predict": 40, "temperature": 0, "grammar": 'root ::= "a b c d e f"',
            "stop": [" c d e X"], "stream": True}
    *partials, final = sse_json(client.post("/completion", json=body).content)
    assert [p["tokens_predicted"] for p in partials] == list(range(1, final["tokens_predicted"] + 1))
    assert "".join(p["content"] for p in partials) == "a b c d e f"
    assert any(p["content"] == "" for p in partials[:-1])
