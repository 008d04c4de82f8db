"""One request never harms another (HTTP level): the heavy work a client can ask for (a chat of 100k
messages, a 4 MB text tokenized with its pieces, millions of ids detokenized, a large JSON schema,
a large body) runs off the event loop, so /health keeps answering within a bound while it runs;
HEAD answers every GET route as cpp-httplib does (the GET's status and headers, no body);
`chat_template_kwargs` names are template variables (llama.cpp's extra_context: a request's
`add_generation_prompt` overrides, a key such as "self" is no Python argument); client errors are
in words, not Python type names."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from runtime.model.tiny_model import spec_with, write_tiny_model
from tests.health_probe import p99, probe_health

HEALTH_P99_S = 0.1  # /health while a hostile request runs (the bound; llama-server stays under it)


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
    for raw in (b'{"a" 1}', b"[1 2]", b"{} x", b"{a:1}", b'"abc', b'{"a":1,}'):  # nlohmann's words, not Python's
        r = httpx.post(srv.url + "/completion", content=raw, headers={"Content-Type": "application/json"}, timeout=30)
        msg = r.json()["error"]["message"]
        assert r.status_code == 500 and msg.startswith("[json.exception.parse_error.101]"), msg
        assert not any(w in msg for w in ("Expecting", "Extra data", "Unterminated", "delimiter")), msg


def _hostile() -> list[tuple[str, str, dict, int]]:
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(100_000)]
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string", "maxLength": 20}
                                               for i in range(3000)}}
    bad_schema = {"type": "object", "properties": {"a" * 3_000_000: {"type": "bogus"}}}  # its error quotes the name
    return [("/apply-template", "chat of 100k messages", {"messages": many}, 200),
            ("/tokenize", "4 MB with pieces", {"content": "hello world " * 380_000, "with_pieces": True}, 200),
            ("/detokenize", "2M ids", {"tokens": [65 + i % 40 for i in range(2_000_000)]}, 200),
            ("/completion", "3000-field schema", {"prompt": "x", "n_predict": 1, "json_schema": schema}, 200),
            ("/completion", "3 MB error text", {"prompt": "x", "json_schema": bad_schema}, 400)]


@pytest.mark.parametrize("case", range(len(_hostile())), ids=[h[1] for h in _hostile()])
def test_health_answers_while_heavy_requests_run(srv, case):
    """Each request class at its accepted maximum size while /health is polled (the issue's bound:
    p99 under 100 ms; llama-server's is under 0.1 s)."""
    path, name, body, status = _hostile()[case]
    raw = json.dumps(body).encode()  # encoded before the clock: the client's own encoding would hold
    result: list[tuple[int, float]] = []  # this process's GIL and delay its probes

    def run():  # sent again until the server has been busy with it for 2 s
        t_start = time.monotonic()
        while not result or time.monotonic() - t_start < 2.0:
            t0 = time.monotonic()
            r = httpx.post(srv.url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=600)
            result.append((r.status_code, time.monotonic() - t0))

    thread = threading.Thread(target=run)
    thread.start()
    lat = probe_health(srv.url, thread.is_alive, 0.01)
    thread.join()
    assert {code for code, _ in result} == {status}, (name, result)
    took = max(t for _, t in result)
    q = p99(lat)
    print(f"{name}: {len(result)} x, longest {took:.1f} s, "
          f"/health n={len(lat)} p99={q * 1e3:.0f} ms max={max(lat) * 1e3:.0f} ms")
    assert len(lat) >= 50, (name, len(lat))  # the load was real: /health probed all through it
    assert q < HEALTH_P99_S, (name, q, sorted(lat)[-5:])


def test_large_answers_encode_as_json_dumps():
    """The answers encoded a slice at a time (api/errors.py: the C encoder holds the GIL for a whole
    call) are byte for byte what one json.dumps call gives, lone surrogates replaced alike."""
    from api.errors import dumps, json_response
    cases = [{}, [], "", {"a": [1, 2]}, list(range(10_000)), "x" * (3 << 20) + "\u00e9\"\n\ud800",
             {"tokens": [{"id": i, "piece": "\ud800x" if i % 7 == 0 else "é"} for i in range(20_000)]},
             {1: [list(range(3000))] * 3, True: None, None: "s" * 5000, 2.5: [[]] * 5000},
             [[list(range(2000))] * 2] * 1500, [{"a": "b" * 2_000_000}], (1, [2] * 5000)]
    for obj in cases:
        want = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        assert dumps(obj) == want
        assert json_response(obj).body == want.encode("utf-8", "replace")
