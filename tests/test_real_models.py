"""The two real models (Qwen2.5-Coder-0.5B-Instruct and Gemma 3 270M, Q4_K_M) against llama-server
b1-0c1e570: tokenizations and greedy tokens recorded by scripts/record_real_references.py into
tests/data/real_models_reference.json; chat, JSON schema and the Qwen2.5 tool-call round trip on
tritium itself. The models come from scripts/fetch_models.py (CI runs it first); without them
these tests skip with a message that names it.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest

from runtime.model.model_files import GEMMA, QWEN
from tests.llama_tokens import real_model_path, recorded_tokens
N_PREDICT = 32


def _reference(key: str) -> dict:
    return recorded_tokens("real_models_reference.json")["models"][key]


@pytest.fixture(scope="module", params=[QWEN, GEMMA], ids=lambda m: m.key)
def real(request):
    return request.param


@pytest.fixture(scope="module")
def servers(start_server):
    started: dict[str, object] = {}

    def get(m):
        if m.key not in started:  # one server per model for the whole module
            path = real_model_path(m)
            started[m.key] = start_server("-m", str(path), "-np", "4", "-c", "4096", wait=False).wait_ready(900)
        return started[m.key]

    yield get
    for s in started.values():
        s.stop()


# ---- tokenizer ------------------------------------------------------------------------------

def test_tokenizer_round_trips_and_matches_llama_server(real):
    from runtime.tokenizer import load_tokenizer

    tk = load_tokenizer(real_model_path(real))
    ref = _reference(real.key)["tokenize"]
    assert len(ref) == 8
    for item in ref:
        ids = tk.encode(item["text"], add_special=False, parse_special=True)
        assert ids == item["tokens"], item["text"]
        assert tk.decode(ids) == item["text"]
    # real text of some length, plain (special-token texts stay text)
    text = Path(__file__).read_text(encoding="utf-8")
    assert tk.decode(tk.encode(text, add_special=False, parse_special=False)) == text
    if real is GEMMA:
        assert tk.n_vocab == 262_144 and tk.bos_id == 2 and tk.eos_id == 1


# ---- greedy tokens against llama-server ----------------------------------------------------

def test_greedy_tokens_match_llama_server(real, servers):
    srv = servers(real)
    ref = _reference(real.key)["completions"]
    assert len(ref) == 8

    def run(item):
        body = {"prompt": item["prompt"], "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False,
                "return_tokens": True}
        return httpx.post(srv.url + "/completion", json=body, timeout=900).json()["tokens"]

    # one request at a time, as the reference was recorded (-np 1): a batch of rows reaches the same
    # logits through other kernels (prefill GEMM vs decode GEMV), which moves near-ties either way
    got = [run(item) for item in ref]
    same = [g == item["tokens"] for g, item in zip(got, ref)]
    detail = [(item["prompt"][:30], sum(a == b for a, b in zip(g, item["tokens"]))) for g, item in zip(got, ref)]
    assert all(len(g) == N_PREDICT for g in got)
    # issue 15's target is 6 of 8 for both. The reference depends on the float order of the CPU build
    # llama.cpp ran (its AVX2 build's tokens differ from its AVX-512 build's on 4 of the 8 Qwen prompts),
    # so each order has its recording (tests/data/ and tests/data/avx2/, `recorded_tokens`).
    # Before tritium computed llama.cpp's float arithmetic bit for bit (2026-12-05, kernels/README.md
    # "Numerics"): Qwen 7-8/8, Gemma 3 5/8 (near ties that any other float order moves: llama-server
    # with --no-repack agrees with itself on 4/8). Since: 8/8 for both (tests/test_exact_numerics.py
    # checks the logits themselves); on AVX2-only CPUs 8/8 for both since 2026-12-07 (llama.cpp's AVX2
    # SwiGLU and tiled-attention exp; before, against the AVX-512 recording, 5/8 and 5/8).
    need = 6
    assert sum(same) >= need, f"{sum(same)}/8 prompts identical over {N_PREDICT} tokens; matching prefix: {detail}"


def test_a_repeated_greedy_request_gives_the_same_numbers_from_the_cache(real, servers):
    """The second request finds its prompt cached and evaluates only its last token, alone:
    llama-server answers it with the same tokens and probabilities as the first (its attention
    gives a row the same bits in any batch under 64 rows), and so must we (before, the prompt's
    rows went through another attention kernel than a lone row: Qwen's " Paris. Paris is located
    in ..." became " Paris. The capital of the United States ..." the second time)."""
    srv = servers(real)
    body = {"prompt": "The capital of France is", "n_predict": 16, "temperature": 0, "n_probs": 3, "id_slot": 3,
            "cache_prompt": True}
    httpx.post(srv.url + "/completion", json=dict(body, prompt="Something else first.", n_predict=1), timeout=900)
    first = httpx.post(srv.url + "/completion", json=body, timeout=900).json()
    again = httpx.post(srv.url + "/completion", json=body, timeout=900).json()
    # llama-server on the sliding-window model resumes from its context checkpoint before the last 4
    # prompt tokens and evaluates from the token before it (cache_n 1, prompt_n 5 for these 6 tokens),
    # in the same batch as the first time; on Qwen the last token alone
    assert first["timings"]["cache_n"] <= 1
    n = first["timings"]["cache_n"] + first["timings"]["prompt_n"]  # the prompt's tokens
    assert (again["timings"]["cache_n"], again["timings"]["prompt_n"]) == ((n - 5, 5) if real is GEMMA else (n - 1, 1))
    assert again["content"] == first["content"]
    assert again["completion_probabilities"] == first["completion_probabilities"]


# ---- chat, schema, tools -------------------------------------------------------------------

def test_chat_answer_to_a_coding_question_contains_code(servers):
    srv = servers(QWEN)
    body = {"messages": [{"role": "user", "content": "Write a Python function `square(x)` that returns x squared."}],
            "max_tokens": 80, "temperature": 0}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=900).json()
    text = r["choices"][0]["message"]["content"]
    assert "def square(" in text and "return" in text, text


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


