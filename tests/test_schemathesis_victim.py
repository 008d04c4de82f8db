"""Schemathesis (4.x) against a real server process (`-np 2`) with a victim beside it (issue 38 item 6).

The schema is the app's own OpenAPI document with llama-server's request bodies (api/openapi.py;
not served over HTTP, as llama-server serves none: read from Python with
`schemathesis.openapi.from_dict`). Every canonical POST route gets bodies that follow the schema
(positive) and bodies that break it one way at a time (negative: wrong types, out-of-range numbers,
missing required fields), sent to slot 1 with a short generation while tests/test_fuzz_victim.py's
watch runs a greedy victim in slot 0 and polls /health. The same invariants: every victim run is
the token ids it produces alone; no 5xx but llama-server's documented ones, errors in its envelope;
/health 200 within HEALTH_MAX_S; no error message names Python internals; RSS bounded.

Derandomized; `TRITIUM_FUZZ_SEED=random` (or a number) explores; `TRITIUM_SCHEMATHESIS_EXAMPLES`
sets the count (CI: 120, about a minute here).
"""
from __future__ import annotations

import os

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from api.openapi import ALIASES
from api.server import ServerConfig, create_app
from runtime.model.tiny_model import spec_with, write_tiny_model
from tests.test_fuzz_victim import (CAPPED, HEALTH_MAX_S, PYTHON_WORDS, RSS_GROWTH_MB, Watch, check_answer,
                                    error_messages, rss_mb, victim)

EXAMPLES = int(os.environ.get("TRITIUM_SCHEMATHESIS_EXAMPLES", "120"))
WARMUP = 30  # cases sent before the RSS baseline (another seed)
_SEED = os.environ.get("TRITIUM_FUZZ_SEED", "")
SKIPPED = {"/cors-proxy"}  # a URL fetcher (off without --ui-mcp-proxy), not llama-server's request bodies


def openapi_schema():
    """The document the app builds (no engine needed), its canonical POST routes only: aliases
    share a handler, GET routes are tests/test_api_fuzz.py's."""
    doc = create_app(ServerConfig(model_path="schema.gguf"), None).openapi()
    doc["paths"] = {p: {"post": ops["post"]} for p, ops in doc["paths"].items()
                    if "post" in ops and p not in ALIASES and p not in SKIPPED}
    return schemathesis.openapi.from_dict(doc)


def test_schema_describes_llama_server_bodies():
    """The request bodies are llama-server's fields (a check of api/openapi.py itself, no server)."""
    doc = create_app(ServerConfig(model_path="schema.gguf"), None).openapi()

    def props(path):
        return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]

    assert {"prompt", "n_predict", "temperature", "json_schema", "logit_bias", "id_slot"} <= set(props("/completion"))
    assert props("/completions") == props("/completion")
    chat = props("/v1/chat/completions")
    assert [m["required"] for m in chat["messages"]["items"]["anyOf"]] == [
        ["role", "content"], ["role", "content"], ["role", "tool_calls"]]
    assert "tool_choice" in chat
    assert props("/detokenize")["tokens"]["items"]["type"] == "integer"
    assert {"input_prefix", "input_suffix", "input_extra"} <= set(props("/infill"))
    assert {"max_tokens", "messages", "system"} <= set(props("/v1/messages"))
    missing = [p for p, ops in doc["paths"].items() if "post" in ops and p not in SKIPPED
               and "requestBody" not in ops["post"]]
    assert not missing, missing
    assert len(list(openapi_schema().get_all_operations())) >= 15


GENERATING = ("/completion", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/infill")


def bounded(case) -> None:
    """A generating case in slot 1 with at most 8 tokens to generate (one asking for none gets 8):
    the run stays short. Slot actions keep their generated slot: a save, restore or erase of the
    victim's slot is hostile too."""
    if not isinstance(case.body, dict) or case.path not in GENERATING:
        return
    b = dict(case.body, id_slot=1)
    if not any(k in b for k in CAPPED):
        b["n_predict"] = 8
    for k in CAPPED:
        v = b.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (v > 8 or int(v) == -1):
            b[k] = 8  # (-1 is no limit; other negatives stay: they are refused)
    case.body = b


def run_cases(url: str, examples: int, fuzz_seed: str, tally: dict) -> None:
    """Send `examples` schemathesis cases (positive and negative) and check each answer; `tally`
    collects the error messages, (path, status) counts and the 5xx texts met."""
    schema = openapi_schema()
    cases = st.one_of(schema.as_strategy(generation_mode=GenerationMode.POSITIVE),
                      schema.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    session = requests.Session()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=not fuzz_seed,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def run(case):
        bounded(case)
        r = session.request(**case.as_transport_kwargs(base_url=url), timeout=120)
        check_answer(r, f"{case.method} {case.formatted_path} {str(case.body)[:300]}")
        tally.setdefault("messages", []).extend(error_messages(r))
        seen = tally.setdefault("seen", {})
        seen[(case.path, r.status_code)] = seen.get((case.path, r.status_code), 0) + 1
        if r.status_code >= 500:
            tally.setdefault("5xx", set()).add(r.text[:120])

    if fuzz_seed and fuzz_seed != "random":
        run = seed(int(fuzz_seed))(run)
    run()


@pytest.fixture(scope="module")
def srv(start_server, tmp_path_factory):
    d = tmp_path_factory.mktemp("schemathesis-victim")
    path = d / "st-victim-tiny.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                                     name="st-victim-tiny", seed=7), vocab="builtin")
    (d / "slots").mkdir()
    return start_server("-m", str(path), "-c", "2048", "-np", "2", "--metrics", "--slots", "--props",
                        "--embeddings", "--pooling", "mean", "--slot-save-path", str(d / "slots"))


def test_schemathesis_never_harms_a_victim(srv):
    alone = victim(srv.url)
    run_cases(srv.url, WARMUP, "1", {})  # caches and lazily built pieces settle before RSS is read
    rss0 = rss_mb(srv.proc.pid)
    tally: dict = {}
    watch = Watch(srv.url, alone)
    try:
        run_cases(srv.url, EXAMPLES, _SEED, tally)
    finally:
        watch.finish()
    lat, seen, messages = sorted(watch.health), tally["seen"], tally.get("messages", [])
    rss1 = rss_mb(srv.proc.pid)
    print(f"schemathesis: {sum(seen.values())} requests, victims {watch.victims}, /health n={len(lat)} "
          f"p99={lat[int(len(lat) * 0.99)] * 1e3:.0f} ms max={lat[-1] * 1e3:.0f} ms, "
          f"RSS {rss0:.0f} -> {rss1:.0f} MB; {sorted(seen.items())}; 5xx: {sorted(tally.get('5xx', ()))}")
    assert watch.victims >= 2 and not watch.wrong, (watch.victims, watch.wrong[:3])
    assert not watch.bad_health and lat[-1] < HEALTH_MAX_S, (watch.bad_health[:3], lat[-1])
    leaked = sorted({m[:200] for m in messages if PYTHON_WORDS.search(m)})
    assert not leaked, leaked[:10]
    assert any(code == 200 for _, code in seen) and any(code == 400 for _, code in seen), seen
    assert rss1 - rss0 < RSS_GROWTH_MB, (rss0, rss1)
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    assert httpx.get(srv.url + "/openapi.json", timeout=30).status_code == 404  # as llama-server: not served
