"""Issue #13 in process (the real app on the tiny engine): deep nesting is a 400 and the connection
stays usable; NaN / Infinity / 1e400 / lone surrogates are rejected as llama-server's parser rejects
them; Python internals never reach messages; n_probs is capped."""
from __future__ import annotations

import time

import pytest

from api.params import N_PROBS_MAX


@pytest.fixture(scope="module")
def client(api_engine, api_client):
    with api_client(api_engine) as c:
        yield c


def envelope(r, status: int, type: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"code", "message", "type"} and err["code"] == status and err["type"] == type
    return err["message"]


@pytest.mark.parametrize("body", [b"[" * 10000, b'{"prompt":' + b"[" * 10000 + b"]" * 10000 + b"}",
                                  b'{"a":' * 5000 + b"1" + b"}" * 5000])
def test_deep_nesting_is_a_400_and_the_connection_stays_usable(client, body):
    msg = envelope(client.post("/completion", content=body), 400, "invalid_request_error")
    assert "nests too deeply" in msg and "recursion" not in msg
    assert client.get("/health").status_code == 200


def test_deeply_nested_schema_is_a_400(client):
    schema = '{"type":"array","items":' * 3000 + '{"type":"integer"}' + "}" * 3000
    r = client.post("/completion", content='{"prompt":"hi","n_predict":1,"json_schema":' + schema + "}")
    assert r.status_code == 400 and "recursion" not in r.text.lower(), r.text[:300]
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("literal, text", [  # llama-server b1-0c1e570's answers to the same bodies
    ("NaN", "column 44: syntax error while parsing value - invalid literal; last read: '\"temperature\":N'"),
    ("Infinity", "column 44: syntax error while parsing value - invalid literal; last read: '\"temperature\":I'"),
    ("-Infinity", "column 45: syntax error while parsing value - invalid number; expected digit after '-'; "
                  "last read: '-I'"),
])
def test_nan_and_infinity_are_parse_errors(client, literal, text):
    r = client.post("/completion", content=f'{{"prompt":"hi","n_predict":1,"temperature":{literal}}}')
    assert envelope(r, 500, "server_error") == "[json.exception.parse_error.101] parse error at line 1, " + text


def test_number_overflow_is_a_parse_error(client):
    r = client.post("/completion", content='{"prompt":"hi","n_predict":1,"temperature":1e400}')
    assert envelope(r, 500, "server_error") == "[json.exception.out_of_range.406] number overflow parsing '1e400'"


@pytest.mark.parametrize("s, text", [  # llama-server b1-0c1e570's answers to the same bodies
    ("\\ud800", "column 18: syntax error while parsing value - invalid string: surrogate U+D800..U+DBFF must be "
                 "followed by U+DC00..U+DFFF; last read: '\"\\ud800\"'"),
    ("x\\udc00x", "column 18: syntax error while parsing value - invalid string: surrogate U+DC00..U+DFFF must "
                   "follow U+D800..U+DBFF; last read: '\"x\\udc00'"),
    ("\\ud800\\u0041", "column 23: syntax error while parsing value - invalid string: surrogate U+D800..U+DBFF "
                         "must be followed by U+DC00..U+DFFF; last read: '\"\\ud800\\u0041'"),
])
def test_lone_surrogates_are_parse_errors(client, s, text):
    r = client.post("/completion", content=f'{{"prompt":"{s}","n_predict":1}}')
    assert envelope(r, 500, "server_error") == "[json.exception.parse_error.101] parse error at line 1, " + text


def test_valid_surrogate_pairs_and_escaped_backslashes_still_parse(client):
    r = client.post("/tokenize", content='{"content":"\\ud83d\\ude00 \\\\ud800"}')
    assert r.status_code == 200 and r.json()["tokens"]


@pytest.mark.parametrize("tc, text", [  # llama-server b1-0c1e570's answers to the same messages
    ([["a", "b"]], 'Missing tool call type: ["a","b"]'),
    ("x", 'Missing tool call type: "x"'),
    ([{"function": 5}], 'Missing tool call type: {"function":5}'),
    ([{"type": "function", "function": {"name": 1}}], "[json.exception.type_error.302] type must be string, but is number"),
    ([{"type": "function", "function": {"name": "f"}}], "[json.exception.out_of_range.403] key 'arguments' not found"),
])
def test_malformed_tool_calls_are_explained(client, tc, text):
    r = client.post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": tc}],
        "max_tokens": 1})
    assert envelope(r, 500, "server_error") == "Failed to parse messages: " + text


