"""The server on its built-in default model (no ../shared needed): API keys (lesson Example 2),
CORS, -lv 4 prompt-cache log lines, generation on every endpoint, plus the API layer's pure
helpers (metrics text, error envelopes, request field types).
"""
from __future__ import annotations

import json
import time

import httpx
import pytest

from api.errors import ApiError, context_exceeded, invalid_api_key, loading_model
from api.metrics import format_value, render
from api.params import Fields, f32, parse_stop


@pytest.fixture(scope="module")
def keyed(start_server, tmp_path_factory):
    keyfile = tmp_path_factory.mktemp("keys") / "keys.txt"
    keyfile.write_text("from-file-key\n\n")
    s = start_server("--api-key", "secret-123,other", "--api-key-file", str(keyfile), "-lv", "4", "-np", "2",
                     "--cors-origins", "https://ok.example")
    yield s
    s.stop()


def test_ex2_api_keys(keyed):
    url = keyed.url
    bad = '{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
    for headers in ({}, {"Authorization": "Bearer nope"}, {"X-Api-Key": "nope"}):
        r = httpx.get(url + "/v1/models", headers=headers)
        assert (r.status_code, r.text) == (401, bad)
    for headers in ({"Authorization": "Bearer secret-123"}, {"Authorization": "Bearer other"},
                    {"X-Api-Key": "secret-123"}, {"Authorization": "Bearer from-file-key"}):
        r = httpx.get(url + "/v1/models", headers=headers)
        assert r.status_code == 200 and "models" in r.json()
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    assert httpx.get(url + "/v1/health").status_code == 200
    assert "security: no API key" not in keyed.log()


def test_cors(keyed):
    r = httpx.options(keyed.url + "/v1/chat/completions", headers={"Origin": "https://ok.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ok.example"
    # llama-server sends an explicit --cors-origins value as it is, whatever the request's Origin
    r = httpx.get(keyed.url + "/health", headers={"Origin": "https://evil.example"})
    assert r.headers["access-control-allow-origin"] == "https://ok.example"


def test_verbose_log_lines(keyed):
    log = keyed.log()
    assert "I srv    load_model: prompt cache is enabled, size limit: 8192 MiB" in log
    assert "I srv    load_model: use `--cache-ram 0` to disable the prompt cache" in log
    assert "n_slots = 2, n_ctx_slot = 2048, kv_unified = 'false'" in log


def test_generation_endpoints(keyed):
    h = {"Authorization": "Bearer secret-123"}
    with httpx.Client(base_url=keyed.url, headers=h, timeout=60) as c:
        d = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3, "temperature": 0}).json()
        assert d["object"] == "text_completion" and d["choices"][0]["finish_reason"] == "length"
        assert d["usage"]["completion_tokens"] == 3
        # stop strings end generation with stop_type "word"
        first = c.post("/completion", json={"prompt": "hello", "n_predict": 4, "temperature": 0}).json()["content"]
        word = first.strip().split(" ")[0] if first.strip() else None
        if word:
            d = c.post("/completion", json={"prompt": "hello", "n_predict": 4, "temperature": 0, "stop": [word]}).json()
            assert d["stop_type"] == "word" and d["stopping_word"] == word and word not in d["content"]
        # n_probs: completion_probabilities with top candidates
        d = c.post("/completion", json={"prompt": "hello", "n_predict": 2, "n_probs": 3, "temperature": 0}).json()
        probs = d["completion_probabilities"]
        assert len(probs) == 2 and all(len(p["top_logprobs"]) == 3 for p in probs)
        # a final assistant message is continued (prefill)
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"},
                                                              {"role": "assistant", "content": "Sure"}],
                                                 "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200
        p1 = c.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
        n1 = len(c.post("/tokenize", json={"content": p1 + "Sure"}).json()["tokens"])
        assert r.json()["usage"]["prompt_tokens"] == n1


