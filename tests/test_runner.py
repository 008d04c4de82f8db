"""The model runner (runtime/serving/runner.py): the one place a sequence's n_tokens advances
after a forward, on the eager path and on the static-buffer (CUDA graph) path; embedding pooling."""
from __future__ import annotations

import pytest
import torch

from runtime.model.cuda_graphs import DecodeGraphs
from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from runtime.serving.plan import StepPlan
from runtime.serving.runner import ModelRunner, pool_embeddings
from runtime.model.tiny_model import spec_with, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    spec = spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300, init_std=0.3, seed=5)
    path = tmp_path_factory.mktemp("r") / "r.gguf"
    write_tiny_model(path, spec)
    return Model(load_model(path))


@pytest.mark.parametrize("graphs", [False, True])
def test_run_advances_n_tokens_after_the_forward(model, graphs):
    kv = BlockManager(model.new_kv_store(128, block_size=4, dtype=torch.float32))
    runner = ModelRunner(model, kv, DecodeGraphs(model, kv.store, 4, 8, capture=False) if graphs else None)
    a, b = SeqKV(), SeqKV()
    kv.reserve(a, 6)
    kv.reserve(b, 3)
    out = runner.run(StepPlan([SeqBatch(a, [1, 2, 3, 4, 5, 6], 0), SeqBatch(b, [7, 8, 9], 0, logits=False, hidden=True)]))
    assert (a.n_tokens, b.n_tokens) == (6, 3)
    assert out.logits.shape == (1, 300) and out.hidden[0] is None and out.hidden[1].shape == (3, 64)
    for _ in range(2):  # decode steps: the static buffers when set up, else Model.forward
        kv.reserve(a, a.n_tokens + 1)
        kv.reserve(b, b.n_tokens + 1)
        out = runner.run(StepPlan([SeqBatch(a, [10], a.n_tokens), SeqBatch(b, [11], b.n_tokens)]))
        assert out.logits.shape == (2, 300) and out.hidden == [None, None]
    assert (a.n_tokens, b.n_tokens) == (8, 5)
    # the eager path on request (warm-up), whatever the graphs
    kv.reserve(a, 9)
    runner.run(StepPlan([SeqBatch(a, [12], 8)]), graphs=False)
    assert a.n_tokens == 9


def test_pool_embeddings():
    hid = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, -2.0]])
    assert pool_embeddings(hid, "cls", -1) == [[3.0, 4.0]]
    assert pool_embeddings(hid, "last", -1) == [[0.0, -2.0]]
    assert pool_embeddings(hid, "none", -1) == pool_embeddings(hid, "none", 2) == hid.double().tolist()  # raw
    mean = pool_embeddings(hid, "mean", -1)[0]
    assert mean == pytest.approx([4 / 3, 2 / 3])
    assert pool_embeddings(hid, "cls", 2) == [pytest.approx([0.6, 0.8])]
    assert pool_embeddings(hid, "cls", 1) == [pytest.approx([3 / 7, 4 / 7])]
    assert pool_embeddings(hid, "cls", 0) == [pytest.approx([3 / 4 * 32760, 32760])]
    assert pool_embeddings(hid, "cls", 3) == [pytest.approx([3 / 91 ** (1 / 3), 4 / 91 ** (1 / 3)])]


def test_micro_batches_compute_what_one_forward_computes(model):
    """A step longer than n_ubatch runs as several forwards (a prompt cut into pieces that read the
    KV of the pieces before them): the same logits and hidden states as one forward."""
    torch.manual_seed(0)
    outs = []
    for n_ubatch in (512, 5, 1):
        kv = BlockManager(model.new_kv_store(128, block_size=4, dtype=torch.float32))
        runner = ModelRunner(model, kv, None, n_ubatch=n_ubatch)
        a, b, c = SeqKV(), SeqKV(), SeqKV()
        for s, n in ((a, 13), (b, 7), (c, 4)):
            kv.reserve(s, n)
        ta, tb, tc = list(range(1, 14)), list(range(50, 57)), [9, 8, 7, 6]
        out = runner.run(StepPlan([SeqBatch(a, ta, 0), SeqBatch(b, tb, 0, logits=False, hidden=True),
                                   SeqBatch(c, tc, 0, topk=5)]))
        assert (a.n_tokens, b.n_tokens, c.n_tokens) == (13, 7, 4)
        kv.reserve(a, 14)
        dec = runner.run(StepPlan([SeqBatch(a, [3], 13)]))
        outs.append((out, dec))
    (ref, ref_dec), *rest = outs
    assert ref.logits.shape[0] == 2 and ref.hidden[1].shape == (7, 64)
    for out, dec in rest:
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.hidden[1], ref.hidden[1], rtol=1e-5, atol=1e-5)
        assert out.hidden[0] is None and out.hidden[2] is None
        torch.testing.assert_close(dec.logits, ref_dec.logits, rtol=1e-5, atol=1e-5)
