"""runtime.model.loader: GGUF round trips of generated tiny models, safetensors folders, metadata."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf import quants as gquants

from kernels.dequant_ref import dequantize
from kernels.qweight import QWeight
from runtime.model.gguf import read_gguf_metadata
from runtime.model.loader import ftype_name, load_model
from runtime.model.tiny_model import TinyModelSpec, write_tiny_model

SHARED = Path(__file__).resolve().parents[2] / "shared"
QWEN2_VOCAB = SHARED / "vocab" / "ggml-vocab-qwen2.gguf"

SMALL = dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=1024, n_vocab=300)

EXPECTED_FTYPE = {"f32": "all F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0",
                  "q4_k": "Q4_K - Medium", "q6_k": "Q6_K"}
BASE_TYPE = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_k": Q.Q4_K,
             "q6_k": Q.Q6_K}

CASES = [("llama", t) for t in EXPECTED_FTYPE] + [
    ("qwen2", "f32"), ("qwen2", "q8_0"), ("qwen3", "f16"), ("qwen3", "q4_k"), ("mistral", "q4_0"),
]


def _reader_dense(rt) -> np.ndarray:
    """A tensor of gguf.GGUFReader dequantized by gguf-py, as [rows, cols] or [n]."""
    data = np.asarray(rt.data)
    if rt.tensor_type == Q.F32:
        out = data.astype(np.float32)
    else:
        out = gquants.dequantize(data, rt.tensor_type)
    return out.reshape(tuple(int(x) for x in reversed(rt.shape.tolist())))


@pytest.mark.parametrize("arch,wtype", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_gguf_round_trip(tmp_path, arch, wtype, capfd):
    head_dim = 48 if arch == "qwen3" else None  # qwen3: head_dim != n_embd / n_head
    spec = TinyModelSpec(arch=arch, wtype=wtype, seed=3, head_dim=head_dim, **SMALL)
    path = write_tiny_model(tmp_path / "m.gguf", spec)
    m = load_model(path)
    assert "load_model: loaded" in capfd.readouterr().err

    c = m.config
    hd = head_dim or 64
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab,
            c.n_ctx_train) == (arch, 2, 256, 4, 2, hd, 512, 300, 1024)
    assert c.rope_freq_base == 10000.0 and c.n_rot == hd
    assert c.rms_eps == 1e-5
    assert c.rope_neox is (arch in ("qwen2", "qwen3"))
    assert c.has_qkv_bias is (arch == "qwen2")
    assert c.has_qk_norm is (arch == "qwen3")
    assert not c.tie_embeddings and c.rope_scaling_type == "none" and not c.has_rope_freqs
    assert c.rope_freq_factors is None
    assert m.file_type == EXPECTED_FTYPE[wtype]

    # every tensor against gguf's own reader and dequantizer
    reader = GGUFReader(path)
    assert set(m.weights) == {t.name for t in reader.tensors}
    assert m.n_params == sum(int(t.n_elements) for t in reader.tensors)
    assert m.size == sum(int(t.n_bytes) for t in reader.tensors)
    for rt in reader.tensors:
        w = m.weights[rt.name]
        want = _reader_dense(rt)
        if want.ndim == 1:
            assert isinstance(w, torch.Tensor) and w.dtype == torch.float32
            np.testing.assert_array_equal(w.numpy(), want)
            continue
        assert isinstance(w, QWeight)
        assert w.qtype == rt.tensor_type and (w.rows, w.cols) == want.shape
        if w.is_float:
            assert w.data.shape == want.shape
        else:
            assert w.data.dtype == torch.uint8 and w.data.shape == (w.rows, w.cols // w.block_size * w.type_size)
        np.testing.assert_array_equal(dequantize(w).numpy(), want)

    # the mix: most matrices in the base type, norms f32, qwen2 biases, qwen3 q/k norms
    attn_q = m.weights["blk.0.attn_q.weight"]
    assert attn_q.qtype == BASE_TYPE[wtype]
    if wtype == "q4_k":
        assert m.weights["output.weight"].qtype == Q.Q6_K
    if arch == "qwen2":
        assert m.weights["blk.1.attn_k.bias"].shape == (2 * hd,)
    if arch == "qwen3":
        assert m.weights["blk.1.attn_q_norm.weight"].shape == (hd,)
        assert attn_q.rows == 4 * hd and m.weights["blk.0.attn_output.weight"].cols == 4 * hd


def test_weights_share_the_file_mapping(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", TinyModelSpec(wtype="q8_0", **SMALL))
    m = load_model(path)
    w = m.weights["blk.0.ffn_up.weight"]
    # a view into the mapping: modifying it neither fails nor touches the file
    before = path.read_bytes()
    w.data[0, 0] ^= 0xFF
    assert path.read_bytes() == before
    assert load_model(path).weights["blk.0.ffn_up.weight"].data[0, 0] != w.data[0, 0]


def test_repacking_drops_the_mapped_pages_but_not_the_bytes(tmp_path):
    """Matrices come `mapped` (views of the never-written file mapping). A CPU model that repacks
    them for the integer-dot kernels drops those pages from memory (madvise) once copied; the
    mapping still reads the file's bytes (they fault back in from the page cache), so a second
    model from the same load gets the same weights."""
    import kernels
    from runtime.model.decoder import Model
    path = write_tiny_model(tmp_path / "m.gguf", TinyModelSpec(wtype="q4_k", **SMALL))
    lm = load_model(path)
    w = lm.weights["blk.1.ffn_up.weight"]
    assert w.mapped and all(x.mapped for x in lm.weights.values() if isinstance(x, QWeight))
    before = w.data.clone()
    m1 = Model(lm)
    if m1.layers[1].w_gate_up[0].layout != "x8":
        pytest.skip("no integer-dot kernels here (no C compiler)")
    assert torch.equal(w.data, before)
    m2 = Model(lm)
    for a, b in zip(m1.layers[1].w_gate_up + [m1.output], m2.layers[1].w_gate_up + [m2.output]):
        assert torch.equal(a.data, b.data)
    assert torch.equal(kernels.dequantize(m1.layers[1].w_gate_up[0])[SMALL["n_ff"]:], dequantize(w))


def test_tied_embeddings(tmp_path):
    spec = TinyModelSpec(tie_embeddings=True, wtype="f16", **SMALL)
    m = load_model(write_tiny_model(tmp_path / "t.gguf", spec))
    assert m.config.tie_embeddings
    assert "output.weight" not in m.weights and "token_embd.weight" in m.weights
    assert m.weights["token_embd.weight"].qtype == Q.F16


def test_file_type_names():
    assert ftype_name(0) == "all F32"
    assert ftype_name(1) == "F16"
    assert ftype_name(7) == "Q8_0"
    assert ftype_name(15) == "Q4_K - Medium"
    assert ftype_name(18) == "Q6_K"
    assert ftype_name(15 | 1024) == "Q4_K - Medium (guessed)"


def test_unsupported_arch_and_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTAGGUF" + b"\0" * 64)
    with pytest.raises(ValueError):
        load_model(bad)
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture"):
        load_model(tmp_path / "gpt2.gguf")


def test_gguf_metadata_is_the_readers(tmp_path):
    path = write_tiny_model(tmp_path / "b.gguf", TinyModelSpec(n_layer=1, n_embd=64, n_head=2,
                                                               n_head_kv=1, n_ff=128),
                            vocab="builtin")
    md = load_model(path).gguf_metadata
    assert md == read_gguf_metadata(path) and md["tokenizer.ggml.pre"] == "qwen2"


def test_gguf_rope_scaling_metadata(tmp_path):
    import gguf

    path = tmp_path / "yarn.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    for k, v in [("context_length", 4096), ("embedding_length", 64), ("block_count", 1),
                 ("feed_forward_length", 64), ("attention.head_count", 2),
                 ("attention.head_count_kv", 1)]:
        w.add_uint32(f"qwen2.{k}", v)
    w.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("qwen2.rope.scaling.type", "yarn")
    w.add_float32("qwen2.rope.scaling.factor", 4.0)
    w.add_uint32("qwen2.rope.scaling.original_context_length", 32768)
    w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    w.add_tensor("rope_freqs.weight", np.ones(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    c = load_model(path).config
    assert (c.rope_scaling_type, c.rope_scaling_factor, c.rope_scaling_orig_ctx) == ("yarn", 4.0, 32768)
    assert c.has_rope_freqs and c.tie_embeddings and c.n_vocab == 10 and c.rope_neox
    assert torch.equal(c.rope_freq_factors, torch.ones(16))
    m = load_model(path)
    assert m.file_type == "all F32 (guessed)"


def test_gguf_bf16_and_quantized_1d(tmp_path):
    import gguf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 64)).astype(np.float32)
    bf = gquants.quantize(x, Q.BF16)  # uint8 [8, 128]
    path = tmp_path / "bf16.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in [("context_length", 128), ("embedding_length", 64), ("block_count", 0),
                 ("feed_forward_length", 64), ("attention.head_count", 2)]:
        w.add_uint32(f"llama.{k}", v)
    w.add_tensor("token_embd.weight", bf, raw_dtype=Q.BF16)
    w.add_tensor("output_norm.weight", gquants.quantize(x[0], Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = load_model(path)
    emb = m.weights["token_embd.weight"]
    assert emb.qtype == Q.BF16 and emb.data.dtype == torch.bfloat16 and emb.data.shape == (8, 64)
    np.testing.assert_array_equal(dequantize(emb).numpy(), gquants.dequantize(bf, Q.BF16))
    norm = m.weights["output_norm.weight"]
    assert norm.shape == (64,) and norm.dtype == torch.float32
    np.testing.assert_array_equal(norm.numpy(), gquants.dequantize(gquants.quantize(x[0], Q.Q8_0), Q.Q8_0))
    assert m.file_type == "BF16 (guessed)" and m.config.n_head_kv == 2 and m.config.head_dim == 32


@pytest.mark.slow
def test_lesson_model_size(tmp_path):
    """The lesson's model: 80,611,584 parameters, 322,446,336 bytes at f32, loads in seconds."""
    if not QWEN2_VOCAB.exists():
        pytest.skip("../shared not available")
    import time

    path = write_tiny_model(tmp_path / "lesson.gguf", TinyModelSpec(), vocab=QWEN2_VOCAB)
    t0 = time.perf_counter()
    m = load_model(path)
    assert time.perf_counter() - t0 < 5.0
    assert m.n_params == 80_611_584
    assert m.size == 322_446_336
    assert m.file_type == "all F32"
    c = m.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ff, c.n_vocab, c.n_ctx_train) == \
        ("llama", 4, 256, 8, 2, 704, 151936, 4096)
    assert not c.tie_embeddings and not c.has_qkv_bias and not c.rope_neox
    src = read_gguf_metadata(QWEN2_VOCAB)
    for k, v in src.items():
        if k.startswith("tokenizer."):
            assert m.gguf_metadata[k] == v, k
