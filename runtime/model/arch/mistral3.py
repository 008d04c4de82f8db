"""Mistral 3 (`mistral3`: Ministral 3, Mistral Small 3.x text decoders), as llama.cpp b1-0c1e570's
src/models/mistral3.cpp computes it: the llama graph (RMSNorm, q/k/v, llama's pairwise "normal"
RoPE with YaRN, SwiGLU, optional tied output) plus, when `attention.temperature_scale` is set,
Llama 4's attention temperature tuning: after RoPE, q of the token at position p is multiplied by
log(floor(p / n_ctx_orig) + 1) * temperature_scale + 1 (llm_graph_input_attn_temp, computed in
double and stored as float; n_ctx_orig is `rope.scaling.original_context_length`, else the
training context), so tokens within the original context are untouched. YaRN's magnitude scale
follows `rope.scaling.yarn_log_multiplier` as llama_context sets yarn_attn_factor:
get_mscale(f, 1) / get_mscale(f, log_mul) in place of 1 + 0.1 ln f (`runtime.model.rope.rope_mscale`). Not handled (refused): the
MoE FFN its loader also accepts, and LongRoPE factors.
"""
from __future__ import annotations

from typing import Any

import torch

ARCHS = ("mistral3",)


def configure(md: dict[str, Any], cfg) -> None:
    a = cfg.arch
    if md.get(f"{a}.expert_count"):
        raise ValueError(f"{a}: the mixture-of-experts variant is not supported")
    cfg.attn_temp_scale = float(md.get(f"{a}.attention.temperature_scale", 0.0) or 0.0)
    cfg.attn_temp_floor = int(cfg.rope_scaling_orig_ctx or cfg.n_ctx_train)
    if cfg.attn_temp_scale and cfg.attn_temp_floor == 0:
        raise ValueError("invalid n_ctx_orig_yarn for attention temperature scaling")
    # llama_context then takes get_mscale(f, 1) / get_mscale(f, log_mul) as YaRN's magnitude (rope.rope_mscale)
    cfg.yarn_log_mul = float(md.get(f"{a}.rope.scaling.yarn_log_multiplier", 0.0) or 0.0)


def temperature(pos: torch.Tensor, scale: float, floor: int) -> torch.Tensor:
    """[T] float32 factors on q for positions pos [T] (llama.cpp's inp_attn_scale)."""
    p = pos.to(torch.float32).double()
    return (torch.log(torch.floor(p / floor) + 1.0) * scale + 1.0).float()


def temper(q: torch.Tensor, pos: torch.Tensor, cfg) -> torch.Tensor:
    """q [T, H, D] (after RoPE) times its position's temperature factor."""
    return q * temperature(pos, cfg.attn_temp_scale, cfg.attn_temp_floor).to(q.dtype)[:, None, None]