def test_error_after_bad_input_server_survives(keyed):
    h = {"Authorization": "Bearer secret-123"}
    with httpx.Client(base_url=keyed.url, headers=h, timeout=30) as c:
        # n above -np 2 is refused (n <= --parallel is served, as by llama-server b1-0c1e570)
        for body in ("[1,2]", "null", '{"messages": 5}', '{"messages":[{"role":"user","content":"x"}],"n":3}',
                     '{"messages":[{"role":"user","content":"x"}],"grammar":"root ::= ("}'):
            r = c.post("/v1/chat/completions", content=body)
            assert 400 <= r.status_code < 600 and "error" in r.json()
        assert c.post("/slots/0?action=save", json={"filename": "x.bin"}).status_code == 501
        # llama-server b1-0c1e570 refuses every slot action, a bad one too, without --slot-save-path
        assert c.post("/slots/0?action=bogus").status_code == 501
        assert c.get("/metrics").status_code == 501
        assert c.get("/health").status_code == 200


# ---- pure helpers ----------------------------------------------------------------------------

def test_error_envelopes_key_order():
    assert json.dumps(loading_model().body()) == \
        '{"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}'
    assert list(invalid_api_key().body()["error"]) == ["message", "type", "code"]
    e = context_exceeded(2118, 2048).body()["error"]
    assert list(e) == ["code", "message", "type", "n_prompt_tokens", "n_ctx"]
    assert e["message"] == "request (2118 tokens) exceeds the available context size (2048 tokens), try increasing it"


def test_field_type_errors():
    f = Fields({"temperature": "hot", "stream": 1, "stop": "x", "top_k": 3.0, "seed": None})
    with pytest.raises(ApiError, match=r"Field 'temperature': \[json.exception.type_error.302\] type must be "
                                       r"number, but is string"):
        f.number("temperature", 0.8)
    with pytest.raises(ApiError, match="type must be boolean, but is number"):
        f.boolean("stream", False)
    assert f.integer("top_k", 40) == 3 and f.integer("seed", 7) == 7  # null -> default
    # b1-0c1e570's schema reads "stop" as a string or an array on every route; other values: none
    assert parse_stop("x", openai=True) == parse_stop("x", openai=False) == ["x"]
    assert parse_stop(5, openai=False) == [] and parse_stop(["a", "", None], openai=False) == ["a"]
    with pytest.raises(ApiError, match="type must be string, but is number"):
        parse_stop(["a", 5], openai=False)
    assert f32(0.8) == 0.800000011920929 and f32(0.95) == 0.949999988079071


def test_metrics_text_format():
    from prometheus_client.parser import text_string_to_metric_families

    text = render({"llamacpp:prompt_tokens_total": 207, "prompt_seconds_total": 0.436448,
                   "tokens_predicted_seconds_total": 33.54761, "n_busy_slots_per_decode": 1.891729})
    assert "llamacpp:prompt_tokens_total 207\n" in text
    assert "llamacpp:prompt_seconds_total 0.436448\n" in text
    assert "llamacpp:tokens_predicted_seconds_total 33.5476\n" in text
    assert "llamacpp:n_busy_slots_per_decode 1.89173\n" in text
    assert "# TYPE llamacpp:n_busy_slots_per_decode gauge\n" in text
    assert len(list(text_string_to_metric_families(text))) == 16  # b1-0c1e570's 15 + kv_cache_usage_ratio (README "Scaling out")
    assert format_value(1234567) == "1.23457e+06"


