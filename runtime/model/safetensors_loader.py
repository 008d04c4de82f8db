"""Model loading from a Hugging Face safetensors folder (config.json + *.safetensors shards).

`load_safetensors(folder) -> LoadedModel`, called by `runtime.model.loader.load_model` for a folder:
tensors renamed to their GGUF names (`hf_to_gguf_name`), matrices as float `QWeight`s, the
config mapped onto `ModelConfig` (llama3 rope factors computed as convert_hf_to_gguf.py does).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from gguf import GGMLQuantizationType, LlamaFileType

from kernels.qweight import QWeight
from runtime.model.config import LoadedModel, ModelConfig, ftype_name, guess_ftype, print_progress

__all__ = ["load_safetensors", "hf_to_gguf_name"]


_HF_ARCH = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
}

_HF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def hf_to_gguf_name(name: str) -> str | None:
    """HF tensor name -> GGUF name; None for tensors the runtime does not use."""
    if name in _HF_GLOBAL_NAMES:
        return _HF_GLOBAL_NAMES[name]
    if name.startswith("model.layers."):
        rest = name[len("model.layers."):]
        idx, _, sub = rest.partition(".")
        if sub in _HF_LAYER_NAMES:
            return f"blk.{int(idx)}.{_HF_LAYER_NAMES[sub]}"
    return None


def _llama3_rope_factors(cfg: dict[str, Any], head_dim: int, base: float) -> torch.Tensor:
    """rope_freqs.weight [head_dim/2] as convert_hf_to_gguf.py computes it for llama3 rope."""
    rs = cfg["rope_scaling"]
    factor = float(rs.get("factor", 8.0))
    low = float(rs.get("low_freq_factor", 1.0))
    high = float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def load_safetensors(folder: Path, _progress=print_progress) -> LoadedModel:
    """A Hugging Face folder: config.json and *.safetensors (several shards are fine)."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    cfg = json.loads((folder / "config.json").read_text())
    model_type = cfg.get("model_type") or (cfg.get("architectures") or [""])[0]
    arch = _HF_ARCH.get(model_type) or _HF_ARCH.get((cfg.get("architectures") or [""])[0])
    if arch is None:
        raise ValueError(f"unsupported model type {model_type!r} in {folder / 'config.json'}")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")

    weights: dict[str, Any] = {}
    n_params = size = 0
    qtypes: list[GGMLQuantizationType] = []
    for fpath in files:
        with safe_open(str(fpath), framework="pt") as f:
            for hf_name in f.keys():
                name = hf_to_gguf_name(hf_name)
                if name is None:
                    continue
                t = f.get_tensor(hf_name)
                if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                    t = t.to(torch.float32)
                n_params += t.numel()
                size += t.numel() * t.element_size()
                if t.dim() == 1:
                    weights[name] = t.to(torch.float32)
                else:
                    w = QWeight.from_float(t.reshape(t.shape[0], -1))
                    weights[name] = w
                    qtypes.append(w.qtype)

    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    base = float(cfg.get("rope_theta", 10000.0))
    tied = bool(cfg.get("tie_word_embeddings", False)) or "output.weight" not in weights
    if tied:
        weights.pop("output.weight", None)
    rs = cfg.get("rope_scaling") or {}
    rs_type = rs.get("rope_type", rs.get("type", "none")) or "none"
    scaling, factor, orig_ctx = "none", 1.0, 0
    if rs_type == "linear":
        scaling, factor = "linear", float(rs.get("factor", 1.0))
    elif rs_type == "yarn":
        scaling, factor = "yarn", float(rs.get("factor", 1.0))
        orig_ctx = int(rs.get("original_max_position_embeddings", 0) or 0)
    elif rs_type == "llama3":
        weights["rope_freqs.weight"] = _llama3_rope_factors(cfg, head_dim, base)
    config = ModelConfig(
        arch=arch,
        n_layer=int(cfg["num_hidden_layers"]),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        head_dim=head_dim,
        n_ff=int(cfg["intermediate_size"]),
        n_vocab=int(weights["token_embd.weight"].rows),
        n_ctx_train=int(cfg.get("max_position_embeddings", 2048)),
        rope_freq_base=base,
        n_rot=head_dim,
        rope_scaling_type=scaling,
        rope_scaling_factor=factor,
        rope_scaling_orig_ctx=orig_ctx,
        yarn_beta_fast=float(rs.get("beta_fast", 32.0)),
        yarn_beta_slow=float(rs.get("beta_slow", 1.0)),
        has_rope_freqs="rope_freqs.weight" in weights,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_neox=True,  # HF weights are not permuted for the pairwise rope
        tie_embeddings=tied,
        has_qkv_bias="blk.0.attn_q.bias" in weights,
        has_qk_norm="blk.0.attn_q_norm.weight" in weights,
    )
    config.rope_freq_factors = weights.get("rope_freqs.weight")
    ft = guess_ftype(qtypes) & ~LlamaFileType.GUESSED
    n_tensors = len(weights)
    _progress(f"load_model: loaded {n_tensors}/{n_tensors} tensors, {size / 1e6:.1f} MB "
              f"in {time.perf_counter() - t0:.2f} s")
    return LoadedModel(config=config, weights=weights, file_type=ftype_name(ft),
                       n_params=n_params, size=size, gguf_metadata={}, path=str(folder),
                       format="safetensors")
