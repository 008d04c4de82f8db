"""gemma / gemma2 / gemma3 as llama.cpp b1-0c1e570 computes them (src/models/gemma*.cpp).

- token embeddings scaled by sqrt(n_embd) (a float32 scale of the dequantized rows);
- GeGLU FFN with the tanh GELU (`kernels.gelu_mul`, ggml's float16-table GELU);
- RMSNorm with the weights as the GGUF stores them (the converter already added gemma's "1 +");
- gemma2/3: RMSNorm of the attention output and of the FFN output before each residual add
  (`post_attention_norm`, `post_ffw_norm`); gemma3: RMSNorm of q and k per head (`attn_q_norm`,
  `attn_k_norm`) before RoPE;
- queries scaled by 1/sqrt(head_dim) (27B-sized models: 1/sqrt(n_embd / n_head)) before the attention,
  which then scales its scores by 1 (as llama.cpp's graphs do; its flash attention rounds the scaled q);
- sliding-window layers (llama.cpp's LLAMA_SWA_TYPE_STANDARD: a query at p sees keys p - W + 1..p):
  gemma3 every layer but each sixth (il % 6 < 5 is local; `attention.sliding_window`, or a
  `sliding_window_pattern` array when the file has one), local layers with their own RoPE base
  (`rope.freq_base_swa`, default 10000, scale 1); gemma2 every other layer (il % 2 == 0 is local,
  window default 4096), both RoPE bases the file's;
- gemma2: tanh soft-cap of the attention scores (`attn_logit_softcapping`, default 50) and of the
  logits (`final_logit_softcapping`, default 30); gemma3: logit soft-cap only when the file sets it.
NEOX RoPE for all three.
"""
from __future__ import annotations

import math
from typing import Any

ARCHS = ("gemma", "gemma2", "gemma3")


def _swa_layers(md: dict[str, Any], arch: str, n_layer: int, n_pattern: int) -> list[bool]:
    """llama_model_base::load_swa_pattern (dense_first = false)."""
    explicit = md.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(explicit, list):
        return [bool(x) for x in explicit[:n_layer]]
    if explicit is not None:
        n_pattern = int(explicit)
    return [n_pattern == 0 or (il % n_pattern < n_pattern - 1) for il in range(n_layer)]


def configure(md: dict[str, Any], cfg) -> None:
    arch = cfg.arch
    if arch == "gemma":
        return
    if arch == "gemma2":
        cfg.sliding_window = int(md.get(f"{arch}.attention.sliding_window", 4096))
        cfg.swa_layers = _swa_layers(md, arch, cfg.n_layer, 2)
        cfg.rope_freq_base_swa = float(md.get(f"{arch}.rope.freq_base_swa", cfg.rope_freq_base))
        cfg.attn_logit_softcap = float(md.get(f"{arch}.attn_logit_softcapping", 50.0))
        cfg.final_logit_softcap = float(md.get(f"{arch}.final_logit_softcapping", 30.0))
        return
    window = int(md.get(f"{arch}.attention.sliding_window", 0) or 0)
    if window > 0:
        cfg.sliding_window = window
        cfg.swa_layers = _swa_layers(md, arch, cfg.n_layer, 6)
        cfg.rope_freq_base_swa = float(md.get(f"{arch}.rope.freq_base_swa", 10000.0))
    cfg.attn_logit_softcap = 0.0  # gemma3 has none
    cfg.final_logit_softcap = float(md.get(f"{arch}.final_logit_softcapping", 0.0) or 0.0)


def _attention_scale(cfg) -> float:
    big = (cfg.arch == "gemma3" and cfg.n_layer == 62) or (cfg.arch == "gemma2" and cfg.n_layer == 46)  # 27B
    return 1.0 / math.sqrt(cfg.n_embd / cfg.n_head) if big else 1.0 / math.sqrt(cfg.head_dim)


def spec_fields(cfg) -> dict[str, Any]:
    swa = cfg.swa_layers or []
    windows = [cfg.sliding_window if is_swa else 0 for is_swa in swa] if cfg.sliding_window else []
    bases = [cfg.rope_freq_base_swa if is_swa else cfg.rope_freq_base for is_swa in swa] if windows else []
    return dict(
        embed_scale=math.sqrt(cfg.n_embd),
        act="gelu",
        post_norms=cfg.arch != "gemma",
        attn_scale=1.0 / math.sqrt(cfg.head_dim) if cfg.arch == "gemma" else _attention_scale(cfg),
        prescale_q=True,
        attn_softcap=cfg.attn_logit_softcap if cfg.arch == "gemma2" else 0.0,
        final_softcap=cfg.final_logit_softcap,
        windows=windows,
        rope_bases=bases,
    )
