"""LoRA adapters (runtime/model/lora.py): an adapter gives the logits of the model whose weights were
merged with it (merged in float64), also with several adapters and per-row adapter sets in one
batch; the adapter file checks of llama.cpp."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.lora import load_lora, write_lora
from runtime.model.decoder import Model, SeqBatch

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from runtime.model.loader import load_model
    from runtime.model.tiny_model import spec_with, write_tiny_model

    path = tmp_path_factory.mktemp("lora") / "base.gguf"
    write_tiny_model(path, spec_with(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=256,
                                     name="lora-base", seed=11), vocab="builtin")
    return path, load_model(path, progress=lambda m: None)


def make_adapter(lm, path, seed, rank=4, alpha=8.0, output=True, layers=None):
    """Random A, B for every target of every layer (and the output head)."""
    rng = np.random.default_rng(seed)
    names = [f"blk.{i}.{t}.weight" for i in (layers if layers is not None else range(lm.config.n_layer))
             for t in TARGETS]
    if output:
        names.append("output.weight")
    weights = {}
    for n in names:
        w = lm.weights[n]
        weights[n] = (rng.normal(0, 0.3, (rank, w.cols)).astype(np.float32),
                      rng.normal(0, 0.3, (w.rows, rank)).astype(np.float32))
    write_lora(path, lm.config.arch, weights, alpha)
    return path


def shapes(lm):
    from kernels.qweight import QWeight
    return {n: (w.rows, w.cols) for n, w in lm.weights.items() if isinstance(w, QWeight)}


def merged(lm, adapters_scales):
    """A copy of the model whose weights are W + sum scale * alpha / r * B A, computed in float64."""
    import copy

    import kernels
    from kernels.qweight import QWeight

    out = copy.copy(lm)
    out.weights = dict(lm.weights)
    for ad, s in adapters_scales:
        for name, lw in ad.weights.items():
            w = out.weights[name]
            w64 = kernels.dequantize(w, torch.float32).double()
            rank = lw.a.shape[0]
            factor = s * ad.alpha / rank if ad.alpha else s  # llama.cpp's llama_adapter_lora_weight::get_scale
            w64 = w64 + factor * (lw.b.double() @ lw.a.double())
            out.weights[name] = QWeight(w64.float().contiguous(), w.qtype, w.rows, w.cols)
    return out


def run(model, seqs):
    """Logits of the last token of each (tokens, lora scales) sequence, all in one forward."""
    kv = BlockManager(model.new_kv_store(256, block_size=8, dtype=torch.float32))
    batch = []
    for toks, scales in seqs:
        s = SeqKV()
        kv.reserve(s, len(toks))
        batch.append(SeqBatch(s, toks, 0, lora=scales))
    logits, _ = model.forward(kv.store, batch)
    return logits.double()


PROMPTS = [[1, 5, 9, 20, 33, 7], [4, 4, 8, 15, 16, 23, 42, 3, 2], [100, 7]]


def close(a, b):
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item()), (a - b).abs().max()


def test_adapter_equals_merged_weights(base, tmp_path):
    path, lm = base
    ad = load_lora(make_adapter(lm, tmp_path / "a.gguf", seed=1), lm.config.arch, shapes(lm))
    assert ad.alpha == 8.0 and len(ad.weights) == 2 * len(TARGETS) + 1
    m = Model(lm, "cpu")
    m.adapters = [ad]
    plain = run(m, [(p, ()) for p in PROMPTS])
    for scale in (1.0, 0.5, -2.0):
        got = run(m, [(p, (scale,)) for p in PROMPTS])
        ref = run(Model(merged(lm, [(ad, scale)]), "cpu"), [(p, ()) for p in PROMPTS])
        close(got, ref)
        assert (got - plain).abs().max() > 1e-2  # the adapter changes the output
    # scale 0 is the base model
    close(run(m, [(p, (0.0,)) for p in PROMPTS]), plain)


def test_per_row_adapter_sets_in_one_batch(base, tmp_path):
    path, lm = base
    a1 = load_lora(make_adapter(lm, tmp_path / "a1.gguf", seed=2), lm.config.arch, shapes(lm))
    a2 = load_lora(make_adapter(lm, tmp_path / "a2.gguf", seed=3, rank=2, alpha=0.0, output=False, layers=[1]),
                   lm.config.arch, shapes(lm))
    m = Model(lm, "cpu")
    m.adapters = [a1, a2]
    sets = [(), (1.0, 0.0), (0.5, 1.0)]
    got = run(m, [(p, s) for p, s in zip(PROMPTS, sets)])
    for i, (p, s) in enumerate(zip(PROMPTS, sets)):
        ref = run(Model(merged(lm, [(a, x) for a, x in zip((a1, a2), s)]), "cpu"), [(p, ())])
        close(got[i:i + 1], ref)
    # a decode row (one token, after a prompt) next to a prompt chunk with another adapter set
    kv = BlockManager(m.new_kv_store(256, block_size=8, dtype=torch.float32))
    sa, sb = SeqKV(), SeqKV()
    kv.reserve(sa, len(PROMPTS[0]))
    m.forward(kv.store, [SeqBatch(sa, PROMPTS[0], 0, lora=(1.0, 0.0))])
    sa.n_tokens = len(PROMPTS[0])
    kv.reserve(sa, len(PROMPTS[0]) + 1)
    kv.reserve(sb, len(PROMPTS[1]))
    logits, _ = m.forward(kv.store, [SeqBatch(sa, [77], len(PROMPTS[0]), lora=(1.0, 0.0)), SeqBatch(sb, PROMPTS[1], 0)])
    close(logits[0:1].double(), run(Model(merged(lm, [(a1, 1.0)]), "cpu"), [(PROMPTS[0] + [77], ())]))
    close(logits[1:2].double(), run(Model(lm, "cpu"), [(PROMPTS[1], ())]))


def test_adapter_file_checks(base, tmp_path):
    from gguf import GGUFWriter

    path, lm = base
    sh = shapes(lm)
    good = make_adapter(lm, tmp_path / "g.gguf", seed=4, layers=[0], output=False)
    with pytest.raises(ValueError, match="model arch and LoRA arch mismatch"):
        load_lora(good, "qwen2", sh)
    w = lm.weights["blk.0.attn_q.weight"]
    bad = tmp_path / "shape.gguf"
    write_lora(bad, "llama", {"blk.0.attn_q.weight": (np.zeros((4, w.cols + 1), np.float32),
                                                      np.zeros((w.rows, 4), np.float32))}, 8)
    with pytest.raises(ValueError, match="has incorrect shape"):
        load_lora(bad, "llama", sh)
    missing = tmp_path / "missing.gguf"
    write_lora(missing, "llama", {"blk.9.attn_q.weight": (np.zeros((4, w.cols), np.float32),
                                                          np.zeros((w.rows, 4), np.float32))}, 8)
    with pytest.raises(ValueError, match="does not exist in base model"):
        load_lora(missing, "llama", sh)
    model_file = path  # a model, not an adapter
    with pytest.raises(ValueError, match="expect general.type to be 'adapter'"):
        load_lora(model_file, "llama", sh)
    notlora = tmp_path / "ia3.gguf"
    g = GGUFWriter(str(notlora), "llama")
    g.add_string("general.type", "adapter")
    g.add_string("adapter.type", "ia3")
    g.write_header_to_file(); g.write_kv_data_to_file(); g.write_tensors_to_file(); g.close()
    with pytest.raises(ValueError, match="expect adapter.type to be 'lora', but got: ia3"):
        load_lora(notlora, "llama", sh)
    with pytest.raises(ValueError, match="failed to load lora adapter"):
        load_lora(tmp_path / "nope.gguf", "llama", sh)
