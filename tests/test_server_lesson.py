"""The lesson's examples (shared/seed/llama-server-lesson.txt) against the real server running the
lesson's tiny model (qwen2 vocabulary, f32). Tests in this module share one server, started like
Example 1, and run in the lesson's order: token counts and cache counters depend on what earlier
requests left in the slots, exactly as in the lesson.
"""
from __future__ import annotations

import json
import re

import httpx
import pytest

PRE = ("You are a careful Java reviewer. Read the code, list each bug with its line number, and suggest a fix. "
       "Keep answers short.")


@pytest.fixture(scope="module")
def slots_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def srv(start_server, lesson_model, slots_dir):
    s = start_server("-m", str(lesson_model), "-a", "tiny-coder", "-np", "2", "-c", "4096", "--metrics",
                     "--slot-save-path", str(slots_dir))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


def completion(client, **body):
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(lines) -> list[str]:
    return [ln[len("data: "):] for ln in lines if ln.startswith("data: ")]


# ---- Example 1 -----------------------------------------------------------------------------

def test_ex1_startup_log(srv):
    log = srv.log()
    stamp = r"^\d+\.\d{2}\.\d{3}\.\d{3} "
    assert re.search(stamp + r"I srv  llama_server: initializing \.\.\.$", log, re.M)
    assert re.search(stamp + r"W srv  llama_server: security: no API key is set and CORS allows all origins", log, re.M)
    assert re.search(stamp + r"I srv    load_model: loading model '.*tiny-random-qwen2vocab-f32\.gguf'$", log, re.M)
    assert re.search(stamp + r"I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 2048, "
                             r"kv_unified = 'false'$", log, re.M)
    loaded = log.index("llama_server: model loaded")
    listening = log.index(f"llama_server: listening on http://127.0.0.1:{srv.port}")
    assert log.index("load_model: loading model") < loaded < listening
    assert "prompt cache is enabled" not in log  # only at -lv 4


def test_ex1_slot_save_path_must_exist(start_server, tmp_path):
    p = start_server("--slot-save-path", str(tmp_path / "slots"), wait=False)
    assert p.proc.wait(timeout=60) == 1
    assert f'error while handling argument "--slot-save-path": not a directory: {tmp_path / "slots"}' in p.log()


# ---- Example 2 -----------------------------------------------------------------------------

def test_ex2_health_loading_then_ok(srv, client):
    # the listener is up before the model is loaded: /health answered 503 first, then 200
    assert srv.health_statuses[-1] == 200
    assert 503 in srv.health_statuses
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/v1/health").json() == {"status": "ok"}


# ---- Example 3 -----------------------------------------------------------------------------

def test_ex3_models(client):
    r = client.get("/v1/models")
    assert r.status_code == 200
    d = r.json()
    assert list(d) == ["models", "object", "data"]
    m = d["models"][0]
    assert m["name"] == m["model"] == "tiny-coder"
    assert m["details"]["format"] == "gguf" and m["capabilities"] == ["completion"]
    e = d["data"][0]
    assert e["id"] == "tiny-coder" and e["object"] == "model" and e["owned_by"] == "llamacpp"
    assert e["aliases"] == ["tiny-coder"] and isinstance(e["created"], int)
    assert e["meta"] == {"vocab_type": 2, "n_vocab": 151936, "n_ctx": 2048, "n_ctx_train": 4096, "n_embd": 256,
                         "n_params": 80611584, "size": 322446336, "ftype": "all F32"}
    assert client.get("/models").json()["data"][0]["meta"]["n_ctx"] == 2048


