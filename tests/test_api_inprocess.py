"""The API in process: the real app (`api.server.create_app`) on a real engine and a tiny generated
model (conftest's `api_engine`), driven through FastAPI's TestClient without a server subprocess.
Covers readiness, auth, CORS, the error envelope, the route families and the SSE layer (framing,
pings, errors before and after the first event); api/engine_api.py's protocol is checked against
the real Engine.
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any, AsyncIterator, Callable

import pytest
from fastapi.testclient import TestClient

from api.engine_api import EngineAPI
from api.server import ServerConfig, create_app
from runtime.tasks import TaskError, TokenOut

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def client(api_engine, api_client):
    with api_client(api_engine, metrics=True) as c:
        yield c


def events(body: bytes) -> list[str]:
    """The SSE events of a stream body, checking llama-server's framing: `data: ...` + blank line."""
    assert body.endswith(b"\n\n")
    parts = body.decode().split("\n\n")[:-1]
    for p in parts:
        assert p.startswith("data: ") and "\n" not in p, p
    return [p[len("data: "):] for p in parts]


def test_engine_has_every_member_of_the_protocol(api_engine):
    assert isinstance(api_engine, EngineAPI)
    for name in ("submit", "slots_info", "slot_action", "metrics", "idle_slot_available", "tokenizer",
                 "chat_template", "model_info", "n_slots", "n_ctx_slot", "cfg", "stop"):
        assert hasattr(api_engine, name), name
    assert isinstance(api_engine.cfg.n_batch, int)


def test_loading_then_ready(api_engine):
    app = create_app(ServerConfig(), None)
    with TestClient(app) as c:
        r = c.get("/health")
        assert (r.status_code, r.text) == (503, '{"error":{"message":"Loading model","type":"unavailable_error",'
                                                '"code":503}}')
        assert r.headers["server"] == "llama.cpp"
        app.state.server.engine = api_engine
        app.state.server.set_ready()
        r = c.get("/health")
        assert (r.status_code, r.text) == (200, '{"status":"ok"}')
        assert r.headers["content-type"] == "application/json; charset=utf-8"


def test_models_and_props(client, api_engine):
    n_ctx = api_engine.n_ctx_slot
    d = client.get("/v1/models").json()
    assert d["object"] == "list" and d["data"][0]["id"] == "api-tiny.gguf"
    assert d["data"][0]["meta"]["n_ctx"] == n_ctx
    assert d["data"][0]["meta"]["n_vocab"] == api_engine.tokenizer.n_vocab
    assert client.get("/models").json()["models"][0]["name"] == "api-tiny.gguf"
    p = client.get("/props").json()
    assert p["total_slots"] == 2 and p["default_generation_settings"]["n_ctx"] == n_ctx
    assert p["endpoint_metrics"] is True and p["endpoint_props"] is False
    assert p["chat_template"] == api_engine.chat_template.source


def test_media_marker_is_drawn_once_per_app(client, api_engine, api_client):
    first = client.get("/props").json()["media_marker"]
    assert re.fullmatch(r"<__media_[A-Za-z0-9]{32}__>", first)
    assert client.get("/props").json()["media_marker"] == first
    with api_client(api_engine) as other:
        assert other.get("/props").json()["media_marker"] != first


def test_tokenize_detokenize_round_trip(client):
    text = "hello world <|im_start|>"
    toks = client.post("/tokenize", json={"content": text}).json()["tokens"]
    assert toks and all(isinstance(t, int) for t in toks)
    pieces = client.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == toks and "".join(p["piece"] for p in pieces) == text
    assert client.post("/detokenize", json={"tokens": toks}).json() == {"content": text}
    r = client.post("/detokenize", json={"tokens": [-1]})
    assert (r.status_code, r.text) == (400, '{"error":{"code":400,"message":"invalid token id -1",'
                                            '"type":"invalid_request_error"}}')


