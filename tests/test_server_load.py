"""A bounded load test against the real server on its built-in model: many concurrent streams,
clients that disconnect mid-stream, malformed bodies mixed in. Every good request must be
answered, every bad one must get its error envelope, and the server must end healthy with all
slots released."""
from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest


@pytest.fixture(scope="module")
def server(start_server):
    s = start_server("-np", "3", "-c", "3072", "--metrics")
    yield s
    s.stop()


def _good_stream(url: str, out: list, i: int) -> None:
    body = {"messages": [{"role": "user", "content": f"story number {i}"}], "max_tokens": 12,
            "temperature": 0.7, "seed": i, "stream": True}
    with httpx.Client(timeout=120) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    ok = r.status_code == 200 and events[-1] == "[DONE]" and \
        json.loads(events[-2])["choices"][0]["finish_reason"] in ("length", "stop")
    out.append(("stream", ok))


def _good_completion(url: str, out: list, i: int) -> None:
    r = httpx.post(url + "/completion", json={"prompt": f"count {i}:", "n_predict": 8, "temperature": 0}, timeout=120)
    out.append(("completion", r.status_code == 200 and r.json()["tokens_predicted"] >= 1))


def _disconnect(url: str, out: list, i: int) -> None:
    body = {"prompt": "a long one", "n_predict": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=120) as c, c.stream("POST", url + "/completion", json=body) as r:
        n = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                n += 1
            if n >= 2:
                break  # leave mid-stream
    out.append(("disconnect", r.status_code == 200))


def _malformed(url: str, out: list, i: int) -> None:
    cases = [
        (b'{"messages":[{"role":"user","content":"hi"}', 500, "server_error"),
        (b'{"prompt":"hi"}', 400, "invalid_request_error"),
        (b'{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}', 400, "invalid_request_error"),
        (b"\xff\xfe not json", 500, "server_error"),
    ]
    raw, status, typ = cases[i % len(cases)]
    r = httpx.post(url + "/v1/chat/completions", content=raw, timeout=60)
    out.append(("malformed", r.status_code == status and r.json()["error"]["type"] == typ))


def test_mixed_load_leaves_the_server_healthy(server):
    url = server.url
    kinds = [_good_stream] * 10 + [_good_completion] * 6 + [_disconnect] * 5 + [_malformed] * 8
    random.Random(1).shuffle(kinds)
    out: list = []
    threads = [threading.Thread(target=k, args=(url, out, i)) for i, k in enumerate(kinds)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads)
    assert len(out) == len(kinds)
    bad = [o for o in out if not o[1]]
    assert not bad, bad
    # disconnected streams were cancelled: every slot comes back idle
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        slots = httpx.get(url + "/slots").json()
        if not any(s["is_processing"] for s in slots):
            break
        time.sleep(0.2)
    assert not any(s["is_processing"] for s in slots)
    # cancelled tasks generated far fewer than the 5 x 400 tokens they asked for
    metrics = httpx.get(url + "/metrics").text
    predicted = float(next(line.split()[1] for line in metrics.splitlines()
                           if line.startswith("llamacpp:tokens_predicted_total ")))
    assert predicted <= 10 * 12 + 6 * 8
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    r = httpx.post(url + "/completion", json={"prompt": "still alive", "n_predict": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 3


def test_deferred_request_is_counted_pinged_and_served(start_server):
    """Lesson Example 8: with both slots busy a third request waits in the queue (metrics:
    requests_processing 2, requests_deferred 1), its open stream gets `:` keep-alive comments every
    --sse-ping-interval seconds, and it is answered once a slot frees."""
    s = start_server("-np", "2", "-c", "8192", "--metrics", "--sse-ping-interval", "1")
    url = s.url
    long_body = {"prompt": "busy", "n_predict": 3000, "ignore_eos": True, "temperature": 0}
    results: dict = {}

    def long_request(i):
        results[i] = httpx.post(url + "/completion", json=long_body, timeout=300).status_code

    busy = [threading.Thread(target=long_request, args=(i,)) for i in range(2)]
    for t in busy:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(x["is_processing"] for x in httpx.get(url + "/slots").json()):
        time.sleep(0.05)
    lines: list[str] = []

    def third():
        body = {"messages": [{"role": "user", "content": "wait for me"}], "max_tokens": 3, "stream": True}
        with httpx.Client(timeout=300) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            lines.extend(r.iter_lines())
            results["third"] = r.status_code

    t3 = threading.Thread(target=third)
    t3.start()
    time.sleep(0.5)
    metrics = {line.split()[0]: float(line.split()[1]) for line in httpx.get(url + "/metrics").text.splitlines()
               if line.startswith("llamacpp:")}
    for t in (*busy, t3):
        t.join(timeout=300)
    assert metrics["llamacpp:requests_processing"] == 2 and metrics["llamacpp:requests_deferred"] == 1
    assert results == {0: 200, 1: 200, "third": 200}
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert any(line.startswith(":") for line in lines[:first_data])  # pings while it waited
    assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"
    s.stop()