def test_ex3_props(client):
    p = client.get("/props").json()
    params = p["default_generation_settings"]["params"]
    assert params["seed"] == 4294967295
    assert params["temperature"] == 0.800000011920929
    assert params["top_k"] == 40 and params["top_p"] == 0.949999988079071 and params["min_p"] == 0.05000000074505806
    assert params["repeat_penalty"] == 1.0 and params["n_predict"] == -1 and params["stream"] is False
    assert params["chat_format"] == "Content-only" and params["reasoning_format"] == "none"
    assert params["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                  "temperature"]
    assert p["default_generation_settings"]["n_ctx"] == 2048
    assert p["total_slots"] == 2 and p["model_alias"] == "tiny-coder"
    assert p["modalities"] == {"vision": False, "video": False, "audio": False}
    assert (p["endpoint_slots"], p["endpoint_props"], p["endpoint_metrics"]) == (True, False, True)
    assert p["chat_template"].startswith("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}")
    caps = p["chat_template_caps"]
    assert caps["supports_system_role"] is True and caps["supports_tools"] is False
    assert caps["supports_tool_calls"] is False and caps["supports_parallel_tool_calls"] is False
    assert p["bos_token"] == p["eos_token"] == "<|endoftext|>"
    assert isinstance(p["build_info"], str) and p["is_sleeping"] is False


# ---- Example 4 and 5 -------------------------------------------------------------------------

def test_ex4_chat(client):
    r = client.post("/v1/chat/completions", json={
        "model": "tiny-coder",
        "messages": [{"role": "system", "content": "You are a coding assistant."},
                     {"role": "user", "content": "Write hello world in Java."}],
        "max_tokens": 8, "temperature": 0, "seed": 42})
    assert r.status_code == 200
    d = r.json()
    assert list(d) == ["choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings"]
    c = d["choices"][0]
    assert c["finish_reason"] == "length" and c["index"] == 0
    assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
    assert d["object"] == "chat.completion" and d["model"] == "tiny-coder"
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{32}", d["id"])
    assert d["usage"] == {"completion_tokens": 8, "prompt_tokens": 25, "total_tokens": 33,
                          "prompt_tokens_details": {"cached_tokens": 0}}
    t = d["timings"]
    assert (t["cache_n"], t["prompt_n"], t["predicted_n"]) == (0, 25, 8)
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 7)


