"""Property-based fuzzing of every route (issue #13): hypothesis strategies over request bodies
(known fields with hostile values, arbitrary JSON, arbitrary bytes) sent to the real app on the tiny
engine in process. Properties: no 5xx except llama-server's JSON parse error (500 server_error
`[json.exception...`) and its 501 not_supported; every error (and every error event of a stream)
in llama-server's envelope with `code` equal to the status; the server healthy after, every slot
idle. The routes come from the app's own OpenAPI schema, so routes added later are fuzzed too.

Bounded to about two minutes (`FUZZ_EXAMPLES` per route group). Derandomized by default so CI is
reproducible; `TRITIUM_FUZZ_SEED=random` (or a number) explores new cases.
"""
from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from api.inputs import ELEMENTS_ERROR

FUZZ_EXAMPLES = int(os.environ.get("TRITIUM_FUZZ_EXAMPLES", "250"))
_SEED = os.environ.get("TRITIUM_FUZZ_SEED", "")

FIELDS = [
    "prompt", "messages", "n_predict", "max_tokens", "max_completion_tokens", "temperature", "top_k", "top_p",
    "min_p", "typical_p", "stream", "stream_options", "json_schema", "grammar", "grammar_lazy", "grammar_triggers",
    "response_format", "tools", "tool_choice", "parallel_tool_calls", "n_probs", "logprobs", "top_logprobs",
    "post_sampling_probs", "stop", "seed", "logit_bias", "samplers", "id_slot", "cache_prompt", "n_keep",
    "n_cache_reuse", "t_max_predict_ms", "ignore_eos", "return_tokens", "content", "tokens", "with_pieces",
    "add_special", "parse_special", "input", "input_extra", "input_prefix", "input_suffix", "filename",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
    "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau",
    "xtc_probability", "xtc_threshold", "top_n_sigma", "min_keep", "dynatemp_range", "dynatemp_exponent",
    "preserved_tokens", "n", "embd_normalize", "encoding_format", "chat_template_kwargs", "reasoning_format",
    "chat_template", "add_generation_prompt", "continue_final_message", "model", "user", "lora", "n_indent",
    "timings_per_token", "return_progress", "reasoning_budget",
]

ints = st.one_of(st.integers(-3, 300), st.sampled_from([-1, 0, 1, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 2**64 - 1,
                                                        10**30]))
floats = st.one_of(st.floats(-10, 10, allow_nan=False), st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324]))
texts = st.one_of(st.text(max_size=40), st.sampled_from(["", "<|im_start|>", "<|im_end|>", "\x00", "\ud83d\ude00",
                                                         "root ::= \"a\"", "{", "[", "w" * 2000]))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts)
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                           st.dictionaries(st.text(max_size=8), kids, max_size=5)),
                           max_leaves=20)
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "x"]),
                           "content": st.one_of(texts, st.none(), json_values)},
                          optional={"tool_calls": json_values, "reasoning_content": texts, "name": texts}),
    json_values), max_size=4)
schemas = st.one_of(json_values, st.sampled_from([
    {"type": "array", "minItems": 1000000000, "items": {"type": "integer"}},
    {"type": "string", "minLength": 10000000}, {"type": "string", "pattern": "^(a|b){2,100000}$"},
    {"type": "integer", "minimum": -10**20, "maximum": 10**20}, {"$ref": "#/nope"}, {"type": "object"},
]))
grammars = st.one_of(texts, st.sampled_from(['root ::= "a"{1000000000}', 'root ::= ("a"?){0,1000000}',
                                             "root ::= " + "(" * 3000 + '"a"' + ")" * 3000, 'root ::= x',
                                             'root ::= [a-z]{2,}']))
special = {
    "prompt": st.one_of(texts, st.lists(st.one_of(ints, texts), max_size=6), json_values),
    "messages": messages, "json_schema": schemas, "grammar": grammars,
    "response_format": st.one_of(json_values, st.fixed_dictionaries({"type": st.sampled_from(
        ["json_object", "json_schema", "text", "x"]), "json_schema": st.one_of(schemas, st.fixed_dictionaries(
            {"schema": schemas}))})),
    "n_predict": st.one_of(st.integers(-2, 8), ints), "max_tokens": st.one_of(st.integers(-2, 8), ints),
    "stream": st.one_of(st.booleans(), json_values), "n_probs": st.one_of(st.integers(-2, 30), ints),
}
bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6).flatmap(
        lambda d: st.fixed_dictionaries({k: special.get(k, json_values) for k in d})),
    json_values,
)
raw_bodies = st.one_of(st.binary(max_size=64), st.sampled_from([
    b"[" * 10000, b'{"prompt":"hi","temperature":NaN}', b'{"prompt":"\\ud800"}', b'{"n_predict":1e400}',
    b'{"prompt":' + b"9" * 5000 + b"}", b"\xff\xfe", b"{}" * 3, b'{"prompt":"hi"', b"null"]))


