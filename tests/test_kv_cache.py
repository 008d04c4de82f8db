"""The KV cache: the block manager (runtime/serving/blocks.py: block pool, block tables, copy-on-write
prefix sharing, usage) over the model room's K/V store (runtime/model/kv_store.py: gather/scatter by
slot, KV moves with key re-rotation, export/import as host rows)."""
from __future__ import annotations

import random

import pytest
import torch

import kernels
from gguf import GGMLQuantizationType
from runtime.model.kv_store import KeyRotation, KVStore, SeqKV
from runtime.serving.blocks import BlockManager, KVUsage, OutOfBlocks


INV_FREQ = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))


def _cache(num_blocks=16, bs=4, dtype=torch.float32) -> BlockManager:
    return BlockManager(KVStore(n_layers=2, n_kv_heads=2, head_dim=8, num_blocks=num_blocks, block_size=bs, dtype=dtype,
                                rope=KeyRotation([INV_FREQ, INV_FREQ], True)))


def _fill(kv: BlockManager, seq: SeqKV, n: int, start: int = 0):
    """Write random K/V for tokens [start, start+n); returns the per-layer tensors written."""
    kv.reserve(seq, start + n)
    ks = [torch.randn(n, 2, 8) for _ in range(kv.store.n_layers)]
    vs = [torch.randn(n, 2, 8) for _ in range(kv.store.n_layers)]
    kv.store.scatter(seq, start, ks, vs)
    kv.commit(seq, start + n)
    return ks, vs


def test_reserve_truncate_release_blocks():
    kv = _cache()
    s = SeqKV()
    kv.reserve(s, 9)
    assert len(s.blocks) == 3 and kv.pool.n_free == 13 and kv.usage().ratio == 3 / 16
    kv.commit(s, 9)
    kv.truncate(s, 4)
    assert len(s.blocks) == 1 and s.n_tokens == 4 and kv.pool.n_free == 15
    kv.clear(s)
    assert s.blocks == [] and kv.pool.n_free == 16 and kv.usage() == KVUsage(16, 16)


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
    gk, gv = kv.store.gather(s, 0, 11)
    for l in range(2):
        assert torch.equal(gk[l], ks[l]) and torch.equal(gv[l], vs[l])
    # slot mapping follows the block table, not block ids
    slots = kv.store.slot_mapping(s, 0, 11)
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
    gk, _ = kv.store.gather(a, 0, 6)
    assert torch.equal(gk[0], ks[0])  # a unchanged
    gkb, _ = kv.store.gather(b, 0, 6)
    assert torch.equal(gkb[0], ks[0])  # b kept the shared prefix
    kv.clear(b)
    assert kv.pool.refs[a.blocks[0]] == 1


def test_move_rerotates_keys_like_fresh_rope():
    kv = _cache(dtype=torch.float32)
    s = SeqKV()
    n_total, src, dst, n = 14, 6, 1, 7
    raw = [torch.randn(n_total, 2, 8) for _ in range(2)]
    pos = torch.arange(n_total)
    rotated = [kernels.rope(k, pos, INV_FREQ, True) for k in raw]
    vs = [torch.randn(n_total, 2, 8) for _ in range(2)]
    kv.reserve(s, n_total)
    kv.store.scatter(s, 0, rotated, vs)
    kv.commit(s, n_total)
    assert kv.can_move(s)
    kv.move(s, src, dst, n)
    gk, gv = kv.store.gather(s, dst, dst + n)
    for l in range(2):
        expect = kernels.rope(raw[l][src:src + n], torch.arange(dst, dst + n), INV_FREQ, True)
        assert torch.allclose(gk[l], expect, atol=1e-5)
        assert torch.equal(gv[l], vs[l][src:src + n])


def test_export_import_roundtrip():
    kv = _cache(dtype=torch.float16)
    s = SeqKV()
    _fill(kv, s, 9)
    state = kv.export(s)
    # the store's own rows: per layer and position 2 heads x 8 float16 values
    assert state.k.shape == (2, 9, 2 * 8 * 2) and state.k.dtype == torch.uint8
    assert state.type_k == state.type_v == GGMLQuantizationType.F16 and state.swa_start is None
    assert state.nbytes == kv.state_bytes(9) == 9 * kv.store.bytes_per_token
    t = SeqKV()
    kv.import_(t, state)
    assert t.n_tokens == 9
    assert torch.equal(kv.export(t).v, state.v)
    assert torch.equal(kv.store.gather(t, 0, 9)[0][1], kv.store.gather(s, 0, 9)[0][1])


def test_import_converts_rows_of_another_float_type():
    """A state in float32 rows (a slot file saved from an f32 cache) goes into a float16 store as
    its values rounded to float16."""
    src, dst = _cache(dtype=torch.float32), _cache(dtype=torch.float16)
    s, t = SeqKV(), SeqKV()
    ks, vs = _fill(src, s, 5)
    state = src.export(s)
    assert state.type_k == GGMLQuantizationType.F32 and state.k.shape == (2, 5, 2 * 8 * 4)
    dst.import_(t, state)
    gk, gv = dst.store.gather(t, 0, 5)
    for l in range(2):
        assert torch.equal(gk[l], ks[l].half()) and torch.equal(gv[l], vs[l].half())