def test_short_completion(client):
    d = client.post("/completion", json={"prompt": "hello", "n_predict": 4, "temperature": 0}).json()
    assert (d["tokens_predicted"], d["stop_type"], d["stop"], d["model"]) == (4, "limit", True, "api-tiny.gguf")
    again = client.post("/completion", json={"prompt": "hello", "n_predict": 4, "temperature": 0}).json()
    assert again["content"] == d["content"]
    o = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0}).json()
    assert o["choices"][0]["text"] == d["content"] and o["usage"]["completion_tokens"] == 4


def test_streamed_completion_chunks(client):
    r = client.post("/completion", json={"prompt": "hello", "n_predict": 3, "temperature": 0, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert (r.headers["cache-control"], r.headers["x-accel-buffering"]) == ("no-cache", "no")
    chunks = [json.loads(e) for e in events(r.content)]
    assert chunks[-1]["stop"] is True and chunks[-1]["content"] == ""
    assert [c["tokens_predicted"] for c in chunks[:-1]] == list(range(1, len(chunks)))


def test_streamed_chat(client):
    body = dict(CHAT, max_tokens=4, stream_options={"include_usage": True})
    evs = events(client.post("/v1/chat/completions", json=body).content)
    assert evs[-1] == "[DONE]"
    chunks = [json.loads(e) for e in evs[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    whole = client.post("/v1/chat/completions", json=dict(body, stream=False)).json()
    assert whole["choices"][0]["message"]["content"] == text


def test_error_envelopes(client, api_engine):
    r = client.post("/completion", content=b"{bad")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert r.json()["error"]["message"].startswith("[json.exception.parse_error.101]")
    r = client.get("/no-such-route")
    assert (r.status_code, r.text) == (404, '{"error":{"message":"File Not Found","type":"not_found_error",'
                                            '"code":404}}')
    assert client.post("/health").status_code == 404  # a known path with the wrong method too
    r = client.post("/completion", json={"prompt": "x " * 300})
    err = r.json()["error"]
    assert (r.status_code, err["type"], err["n_ctx"]) == (400, "exceed_context_size_error", api_engine.n_ctx_slot)
    assert list(err) == ["code", "message", "type", "n_prompt_tokens", "n_ctx"]
    r = client.post("/completion", json={"prompt": "x " * 300, "stream": True})
    assert r.status_code == 400 and not r.headers["content-type"].startswith("text/event-stream")
    r = client.post("/v1/embeddings", json={"input": "x"})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


ELEMENTS = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
            'or a list of mixed strings & tokens.')


# (route, body, status, error type, message): what llama-server b1-0c1e570 answered, asked the same
# (the reference from scripts/build_llama_server.sh, 2026-12-05)
@pytest.mark.parametrize("route,body,status,kind,message", [
    ("/completion", {"n_predict": 1}, 400, "invalid_request_error",
     "[json.exception.out_of_range.403] key 'prompt' not found"),
    ("/completion", {"prompt": None}, 400, "invalid_request_error", ELEMENTS),
    ("/completion", {"prompt": 5}, 400, "invalid_request_error", ELEMENTS),
    ("/completion", {"prompt": ["a", 1.5]}, 400, "invalid_request_error", ELEMENTS),
    ("/completion", {"prompt": [[1, 2], None]}, 400, "invalid_request_error", ELEMENTS),
    ("/completion", {"prompt": ["a", 1, None]}, 400, "invalid_request_error",
     "[json.exception.type_error.302] type must be number, but is null"),
    ("/completion", {"prompt": [1, -5]}, 400, "invalid_request_error", "Prompt contains invalid tokens"),
    ("/completion", {"prompt": [1, 999999999]}, 400, "invalid_request_error", "Prompt contains invalid tokens"),
    ("/completion", {"prompt": []}, 400, "invalid_request_error", '"prompt" must not be empty'),
    ("/tokenize", {"content": 5}, 500, "server_error", "[json.exception.type_error.302] type must be string, but is number"),
    ("/tokenize", {"content": None}, 500, "server_error", "[json.exception.type_error.302] type must be string, but is null"),
    ("/tokenize", {"content": ["a", 1, None]}, 500, "server_error",
     "[json.exception.type_error.302] type must be number, but is null"),
])
def test_prompt_shapes_are_refused_as_llama_server_refuses_them(client, route, body, status, kind, message):
    r = client.post(route, json=body)
    assert (r.status_code, r.json()) == (status, {"error": {"code": status, "message": message, "type": kind}})


def test_prompt_lists_mix_ids_as_llama_server_does(client):
    hello = client.post("/tokenize", json={"content": "hello"}).json()["tokens"]
    # ids pass through /tokenize as given (even outside the vocabulary), true / 1.7 convert to 1
    r = client.post("/tokenize", json={"content": ["hello", -5, True, 1.7]})
    assert r.json() == {"tokens": hello + [-5, 1, 1]}
    r = client.post("/tokenize", json={"content": [-5], "with_pieces": True})
    assert r.status_code == 500 and r.json()["error"]["message"].startswith("vector::_M_range_check: __n (which is "
                                                                           "18446744073709551611)")
    # a list with a string and an integer is one prompt: strings tokenized, other elements as ids
    d = client.post("/completion", json={"prompt": ["hello", 1, True], "n_predict": 1, "temperature": 0}).json()
    bos = client.post("/tokenize", json={"content": "hello", "add_special": True}).json()["tokens"]
    assert d["tokens_evaluated"] == len(bos) + 2
    # a list without integers is one prompt per element
    r = client.post("/completion", json={"prompt": ["hello", [1, 2]], "n_predict": 1, "temperature": 0})
    assert [x["index"] for x in r.json()] == [0, 1]


def _stream_lines(body: bytes) -> list[Any]:
    """The data of each SSE event: parsed JSON, or the raw text ([DONE])."""
    out = []
    for e in events(body):
        out.append(e if e == "[DONE]" else json.loads(e))
    return out


def test_several_prompts_and_choices_stream_side_by_side(client):
    """As b1-0c1e570: every task streams its chunks (interleaved, each with its index) and its final
    object; each prompt after the first announces itself with `data: null`; children do not."""
    body = {"prompt": ["one two", "three four"], "n_predict": 3, "temperature": 0, "n_cmpl": 2}
    whole = client.post("/completion", json=body).json()
    assert [d["index"] for d in whole] == [0, 1, 2, 3]
    got = _stream_lines(client.post("/completion", json=dict(body, stream=True)).content)
    assert got.count(None) == 1
    chunks = [d for d in got if d is not None]
    for i in range(4):
        mine = [d for d in chunks if d["index"] == i]
        assert [d["stop"] for d in mine] == [False] * (len(mine) - 1) + [True]
        assert "".join(d["content"] for d in mine) == whole[i]["content"]
    assert got.index(None) < min(k for k, d in enumerate(got) if d is not None and d["index"] == 2)


def test_v1_completions_take_several_prompts(client):
    body = {"prompt": ["one two", "three four"], "max_tokens": 3, "temperature": 0, "n": 2}
    d = client.post("/v1/completions", json=body).json()
    texts = [c["text"] for c in d["choices"]]
    assert [c["index"] for c in d["choices"]] == [0, 1, 2, 3] and texts[0] == texts[1] and texts[2] == texts[3]
    first, second = (client.post("/v1/completions", json=dict(body, prompt=p, n=1)).json() for p in body["prompt"])
    assert (first["choices"][0]["text"], second["choices"][0]["text"]) == (texts[0], texts[2])
    assert d["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]  # the first task's usage
    got = _stream_lines(client.post("/v1/completions", json=dict(body, stream=True)).content)
    assert got[-1] == "[DONE]" and got.count("[DONE]") == 1 and got.count(None) == 1
    chunks = [c for c in got if isinstance(c, dict)]
    for i in range(4):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == texts[i] and mine[-1]["finish_reason"] == "length"


def test_chat_streams_n_choices(client):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "n": 2}
    whole = client.post("/v1/chat/completions", json=body).json()
    got = _stream_lines(client.post("/v1/chat/completions", json=dict(body, stream=True)).content)
    assert got[-1] == "[DONE]" and got.count("[DONE]") == 1
    for i in range(2):
        mine = [c["choices"][0] for c in got[:-1] if c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": None}
        assert mine[-1]["finish_reason"] == "length" and mine[-1]["delta"] == {}
        text = "".join(c["delta"].get("content") or "" for c in mine)
        assert text == whole["choices"][i]["message"]["content"]


def test_api_key_and_cors(api_engine, api_client):
    with api_client(api_engine, api_keys=["k1"], cors_origins="https://ok.example") as c:
        r = c.get("/v1/models")
        assert (r.status_code, r.text) == (401, '{"error":{"message":"Invalid API Key",'
                                                '"type":"authentication_error","code":401}}')
        assert c.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
        assert c.get("/v1/models", headers={"X-Api-Key": "k1"}).status_code == 200
        assert c.get("/health").status_code == 200  # public
        # a preflight needs no key; an explicit --cors-origins is sent as it is, whatever the Origin
        r = c.options("/v1/chat/completions", headers={"Origin": "https://ok.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ok.example"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["access-control-allow-headers"] == "*"
        assert r.headers["access-control-allow-credentials"] == "true"
        r = c.get("/health", headers={"Origin": "https://evil.example"})
        assert r.headers["access-control-allow-origin"] == "https://ok.example"
        assert "access-control-allow-methods" not in r.headers  # preflight only


def test_cors_defaults_echo_the_origin(client):
    """`*` with credentials (the defaults): the Origin is echoed, on preflights and on responses."""
    r = client.options("/completions", headers={"Origin": "web.mydomain.fr", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.text == ""
    assert r.headers["access-control-allow-origin"] == "web.mydomain.fr"
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert client.get("/health", headers={"Origin": "http://a.example"}).headers["access-control-allow-origin"] \
        == "http://a.example"


@pytest.mark.parametrize("origin,allowed", [
    ("http://localhost", True), ("http://localhost:8080", True), ("http://127.0.0.1:3000", True),
    ("http://[::1]", True), ("http://[::1]:3000", True), ("http://evil.com", False),
    ("http://notlocalhost", False), ("http://localhost.evil.com", False), ("localhost", False),
])
def test_cors_localhost_reflects_only_loopback_origins(api_engine, api_client, origin, allowed):
    with api_client(api_engine, cors_origins="localhost") as c:
        r = c.options("/completions", headers={"Origin": origin})
        assert r.status_code == 200
        assert r.headers.get("access-control-allow-origin") == (origin if allowed else None)


def test_cors_methods_headers_credentials_flags(api_engine, api_client):
    with api_client(api_engine, cors_methods="GET", cors_headers="X-A", cors_credentials=False) as c:
        r = c.options("/completions", headers={"Origin": "http://x.example"})
        # without credentials "*" is sent as it is instead of the echoed Origin
        assert r.headers["access-control-allow-origin"] == "*"
        assert (r.headers["access-control-allow-methods"], r.headers["access-control-allow-headers"],
                r.headers["access-control-allow-credentials"]) == ("GET", "X-A", "false")


def test_cors_proxy(api_engine, api_client):
    """`/cors-proxy` is 403 unless --ui-mcp-proxy; it forwards only the x-llama-server-proxy-header-* headers."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: dict[str, str] = {}

    class Capture(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.update({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    with api_client(api_engine) as c:
        r = c.get("/cors-proxy?url=http://127.0.0.1:1/")
        assert r.status_code == 403 and r.json() == {"error": {"message": "this feature is disabled",
                                                               "type": "feature_disabled"}}
    target = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    try:
        with api_client(api_engine, ui_mcp_proxy=True) as c:
            r = c.get(f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/x", headers={
                "Authorization": "Bearer mine", "Cookie": "s=1", "X-Api-Key": "k",
                "x-llama-server-proxy-header-authorization": "Bearer explicit"})
            assert (r.status_code, r.text) == (200, "ok")
            assert seen["authorization"] == "Bearer explicit"
            assert "cookie" not in seen and "x-api-key" not in seen
            assert c.get("/cors-proxy?url=ftp://127.0.0.1/").status_code == 500
    finally:
        target.shutdown()
        target.server_close()


def test_embeddings_server(api_engine, api_client):
    with api_client(api_engine, embeddings=True, pooling="mean") as c:
        d = c.post("/v1/embeddings", json={"input": ["a", "b c"]}).json()
        assert [x["index"] for x in d["data"]] == [0, 1] and len(d["data"][0]["embedding"]) == 64
        # b1-0c1e570 generates on an --embeddings server too
        assert c.post("/completion", json={"prompt": "a", "n_predict": 2}).json()["tokens_predicted"] == 2


def test_embedding_inputs_as_b1(api_engine, api_client):
    """The inputs' shapes and errors as llama-server b1-0c1e570 answers them (checked against it):
    it tokenizes them outside any handler (runtime errors are 500s, /completion's are 400s), a
    pooled prompt must fit one ubatch (min(n_ctx, -b, -ub)) and its slot."""
    with api_client(api_engine, embeddings=True, pooling="mean") as c:
        def err(body):
            r = c.post("/v1/embeddings", json=body)
            return r.status_code, r.json()["error"]["message"]
        assert err({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}}) \
            == (500, "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj")
        assert err({"input": {"prompt_string": "x", "multimodal_data": ["AAAA"]}}) \
            == (500, "Multimodal data provided, but model does not support multimodal requests.")
        assert err({"input": {"content": "x"}}) == (400, '"content" must be an array')
        assert err({"input": {"content": [{"type": "foo"}]}}) == (400, "unsupported content[].type")
        assert err({"input": 5})[0] == 500
        assert err({"input": []}) == (400, '"input" must not be empty')
        assert err({"input": [1] * 513}) == (500, "input (513 tokens) is too large to process. increase the "
                                                  "physical batch size (current batch size: 512)")
        assert err({"input": [1] * 300}) == (400, "input (300 tokens) is larger than the max context size "
                                                  "(256 tokens). skipping")
        parts = c.post("/v1/embeddings", json={"input": {"content": [{"type": "text", "text": "a "},
                                                                     {"type": "text", "text": "b"}]}}).json()
        plain = c.post("/v1/embeddings", json={"input": "a b"}).json()
        assert parts["data"][0]["embedding"] == plain["data"][0]["embedding"] and parts["usage"] == plain["usage"]
        mixed = c.post("/v1/embeddings", json={"input": ["a", 5]}).json()  # one mixed prompt
        assert len(mixed["data"]) == 1


def test_embeddings_pooling_defaults_to_the_models(api_engine, api_client):
    """Without --pooling the model's own pooling applies (GGUF {arch}.pooling_type; a causal LM has
    none, as Qwen2.5 under b1-0c1e570): /v1/embeddings refuses with b1's 400, /embedding answers one
    raw vector per token (b1 normalizes only pooled vectors)."""
    assert api_engine.model_info["pooling"] == "none"
    with api_client(api_engine, embeddings=True) as c:
        r = c.post("/v1/embeddings", json={"input": "a b"})
        assert (r.status_code, r.json()["error"]["message"]) == (
            400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type")
        n = len(c.post("/tokenize", json={"content": "a b c", "add_special": True}).json()["tokens"])
        vecs = c.post("/embedding", json={"content": "a b c"}).json()[0]["embedding"]
        assert len(vecs) == n and all(len(v) == 64 for v in vecs)
        assert any(abs(sum(x * x for x in v) - 1.0) > 1e-3 for v in vecs)  # not normalized


def test_metrics(client):
    r = client.get("/metrics")
    # starlette appends the charset to text/ types (llama-server sends "text/plain; version=0.0.4")
    assert r.status_code == 200 and r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE llamacpp:prompt_tokens_total counter\n" in r.text


# ---- SSE: the real engine generates, a thin wrapper delays or cuts its event stream --------------

Script = Callable[[AsyncIterator[Any]], AsyncIterator[Any]]


class ScriptedHandle:
    def __init__(self, inner: Any, script: Script):
        self.inner, self.script = inner, script

    def events(self) -> AsyncIterator[Any]:
        return self.script(self.inner.events())

    def cancel(self) -> None:
        self.inner.cancel()


class ScriptedEngine:
    """The real engine, except that each task's events pass through `script`."""

    def __init__(self, real: Any, script: Script):
        self.real, self.script = real, script

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def submit(self, task: Any) -> ScriptedHandle:
        return ScriptedHandle(self.real.submit(task), self.script)


def scripted(api_client, engine, script: Script, ping: float) -> TestClient:
    return api_client(ScriptedEngine(engine, script), sse_ping_interval=ping)


async def late(evs: AsyncIterator[Any]) -> AsyncIterator[Any]:
    await asyncio.sleep(0.5)
    async for ev in evs:
        yield ev


async def error_first(evs: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield TaskError(400, "no good", "invalid_request_error", {"n_extra": 1})


async def error_second(evs: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for ev in evs:
        assert isinstance(ev, TokenOut)
        yield ev
        yield TaskError(500, "lost it", "server_error")
        return


async def raise_second(evs: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for ev in evs:
        yield ev
        raise RuntimeError("exploded")


def test_sse_pings_while_the_task_is_silent(api_engine, api_client):
    with scripted(api_client, api_engine, late, 0.1) as c:
        body = c.post("/completion", json={"prompt": "hi", "n_predict": 2, "temperature": 0, "stream": True}).content
    n_pings = 0
    while body.startswith(b":\n\n"):
        body, n_pings = body[3:], n_pings + 1
    assert n_pings >= 2  # one per 0.1 s of the 0.5 s wait
    assert json.loads(events(body)[-1])["stop"] is True


def test_sse_no_pings_with_interval_zero(api_engine, api_client):
    with scripted(api_client, api_engine, late, 0) as c:
        assert events(c.post("/v1/chat/completions", json=CHAT).content)[-1] == "[DONE]"


def test_sse_error_before_the_first_event_is_a_plain_response(api_engine, api_client):
    with scripted(api_client, api_engine, error_first, 30) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json; charset=utf-8"
    assert r.text == '{"error":{"code":400,"message":"no good","type":"invalid_request_error","n_extra":1}}'


@pytest.mark.parametrize("script,message", [(error_second, "lost it"), (raise_second, "exploded")])
def test_sse_error_after_the_first_event_ends_the_stream(api_engine, api_client, script, message):
    with scripted(api_client, api_engine, script, 30) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    evs = events(r.content)
    assert "[DONE]" not in evs
    assert json.loads(evs[0])["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(evs[-1]) == {"error": {"code": 500, "message": message, "type": "server_error"}}


def test_path_serves_a_folder_instead_of_the_page(api_engine, api_client, tmp_path):
    """--path DIR (cpp-httplib's mount point at /): its files, a folder's index.html for a path
    ending in /, nothing outside DIR; the built-in page is not served; the API is unchanged."""
    (tmp_path / "index.html").write_text("<p>mine</p>")
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.css").write_text("p{}")
    with api_client(api_engine, public_path=str(tmp_path)) as c:
        r = c.get("/")
        assert (r.status_code, r.text, r.headers["content-type"].split(";")[0]) == (200, "<p>mine</p>", "text/html")
        assert c.get("/a.txt").text == "hello" and c.head("/a.txt").status_code == 200
        assert c.get("/sub/b.css").headers["content-type"].startswith("text/css")
        for missing in ("/sub/", "/sub", "/%2e%2e/a.txt", "/app.js", "/nope"):
            assert c.get(missing).status_code == 404, missing
        assert c.get("/health").json() == {"status": "ok"}
