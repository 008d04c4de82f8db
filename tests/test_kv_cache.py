"""Block pool, block tables, copy-on-write prefix sharing, KV moves with key re-rotation, export/import."""
from __future__ import annotations

import random

import pytest
import torch

import kernels
from runtime.kv_cache import KVCache, OutOfBlocks, SeqKV


def _cache(num_blocks=16, bs=4, dtype=torch.float32):
    return KVCache(n_layers=2, n_kv_heads=2, head_dim=8, num_blocks=num_blocks, block_size=bs, dtype=dtype)


def _fill(kv: KVCache, seq: SeqKV, n: int, start: int = 0):
    """Write random K/V for tokens [start, start+n); returns the per-layer tensors written."""
    kv.reserve(seq, start + n)
    ks = [torch.randn(n, 2, 8) for _ in range(kv.n_layers)]
    vs = [torch.randn(n, 2, 8) for _ in range(kv.n_layers)]
    kv.scatter(seq, start, ks, vs)
    seq.n_tokens = start + n
    return ks, vs


def test_reserve_truncate_release_blocks():
    kv = _cache()
    s = SeqKV()
    kv.reserve(s, 9)
    assert len(s.blocks) == 3 and kv.pool.n_free == 13
    s.n_tokens = 9
    kv.truncate(s, 4)
    assert len(s.blocks) == 1 and s.n_tokens == 4 and kv.pool.n_free == 15
    kv.clear(s)
    assert s.blocks == [] and kv.pool.n_free == 16


def test_out_of_blocks_leaves_pool_unchanged():
    kv = _cache(num_blocks=3)
    a, b = SeqKV(), SeqKV()
    kv.reserve(a, 8)
    with pytest.raises(OutOfBlocks):
        kv.reserve(b, 9)
    assert kv.pool.n_free == 1 and b.blocks == []


def test_gather_scatter_roundtrip_out_of_order_blocks():
    kv = _cache()
    order = list(range(16))
    random.shuffle(order)
    kv.pool.free.clear()
    kv.pool.free.extend(order)
    s = SeqKV()
    ks, vs = _fill(kv, s, 11)
    gk, gv = kv.gather(s, 0, 11)
    for l in range(2):
        assert torch.equal(gk[l], ks[l]) and torch.equal(gv[l], vs[l])
    # slot mapping follows the block table, not block ids
    slots = kv.slot_mapping(s, 0, 11)
    assert slots[5].item() == s.blocks[1] * 4 + 1


def test_shared_prefix_copy_on_write():
    kv = _cache()
    a = SeqKV()
    ks, _ = _fill(kv, a, 6)  # blocks: [full, half]
    b = kv.share_prefix(a, 6)
    assert b.blocks == a.blocks and kv.pool.refs[a.blocks[1]] == 2
    # b appends into the shared half block: it must get its own copy
    _fill(kv, b, 1, start=6)
    assert b.blocks[0] == a.blocks[0] and b.blocks[1] != a.blocks[1]
    gk, _ = kv.gather(a, 0, 6)
    assert torch.equal(gk[0], ks[0])  # a unchanged
    gkb, _ = kv.gather(b, 0, 6)
    assert torch.equal(gkb[0], ks[0])  # b kept the shared prefix
    kv.clear(b)
    assert kv.pool.refs[a.blocks[0]] == 1


def test_move_rerotates_keys_like_fresh_rope():
    kv = _cache(dtype=torch.float32)
    s = SeqKV()
    n_total, src, dst, n = 14, 6, 1, 7
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))
    raw = [torch.randn(n_total, 2, 8) for _ in range(2)]
    pos = torch.arange(n_total)
    rotated = [kernels.rope(k, pos, inv_freq, True) for k in raw]
    vs = [torch.randn(n_total, 2, 8) for _ in range(2)]
    kv.reserve(s, n_total)
    kv.scatter(s, 0, rotated, vs)
    s.n_tokens = n_total
    kv.move(s, src, dst, n, inv_freq, True)
    gk, gv = kv.gather(s, dst, dst + n)
    for l in range(2):
        expect = kernels.rope(raw[l][src:src + n], torch.arange(dst, dst + n), inv_freq, True)
        assert torch.allclose(gk[l], expect, atol=1e-5)
        assert torch.equal(gv[l], vs[l][src:src + n])


def test_export_import_roundtrip():
    kv = _cache(dtype=torch.float16)
    s = SeqKV()
    _fill(kv, s, 9)
    state = kv.export(s)
    assert state["k"].shape == (2, 9, 2, 8) and state["k"].dtype == torch.float16
    t = SeqKV()
    kv.import_(t, state)
    assert t.n_tokens == 9
    assert torch.equal(kv.export(t)["v"], state["v"])
