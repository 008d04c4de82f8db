"""Bad chat and completion bodies get b1-0c1e570's answers (api/chat_checks.py and the parameter
reads): each status, type and message below is what the reference server answered to the same
body (scripts/build_llama_server.sh's build on Qwen2.5 0.5B, 2026-12-05); and the lenient reads
b1 makes (a string `stop`, a `logit_bias` of another type, an empty message list) are served."""
from __future__ import annotations

import pytest

U = [{"role": "user", "content": "x"}]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def client(api_engine, api_client):
    with api_client(api_engine) as c:
        yield c


@pytest.mark.parametrize("route,body,status,kind,message", [
    (CHAT, {"messages": [{"content": "x"}]}, 500, "server_error",
     'Failed to parse messages: Missing \'role\' in message: {"content":"x"}'),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "invalid_request_error",
     "All non-assistant messages must contain 'content'"),
    (CHAT, {"messages": [{"role": "assistant"}]}, 400, "invalid_request_error",
     "Assistant message must contain either 'content' or 'tool_calls'!"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 500, "server_error",
     "Failed to parse messages: [json.exception.out_of_range.403] key 'text' not found"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "bogus", "text": "x"}]}]}, 400,
     "invalid_request_error", "unsupported content[].type"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "invalid_request_error",
     "Expected 'content' to be a string or an array"),
    (CHAT, {"messages": U, "tools": "x"}, 500, "server_error",
     'Failed to parse tools: Expected \'tools\' to be an array, got "x"; tools = "x"'),
    (CHAT, {"messages": U, "tools": [{"type": "function"}]}, 500, "server_error",
     'Failed to parse tools: Missing tool function: {"type":"function"}; tools = [\n  {\n    "type": "function"\n  }\n]'),
    (CHAT, {"messages": U, "stream_options": {"include_usage": "yes"}}, 400, "invalid_request_error",
     "Field 'include_usage': [json.exception.type_error.302] type must be boolean, but is string"),
    (CHAT, {"messages": U, "tools": [{"type": "function", "function": {"name": "x", "parameters": {"$ref": "#/nope"}}}]},
     400, "invalid_request_error", "Unable to generate parser for this template. Automatic parser generation failed: "
     "JSON schema error at #: cannot resolve $ref #/nope, nope not found"),
    (CHAT, {"messages": U, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "bogus"}}}]},
     400, "invalid_request_error", "Unable to generate parser for this template. Automatic parser generation failed: "
     "JSON schema error at #: unrecognized type bogus"),
    (CHAT, {"messages": U, "max_tokens": -7}, 400, "invalid_request_error",
     "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -7"),
    (CHAT, {"messages": U, "max_completion_tokens": -7, "max_tokens": 5}, 400, "invalid_request_error",
     "Field 'max_completion_tokens': Value must be between -1 <= value <= 2147483647, but got -7"),
    ("/v1/messages", {"messages": U, "max_tokens": -7}, 400, "invalid_request_error",
     "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -7"),
    ("/v1/responses", {"input": "x", "max_output_tokens": -7}, 400, "invalid_request_error",
     "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -7"),
    (CHAT, {"messages": U, "grammar": "bogus"}, 400, "invalid_request_error",
     "Failed to initialize samplers: failed to parse grammar"),
    ("/completion", {"prompt": "x", "grammar": "root ::= [", "n_predict": 1}, 400, "invalid_request_error",
     "Failed to initialize samplers: failed to parse grammar"),
    ("/completion", {"prompt": "x", "stop": ["a", 5], "n_predict": 1}, 400, "invalid_request_error",
     "Field 'stop': [json.exception.type_error.302] type must be string, but is number"),
    ("/v1/completions", {}, 400, "invalid_request_error", "[json.exception.out_of_range.403] key 'prompt' not found"),
])
def test_bad_bodies_get_llama_servers_answers(client, route, body, status, kind, message):
    r = client.post(route, json=dict({"max_tokens": 1}, **body) if route == CHAT else body)
    assert (r.status_code, r.json()) == (status, {"error": {"code": status, "message": message, "type": kind}})


def test_what_b1_reads_leniently_is_served(client):
    # an empty message list renders (the template's messages[0] is undefined, as in minja)
    assert client.post(CHAT, json={"messages": [], "max_tokens": 1}).status_code == 200
    # a `stop` that is neither a string nor an array, a `logit_bias` that is neither an array nor
    # an object: ignored
    assert client.post(CHAT, json={"messages": U, "max_tokens": 1, "stop": 5}).status_code == 200
    assert client.post("/completion", json={"prompt": "x", "n_predict": 1, "logit_bias": 5}).status_code == 200
    # a string `stop` on /completion too (b1's schema): generation ends before it
    free = client.post("/completion", json={"prompt": "a b", "n_predict": 6, "temperature": 0}).json()
    word = free["content"][2:4]
    assert word
    cut = client.post("/completion", json={"prompt": "a b", "n_predict": 6, "temperature": 0, "stop": word}).json()
    assert (cut["stop_type"], cut["stopping_word"]) == ("word", word) and word not in cut["content"]
    # /tokenize's flags are json_value reads: a wrong type is the default
    r = client.post("/tokenize", json={"content": "hello", "with_pieces": "yes"})
    assert r.status_code == 200 and all(isinstance(t, int) for t in r.json()["tokens"])