def _routes(app) -> list[tuple[str, str]]:
    out = []
    for path, ops in app.openapi()["paths"].items():
        for method in ops:
            out.append((method.upper(), path.replace("{id_slot}", "0")))
    return sorted(out)


@pytest.fixture(scope="module")
def fuzz_client(api_engine, api_client):
    with api_client(api_engine, slot_save_path=api_engine.cfg.slot_save_path, metrics=True, props=True) as c:
        yield c


def check(r, what: str) -> None:
    status = r.status_code
    if status >= 400:
        try:
            err = r.json()["error"]
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{what}: {status} without the error envelope: {r.text[:300]!r}") from e
        if status == 403 and err == {"message": "this feature is disabled", "type": "feature_disabled"}:
            return  # llama-server's res_403 (server.cpp, e.g. /cors-proxy without --ui-mcp-proxy) has no "code"
        assert {"code", "message", "type"} <= set(err) and err["code"] == status, (what, r.text[:300])
        if status >= 500:
            parse_error = status == 500 and err["type"] == "server_error" and err["message"].startswith(
                "[json.exception.")
            # server-chat.cpp's Anthropic converter throws runtime_error("'messages' is required"): a 500 there too
            no_messages = what.startswith("POST /v1/messages") and err == {
                "code": 500, "message": "'messages' is required", "type": "server_error"}
            # b1 tokenizes an embedding's input outside its handler's try: a bad element is its 500
            bad_element = what.startswith(("POST /v1/embeddings", "POST /embedding")) and err == {
                "code": 500, "message": ELEMENTS_ERROR, "type": "server_error"}
            # common/chat.cpp's message / tool parses throw runtime_error: b1's 500 (e.g. a null tool call:
            # "Failed to parse messages: Missing tool call type: null", checked against llama-server b1-0c1e570)
            chat_parse = status == 500 and err["type"] == "server_error" and err["message"].startswith(
                ("Failed to parse messages: ", "Failed to parse tools: "))
            assert parse_error or no_messages or bad_element or chat_parse or (status == 501 and err["type"] == "not_supported_error"), (what, r.text[:500])
        return
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        for chunk in r.text.split("\n\n"):
            if chunk.startswith("data: ") and chunk != "data: [DONE]":
                ev = json.loads(chunk[6:])
                if "error" in ev:
                    err = ev["error"]
                    assert {"code", "message", "type"} <= set(err), (what, chunk[:300])
                    assert err["code"] < 500 or err["message"].startswith("[json."), (what, chunk[:300])


def _fuzz(fuzz_client, strategy, send) -> None:
    routes = [r for r in _routes(fuzz_client.app) if r[0] == "POST"]

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=not _SEED,
              suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(routes), body=strategy)
    def run(route, body):
        method, path = route
        r = send(method, path, body)
        check(r, f"{method} {path} {str(body)[:200]}")

    if _SEED and _SEED != "random":
        run = seed(int(_SEED))(run)
    run()


def _healthy(client, engine) -> None:
    assert client.get("/health").status_code == 200
    deadline = time.monotonic() + 10
    while any(s["is_processing"] for s in engine.slots_info()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(s["is_processing"] for s in engine.slots_info())


def test_fuzz_json_bodies_on_every_route(fuzz_client, api_engine):
    _fuzz(fuzz_client, bodies, lambda m, p, b: fuzz_client.request(m, p, content=json.dumps(b)))
    _healthy(fuzz_client, api_engine)


def test_fuzz_raw_bodies_on_every_route(fuzz_client, api_engine):
    _fuzz(fuzz_client, raw_bodies, lambda m, p, b: fuzz_client.request(m, p, content=b))
    _healthy(fuzz_client, api_engine)


def test_get_routes_and_queries(fuzz_client, api_engine):
    for method, path in _routes(fuzz_client.app):
        if method == "GET":
            for q in ["", "?model=x", "?fail_on_no_slot=1", "?action=save&filename=../x"]:
                check(fuzz_client.get(path + q), f"GET {path}{q}")
    for q in ["?action=save", "?action=restore", "?action=erase", "?action=x", ""]:
        for slot in ["0", "-1", "99", "x", "1e3"]:
            check(fuzz_client.post(f"/slots/{slot}{q}", json={"filename": "../../etc/passwd"}), f"slot {slot}{q}")
    _healthy(fuzz_client, api_engine)
