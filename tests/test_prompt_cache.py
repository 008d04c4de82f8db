"""Prompt reuse (runtime/serving/prompt_cache.py): prefix match, --cache-reuse plan, RAM prompt cache."""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from runtime.model.kv_store import KVState
from runtime.serving.prompt_cache import PromptCache, cache_reuse_plan
from runtime.serving.slots import common_prefix


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_cache_reuse_plan_lesson_example_10():
    # cached: 5 header tokens + 38 prompt tokens + 1 generated; new prompt: the 38 without the header
    body = list(range(100, 138))
    cache = [1, 2, 3, 4, 5] + body + [999]
    moves, n_past = cache_reuse_plan(cache, body, 0, 8)
    assert moves == [(5, 0, 38)] and n_past == 38
    # a chunk shorter than the threshold is not reused
    moves, n_past = cache_reuse_plan([1, 2, 3] + body[:5], body[:5] + [7], 0, 8)
    assert moves == [] and n_past == 0


def _state(n):
    """n positions of one layer, one head of 4 float32 values, as a store exports them."""
    rows = torch.zeros(1, n, 16, dtype=torch.uint8)
    return KVState(rows, rows.clone(), GGMLQuantizationType.F32, GGMLQuantizationType.F32)


def test_prompt_cache_save_dedup_and_take_best():
    pc = PromptCache(limit_bytes=None)
    a = list(range(40))
    assert pc.save(a, lambda: _state(40))
    assert not pc.save(a[:20], lambda: _state(20))  # already a prefix of a saved prompt
    b = list(range(1000, 1008))
    pc.save(b, lambda: _state(8))
    # the new prompt shares 30 tokens with `a`: it beats an unrelated slot content
    new = a[:30] + [5000] * 8
    e = pc.take_best(b, new)
    assert e is not None and e.tokens == a
    assert [x.tokens for x in pc.entries] == [b]  # a hit moves the state out of the cache
    # entries keeping less than a quarter of themselves are never used
    pc.save(list(range(100)), lambda: _state(100))
    assert pc.take_best([], list(range(20)) + [7]) is None


def test_prompt_cache_evicts_oldest_over_limit():
    size = _state(10).nbytes
    assert size == 2 * 10 * 16
    pc = PromptCache(limit_bytes=2 * size)
    for i in range(4):
        pc.save([i * 100 + j for j in range(10)], lambda: _state(10))
        pc.update()
    assert len(pc.entries) == 2 and pc.entries[0].tokens[0] == 200


def test_prompt_cache_alloc_and_trace_as_llama_server():
    """server_prompt_cache::alloc: a state larger than the whole limit is not stored (and evicts
    nothing); room is made before a state goes in; update's trace lines name every entry."""
    size = _state(10).nbytes
    lines: list[str] = []
    pc = PromptCache(limit_bytes=2 * size, limit_tokens=4096, trace=lines.append)
    assert pc.save(list(range(10)), lambda: _state(10), size)
    assert not pc.save(list(range(100, 130)), lambda: _state(30), 3 * size)  # over the limit alone
    assert [e.tokens[0] for e in pc.entries] == [0] and "exceeds cache size limit" in lines[-1]
    assert pc.save(list(range(200, 210)), lambda: _state(10), size)
    assert pc.save(list(range(300, 310)), lambda: _state(10), size)  # the oldest goes first
    assert [e.tokens[0] for e in pc.entries] == [200, 300]
    lines.clear()
    pc.update()
    assert lines[0].endswith(f"cache state: 2 prompts, {2 * size / 2**20:.3f} MiB (limits: {2 * size / 2**20:.3f} MiB, "
                             f"4096 tokens, 4096 est)")
    assert len(lines) == 3 and all("tokens, checkpoints:  0," in x for x in lines[1:])
    empty = PromptCache(limit_bytes=8 << 30, limit_tokens=4096, trace=lines.append)
    empty.update()  # no entries: the estimate is the byte limit at one byte per token, as llama-server prints
    assert lines[-1].endswith("(limits: 8192.000 MiB, 4096 tokens, 8589934592 est)")