@pytest.mark.parametrize("field,value,message", [  # b1-0c1e570's range checks (set_hard_limits)
    ("repeat_last_n", -1, "Field 'repeat_last_n': Value must be between 0 <= value <= 2147483647, but got -1"),
    ("n_keep", -5, "Field 'n_keep': Value must be between -1 <= value <= 2147483647, but got -5"),
    ("n_predict", -5, "Field 'n_predict': Value must be between -1 <= value <= 2147483647, but got -5"),
    ("t_max_predict_ms", -3,
     "Field 't_max_predict_ms': Value must be between -1 <= value <= 9223372036854775807, but got -3"),
    ("adaptive_decay", 2, "Field 'adaptive_decay': Value must be between 0.000000 <= value <= 0.990000, but got 2.000000"),
    ("min_keep", -1, "Field 'min_keep': Value must be between 0 <= value <= 2147483647, but got -1"),
    ("n_discard", -1, "Field 'n_discard': Value must be between 0 <= value <= 2147483647, but got -1"),
    ("chat_format", "x", "Field 'chat_format': [json.exception.type_error.302] type must be number, but is string"),
    ("samplers", [5], "Field 'samplers': [json.exception.type_error.302] type must be string, but is number"),
    ("lora", "x", "Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields"),
])
def test_out_of_range_fields_are_refused_as_b1_refuses_them(client, field, value, message):
    r = client.post("/completion", json={"prompt": "x", "n_predict": 1, field: value})
    assert (r.status_code, r.json()["error"]["message"]) == (400, message)


def test_clamped_fields_are_echoed_clamped(client):
    """b1's set_limits: top_k -5 -> 0, temperature -1 -> 0, top_p 2 -> 1, xtc_threshold 7 -> 1."""
    body = {"prompt": "x", "n_predict": 1, "top_k": -5, "temperature": -1, "top_p": 2, "xtc_threshold": 7}
    g = client.post("/completion", json=body).json()["generation_settings"]
    assert (g["top_k"], g["temperature"], g["top_p"], g["xtc_threshold"]) == (0, 0.0, 1.0, 1.0)
    # a samplers value that is neither an array nor a string is ignored; token ids convert as in b1
    assert client.post("/completion", json={"prompt": "x", "n_predict": 1, "samplers": 5}).status_code == 200
    ids = client.post("/tokenize", json={"content": "hello"}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": [float(t) + 0.5 for t in ids]}).json()["content"] == "hello"
    r = client.post("/detokenize", json={"tokens": "a"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        500, "[json.exception.type_error.302] type must be array, but is string")


def test_the_first_present_token_limit_wins(client):
    """b1 reads n_predict, then max_completion_tokens, then max_tokens (its answers: 1 and 2 tokens)."""
    body = {"messages": U, "temperature": 0, "max_tokens": 3, "max_completion_tokens": 2, "ignore_eos": True}
    assert client.post(CHAT, json=dict(body, n_predict=1)).json()["usage"]["completion_tokens"] == 1
    assert client.post(CHAT, json=body).json()["usage"]["completion_tokens"] == 2
    body.pop("max_completion_tokens")
    assert client.post(CHAT, json=body).json()["usage"]["completion_tokens"] == 3


def test_generation_prompt_is_echoed_as_b1_echoes_it(api_engine, api_client):
    """generation_settings.generation_prompt (verbose chat, /slots): the template's assistant-turn
    opening, with a prefilled assistant message's text after it (b1: '<|im_start|>assistant\\n' and
    '<|im_start|>assistant\\nHel' on Qwen2.5's ChatML); a completion's is ""; and n_tokens_max counts
    what a slot's cache held (the last sampled token is never decoded)."""
    with api_client(api_engine, slots=True, metrics=True) as c:
        def echoed(messages):
            d = c.post(CHAT, json={"messages": messages, "max_tokens": 1, "verbose": True}).json()
            return d["__verbose"]["generation_settings"]["generation_prompt"]
        assert echoed(U) == "<|im_start|>assistant\n"
        assert echoed(U + [{"role": "assistant", "content": "Hel"}]) == "<|im_start|>assistant\nHel"
        c.post(CHAT, json={"messages": U, "max_tokens": 3, "temperature": 0, "id_slot": 0, "ignore_eos": True})
        slot0 = next(s for s in c.get("/slots").json() if s["id"] == 0)
        assert slot0["params"]["generation_prompt"] == "<|im_start|>assistant\n"
        d = c.post("/completion", json={"prompt": "x", "n_predict": 1, "id_slot": 1}).json()
        assert d["generation_settings"]["generation_prompt"] == ""
