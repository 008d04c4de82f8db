"""runtime.model.safetensors_loader: Hugging Face safetensors folders loaded as GGUF-named weights."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from kernels.qweight import QWeight
from runtime.model.loader import load_model

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
