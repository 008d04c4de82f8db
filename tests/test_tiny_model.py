"""runtime.model.tiny_model: quantizers, built-in vocabulary, default model, CLI."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants as gquants

from kernels.dequant_ref import dequantize, dequantize_rows
from kernels.qweight import QWeight
from runtime.tokenizer.builtin_vocab import QWEN2_CHAT_TEMPLATE
from runtime.model.gguf import read_gguf_metadata
from runtime.model.loader import load_model
from runtime.model.tiny_model import TinyModelSpec, ensure_default_model, quantize, write_tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("qtype,tol", [(Q.Q4_K, 0.12), (Q.Q6_K, 0.03)])
def test_own_kquant_quantizers(qtype, tol):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, size=(6, 512)).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block
    x[1] += 3.0  # all-positive blocks (Q4_K min offset 0)
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (6, 2 * {Q.Q4_K: 144, Q.Q6_K: 210}[qtype])
    ref = gquants.dequantize(raw, qtype)
    assert np.isfinite(ref).all()
    # relative to each block's range
    err = np.abs(ref - x).reshape(-1, 256).max(-1) / (np.abs(x).reshape(-1, 256).max(-1) + 1e-9)
    assert err.max() < tol
    assert np.all(ref[0, :256] == 0.0)
    np.testing.assert_array_equal(dequantize(QWeight(torch.from_numpy(raw), qtype, 6, 512)).numpy(), ref)


def test_quantize_rejects_bad_row_size():
    with pytest.raises(ValueError):
        quantize(np.zeros((2, 300), dtype=np.float32), Q.Q4_K)


def _single_token_forward(m, token: int) -> torch.Tensor:
    """Logits of a one-token sequence (attention over one key returns V)."""
    c, W = m.config, m.weights

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_eps) * w

    def mm(x, name):
        return x @ dequantize(W[name]).T

    x = dequantize_rows(W["token_embd.weight"], torch.tensor([token]))
    for i in range(c.n_layer):
        p = f"blk.{i}."
        h = rms(x, W[p + "attn_norm.weight"])
        v = mm(h, p + "attn_v.weight").reshape(1, c.n_head_kv, c.head_dim)
        v = v.repeat_interleave(c.n_head // c.n_head_kv, dim=1).reshape(1, -1)
        x = x + mm(v, p + "attn_output.weight")
        h = rms(x, W[p + "ffn_norm.weight"])
        g = torch.nn.functional.silu(mm(h, p + "ffn_gate.weight")) * mm(h, p + "ffn_up.weight")
        x = x + mm(g, p + "ffn_down.weight")
    out = W.get("output.weight", W["token_embd.weight"])
    return rms(x, W["output_norm.weight"]) @ dequantize(out).T


def test_ensure_default_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path / "cache"))
    p = ensure_default_model()
    assert p.exists() and p.parent == tmp_path / "cache"
    stat = p.stat()
    assert ensure_default_model() == p and p.stat().st_mtime_ns == stat.st_mtime_ns  # generated once
    assert [f.name for f in p.parent.iterdir()] == [p.name]  # no temp files left

    m = load_model(p)
    c = m.config
    assert (c.arch, c.n_layer, c.n_embd) == ("llama", 2, 128)
    assert c.n_vocab == len(m.gguf_metadata["tokenizer.ggml.tokens"])
    assert m.file_type == "all F32"
    assert m.gguf_metadata["tokenizer.chat_template"] == QWEN2_CHAT_TEMPLATE
    assert m.size < 10_000_000

    # a deterministic file: a fresh generation elsewhere has the same bytes
    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path / "other"))
    p2 = ensure_default_model()
    assert hashlib.sha256(p2.read_bytes()).digest() == hashlib.sha256(p.read_bytes()).digest()

    # random weights keep activations finite and logits spread
    logits = _single_token_forward(m, 42)
    assert logits.shape == (1, c.n_vocab) and torch.isfinite(logits).all()
    assert logits.std() > 1e-3


@pytest.mark.parametrize("wtype", ["q4_k", "q6_k", "q4_0"])
def test_quantized_model_forward_close_to_f32(tmp_path, wtype):
    base = dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=320, seed=5)
    f32 = load_model(write_tiny_model(tmp_path / "a.gguf", TinyModelSpec(**base)))
    q = load_model(write_tiny_model(tmp_path / "b.gguf", TinyModelSpec(wtype=wtype, **base)))
    a, b = _single_token_forward(f32, 7), _single_token_forward(q, 7)
    cos = torch.nn.functional.cosine_similarity(a, b).item()
    assert cos > {"q4_k": 0.97, "q4_0": 0.95, "q6_k": 0.995}[wtype], cos


def test_cli(tmp_path):
    out = tmp_path / "q3.gguf"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--out", str(out),
                        "--arch", "qwen3", "--layers", "1", "--embd", "128", "--heads", "4",
                        "--kv-heads", "2", "--head-dim", "64", "--ff", "256", "--ctx", "512",
                        "--type", "q8_0", "--seed", "9", "--builtin"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr
    m = load_model(out)
    c = m.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_ctx_train) == \
        ("qwen3", 1, 128, 4, 2, 64, 256, 512)
    assert c.has_qk_norm and m.file_type == "Q8_0"
    assert m.weights["blk.0.attn_q.weight"].qtype == Q.Q8_0
    md = read_gguf_metadata(out)
    assert md["tokenizer.ggml.pre"] == "qwen2" and md["general.quantization_version"] == 2


def test_lesson_vocab_copied(tmp_path):
    vocab = Path(__file__).resolve().parents[2] / "shared" / "vocab" / "ggml-vocab-llama-spm.gguf"
    if not vocab.exists():
        pytest.skip("../shared not available")
    spec = TinyModelSpec(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, wtype="f16")
    m = load_model(write_tiny_model(tmp_path / "spm.gguf", spec, vocab=vocab))
    src = read_gguf_metadata(vocab)
    tok_keys = [k for k in src if k.startswith("tokenizer.")]
    assert tok_keys and all(m.gguf_metadata[k] == src[k] for k in tok_keys)
    assert m.config.n_vocab == len(src["tokenizer.ggml.tokens"])


def test_random_blocks_model_loads_and_runs(tmp_path):
    """--random-blocks writes valid quantized blocks: the file loads, dequantizes to finite values
    of about init_std, and a forward pass gives finite logits."""
    import torch

    from kernels.dequant_ref import dequantize
    from runtime.model.kv_store import SeqKV
    from runtime.serving.blocks import BlockManager
    from runtime.model.loader import load_model
    from runtime.model.decoder import Model, SeqBatch
    from runtime.model.tiny_model import spec_with, write_tiny_model

    spec = spec_with(wtype="q4_k", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=512,
                     random_blocks=True, seed=3)
    path = write_tiny_model(tmp_path / "rb.gguf", spec)
    lm = load_model(path)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "output.weight"):
        w = dequantize(lm.weights[name])
        assert torch.isfinite(w).all() and 0.001 < float(w.std()) < 0.2, name
    m = Model(lm, unpack_budget=0)
    kv = BlockManager(m.new_kv_store(32))
    s = SeqKV()
    kv.reserve(s, 5)
    logits, _ = m.forward(kv.store, [SeqBatch(s, [1, 2, 3, 4, 5], 0)])
    assert torch.isfinite(logits).all()
