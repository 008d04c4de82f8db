"""runtime.loader: GGUF round trips of generated tiny models, safetensors folders, metadata."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf import quants as gquants

from kernels.dequant_ref import dequantize
from kernels.qweight import QWeight
from runtime.gguf import read_gguf, read_gguf_metadata
from runtime.loader import ftype_name, load_model
from runtime.tiny_model import TinyModelSpec, write_tiny_model

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


def test_metadata_matches_gguf_reader(tmp_path):
    path = write_tiny_model(tmp_path / "b.gguf", TinyModelSpec(n_layer=1, n_embd=64, n_head=2,
                                                               n_head_kv=1, n_ff=128),
                            vocab="builtin")
    md = read_gguf_metadata(path)
    reader = GGUFReader(path)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(md) == keys
    for k in keys:
        want = reader.fields[k].contents()
        if isinstance(want, float):
            assert md[k] == pytest.approx(want)
        else:
            assert md[k] == want, k
    gf = read_gguf(path)
    assert [t.name for t in gf.tensors] == [t.name for t in reader.tensors]
    assert [t.offset for t in gf.tensors] == [int(t.data_offset) for t in reader.tensors]
    assert load_model(path).gguf_metadata["tokenizer.ggml.pre"] == "qwen2"


def test_read_qwen2_vocab_metadata():
    if not QWEN2_VOCAB.exists():
        pytest.skip("../shared not available")
    md = read_gguf_metadata(QWEN2_VOCAB)
    assert md["general.architecture"] == "qwen2"
    assert len(md["tokenizer.ggml.tokens"]) == 151936
    assert md["tokenizer.ggml.tokens"][:3] == ["!", '"', "#"]
    assert md["tokenizer.ggml.merges"][0] == "Ġ Ġ"
    assert md["tokenizer.ggml.eos_token_id"] == 151643
    assert "You are a helpful assistant" in md["tokenizer.chat_template"]


# ---------------------------------------------------------------------------------------------
# safetensors folders

def _write_hf_folder(folder: Path, model_type: str, dtype=torch.bfloat16, tied=False,
                     rope_scaling=None) -> dict[str, torch.Tensor]:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    E, H, KVH, D, F, V, L = 64, 4, 2, 16, 96, 50, 2
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(V, E, generator=g),
                                  "model.norm.weight": torch.rand(E, generator=g)}
    if not tied:
        t["lm_head.weight"] = torch.randn(V, E, generator=g)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = torch.rand(E, generator=g)
        t[p + "post_attention_layernorm.weight"] = torch.rand(E, generator=g)
        t[p + "self_attn.q_proj.weight"] = torch.randn(H * D, E, generator=g)
        t[p + "self_attn.k_proj.weight"] = torch.randn(KVH * D, E, generator=g)
        t[p + "self_attn.v_proj.weight"] = torch.randn(KVH * D, E, generator=g)
        t[p + "self_attn.o_proj.weight"] = torch.randn(E, H * D, generator=g)
        t[p + "mlp.gate_proj.weight"] = torch.randn(F, E, generator=g)
        t[p + "mlp.up_proj.weight"] = torch.randn(F, E, generator=g)
        t[p + "mlp.down_proj.weight"] = torch.randn(E, F, generator=g)
        if model_type == "qwen2":
            for n, d in (("q", H * D), ("k", KVH * D), ("v", KVH * D)):
                t[p + f"self_attn.{n}_proj.bias"] = torch.randn(d, generator=g)
        if model_type == "qwen3":
            t[p + "self_attn.q_norm.weight"] = torch.rand(D, generator=g)
            t[p + "self_attn.k_norm.weight"] = torch.rand(D, generator=g)
    t = {k: v.to(dtype) for k, v in t.items()}
    names = sorted(t)
    half = len(names) // 2  # two shards
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: t[k] for k in names[:half]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: t[k] for k in names[half:]}, str(folder / "model-00002-of-00002.safetensors"))
    cfg = {"architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                              "qwen3": "Qwen3ForCausalLM"}[model_type]],
           "model_type": model_type, "hidden_size": E, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": KVH, "intermediate_size": F,
           "vocab_size": V, "max_position_embeddings": 2048, "rope_theta": 500000.0,
           "rms_norm_eps": 1e-6, "tie_word_embeddings": tied, "head_dim": D}
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    (folder / "config.json").write_text(json.dumps(cfg))
    return t


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_safetensors_folder(tmp_path, model_type):
    t = _write_hf_folder(tmp_path / "hf", model_type)
    m = load_model(tmp_path / "hf")
    c = m.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab,
            c.n_ctx_train) == (model_type, 2, 64, 4, 2, 16, 96, 50, 2048)
    assert c.rope_freq_base == 500000.0 and c.rms_eps == 1e-6
    assert c.rope_neox is True  # HF weights are not permuted
    assert c.has_qkv_bias is (model_type == "qwen2") and c.has_qk_norm is (model_type == "qwen3")
    assert not c.tie_embeddings
    assert m.format == "safetensors" and m.file_type == "BF16"
    assert m.n_params == sum(v.numel() for v in t.values())
    assert m.size == 2 * m.n_params
    q = m.weights["blk.1.attn_q.weight"]
    assert isinstance(q, QWeight) and q.qtype == Q.BF16 and (q.rows, q.cols) == (64, 64)
    assert torch.equal(q.data, t["model.layers.1.self_attn.q_proj.weight"])
    assert torch.equal(m.weights["output.weight"].data, t["lm_head.weight"])
    down = m.weights["blk.0.ffn_down.weight"]
    assert (down.rows, down.cols) == (64, 96)
    norm = m.weights["blk.0.ffn_norm.weight"]
    assert norm.dtype == torch.float32
    assert torch.equal(norm, t["model.layers.0.post_attention_layernorm.weight"].float())
    if model_type == "qwen2":
        assert torch.equal(m.weights["blk.0.attn_v.bias"], t["model.layers.0.self_attn.v_proj.bias"].float())
    if model_type == "qwen3":
        assert m.weights["blk.0.attn_k_norm.weight"].shape == (16,)


def test_safetensors_tied_and_llama3_rope(tmp_path):
    _write_hf_folder(tmp_path / "hf", "llama", dtype=torch.float16, tied=True,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192})
    m = load_model(tmp_path / "hf")
    assert m.config.tie_embeddings and "output.weight" not in m.weights
    assert m.file_type == "F16"
    assert m.config.has_rope_freqs
    f = m.weights["rope_freqs.weight"]
    assert f.shape == (8,) and f.dtype == torch.float32
    # high frequencies unscaled, low frequencies divided by the factor, smooth in between
    assert f[0] == 1.0 and f[-1] == pytest.approx(8.0)
    assert m.config.rope_freq_factors is f
    assert torch.all(f[1:] >= f[:-1])


def test_safetensors_linear_rope_scaling(tmp_path):
    _write_hf_folder(tmp_path / "hf", "qwen2", dtype=torch.float32,
                     rope_scaling={"type": "linear", "factor": 4.0})
    m = load_model(tmp_path / "hf" / "model-00001-of-00002.safetensors")  # a shard: its folder
    assert m.config.rope_scaling_type == "linear" and m.config.rope_scaling_factor == 4.0
    assert m.file_type == "all F32"


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
