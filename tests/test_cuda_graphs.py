"""The static-buffer decode path that CUDA graphs replay (`runtime.model.cuda_graphs`), run eagerly here:
same logits and same KV cache as `Model.forward`, padding rows invisible, buckets and limits."""
from __future__ import annotations

import copy
import random

import pytest
import torch

from runtime.model.cuda_graphs import DecodeGraphs
from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from runtime.model.tiny_model import spec_with, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    spec = spec_with(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, init_std=0.3,
                     seed=random.randrange(1 << 20))
    path = tmp_path_factory.mktemp("g") / "g.gguf"
    write_tiny_model(path, spec)
    return Model(load_model(path))


def _prefilled(model, lengths, block_size=4):
    kv = BlockManager(model.new_kv_store(256, block_size=block_size, dtype=torch.float32))
    seqs = [SeqKV() for _ in lengths]
    for s, n in zip(seqs, lengths):
        kv.reserve(s, n)
        model.forward(kv.store, [SeqBatch(s, [random.randrange(300) for _ in range(n)], 0)])
        s.n_tokens = n  # what the serving runner does after a forward
    return kv, seqs


def _clone(kv, seqs):
    """An independent copy of the cache (tensors and block pool) and of the sequences."""
    return copy.deepcopy(kv), copy.deepcopy(seqs)


@pytest.mark.parametrize("lengths", [[5], [3, 9, 1], [7, 2, 11, 4, 6]])
def test_static_decode_matches_forward(model, lengths):
    kv, seqs = _prefilled(model, lengths)
    kv_ref, seqs_ref = _clone(kv, seqs)
    before = [t.clone() for t in kv.store.k + kv.store.v]
    graphs = DecodeGraphs(model, kv.store, max_batch=8, max_blocks=8, capture=False)
    for _ in range(3):  # a few steps: positions advance, blocks fill and spill over
        toks = [random.randrange(300) for _ in seqs]
        for s, r in zip(seqs, seqs_ref):
            kv.reserve(s, s.n_tokens + 1)
            kv_ref.reserve(r, r.n_tokens + 1)
        batch = [SeqBatch(s, [t], s.n_tokens) for s, t in zip(seqs, toks)]
        assert graphs.supports(batch)
        n_before = [s.n_tokens for s in seqs]
        got = graphs.run(batch)
        assert [s.n_tokens for s in seqs] == n_before  # only the serving runner advances them
        want, _ = model.forward(kv_ref.store, [SeqBatch(s, [t], s.n_tokens) for s, t in zip(seqs_ref, toks)])
        assert got.shape == want.shape == (len(seqs), 300)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        assert [s.n_tokens for s in seqs] == [s.n_tokens for s in seqs_ref]  # neither path advanced them
        for s in seqs + seqs_ref:
            s.n_tokens += 1  # the caller (the serving runner) does
    # the padding rows (bucket 4 or 8 for 3 or 5 sequences) wrote nothing to the cache: every cell that no
    # sequence owns is as it was; the owned cells hold what Model.forward wrote (up to the rounding of a
    # matmul over a padded batch, whose blocking may differ from the unpadded one)
    owned = torch.zeros(kv.store.k[0].shape[0] * kv.store.k[0].shape[1], dtype=torch.bool)
    for s in seqs:
        owned[torch.as_tensor(kv.store.slot_mapping(s, 0, s.n_tokens))] = True
    owned = owned.view(kv.store.k[0].shape[0], kv.store.k[0].shape[1])
    for a, b, old in zip(kv.store.k + kv.store.v, kv_ref.store.k + kv_ref.store.v, before):
        assert torch.equal(a[~owned], old[~owned])
        assert torch.allclose(a[owned], b[owned], rtol=1e-5, atol=1e-5)


def test_buckets_and_what_is_supported(model):
    kv, seqs = _prefilled(model, [3, 30])
    graphs = DecodeGraphs(model, kv.store, max_batch=6, max_blocks=4, capture=False)
    assert graphs.buckets == [1, 2, 4, 6]
    assert [graphs.bucket(n) for n in (1, 2, 3, 5, 6)] == [1, 2, 4, 6, 6]
    assert graphs.supports([SeqBatch(seqs[0], [1], 3)])
    assert not graphs.supports([SeqBatch(seqs[0], [1, 2], 3)])  # a prefill chunk
    assert not graphs.supports([SeqBatch(seqs[0], [1], 3, logits=False)])
    assert not graphs.supports([SeqBatch(seqs[0], [1], 3, hidden=True)])
    assert not graphs.supports([SeqBatch(seqs[1], [1], 30)])  # 8 blocks of 4 > max_blocks
    assert not graphs.supports([SeqBatch(seqs[0], [1], 3)] * 7)
    assert not graphs.supports([])
