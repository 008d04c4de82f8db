"""Draft-free speculative decoding (--spec-type ngram-simple / ngram-mod, runtime/serving/spec.py):
the drafters as llama.cpp b1-0c1e570 defines them, and greedy outputs token-identical with and
without speculation (a tiny model with the real Qwen2 vocabulary, several slots batched together,
and the real Qwen2.5-Coder-0.5B Q4_K_M on a code-editing prompt); timings' draft_n /
draft_n_accepted, /slots and /metrics through the server."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import numpy as np
import pytest

from runtime.serving import Engine, EngineConfig
from runtime.serving.spec import NgramMod, Speculator, ngram_simple_draft
from runtime.spec_config import NgramMapParams, NgramModParams, SpecConfig, SpecType
from runtime.tasks import CompletionResult, CompletionTask, SamplingParams
from scripts import bench_spec

SHARED = Path(__file__).resolve().parents[2] / "shared"
QWEN2 = SHARED / "vocab" / "ggml-vocab-qwen2.gguf"
SIMPLE = SpecConfig(types=(SpecType.NGRAM_SIMPLE,), ngram_simple=NgramMapParams(3, 8, 1))
MOD = SpecConfig(types=(SpecType.NGRAM_MOD,), ngram_mod=NgramModParams(n_match=3, n_max=8, n_min=2))
MAP_K = SpecConfig(types=(SpecType.NGRAM_MAP_K,), ngram_map_k=NgramMapParams(3, 8, 1))
MAP_K4V = SpecConfig(types=(SpecType.NGRAM_MAP_K4V,), ngram_map_k4v=NgramMapParams(2, 6, 1))


# ---- the drafters ----------------------------------------------------------------------------

def test_ngram_simple_drafts_what_followed_the_latest_match():
    toks = np.array([9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 40, 50, 60, 70, 80, 90, 11, 12, 13, 1, 2], dtype=np.int64)
    # pattern (last 2 cached + sampled) = [1, 2, 3]: at 9 (latest) and 1; the draft is what followed at 9
    assert ngram_simple_draft(3, 4, toks, 3) == [40, 50, 60, 70]
    # a match too close to the end to copy n tokens: none
    assert ngram_simple_draft(3, 4, toks[:14], 3) == [] and ngram_simple_draft(3, 4, toks, 99) == []
    # position 0 never counts; too short a history: none
    assert ngram_simple_draft(3, 4, np.array([1, 2, 3, 7, 7, 7, 7, 7, 7, 1, 2], dtype=np.int64), 3) == []
    assert ngram_simple_draft(3, 4, toks[:8], 3) == []
    # m bounds the copy
    assert ngram_simple_draft(3, 3, toks, 3) == [40, 50, 60]


def test_ngram_mod_chains_lookups():
    mod = NgramMod(3, size=1 << 20)
    seq = np.array([5, 6, 7, 8, 9, 10, 11], dtype=np.int64)
    mod.add_range(seq, 0, len(seq) - 3)  # [5,6,7]->8 ... [8,9,10]->11
    assert mod.used == 4 and mod.get([5, 6, 7]) == 8 and mod.get([8, 9, 10]) == 11 and mod.get([1, 2, 3]) == -1
    sp = Speculator(SpecConfig(types=(SpecType.NGRAM_MOD,), ngram_mod=NgramModParams(3, 4, 2)), 1)
    sp.begin(0, [5, 6, 7, 8, 9, 10, 11, 12])
    assert sp.draft(0, [1, 5, 6], 7, 16) == [8, 9, 10, 11]  # n_max 4
    assert sp.draft(0, [1, 5, 6], 7, 2) == [8, 9]  # the slot's own bound
    assert sp.draft(0, [1, 2, 3, 10], 11, 16) == []  # [3, 10, 11] unseen: nothing before n_min


def test_ngram_map_k_drafts_after_the_latest_key_and_learns_acceptance():
    from runtime.serving.ngram_map import NgramMap
    mp = NgramMap(NgramMapParams(2, 3, 1), key_only=True)
    hist = [9, 1, 2, 5, 6, 7, 8, 3, 3, 1, 2, 40, 50, 60, 70, 4, 4, 4, 4, 4, 11, 1]
    mp.begin(len(hist))
    assert mp.draft(hist, 2) == [40, 50, 60]  # key [1, 2]: its latest occurrence (index 9)
    mp.accept(1)  # one token accepted: the next draft of that key is one token
    assert mp.draft(hist, 2) == [40]
    assert mp.draft(hist, 77) == []  # an unseen key
    k4v = NgramMap(NgramMapParams(2, 2, 1), key_only=False)
    hist = [0, 1, 2, 7, 8, 1, 2, 7, 8, 1, 2, 5, 6, 0, 0, 0, 0, 1]
    k4v.begin(len(hist))
    # values after [1, 2]: [7, 8] twice, [5, 6] once: 2 >= 2 * 1 drafts (b1 copies what follows the
    # latest occurrence, whichever value won)
    assert k4v.draft(hist, 2) == [5, 6]
    k4v = NgramMap(NgramMapParams(2, 2, 1), key_only=False)
    hist = [0, 1, 2, 7, 8, 1, 2, 5, 6, 0, 0, 0, 0, 1]
    k4v.begin(len(hist))
    assert k4v.draft(hist, 2) == []  # [7, 8] once, [5, 6] once: no value dominates


# ---- greedy identity on a tiny model ---------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from runtime.model.tiny_model import spec_with, write_tiny_model
    if not QWEN2.exists():
        pytest.skip("../shared/vocab not available")
    path = tmp_path_factory.mktemp("spec") / "tiny-qwen2vocab.gguf"
    write_tiny_model(path, spec_with(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, init_std=0.1, seed=3),
                     vocab=QWEN2)
    return str(path)


def _engine(path: str, spec: SpecConfig, **kw) -> Engine:
    e = Engine(EngineConfig(model_path=path, verbosity=0, n_ctx=4096, n_parallel=3, warmup=False, spec=spec, **kw))
    e.load()
    e.start()
    return e


PROMPTS = ["def f(x):\n    return x + 1\n" * 12, "The quick brown fox jumps over the lazy dog. " * 8,
           "Unrelated short prompt"]


def _generate(e: Engine, prompts: list[str], n: int, **params) -> list[CompletionResult]:
    """The prompts as concurrent tasks (they share forwards: continuous batching)."""
    sp = SamplingParams(**{"temperature": 0, **params})
    handles = [e.submit(CompletionTask(e.tokenizer.encode(p, add_special=True, parse_special=True), sp, n_predict=n,
                                       cache_prompt=False)) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(handles)) as ex:
        out = list(ex.map(lambda h: h.result_sync(timeout=300), handles))
    assert all(isinstance(r, CompletionResult) for r in out), out
    return out


@pytest.fixture(scope="module")
def baseline(tiny_path):
    e = _engine(tiny_path, SpecConfig())
    try:
        yield {"plain": _generate(e, PROMPTS, 120), "penalized": _generate(e, PROMPTS[:1], 80, repeat_penalty=1.3),
               "sampled": _generate(e, PROMPTS[:1], 80, temperature=0.7, seed=11)}
    finally:
        e.stop()


@pytest.mark.parametrize("spec", [SIMPLE, MOD, MAP_K, MAP_K4V], ids=["ngram-simple", "ngram-mod", "ngram-map-k",
                                                                  "ngram-map-k4v"])
def test_greedy_identical_with_speculation_batched(tiny_path, baseline, spec):
    e = _engine(tiny_path, spec)
    try:
        got = _generate(e, PROMPTS, 120)
        pen = _generate(e, PROMPTS[:1], 80, repeat_penalty=1.3)
        sampled = _generate(e, PROMPTS[:1], 80, temperature=0.7, seed=11)
        slots = e.slots_info()
        m = e.metrics()
    finally:
        e.stop()
    for a, b in zip(baseline["plain"], got):
        assert b.tokens == a.tokens and b.content == a.content
        assert b.tokens_cached == a.tokens_cached  # the rejected rows left the cache
        assert b.stop_type == a.stop_type and b.n_decoded == a.n_decoded
    assert pen[0].tokens == baseline["penalized"][0].tokens  # the penalty sees the tokens one at a time
    # temperature > 0: each row is sampled from the model's own distribution, one draw per token in
    # order, so a seeded request gives the same tokens (the draft only says how far a step goes)
    assert sampled[0].tokens == baseline["sampled"][0].tokens
    drafted = [r.timings.draft_n for r in got]
    accepted = [r.timings.draft_n_accepted for r in got]
    assert drafted[0] > 0 and 0 < accepted[0] <= drafted[0]  # the repeated code drafts and is accepted
    d = got[0].timings.as_dict()
    assert d["draft_n"] == drafted[0] and d["draft_n_accepted"] == accepted[0]
    no_draft = [r for r in got if r.timings.draft_n == 0]
    assert all("draft_n" not in r.timings.as_dict() for r in no_draft)  # listed only with a draft, as b1
    assert all(s["speculative"] is True for s in slots)
    assert m["spec_decode_num_draft_tokens_total"] == sum(drafted) + pen[0].timings.draft_n + sampled[0].timings.draft_n
    assert m["spec_decode_num_accepted_tokens_total"] == (sum(accepted) + pen[0].timings.draft_n_accepted
                                                          + sampled[0].timings.draft_n_accepted)
    assert m["spec_decode_num_drafts_total"] > 0


def test_draft_bounded_by_n_predict_and_context(tiny_path, baseline):
    e = _engine(tiny_path, SIMPLE)
    try:
        short = _generate(e, PROMPTS[:1], 9)[0]
    finally:
        e.stop()
    assert short.tokens == baseline["plain"][0].tokens[:9] and short.n_decoded == 9
    assert short.timings.draft_n <= 9 - 2  # at most n_remaining - 1 per step, after the first token


# ---- the real model: a code-editing prompt ----------------------------------------------------

# the benchmark's code-editing request (scripts/bench_spec.py: the same prompt builder)
EDIT_PROMPT = bench_spec.code_prompt(*bench_spec.FUNCS[0])


def test_real_qwen_code_edit_greedy_identical():
    from runtime.model.model_files import QWEN
    from tests.llama_tokens import real_model_path

    path = str(real_model_path(QWEN))
    out = {}
    for name, spec in (("plain", SpecConfig()), ("spec", SpecConfig(types=(SpecType.NGRAM_SIMPLE,)))):
        e = Engine(EngineConfig(model_path=path, verbosity=0, n_ctx=2048, n_parallel=1, warmup=False, spec=spec))
        e.load()
        e.start()
        try:
            ids = e.tokenizer.encode(EDIT_PROMPT, add_special=False, parse_special=True)
            out[name] = e.submit(CompletionTask(ids, SamplingParams(temperature=0), n_predict=96)).result_sync(600)
        finally:
            e.stop()
    a, b = out["plain"], out["spec"]
    assert isinstance(a, CompletionResult) and isinstance(b, CompletionResult)
    assert b.tokens == a.tokens and len(a.tokens) > 40
    assert b.timings.draft_n_accepted > 20  # the answer repeats the prompt's code


# ---- the server: flags, timings, /slots, /metrics --------------------------------------------

def test_server_spec_flags_timings_slots_metrics(start_server, tiny_path):
    srv = start_server("-m", tiny_path, "-np", "2", "-c", "2048", "--metrics", "--spec-type", "ngram-simple",
                       "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8")
    prompt = "def f(x):\n    return x + 1\n" * 12
    r = httpx.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 64, "temperature": 0}, timeout=120)
    t = r.json()["timings"]
    assert r.json()["generation_settings"]["speculative.types"] == "none,ngram-simple"  # as llama-server echoes it
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
    assert all(s["speculative"] is True for s in httpx.get(srv.url + "/slots", timeout=30).json())
    metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    line = next(x for x in metrics.splitlines() if x.startswith("llamacpp:spec_decode_num_draft_tokens_total"))
    assert float(line.split()[-1]) == t["draft_n"]


@pytest.mark.parametrize("args,message", [
    (["--spec-type", "foo"], 'error while handling argument "--spec-type": unknown speculative type: foo'),
    (["--spec-ngram-simple-size-n", "0"], "ngram size N must be between 1 and 1024 inclusive"),
    (["--spec-ngram-mod-n-max", "2000"], "ngram n-max must be between 0 and 1024 inclusive"),
])
def test_bad_spec_flags_fail_as_llama_server(args, message):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "api.cli", *args], capture_output=True, text=True, timeout=60,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert r.returncode == 1 and message in r.stderr
