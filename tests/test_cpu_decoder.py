"""kernels/cpu/decoder.py: the fused decode loop gives the per-op path's bits, and is taken exactly
where the model qualifies."""
from __future__ import annotations

import pytest
import torch

from kernels import Numerics
from kernels.cpu import native, qdot
from dataclasses import replace

from runtime.model.kv_store import KVStore, SeqKV
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from runtime.model.tiny_model import GEMMA3_SPEC, MOE_SPEC, PHI3_SPEC, TinyModelSpec, write_tiny_model
from runtime.serving.blocks import BlockManager, swa_blocks_for

pytestmark = pytest.mark.skipif(native.lib() is None or not qdot.available(),
                                reason="the fused decoder needs the compiled CPU kernels")

CASES = {  # arch, weight type: qwen2 has q/k/v biases, qwen3 q/k norms, llama neither
    "qwen2-q4_k": TinyModelSpec(arch="qwen2", n_layer=3, n_embd=256, n_head=8, n_head_kv=2, n_ff=512,
                                wtype="q4_k", seed=3, norm_std=0.1, n_vocab=300),
    "qwen3-q8_0": TinyModelSpec(arch="qwen3", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
                                n_ff=256, wtype="q8_0", seed=4, norm_std=0.1, n_vocab=300),
    "llama-q6_k": TinyModelSpec(arch="llama", n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=512,
                                wtype="q6_k", seed=5, n_vocab=300),
    # post-norms, GeGLU, q/k norms, five sliding-window layers of 8 and a global one
    "gemma3-q8_0": replace(GEMMA3_SPEC, wtype="q8_0", n_vocab=300, norm_std=0.1),
    "phi3-q4_k": replace(PHI3_SPEC, wtype="q4_k", n_embd=256, n_vocab=300),  # fused qkv and gate+up, window 16
    # float weights: 64-row GEMV tiles (every matrix here has at least 2^16 elements)
    "qwen2-f32": TinyModelSpec(arch="qwen2", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, seed=6,
                               norm_std=0.1, n_vocab=300),
    "llama-f16": TinyModelSpec(arch="llama", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, wtype="f16",
                               seed=8, n_vocab=300),
}


def _model(tmp_path_factory, key: str, numerics: Numerics = Numerics.GGML) -> Model:
    path = tmp_path_factory.mktemp("dec") / f"{key}.gguf"
    write_tiny_model(path, CASES[key])
    return Model(load_model(path), "cpu", numerics=numerics)


def _cache(m: Model, n_tokens: int, kv_dtype: torch.dtype, swa_pool: bool) -> BlockManager:
    """One pool for every layer, or (swa_pool) the sliding-window layers in their own small pool."""
    if not swa_pool:
        return BlockManager(m.new_kv_store(n_tokens, dtype=kv_dtype))
    windows = [L.window for L in m.layers]
    n_swa = swa_blocks_for(max(windows), 3, 64, 16)
    return BlockManager(KVStore(len(m.layers), m.n_head_kv, m.head_dim, (n_tokens + 15) // 16, 16, kv_dtype, "cpu",
                                windows, n_swa))


def _decode(m: Model, prompts: list[list[int]], steps: int, kv_dtype: torch.dtype,
            swa_pool: bool = False) -> list[torch.Tensor]:
    """Logits of every decode step (all sequences in one batch), greedy, after a prefill each."""
    kv = _cache(m, sum(len(p) + steps + 16 for p in prompts), kv_dtype, swa_pool)
    seqs = [SeqKV() for _ in prompts]
    last = []
    for s, p in zip(seqs, prompts):
        kv.reserve(s, len(p))
        kv.advance_window(s, 0, len(p))  # (a no-op without the SWA pool)
        logits, _ = m.forward(kv.store, [SeqBatch(s, p, 0)])
        s.n_tokens = len(p)
        last.append(int(logits[-1].argmax()))
    out = []
    for _ in range(steps):
        for s in seqs:
            kv.reserve(s, s.n_tokens + 1)
            kv.advance_window(s, s.n_tokens, s.n_tokens + 1)
        logits, _ = m.forward(kv.store, [SeqBatch(s, [t], s.n_tokens) for s, t in zip(seqs, last)])
        for s in seqs:
            s.n_tokens += 1
        last = logits.argmax(-1).tolist()
        out.append(logits.clone())
    return out


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("key", sorted(CASES))
def test_fused_decode_is_bit_identical_to_the_per_op_path(tmp_path_factory, key, kv_dtype):
    m = _model(tmp_path_factory, key)
    assert m.decoder is not None  # these models qualify
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 19, 33)]
    windowed = any(L.window for L in m.layers)
    for batch in (prompts[:1], prompts):  # one sequence, and three of different lengths
        for swa_pool in (False, True) if windowed else (False,):
            fused = _decode(m, batch, 6, kv_dtype, swa_pool)
            dec, m.decoder = m.decoder, None
            try:
                per_op = _decode(m, batch, 6, kv_dtype, swa_pool)
            finally:
                m.decoder = dec
            for a, b in zip(fused, per_op):
                assert torch.equal(a, b)


