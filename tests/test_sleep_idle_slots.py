"""`--sleep-idle-seconds` and `--cache-idle-slots`, black-box over HTTP (as llama-server b1-0c1e570's
test_sleep.py and test_kv_keep_only_active.py, which llama.cpp's suite checks too).

Sleep: after N idle seconds the model and KV cache are released; /health, /props, /models and
/metrics answer from what stays loaded without waking it; any other route loads the model again.
While asleep, /metrics shows the values of the moment it fell asleep, its throughput window reported
once. Idle slots: when a task starts, every other idle slot's content goes to the RAM prompt cache,
and with a unified KV cache the slot is cleared (a later request restores it from RAM).
"""
from __future__ import annotations

import time

import httpx
import pytest

TAG_ENABLED = "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__"
TAG_SLOT = "__TEST_TAG_CACHE_IDLE_SLOT__"
LONG = ("Once upon a time in a land far away, there lived a brave knight who traveled across mountains and "
        "rivers to find the legendary golden sword hidden deep within the enchanted forest of whispers.")


def sleeping(url: str) -> bool:
    r = httpx.get(url + "/props", timeout=30)
    assert r.status_code == 200
    return r.json()["is_sleeping"]


def wait_asleep(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sleeping(url):
            return
        time.sleep(0.1)
    raise AssertionError("the server did not fall asleep")


def metric(text: str, name: str) -> float:
    lines = [ln for ln in text.splitlines() if ln.startswith(f"llamacpp:{name} ")]
    assert len(lines) == 1, name
    return float(lines[0].split()[1])


@pytest.fixture(scope="module")
def sleepy(start_server):
    return start_server("-np", "1", "-c", "512", "--metrics", "--sleep-idle-seconds", "1")


def test_sleep_releases_and_wakes(sleepy):
    url = sleepy.url
    r = httpx.post(url + "/completion", json={"prompt": "Hello", "n_predict": 6, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 6
    wait_asleep(url)
    assert "server is entering sleeping state" in sleepy.log()
    # read-only routes answer without waking
    assert httpx.get(url + "/health").status_code == 200
    models = httpx.get(url + "/v1/models").json()
    assert len(models["data"]) == 1
    first = httpx.get(url + "/metrics").text
    assert metric(first, "tokens_predicted_total") == 6
    assert metric(first, "predicted_tokens_seconds") > 0  # the window of the last generation, once
    second = httpx.get(url + "/metrics").text
    assert metric(second, "predicted_tokens_seconds") == 0
    assert metric(second, "tokens_predicted_total") == 6
    assert sleeping(url)
    # a route that needs the model wakes it, and the window is not reported again
    r = httpx.post(url + "/tokenize", json={"content": "Hello"}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens"]
    assert not sleeping(url)
    assert "server is exiting sleeping state" in sleepy.log()
    assert metric(httpx.get(url + "/metrics").text, "predicted_tokens_seconds") == 0
    # and generation works as before the sleep
    r = httpx.post(url + "/completion", json={"prompt": "Hello", "n_predict": 3, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 3
    assert metric(httpx.get(url + "/metrics").text, "tokens_predicted_total") == 9


def test_sleep_wakes_for_a_generation_request(sleepy):
    wait_asleep(sleepy.url)
    r = httpx.post(sleepy.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200
    assert not sleeping(sleepy.url)


def test_sleep_flag_validated(start_server):
    with pytest.raises(RuntimeError, match="cannot be 0 or less than -1"):
        start_server("--sleep-idle-seconds", "0")


def _completion(url: str, prompt: str, **kw) -> dict:
    r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0,
                                              "cache_prompt": True, **kw}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_idle_slots_cached_and_cleared(start_server):
    srv = start_server("-np", "2", "-kvu", "-c", "1024", "--cache-ram", "100", "--verbose")
    log_at = len(srv.log())
    assert TAG_ENABLED in srv.log()

    def new_log() -> str:
        nonlocal log_at
        text = srv.log()
        out, log_at = text[log_at:], len(text)
        return out

    first = _completion(srv.url, LONG, id_slot=0)
    assert TAG_SLOT not in new_log()  # the other slot holds nothing
    _completion(srv.url, "The quick brown fox", id_slot=1)
    assert TAG_SLOT in new_log()  # slot 0 went to the RAM cache ...
    slots = httpx.get(srv.url + "/slots").json()
    assert slots[0]["is_processing"] is False
    again = _completion(srv.url, LONG)  # ... and comes back from it
    assert "updating prompt cache" in new_log()
    assert again["timings"]["cache_n"] > 0
    assert again["timings"]["prompt_n"] < first["timings"]["prompt_n"]
    assert again["content"] == first["content"]  # the restored cache gives the same greedy tokens


def test_idle_slots_not_cached_when_disabled(start_server):
    srv = start_server("-np", "2", "-kvu", "-c", "1024", "--cache-ram", "100", "--verbose", "--no-cache-idle-slots")
    assert TAG_ENABLED not in srv.log()
    _completion(srv.url, LONG, id_slot=0)
    _completion(srv.url, "The quick brown fox", id_slot=1)
    assert TAG_SLOT not in srv.log()
    # slot 0 kept its KV: the same prompt on it reuses the prefix in place
    assert _completion(srv.url, LONG, id_slot=0)["timings"]["cache_n"] > 0
