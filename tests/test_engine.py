"""The engine end to end (no HTTP): slot choice, prompt caching rules of the lesson (Examples 9-11),
continuous batching, cancellation, embeddings. Uses a small model with the real Qwen2 vocabulary
so token counts equal the lesson's."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime.serving import Engine, EngineConfig, SlotError
from runtime.tasks import CompletionResult, CompletionTask, EmbeddingTask, SamplingParams, TaskError, TokenOut
from runtime.model.tiny_model import spec_with, write_tiny_model

SHARED = Path(__file__).resolve().parents[2] / "shared"
QWEN2 = SHARED / "vocab" / "ggml-vocab-qwen2.gguf"
PRE = ("You are a careful Java reviewer. Read the code, list each bug with its line number, "
       "and suggest a fix. Keep answers short.")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    if not QWEN2.exists():
        pytest.skip("../shared/vocab not available")
    path = tmp_path_factory.mktemp("engine") / "small-qwen2vocab.gguf"
    write_tiny_model(path, spec_with(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, init_std=0.1, seed=3),
                     vocab=QWEN2)
    return str(path)


def _engine(model_path, **kw) -> Engine:
    e = Engine(EngineConfig(model_path=model_path, verbosity=0, **kw))
    e.load()
    e.start()
    return e


@pytest.fixture(scope="module")
def engine(model_path, tmp_path_factory):
    slots_dir = tmp_path_factory.mktemp("slots")
    e = _engine(model_path, n_ctx=4096, n_parallel=2, slot_save_path=str(slots_dir))
    yield e
    e.stop()


def _run(e: Engine, prompt: str, **kw) -> CompletionResult:
    ids = e.tokenizer.encode(prompt, add_special=True, parse_special=True)
    params = kw.pop("params", SamplingParams(temperature=0))
    res = e.submit(CompletionTask(ids, params, **kw)).result_sync(timeout=120)
    assert isinstance(res, CompletionResult), res
    return res


def test_slot_layout(engine):
    assert engine.n_slots == 2 and engine.n_ctx_slot == 2048 and not engine.kv_unified
    assert engine.model_info["n_vocab"] == 151936


def test_lesson_example_9_prefix_and_ram_cache(engine):
    engine.slot_action(0, "erase")
    rows = []
    for prompt, extra in [(PRE + " Question: int x = 1/0;", {}),
                          (PRE + " Question: String s = null; s.length();", {}),
                          (PRE + " Question: String s = null; s.length();", {"cache_prompt": False}),
                          ("Unrelated text about cooking pasta.", {}),
                          (PRE + " Question: int x = 1/0;", {})]:
        r = _run(engine, prompt, n_predict=2, id_slot=0, **extra)
        rows.append((r.id_slot, r.n_prompt_tokens, r.timings.cache_n, r.timings.prompt_n))
    assert rows == [(0, 38, 0, 38), (0, 38, 30, 8), (0, 38, 0, 38), (0, 7, 0, 7), (0, 38, 30, 8)]


def test_identical_prompt_still_evaluates_one_token(engine):
    a = _run(engine, "Say hi twice please.", n_predict=3, id_slot=1)
    b = _run(engine, "Say hi twice please.", n_predict=3, id_slot=1)
    assert a.timings.cache_n == 0
    assert b.timings.cache_n == a.n_prompt_tokens - 1 and b.timings.prompt_n == 1
    assert a.tokens == b.tokens  # greedy output does not depend on the cache
    assert a.tokens_cached == a.n_prompt_tokens + 3 - 1  # the last sampled token is never decoded


def test_lesson_example_11_slot_files(engine):
    r = _run(engine, PRE, n_predict=0, id_slot=0)
    assert r.n_decoded == 1 and r.tokens_cached == 28  # b1 samples one token at n_predict 0, never decoded
    saved = engine.slot_action(0, "save", "review-prefix2.bin")
    L = engine.blocks.store.n_layers
    # llama-server's layout with two KV streams (one per slot): 48 + 24 per layer fixed bytes
    assert saved["n_saved"] == 28 and saved["n_written"] == 48 + 24 * L + 28 * (16 + engine.blocks.store.bytes_per_token)
    assert engine.slot_action(0, "erase")["n_erased"] == 28
    r = _run(engine, PRE + " Question: int x = 1/0;", n_predict=2, id_slot=0)
    assert (r.timings.cache_n, r.timings.prompt_n) == (0, 38)
    assert engine.slot_action(0, "erase")["n_erased"] == 39
    restored = engine.slot_action(0, "restore", "review-prefix2.bin")
    assert restored["n_restored"] == 28 and restored["n_read"] == saved["n_written"]
    r = _run(engine, PRE + " Question: int x = 1/0;", n_predict=2, id_slot=0)
    assert (r.timings.cache_n, r.timings.prompt_n) == (28, 10)
    for bad in ("../etc/passwd", "a/b", "..", ""):
        with pytest.raises(SlotError) as ei:
            engine.slot_action(0, "restore", bad)
        assert ei.value.code == 400 and ei.value.message == "Invalid filename"


def test_continuous_batching_matches_one_at_a_time(engine):
    prompts = ["first request", "second request here"]
    alone = [_run(engine, p, n_predict=12, params=SamplingParams(temperature=0, ignore_eos=True)).tokens for p in prompts]
    handles = [engine.submit(CompletionTask(engine.tokenizer.encode(p, add_special=True, parse_special=True),
                                            SamplingParams(temperature=0, ignore_eos=True), n_predict=12,
                                            cache_prompt=False))
               for p in prompts]
    together = [h.result_sync(timeout=120) for h in handles]
    assert {r.id_slot for r in together} == {0, 1}
    assert [r.tokens for r in together] == alone
    m = engine.metrics()
    assert m["n_busy_slots_per_decode"] > 1.0  # the two requests shared forward steps


def test_decode_graph_path_gives_the_same_tokens(model_path, engine, monkeypatch):
    """TRITIUM_CUDA_GRAPHS=eager: decode steps through the static buffers CUDA graphs replay
    (runtime.model.cuda_graphs, run eagerly here), three requests at once, bucket padding included."""
    prompts = ["first request", "second request here", "and a third one"]
    params = SamplingParams(temperature=0, ignore_eos=True)
    alone = [_run(engine, p, n_predict=10, params=params).tokens for p in prompts]
    monkeypatch.setenv("TRITIUM_CUDA_GRAPHS", "eager")
    e = _engine(model_path, n_ctx=2048, n_parallel=3)
    try:
        assert e.runner.graphs is not None and e.runner.graphs.buckets == [1, 2, 3]
        handles = [e.submit(CompletionTask(e.tokenizer.encode(p, add_special=True, parse_special=True), params,
                                           n_predict=10, cache_prompt=False)) for p in prompts]
        assert [h.result_sync(timeout=120).tokens for h in handles] == alone
    finally:
        e.stop()


def test_streaming_events_and_stop_word(engine):
    ids = engine.tokenizer.encode("Count: one two three", add_special=True)
    h = engine.submit(CompletionTask(ids, SamplingParams(temperature=0, ignore_eos=True), n_predict=6, stream=True))
    evs = list(h.iter_sync(timeout=120))
    toks = [e for e in evs if isinstance(e, TokenOut)]
    final = evs[-1]
    assert isinstance(final, CompletionResult) and final.stop_type == "limit"
    assert "".join(t.text for t in toks) == final.content
    assert [t.id for t in toks] == final.tokens
    # stop on a string the model produces: the first token's text
    word = engine.tokenizer.decode(final.tokens[1:2])
    if word.strip():
        r = _run(engine, "Count: one two three", n_predict=6, stop=[word],
                 params=SamplingParams(temperature=0, ignore_eos=True))
        assert r.stop_type == "word" and r.stopping_word == word and word not in r.content


def test_cancel_frees_the_slot(engine):
    ids = engine.tokenizer.encode("a long generation", add_special=True)
    h = engine.submit(CompletionTask(ids, SamplingParams(temperature=0, ignore_eos=True), n_predict=1500, stream=True,
                                     id_slot=1))
    it = h.iter_sync(timeout=120)
    next(it)
    h.cancel()
    r = _run(engine, "after cancel", n_predict=2, id_slot=1)
    assert r.id_slot == 1


def test_context_overflow_is_an_error(engine):
    ids = [100] * 2100
    res = engine.submit(CompletionTask(ids, SamplingParams(temperature=0), n_predict=4)).result_sync(timeout=60)
    assert isinstance(res, TaskError) and res.code == 400 and res.type == "exceed_context_size_error"
    assert res.extra == {"n_prompt_tokens": 2100, "n_ctx": 2048}


def test_generation_stops_at_context_end(engine):
    ids = [100] * 2040
    r = engine.submit(CompletionTask(ids, SamplingParams(temperature=0, ignore_eos=True), n_predict=50)).result_sync(120)
    assert r.truncated and r.stop_type == "limit" and r.n_decoded <= 8


def test_lesson_example_10_cache_reuse(model_path):
    e = _engine(model_path, n_ctx=4096, n_parallel=1, cache_ram_mib=0, cache_reuse=8)
    try:
        a = _run(e, "File: Main.java\n" + PRE + " Question: int x = 1/0;", n_predict=2)
        b = _run(e, PRE + " Question: int x = 1/0;", n_predict=2)
        assert (a.n_prompt_tokens, a.timings.cache_n, a.timings.prompt_n) == (43, 0, 43)
        assert (b.n_prompt_tokens, b.timings.cache_n, b.timings.prompt_n) == (38, 37, 1)
        assert b.tokens_cached == 39 and len(b.tokens) == 2
    finally:
        e.stop()


def test_embeddings_pooling(model_path):
    e = _engine(model_path, n_ctx=512, n_parallel=1, embeddings=True)
    try:
        ids = e.tokenizer.encode("public class Main", add_special=True)
        mean = e.submit(EmbeddingTask(ids, "mean", 2)).result_sync(60)
        none = e.submit(EmbeddingTask(ids, "none", -1)).result_sync(60)
        assert len(mean) == 1 and len(mean[0]) == 64
        assert abs(sum(x * x for x in mean[0]) - 1.0) < 1e-6
        assert len(none) == len(ids)
        import torch
        m = torch.tensor(none).mean(0)
        assert torch.allclose(m / m.norm(), torch.tensor(mean[0]), atol=1e-5)
    finally:
        e.stop()


def test_grammar_constrains_and_ends_with_eos(engine):
    r = _run(engine, "Answer:", n_predict=20, params=SamplingParams(temperature=0, grammar='root ::= ("yes" | "no") "\\n"'))
    assert r.content in ("yes\n", "no\n") and r.stop_type == "eos"


def test_lazy_grammar_activates_at_trigger(engine):
    free = _run(engine, "Tell me something", n_predict=6, params=SamplingParams(temperature=0, ignore_eos=True))
    trigger = engine.tokenizer.decode(free.tokens[2:3])
    assert trigger.strip()
    gbnf = 'root ::= ' + '"' + trigger.replace("\\", "\\\\").replace('"', '\\"') + '" [0-9] [0-9] [0-9]'
    p = SamplingParams(temperature=0, grammar=gbnf, grammar_lazy=True, grammar_triggers=[trigger])
    r = _run(engine, "Tell me something", n_predict=30, params=p)
    head = engine.tokenizer.decode(free.tokens[:2])
    assert r.content.startswith(head + trigger)  # free text before the trigger is unconstrained
    tail = r.content[len(head) + len(trigger):]
    assert len(tail) == 3 and tail.isdigit() and r.stop_type == "eos"


@pytest.mark.parametrize("seed", range(6))
def test_model_sampled_json_validates_against_random_schemas(engine, seed):
    """Property: whatever the random-weight model samples under a schema's grammar parses as JSON
    and validates against the schema (or stopped at the length limit)."""
    import json
    import random

    import jsonschema

    from grammar import json_schema_to_gbnf
    from tests.test_grammar_json_schema import random_schema

    rng = random.Random(seed)
    schema = random_schema(rng)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                            grammar=json_schema_to_gbnf(schema))
    r = _run(engine, "Give JSON:", n_predict=200, params=params)
    if r.stop_type == "eos":
        jsonschema.validate(json.loads(r.content), schema)
    else:
        assert r.stop_type == "limit" and r.n_decoded == 200


def test_empty_prompt_gives_an_empty_result_not_the_previous_one(engine):
    _run(engine, "something to remember", n_predict=4, id_slot=0)
    r = engine.submit(CompletionTask([], SamplingParams(temperature=0), n_predict=2, id_slot=0)).result_sync(60)
    assert isinstance(r, CompletionResult)
    assert r.content == "" and r.n_decoded == 0 and r.n_prompt_tokens == 0


def test_time_limit_stops_after_a_new_line(engine):
    nl = engine.tokenizer.encode("\n")[0]
    # bias the newline so it appears; with a 1 ms budget generation stops at the first token after it
    p = SamplingParams(temperature=0, ignore_eos=True, logit_bias=[(nl, 30.0)])
    r = _run(engine, "lines:", n_predict=50, params=p, t_max_predict_ms=1)
    assert r.stop_type == "limit" and r.n_decoded < 50 and "\n" in r.content
    r = _run(engine, "lines:", n_predict=5, params=SamplingParams(temperature=0, ignore_eos=True), t_max_predict_ms=0)
    assert r.n_decoded == 5


def test_unified_cache_purges_idle_slots_when_full(model_path):
    """-np auto: 4 slots share one pool of n_ctx tokens; idle slots keep their prompts until a
    new request needs the room, then idle slots are purged one at a time in slot order (llama.cpp does the same).
    With --cache-idle-slots (the default) idle slots of a unified cache are moved to the RAM cache and
    cleared as soon as another task starts, so the purge is what --no-cache-idle-slots relies on."""
    e = _engine(model_path, n_ctx=256, n_parallel=-1, cache_idle_slots=False)
    try:
        assert e.kv_unified and e.n_ctx_slot == 256
        for slot in range(3):
            r = _run(e, " ".join(["word"] * 70), n_predict=2, id_slot=slot, cache_prompt=True)
            assert isinstance(r, CompletionResult)
        assert sum(len(s.tokens) for s in e.slots) > 200  # the pool is mostly held by idle slots
        r = _run(e, " ".join(["other"] * 150), n_predict=4, id_slot=3)
        assert r.n_decoded == 4 and r.stop_type == "limit"
        assert any(not s.tokens for s in e.slots[:3])  # an idle slot's prompt was purged for it
    finally:
        e.stop()


def test_unified_cache_moves_idle_slots_to_ram(model_path):
    """--cache-idle-slots with -np auto: a task starting clears the other idle slots after saving
    them to the RAM cache, and a later prompt that an idle slot held comes back from there."""
    e = _engine(model_path, n_ctx=256, n_parallel=-1)
    try:
        prompt = " ".join(["word"] * 70)
        first = _run(e, prompt, n_predict=2, id_slot=0, cache_prompt=True)
        _run(e, " ".join(["other"] * 30), n_predict=2, id_slot=1, cache_prompt=True)
        assert not e.slots[0].tokens and e.slots[1].tokens  # slot 0 went to RAM when slot 1 started
        assert len(e.prompt_cache.entries) == 1
        again = _run(e, prompt, n_predict=2, cache_prompt=True)  # no id_slot: the LRU slot, from RAM
        assert again.timings.cache_n == first.timings.prompt_n - 1
    finally:
        e.stop()


def test_infill_tasks_leave_the_ram_cache_alone(engine):
    """llama-server updates its RAM prompt cache for completion tasks only: an /infill task taking
    a slot neither saves what the slot held nor loads a better entry (a completion does both). The
    other slot stays empty, so that --cache-idle-slots (any task) has nothing to save."""
    engine.slot_action(0, "erase")
    engine.slot_action(1, "erase")
    engine.prompt_cache.entries.clear()
    _run(engine, PRE + " Question: int x = 1/0;", n_predict=2, id_slot=0)
    _run(engine, "Unrelated text about cooking pasta.", n_predict=2, id_slot=0, infill=True)
    assert engine.prompt_cache.entries == []  # the slot's first prompt was not saved
    _run(engine, PRE + " Question: String s = null;", n_predict=2, id_slot=0)
    assert len(engine.prompt_cache.entries) == 1  # a completion saves what it displaces
    r = _run(engine, "Unrelated text about cooking pasta, again.", n_predict=2, id_slot=0, infill=True)
    assert r.timings.cache_n == 0 and len(engine.prompt_cache.entries) == 1


def test_n_tokens_max_is_what_a_slot_held(model_path):
    """llamacpp:n_tokens_max, as b1-0c1e570 keeps it (the most tokens a slot's cache held after a
    decode): prompt + generated - 1, the last sampled token never being decoded (b1: 33 for a 30-token
    chat prompt and 4 generated tokens)."""
    e = _engine(model_path, n_ctx=512, n_parallel=1)
    try:
        r = _run(e, PRE, n_predict=4, params=SamplingParams(temperature=0, ignore_eos=True))
        assert r.n_decoded == 4
        assert e.metrics()["n_tokens_max"] == r.n_prompt_tokens + 3
    finally:
        e.stop()