def test_llama_server_script_flags_are_accepted(start_server, tmp_path):
    """A typical llama-server launch line works unchanged: accepted flags (GPU offload, flash
    attention, batch sizes, load mode, NUMA, continuous batching, tensor overrides, draft model placement
    and speculative settings), the ones with an effect here (-C pins the process, --log-file,
    --no-warmup, -ctk/-ctv, -b, RoPE overrides). (b1-0c1e570 has no --mlock / --no-mmap: -lm.)"""
    import os
    log_file = tmp_path / "server.log"
    srv = start_server("-ngl", "99", "-fa", "on", "-b", "1024", "-ub", "512", "-tb", "2", "-lm", "mmap+mlock",
                       "--numa", "distribute", "-cb", "--no-warmup", "-C", "1", "-ctk", "f32", "-ctv", "f32",
                       "--rope-freq-base", "20000", "-sm", "none", "-mg", "0", "--threads-http", "4",
                       "-dt", "0.1", "--no-webui", "-td", "2", "-ngld", "0", "--spec-draft-n-max", "8",
                       "--spec-type", "ngram-simple", "-ot", "exps=CPU", "--n-cpu-moe", "4", "--log-file",
                       str(log_file), "-dev", "none", "--top-nsigma", "-1", "--ignore-eos")
    assert os.sched_getaffinity(srv.proc.pid) == {0}
    r = httpx.post(srv.url + "/completion", json={"prompt": "hello", "n_predict": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    assert r.json()["generation_settings"]["ignore_eos"] is True  # a sampling default from the command line
    text = log_file.read_text()
    assert "listening on" in text and "rope_freq_base = 20000.0 (command line)" in text
    assert "speculative decoding: ngram-simple" in srv.log()  # (-md FILE that cannot be read stops the start, as b1)


@pytest.mark.parametrize("flag,value", [("--control-vector", "x.gguf"), ("-mu", "http://h/m.gguf"),
                                        ("--control-vector-scaled", "x.gguf:0.5")])
def test_unsupported_llama_server_flags_fail_clearly(flag, value):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "api.cli", flag] + ([value] if value else []), capture_output=True,
                       text=True, timeout=60,
                       cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert r.returncode == 1
    assert r.stderr.startswith('error while handling argument "') and ("not supported" in r.stderr or "unsupported" in r.stderr)


def test_server_grammar_flag_is_every_request_default(start_server, tmp_path):
    """--grammar-file (as llama-server scripts use it): requests without a grammar of their own
    are constrained by it; a request's own grammar or json_schema replaces it."""
    g = tmp_path / "yes.gbnf"
    g.write_text('root ::= "yes" | "no"\n')
    srv = start_server("--grammar-file", str(g))
    r = httpx.post(srv.url + "/completion", json={"prompt": "answer:", "n_predict": 8, "temperature": 1.0}, timeout=60)
    assert r.status_code == 200 and r.json()["content"] in ("yes", "no")
    r = httpx.post(srv.url + "/completion", json={"prompt": "answer:", "n_predict": 8, "grammar": 'root ::= "maybe"'},
                   timeout=60)
    assert r.json()["content"] == "maybe"
    r = httpx.post(srv.url + "/completion", json={"prompt": "x", "n_predict": 20, "json_schema": {"type": "integer"}},
                   timeout=60)
    assert r.json()["content"].strip().lstrip("-").isdigit()


def test_bad_server_grammar_stops_at_start(tmp_path):
    import subprocess
    import sys
    g = tmp_path / "bad.gbnf"
    g.write_text("root ::= \"unterminated\n")
    r = subprocess.run([sys.executable, "-m", "api.cli", "--grammar-file", str(g)], capture_output=True, text=True,
                       timeout=60, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert r.returncode == 1 and r.stderr.startswith('error while handling argument "--grammar-file"')


# key lists of llama-server b1-0c1e570 (scripts/build_llama_server.sh), same flags, same requests
_REAL_PROPS_KEYS = ["default_generation_settings", "total_slots", "model_alias", "model_ftype", "model_path",
                    "modalities", "media_marker", "endpoint_slots", "endpoint_props", "endpoint_metrics", "ui",
                    "ui_settings", "chat_template", "chat_template_caps", "bos_token", "eos_token", "build_info",
                    "is_sleeping", "cors_proxy_enabled"]
_REAL_PARAMS_KEYS = ["seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
                     "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
                     "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
                     "dry_allowed_length", "dry_penalty_last_n", "mirostat", "mirostat_tau", "mirostat_eta",
                     "adaptive_target", "adaptive_decay", "max_tokens", "n_predict", "n_keep", "n_discard",
                     "ignore_eos", "stream", "n_probs", "min_keep", "chat_format", "reasoning_format",
                     "reasoning_in_content", "generation_prompt", "samplers", "speculative.types",
                     "timings_per_token", "post_sampling_probs", "backend_sampling", "lora"]


def test_props_and_slots_have_llama_servers_shape(start_server):
    srv = start_server("-np", "2", "-c", "1024")
    props = httpx.get(srv.url + "/props").json()
    assert list(props) == _REAL_PROPS_KEYS
    assert list(props["default_generation_settings"]["params"]) == _REAL_PARAMS_KEYS
    assert props["default_generation_settings"]["params"]["dry_penalty_last_n"] == 64
    assert props["media_marker"].startswith("<__media_") and props["model_ftype"]
    fresh = httpx.get(srv.url + "/slots").json()
    assert [list(s) for s in fresh] == [["id", "n_ctx", "speculative", "is_processing"]] * 2
    r = httpx.post(srv.url + "/completion", json={"prompt": "hello\n\nworld", "n_predict": 5, "temperature": 0,
                                                  "n_probs": 1}, timeout=60)
    assert r.status_code == 200
    gen = r.json()["generation_settings"]
    assert "adaptive_decay" in gen and "speculative.types" in gen and "thinking_forced_open" not in gen
    used = [s for s in httpx.get(srv.url + "/slots").json() if "id_task" in s]
    assert len(used) == 1
    s = used[0]
    assert list(s) == ["id", "n_ctx", "speculative", "is_processing", "id_task", "n_prompt_tokens",
                       "n_prompt_tokens_processed", "n_prompt_tokens_cache", "params", "next_token"]
    assert list(s["params"]) == _REAL_PARAMS_KEYS
    assert (s["params"]["n_probs"], s["params"]["max_tokens"], s["params"]["temperature"]) == (1, 5, 0.0)
    assert s["next_token"] == [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]


def _sse(url: str, body: dict) -> list:
    out = []
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def test_stream_chunks_have_llama_servers_shape(start_server):
    """As llama-server b1-0c1e570 streams: native partial chunks carry the token id and the running
    tokens_predicted; the last /v1/completions chunk carries usage (before its id) unasked."""
    srv = start_server("-np", "1", "-c", "512")
    chunks = _sse(srv.url + "/completion", {"prompt": "hello", "n_predict": 3, "temperature": 0, "stream": True,
                                            "ignore_eos": True})
    partial = [c for c in chunks if not c["stop"]]
    assert [list(c) for c in partial] == [["index", "content", "tokens", "stop", "id_slot", "tokens_predicted",
                                           "tokens_evaluated"]] * len(partial)
    assert all(len(c["tokens"]) == 1 for c in partial)
    assert [c["tokens_predicted"] for c in partial] == list(range(1, len(partial) + 1))
    chunks = _sse(srv.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2, "temperature": 0, "stream": True})
    assert chunks[-1] == "[DONE]"
    last = chunks[-2]
    assert list(last) == ["choices", "created", "model", "system_fingerprint", "object", "usage", "id", "timings"]
    assert last["usage"]["completion_tokens"] == 2


def test_logit_bias_and_mirostat_flags_set_the_sampling_defaults():
    """-l TOKEN_ID(+/-)BIAS (repeatable, common/arg.cpp's format) and --mirostat/-lr/-ent become
    every request's defaults; b1 answered the same bias list for `-l 15043+1 -l "11-2.5"`."""
    from api.cli import server_config
    from api.cli_args import ArgError, build_parser

    args = build_parser().parse_args(["-l", "15043+1", "-l", "11-2.5", "--mirostat", "2", "--mirostat-lr", "0.2",
                                      "--mirostat-ent", "3"])
    d = server_config(args).defaults
    assert d.logit_bias == [(15043, 1.0), (11, -2.5)]
    assert (d.mirostat, d.mirostat_eta, d.mirostat_tau) == (2, f32(0.2), 3.0)
    with pytest.raises(ArgError, match='"-l": invalid input format'):  # the spelling given, as llama-server
        server_config(build_parser().parse_args(["-l", "15043"]))


def test_api_prefix_and_https(start_server, tmp_path):
    """--api-prefix P serves every route at P + path and nothing outside it (llama-server's 404
    envelope); --ssl-key-file / --ssl-cert-file serve HTTPS (a self-signed pair made here)."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (it makes the test's certificate)")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost"], check=True, capture_output=True)
    srv = start_server("--api-prefix", "/api", "--ssl-key-file", str(key), "--ssl-cert-file", str(cert), wait=False)
    base = srv.url.replace("http://", "https://")
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    deadline = time.time() + 120
    while True:
        try:
            if httpx.get(base + "/api/health", verify=ctx, timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, srv.log()
        time.sleep(0.2)
    r = httpx.post(base + "/api/completion", json={"prompt": "hi", "n_predict": 2}, verify=ctx, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
    r = httpx.get(base + "/health", verify=ctx, timeout=5)
    assert (r.status_code, r.json()) == (404, {"error": {"message": "File Not Found", "type": "not_found_error",
                                                         "code": 404}})
    with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
        httpx.get(srv.url + "/api/health", timeout=5)
    assert "listening on https://" in srv.log()