def test_ex5_streaming(client):
    body = {"model": "tiny-coder", "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4, "temperature": 0, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert list(chunks[0]) == ["choices", "created", "id", "model", "system_fingerprint", "object"]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    middle = chunks[1:-1]
    assert 1 <= len(middle) <= 4 and all(set(c["choices"][0]["delta"]) == {"content"} for c in middle)
    last = chunks[-1]
    assert last["choices"][0] == {"finish_reason": "length", "index": 0, "delta": {}}
    t = last["timings"]
    # the template's default system prompt shares 6 tokens with Example 4's prompt in the same slot
    assert (t["cache_n"], t["prompt_n"], t["predicted_n"]) == (6, 15, 4)

    body["stream_options"] = {"include_usage": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks2 = [json.loads(e) for e in sse_events(list(r.iter_lines()))[:-1]]
    fin, usage = chunks2[-2], chunks2[-1]
    assert fin["choices"][0]["finish_reason"] == "length" and "timings" not in fin
    assert usage["choices"] == []
    assert usage["usage"] == {"completion_tokens": 4, "prompt_tokens": 21, "total_tokens": 25,
                              "prompt_tokens_details": {"cached_tokens": 20}}
    assert (usage["timings"]["cache_n"], usage["timings"]["prompt_n"]) == (20, 1)


# ---- Example 6 -----------------------------------------------------------------------------

def test_ex6_native_completion(client):
    d = completion(client, prompt="public static void main", n_predict=4, temperature=0)
    assert list(d)[:9] == ["index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
                           "tokens_evaluated", "generation_settings"]
    assert d["tokens"] == [] and d["stop"] is True and d["model"] == "tiny-coder"
    assert (d["tokens_predicted"], d["tokens_evaluated"]) == (4, 4)
    assert d["prompt"] == "public static void main"
    assert d["stop_type"] == "limit" and d["stopping_word"] == "" and d["truncated"] is False
    assert d["tokens_cached"] == 7  # the last sampled token is never decoded
    g = d["generation_settings"]
    assert len(g) >= 45  # the lesson trims "the 50 fields"; every SamplingParams field is echoed
    assert (g["temperature"], g["top_k"], g["max_tokens"], g["n_predict"]) == (0.0, 40, 4, 4)
    assert g["grammar"] == "" and g["chat_format"] == "Content-only"
    t = d["timings"]
    assert t["cache_n"] + t["prompt_n"] == 4 and t["predicted_n"] == 4
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 3)
    assert t["predicted_per_second"] == pytest.approx(3e3 / t["predicted_ms"])
    assert t["prompt_per_second"] == pytest.approx(1e3 * t["prompt_n"] / t["prompt_ms"])


def test_ex6_native_streaming(client):
    with client.stream("POST", "/completion", json={"prompt": "public static void main", "n_predict": 3,
                                                    "temperature": 0, "stream": True}) as r:
        events = [json.loads(e) for e in sse_events(list(r.iter_lines()))]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert events[-1]["stop_type"] == "limit" and events[-1]["tokens_predicted"] == 3
    assert "".join(e["content"] for e in events[:-1]) != ""


# ---- Example 7 -----------------------------------------------------------------------------

def test_ex7_tokenize_detokenize_template(client):
    post = lambda path, body: client.post(path, content=json.dumps(body)).json()  # noqa: E731 - no content type, like curl -d
    assert post("/tokenize", {"content": "public static void main"}) == {"tokens": [888, 1099, 737, 1887]}
    assert post("/tokenize", {"content": "public static void main", "with_pieces": True}) == {"tokens": [
        {"id": 888, "piece": "public"}, {"id": 1099, "piece": " static"}, {"id": 737, "piece": " void"},
        {"id": 1887, "piece": " main"}]}
    assert post("/tokenize", {"content": "<|im_start|>user", "with_pieces": True}) == {"tokens": [
        {"id": 151644, "piece": "<|im_start|>"}, {"id": 872, "piece": "user"}]}
    assert [t["id"] for t in post("/tokenize", {"content": "<|im_start|>user", "with_pieces": True,
                                                "parse_special": False})["tokens"]] == [27, 91, 318, 4906, 91, 29, 872]
    assert post("/detokenize", {"tokens": [888, 1099, 737, 1887]}) == {"content": "public static void main"}
    assert post("/apply-template", {"messages": [
        {"role": "system", "content": "You are a coding assistant."},
        {"role": "user", "content": "Write hello world in Java."}]}) == {"prompt":
        "<|im_start|>system\nYou are a coding assistant.<|im_end|>\n<|im_start|>user\nWrite hello world in Java."
        "<|im_end|>\n<|im_start|>assistant\n"}
    assert post("/apply-template", {"messages": [{"role": "user", "content": "Say hi."}]}) == {"prompt":
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n"
        "<|im_start|>assistant\n"}


def test_ex7_piece_not_utf8_is_bytes(client):
    # 🧬 is two tokens whose pieces are parts of one UTF-8 sequence: each is a list of byte values
    toks = client.post("/tokenize", json={"content": "\U0001F9EC", "with_pieces": True}).json()["tokens"]
    assert toks == [{"id": 123908, "piece": [240, 159, 167]}, {"id": 105, "piece": [172]}]
    assert client.post("/detokenize", json={"tokens": [123908, 105]}).json() == {"content": "\U0001F9EC"}


# ---- Example 8 -----------------------------------------------------------------------------

def test_ex8_two_slots_busy(srv, client):
    import time

    body = {"n_predict": 1500, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(base_url=srv.url, timeout=60) as a, httpx.Client(base_url=srv.url, timeout=60) as b:
        with a.stream("POST", "/completion", json={"prompt": "first request", "id_slot": 0, **body}) as ra, \
                b.stream("POST", "/completion", json={"prompt": "second request here", **body}) as rb:
            assert ra.status_code == rb.status_code == 200
            slots = client.get("/slots").json()
            assert [s["is_processing"] for s in slots] == [True, True]
            by_prompt = {s["n_prompt_tokens_processed"]: s for s in slots}
            assert slots[0]["n_prompt_tokens_processed"] == 2 and set(by_prompt) == {2, 3}
            for s in slots:
                assert s["n_ctx"] == 2048 and s["speculative"] is False
                nt = s["next_token"][0]
                assert nt["has_next_token"] is True and nt["n_remain"] == 1500 - nt["n_decoded"]
            r = client.get("/slots", params={"fail_on_no_slot": 1})
            assert r.status_code == 503
            assert r.text == '{"error":{"code":503,"message":"no slot available","type":"unavailable_error"}}'
            m = client.get("/metrics").text
            assert "llamacpp:requests_processing 2\n" in m
        # both clients went away: the server cancels the tasks and frees the slots
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not any(s["is_processing"] for s in client.get("/slots").json()):
            break
        time.sleep(0.1)
    assert not any(s["is_processing"] for s in client.get("/slots").json())
    assert client.get("/slots", params={"fail_on_no_slot": 1}).status_code == 200


# ---- Example 9 -----------------------------------------------------------------------------

def test_ex9_prompt_cache_pattern(client):
    q1, q2 = f"{PRE} Question: int x = 1/0;", f"{PRE} Question: String s = null; s.length();"
    reqs = [dict(prompt=q1), dict(prompt=q2), dict(prompt=q2, cache_prompt=False),
            dict(prompt="Unrelated text about cooking pasta."), dict(prompt=q1)]
    got = []
    for r in reqs:
        d = completion(client, n_predict=2, id_slot=0, **r)
        assert d["id_slot"] == 0
        got.append((d["tokens_evaluated"], d["timings"]["cache_n"], d["timings"]["prompt_n"]))
    assert got == [(38, 0, 38), (38, 30, 8), (38, 0, 38), (7, 0, 7), (38, 30, 8)]


# ---- Example 11 ----------------------------------------------------------------------------

def test_ex11_slot_save_erase_restore(client, slots_dir):
    d = completion(client, prompt=PRE, n_predict=0, id_slot=0)
    # b1-0c1e570 samples one token even at n_predict 0 (its limit is checked after a token); that
    # token is never decoded, so the slot holds the 28 prompt tokens
    assert d["tokens_evaluated"] == 28 and d["tokens_predicted"] == 1 and d["tokens_cached"] == 28
    r = client.post("/slots/0?action=save", json={"filename": "review-prefix2.bin"}).json()
    assert (r["id_slot"], r["filename"], r["n_saved"]) == (0, "review-prefix2.bin", 28)
    assert r["n_written"] == (slots_dir / "review-prefix2.bin").stat().st_size
    # the lesson's 29,264 bytes: 1040 per token (1024 KV + 4 token id + 12 cell metadata) and 144 fixed
    # (header 12, packed token state 16, two KV streams' counts 12, v_trans/n_layer 8, 4 layers x 24)
    assert r["n_written"] == 144 + 28 * 1040 == 29264
    assert "save_ms" in r["timings"]
    assert client.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": 28}
    q = f"{PRE} Question: int x = 1/0;"
    d = completion(client, prompt=q, n_predict=2, id_slot=0)
    assert (d["tokens_evaluated"], d["timings"]["cache_n"], d["timings"]["prompt_n"]) == (38, 0, 38)
    assert client.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": 39}
    r = client.post("/slots/0?action=restore", json={"filename": "review-prefix2.bin"}).json()
    assert (r["id_slot"], r["filename"], r["n_restored"], r["n_read"]) == (0, "review-prefix2.bin", 28, 29264)
    d = completion(client, prompt=q, n_predict=2, id_slot=0)
    assert (d["tokens_evaluated"], d["timings"]["cache_n"], d["timings"]["prompt_n"]) == (38, 28, 10)
    for bad in ("../etc/passwd", "a/b.bin", "..", "x\\y"):
        r = client.post("/slots/0?action=restore", json={"filename": bad})
        assert r.status_code == 400
        assert r.text == '{"error":{"code":400,"message":"Invalid filename","type":"invalid_request_error"}}'


# ---- Example 12 ----------------------------------------------------------------------------

def test_ex12_gbnf_yes_no(client):
    d = completion(client, prompt="Answer:", n_predict=20, temperature=0, grammar='root ::= ("yes" | "no") "\\n"')
    assert d["content"] in ("yes\n", "no\n")
    assert d["stop_type"] == "eos"
    assert 2 <= d["tokens_predicted"] <= 5  # the grammar's text, then the end-of-generation token


@pytest.mark.slow
def test_ex12_json_schema_response_format(client):
    schema = {"type": "object",
              "properties": {"file": {"type": "string", "maxLength": 12},
                             "lines": {"type": "integer", "minimum": 0, "maximum": 99999}},
              "required": ["file", "lines"], "additionalProperties": False}
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Give a file name and line count."}],
        "temperature": 0, "max_tokens": 400,
        "response_format": {"type": "json_schema", "json_schema": {"name": "file_info", "schema": schema}}})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop"
    obj = json.loads(c["message"]["content"])
    import jsonschema
    jsonschema.validate(obj, schema)
    # the grammar the server built is echoed by the native endpoint
    g = completion(client, prompt="x", n_predict=0, json_schema=schema)["generation_settings"]["grammar"]
    assert 'root ::= "{" space file-kv "," space lines-kv space "}"' in g