@pytest.mark.parametrize("key,fast", [("qwen2-q4_k", True), ("gemma3-q8_0", False), ("gemma3-q8_0", True),
                                      ("phi3-q4_k", True)])
def test_a_token_gets_the_same_logits_however_its_prompt_is_batched(tmp_path_factory, key, fast):
    """The last prompt token's logits are the same bits for the prompt in one batch, after a cached
    prefix (through the fused decoder), in chunks, and beside another sequence's decode: with
    llama.cpp's numerics for the 32-block types (its Q4_K / Q6_K kernels take another float order
    from 4 / 8 rows, and so does tritium there, kernels/README.md), in the kernels' own numerics
    (--numerics own, TRITIUM_FAST_NUMERICS) for every type."""
    m = _model(tmp_path_factory, key, Numerics.OWN if fast else Numerics.GGML)
    assert m.ops.numerics is (Numerics.OWN if fast else Numerics.GGML)
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, 300, (37,), generator=g).tolist()
    other = torch.randint(0, 300, (9,), generator=g).tolist()

    def last_logits(chunks: list[int], with_other: bool = False) -> torch.Tensor:
        kv = BlockManager(m.new_kv_store(128))
        s, o = SeqKV(), SeqKV()
        kv.reserve(s, len(prompt))
        if with_other:
            kv.reserve(o, len(other) + 1)
            kv.advance_window(o, 0, len(other))
            m.forward(kv.store, [SeqBatch(o, other, 0)])
        past, out = 0, None
        for n in chunks:
            kv.advance_window(s, past, past + n)
            batch = [SeqBatch(s, prompt[past:past + n], past)]
            if with_other and n == chunks[-1]:
                kv.advance_window(o, len(other), len(other) + 1)
                batch.append(SeqBatch(o, [5], len(other)))
            logits, _ = m.forward(kv.store, batch)
            out = logits[0].clone()
            past += n
        return out

    whole = last_logits([37])
    assert torch.equal(last_logits([36, 1]), whole)
    assert torch.equal(last_logits([10, 20, 7]), whole)
    assert torch.equal(last_logits([30, 7], with_other=True), whole)


def test_fused_decode_is_taken_for_decode_steps_only(tmp_path_factory, monkeypatch):
    m = _model(tmp_path_factory, "qwen2-q4_k")
    calls = []
    real = m.decoder

    class Spy:
        max_rows = real.max_rows

        def supports(self, k, v):
            return real.supports(k, v)

        def __call__(self, *a):
            calls.append(a[0].shape[0])
            return real(*a)

    m.decoder = Spy()
    kv = BlockManager(m.new_kv_store(64))
    s = SeqKV()
    kv.reserve(s, 4)
    m.forward(kv.store, [SeqBatch(s, [1, 2, 3, 4], 0)])  # prefill: per-op path
    s.n_tokens = 4
    assert calls == []
    kv.reserve(s, 5)
    m.forward(kv.store, [SeqBatch(s, [5], 4)])
    assert calls == [1]


def test_models_outside_its_scope_keep_the_per_op_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("dec") / "moe.gguf"
    write_tiny_model(path, replace(MOE_SPEC, wtype="q8_0"))  # routed experts
    assert Model(load_model(path), "cpu").decoder is None
    small = tmp_path_factory.mktemp("dec") / "f32.gguf"
    write_tiny_model(small, TinyModelSpec(n_layer=1, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=300))
    assert Model(load_model(small), "cpu").decoder is None  # float matrices under 2^16 elements: BLAS, not tiles
    q = CASES["qwen2-q4_k"]
    assert Model(load_model(write_tiny_model(tmp_path_factory.mktemp("dec") / "q.gguf", q)), "cpu",
                 backend="torch").decoder is None  # the reference backend has no fused loop


def test_a_slot_outside_the_cache_is_an_error_not_a_write(tmp_path_factory):
    m = _model(tmp_path_factory, "llama-q6_k")
    kv = BlockManager(m.new_kv_store(32))
    s = SeqKV()
    kv.reserve(s, 3)
    m.forward(kv.store, [SeqBatch(s, [1, 2, 3], 0)])
    h = torch.zeros((1, m.n_embd))
    n_slots = kv.store.k[0].shape[0] * kv.store.k[0].shape[1]
    before = [t.clone() for t in kv.store.k]
    with pytest.raises(IndexError, match="outside the cache"):
        m.decoder(h, kv.store.k, kv.store.v, torch.tensor([3]), torch.tensor([n_slots]),
                  torch.zeros((1, 2), dtype=torch.int32), torch.tensor([4], dtype=torch.int32))
    assert all(torch.equal(a, b) for a, b in zip(before, kv.store.k))
