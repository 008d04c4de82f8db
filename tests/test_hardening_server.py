"""Issue #13 against a real server process (tiny generated model): a non-streamed request whose
client leaves frees its slot within a second; body-size and header limits; SIGTERM drains (503 for
new requests, running streams ended with a final error event after --shutdown-timeout, exit 0)."""
from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.health_probe import probe_health

LONG = {"prompt": "hi", "n_predict": -1, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from runtime.model.tiny_model import spec_with, write_tiny_model

    path = tmp_path_factory.mktemp("harden") / "harden-tiny.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=65536,
                                     name="harden-tiny", seed=7), vocab="builtin")
    return path


SERVER_ARGS = ["-np", "2", "-c", "32768", "--max-body-size", "8000000", "--header-timeout", "1"]


@pytest.fixture(scope="module")
def server(start_server, tiny_model):
    return start_server("-m", str(tiny_model), *SERVER_ARGS)


def raw_request(url: str, path: str, body: dict) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def busy(url: str) -> list[bool]:
    return [s["is_processing"] for s in httpx.get(url + "/slots", timeout=10).json()]


def test_non_streamed_request_frees_its_slot_when_the_client_leaves(server):
    s = raw_request(server.url, "/completion", LONG)
    deadline = time.monotonic() + 10
    while not any(busy(server.url)) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    assert any(busy(server.url))
    s.close()
    t0 = time.monotonic()
    while any(busy(server.url)) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert not any(busy(server.url)) and time.monotonic() - t0 < 1.0
    time.sleep(0.2)
    log = server.log()
    assert "client disconnected: POST /completion" in log
    assert "Traceback" not in log


def test_body_over_the_limit_is_a_413_in_the_envelope(server):
    r = httpx.post(server.url + "/completion", content=b'{"prompt":"' + b"a" * 8_000_001 + b'"}', timeout=30)
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == 413 and err["type"] == "invalid_request_error" and "--max-body-size" in err["message"]

    def chunks():
        for _ in range(100):
            yield b"a" * 100_000
    r = httpx.post(server.url + "/completion", content=chunks(), timeout=30)
    assert r.status_code == 413 and "8000000" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def huge_request(path: str, text: str) -> dict:
    """A one-token request of `path` whose prompt is `text`."""
    if path == "/completion":
        return {"prompt": text, "n_predict": 1}
    if path == "/v1/responses":
        return {"input": text, "max_output_tokens": 1}
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 1}  # chat, Anthropic Messages


@pytest.mark.parametrize("path", ["/completion", "/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_health_answers_while_a_huge_prompt_is_tokenized(server, path):
    """Tokenizing a multi-megabyte prompt takes seconds (tens on a loaded CI machine); it runs off
    the event loop with the GIL released, so /health keeps answering. Before, /health waited for
    the whole tokenization (on /v1/messages and /v1/responses until the seventh session)."""
    words = " ".join(f"w{i}" for i in range(250_000))  # ~1.9 MB of text
    out: dict = {}

    def big():
        out["r"] = httpx.post(server.url + path, json=huge_request(path, words), timeout=300)

    t = threading.Thread(target=big)
    t0 = time.monotonic()
    t.start()
    lat = probe_health(server.url, t.is_alive, 0.05)
    t.join()
    total = time.monotonic() - t0
    assert out["r"].status_code == 400 and "exceed_context_size_error" in out["r"].text, out["r"].text[:300]
    assert len(lat) >= 5, lat  # the big request took a while: /health was really measured during it
    assert max(lat) < max(2.5, total / 4), (max(lat), total)


def test_half_open_connections_are_closed_after_the_header_timeout(server):
    host, port = server.url.removeprefix("http://").split(":")
    socks = []
    for _ in range(20):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        s.settimeout(10)
        socks.append(s)
    silent = socket.create_connection((host, int(port)))  # nothing sent at all
    silent.settimeout(10)
    t0 = time.monotonic()
    for s in socks + [silent]:
        assert s.recv(100) == b""  # closed by the server
        s.close()
    assert time.monotonic() - t0 < 5
    assert httpx.get(server.url + "/health").status_code == 200


def test_sigterm_drains_streams_then_exits_0(start_server, tiny_model):
    srv = start_server("-m", str(tiny_model), *SERVER_ARGS, "--shutdown-timeout", "2")
    got: list[bytes] = []
    ready = threading.Event()

    def stream():
        with httpx.stream("POST", srv.url + "/completion", json={**LONG, "stream": True}, timeout=30) as r:
            for chunk in r.iter_bytes():
                got.append(chunk)
                ready.set()

    t = threading.Thread(target=stream)
    t.start()
    assert ready.wait(20)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    r = httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 1}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
    t.join(15)
    assert not t.is_alive()
    assert srv.proc.wait(15) == 0
    elapsed = time.monotonic() - t0
    assert 1.5 < elapsed < 8, elapsed
    text = b"".join(got).decode()
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("data: ") and json.loads(last[6:])["error"]["code"] == 503, last
    assert "Traceback" not in srv.log()