# ---- Example 15 ----------------------------------------------------------------------------

def values(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))}


def test_ex15_metrics(client):
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics").text
    assert text.startswith(
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total ")
    assert ("# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache\n"
            "# TYPE llamacpp:prompt_tokens_cached_total counter\n") in text
    fams = {f.name: f for f in text_string_to_metric_families(text)}  # valid Prometheus text
    val = values(text)
    assert fams["llamacpp:prompt_tokens"].type == "counter"
    assert fams["llamacpp:n_busy_slots_per_decode"].type == "gauge"
    assert val["llamacpp:prompt_tokens_total"] > 0 and val["llamacpp:prompt_tokens_cached_total"] >= 30 + 30 + 28
    assert val["llamacpp:tokens_predicted_total"] > 0 and val["llamacpp:n_decode_total"] > 0
    assert val["llamacpp:n_tokens_max"] >= 38
    assert val["llamacpp:requests_processing"] == 0 and val["llamacpp:requests_deferred"] == 0
    assert 1.0 <= val["llamacpp:n_busy_slots_per_decode"] <= 2.0
    # gauges are averaged over the window between scrapes; counters are cumulative
    val2 = values(client.get("/metrics").text)
    assert val2["llamacpp:prompt_tokens_seconds"] == 0 and val2["llamacpp:predicted_tokens_seconds"] == 0
    assert val2["llamacpp:prompt_tokens_total"] == val["llamacpp:prompt_tokens_total"]


# ---- Example 17 ----------------------------------------------------------------------------

def test_ex17_errors(client):
    def call(method, path, body=None):
        r = client.request(method, path, content=body)
        return r.status_code, r.text

    big = " ".join(["word"] * 2100)
    n = len(client.post("/tokenize", json={"content": client.post("/apply-template", json={
        "messages": [{"role": "user", "content": big}]}).json()["prompt"]}).json()["tokens"])
    assert n >= 2048
    st, text = call("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": big}],
                                                                 "max_tokens": 4}))
    assert st == 400
    assert json.loads(text) == {"error": {"code": 400, "message": f"request ({n} tokens) exceeds the available "
                                          "context size (2048 tokens), try increasing it",
                                          "type": "exceed_context_size_error", "n_prompt_tokens": n, "n_ctx": 2048}}
    st, text = call("POST", "/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}')
    assert st == 500
    err = json.loads(text)["error"]
    assert list(err) == ["code", "message", "type"] and err["code"] == 500 and err["type"] == "server_error"
    assert "column 44" in err["message"]
    assert call("POST", "/v1/chat/completions", '{"prompt":"hi"}') == (
        400, '{"error":{"code":400,"message":"\'messages\' is required","type":"invalid_request_error"}}')
    assert call("POST", "/v1/chat/completions",
                '{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}') == (
        400, '{"error":{"code":400,"message":"Field \'temperature\': [json.exception.type_error.302] type must be '
             'number, but is string","type":"invalid_request_error"}}')
    assert call("GET", "/v1/nothing") == (
        404, '{"error":{"message":"File Not Found","type":"not_found_error","code":404}}')
    assert call("POST", "/props", "{}") == (
        501, '{"error":{"code":501,"message":"This server does not support changing global properties. Start it '
             'with `--props`","type":"not_supported_error"}}')
    assert call("POST", "/v1/embeddings", '{"input":"hi"}') == (
        501, '{"error":{"code":501,"message":"This server does not support embeddings. Start it with '
             '`--embeddings`","type":"not_supported_error"}}')
    # the server is still fine
    assert client.get("/health").status_code == 200