def test_empty_and_junk_slot_files_are_explained(api_engine, api_client):
    d = api_engine.cfg.slot_save_path
    client = api_client(api_engine, slot_save_path=d)
    open(f"{d}/empty.bin", "wb").close()
    open(f"{d}/short.bin", "wb").write(b"\x01\x00")
    for name, text in [("empty.bin", "empty file"), ("short.bin", "truncated or not a slot file")]:
        msg = envelope(client.post("/slots/0?action=restore", json={"filename": name}), 400, "invalid_request_error")
        assert text in msg and "unpack" not in msg and "buffer" not in msg


def test_n_probs_is_capped(client):
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 2, "n_probs": 1000000})
    assert r.status_code == 200
    body = r.json()
    assert body["generation_settings"]["n_probs"] == N_PROBS_MAX
    assert all(len(p["top_logprobs"]) == N_PROBS_MAX for p in body["completion_probabilities"])
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                  "logprobs": True, "top_logprobs": 10 ** 6})
    assert r.status_code == 200
    assert all(len(c["top_logprobs"]) == N_PROBS_MAX for c in r.json()["choices"][0]["logprobs"]["content"])


def test_huge_repetition_bounds_are_served_in_bounded_memory(client):
    import resource
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for schema in [{"type": "array", "minItems": 1000000000, "items": {"type": "integer"}},
                   {"type": "string", "minLength": 10000000}, {"type": "string", "pattern": "^[a-z]{5,2000000000}$"}]:
        r = client.post("/completion", json={"prompt": "hi", "n_predict": 4, "json_schema": schema})
        assert r.status_code == 200, r.text
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 4, "grammar": 'root ::= "a"{3000000000,}'})
    assert r.status_code == 200 and r.json()["content"] == "aaaa"
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024 < 100


def test_grammar_over_the_size_limit_is_a_400_naming_it(client):
    from grammar.gbnf import MAX_GRAMMAR_ELEMENTS
    grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(MAX_GRAMMAR_ELEMENTS // 4))
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 1, "grammar": grammar})
    msg = envelope(r, 400, "invalid_request_error")
    assert f"the limit is {MAX_GRAMMAR_ELEMENTS}" in msg
    assert client.get("/health").status_code == 200


def test_handle_whose_submitting_task_ended_is_released(api_engine):
    """A request cancelled before the code that would cancel its handle ran (e.g. a gather's child
    task cancelled before its first step) must not keep generating: the engine drops a handle
    whose submitting asyncio task has ended."""
    import asyncio

    from runtime.tasks import CompletionTask, SamplingParams

    task = CompletionTask([1, 2, 3], SamplingParams(ignore_eos=True), n_predict=200)

    async def submit_and_leave():
        return api_engine.submit(task)

    n0 = api_engine.metrics()["n_decode_total"]
    asyncio.run(submit_and_leave())
    t0 = time.monotonic()
    while any(s["is_processing"] for s in api_engine.slots_info()) or time.monotonic() - t0 < 0.3:
        time.sleep(0.01)
        assert time.monotonic() - t0 < 10
    assert api_engine.metrics()["n_decode_total"] - n0 < 100


def test_one_request_starts_a_bounded_number_of_tasks(client):
    """A few hundred kB of one-token prompts would be tens of thousands of tasks: refused with a 400
    naming the bound, before any is tokenized or queued; the server keeps serving."""
    from api.inputs import MAX_TASKS_PER_REQUEST

    many = ["a"] * (MAX_TASKS_PER_REQUEST + 1)
    for route, body in (("/completion", {"prompt": many, "n_predict": 1}),
                        ("/v1/completions", {"prompt": many, "max_tokens": 1}),
                        ("/completion", {"prompt": ["a"] * (MAX_TASKS_PER_REQUEST // 2 + 1), "n_predict": 1,
                                         "n_cmpl": 2})):
        msg = envelope(client.post(route, json=body), 400, "invalid_request_error")
        assert f"the limit is {MAX_TASKS_PER_REQUEST}" in msg, route
    assert client.post("/completion", json={"prompt": ["a", "b"], "n_predict": 1}).status_code == 200
    assert client.get("/health").status_code == 200


def test_embedding_inputs_are_bounded_too(api_engine, api_client):
    from api.inputs import MAX_TASKS_PER_REQUEST

    with api_client(api_engine, embeddings=True, pooling="mean") as c:
        r = c.post("/v1/embeddings", json={"input": ["a"] * (MAX_TASKS_PER_REQUEST + 1)})
        assert f"the limit is {MAX_TASKS_PER_REQUEST}" in envelope(r, 400, "invalid_request_error")
        assert len(c.post("/v1/embeddings", json={"input": ["a", "b"]}).json()["data"]) == 2
