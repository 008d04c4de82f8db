"""One request never harms another (HTTP level): the heavy work a client can ask for (a chat of 100k
messages, a 4 MB text tokenized with its pieces, millions of ids detokenized, a large JSON schema,
a large body) runs off the event loop, so /health keeps answering within a bound while it runs;
HEAD answers every GET route as cpp-httplib does (the GET's status and headers, no body);
`chat_template_kwargs` names are template variables (llama.cpp's extra_context: a request's
`add_generation_prompt` overrides, a key such as "self" is no Python argument); client errors are
in words, not Python type names."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from runtime.tiny_model import spec_with, write_tiny_model

HEALTH_P99_S = 0.5  # /health while the hostile requests run (each of them takes seconds here)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("isolation-api") / "iso-api-tiny.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=1024,
                                     name="iso-api-tiny", seed=7), vocab="builtin")
    return path


@pytest.fixture(scope="module")
def srv(start_server, model):
    return start_server("-m", str(model), "-c", "1024", "-np", "2", "--metrics", "--slots")


def test_head_answers_every_get_route(srv):
    for path in ("/health", "/v1/health", "/models", "/v1/models", "/props", "/slots", "/metrics", "/"):
        get = httpx.get(srv.url + path, timeout=30)
        head = httpx.head(srv.url + path, timeout=30)
        assert head.status_code == get.status_code == 200, (path, head.status_code, get.status_code)
        assert head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
    get = httpx.get(srv.url + "/health", timeout=30)
    assert httpx.head(srv.url + "/health", timeout=30).headers["content-length"] == str(len(get.content))
    # a path with no GET handler answers HEAD as it answers GET; an unknown one is the 404
    for path in ("/completion", "/no-such-path"):
        assert httpx.head(srv.url + path, timeout=30).status_code == httpx.get(srv.url + path, timeout=30).status_code


def test_head_with_api_prefix(start_server, model):
    s = start_server("-m", str(model), "-c", "512", "-np", "1", "--api-prefix", "/pfx", wait=False)
    deadline = time.monotonic() + 180
    while True:  # ready: the prefixed /health (the fixture's readiness probe asks the plain one)
        try:
            if httpx.get(s.url + "/pfx/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, s.log()
        time.sleep(0.2)
    assert httpx.head(s.url + "/pfx/health", timeout=30).status_code == 200
    assert httpx.head(s.url + "/pfx/v1/models", timeout=30).status_code == 200
    assert httpx.head(s.url + "/health", timeout=30).status_code == 404


def test_chat_template_kwargs_are_template_variables(srv):
    msgs = [{"role": "user", "content": "hi"}]

    def prompt(ctk=None):
        body = {"messages": msgs} if ctk is None else {"messages": msgs, "chat_template_kwargs": ctk}
        r = httpx.post(srv.url + "/apply-template", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    opened = prompt()
    closed = prompt({"add_generation_prompt": False})
    assert opened.startswith(closed) and len(opened) > len(closed)  # the assistant turn's opening is gone
    assert prompt({"add_generation_prompt": True}) == opened
    assert prompt({"self": 1, "messages": [], "tools": 3, "chat_template_kwargs": {}}) == opened
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2,
                                                          "chat_template_kwargs": {"add_generation_prompt": False}},
                   timeout=60)
    assert r.status_code == 200, r.text


def test_client_errors_name_no_python_types(srv):
    r = httpx.post(srv.url + "/completion", content=b"[1, 2]", headers={"Content-Type": "application/json"},
                   timeout=30)
    msg = r.json()["error"]["message"]
    assert "but is array" in msg and "list" not in msg, msg


def _hostile() -> list[tuple[str, str, dict]]:
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(100_000)]
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string", "maxLength": 20}
                                               for i in range(3000)}}
    return [("/apply-template", "chat of 100k messages", {"messages": many}),
            ("/tokenize", "4 MB with pieces", {"content": "hello world " * 380_000, "with_pieces": True}),
            ("/detokenize", "2M ids", {"tokens": [65 + i % 40 for i in range(2_000_000)]}),
            ("/completion", "3000-field schema", {"prompt": "x", "n_predict": 1, "json_schema": schema})]


def test_health_answers_while_heavy_requests_run(srv):
    results: dict[str, tuple[int, float]] = {}

    def run(path, name, body):
        t0 = time.monotonic()
        r = httpx.post(srv.url + path, json=body, timeout=600)
        results[name] = (r.status_code, time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=h) for h in _hostile()]
    for t in threads:
        t.start()
    lat = []
    with httpx.Client(timeout=30) as c:
        while any(t.is_alive() for t in threads):
            t0 = time.monotonic()
            assert c.get(srv.url + "/health").status_code == 200
            lat.append(time.monotonic() - t0)
            time.sleep(0.02)
    for t in threads:
        t.join()
    assert all(code == 200 for code, _ in results.values()), results
    # the load is real: together the hostile requests kept the server busy for seconds
    assert max(s for _, s in results.values()) > 2 * HEALTH_P99_S, results
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    assert len(lat) >= 10 and p99 < HEALTH_P99_S, (p99, lat[-5:], results)