def test_json_schema_request_validates(real, servers):
    srv = servers(real)
    body = {"messages": [{"role": "user", "content": "Describe a person as JSON with a name and an age."}],
            "max_tokens": 48, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=900).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop", r
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_qwen25_tool_call_round_trip(servers):
    """The 0.5B coder model, asked plainly, writes the call's JSON without the <tool_call> tags (so
    there is nothing to parse); the assistant turn is therefore prefilled with "<tool_call>\n", after
    which the required-tool grammar holds the call and the Hermes parser must return it. With the
    template's default (parallel calls) b1-0c1e570's grammar lets the block take more calls after a
    comma, and this model keeps adding cities until max_tokens, as llama-server does on this file
    (2026-12-05: Paris, London, Berlin, ...); one call per block ends the turn."""
    srv = servers(QWEN)
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    body = {"messages": messages + [{"role": "assistant", "content": "<tool_call>\n"}], "tools": TOOLS,
            "tool_choice": "required", "max_tokens": 40, "temperature": 0}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=900).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["message"]["tool_calls"]) >= 2, r
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert {c["function"]["name"] for c in choice["message"]["tool_calls"]} == {"get_weather"}
    r = httpx.post(srv.url + "/v1/chat/completions", json={**body, "parallel_tool_calls": False}, timeout=900).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls", r
    calls = choice["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    args = json.loads(calls[0]["function"]["arguments"])
    assert isinstance(args.get("city"), str) and args["city"]
    # the call and its result go back through the Qwen2.5 template: <tool_call> / <tool_response>
    messages += [{"role": "assistant", "content": None, "tool_calls": calls},
                 {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"temperature_c": 18, "sky": "clear"}'}]
    prompt = httpx.post(srv.url + "/apply-template", json={"messages": messages, "tools": TOOLS}).json()["prompt"]
    assert "<tool_call>" in prompt and '"name": "get_weather"' in prompt
    assert "<tool_response>\n{\"temperature_c\": 18" in prompt
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 40, "temperature": 0}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=900).json()
    msg = r["choices"][0]["message"]
    assert msg["role"] == "assistant" and (msg.get("content") or msg.get("tool_calls")), r
