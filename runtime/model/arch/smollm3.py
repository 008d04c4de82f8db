"""SmolLM3 (`smollm3`), as llama.cpp b1-0c1e570's src/models/smollm3.cpp computes it: the llama
graph (RMSNorm, q/k/v, llama's pairwise "normal" RoPE, SwiGLU, optional tied output) except that
every 4th layer uses no RoPE at all (`n_no_rope_layer_step = 4`: layer il rotates q and k unless
(il + 1) % 4 == 0). The decoder keeps its one loop: a NoPE layer gets all-zero inverse
frequencies and no ggml angle chain, so its rotation is by angle 0 (cos 1, sin 0: q and k pass
through bit for bit), which also keeps `--cache-reuse` re-rotation and the fused CPU decode step
right for it.
"""
from __future__ import annotations

from typing import Any

import torch

ARCHS = ("smollm3",)
NO_ROPE_LAYER_STEP = 4  # llama.cpp: hparams.n_no_rope_layer_step, fixed for smollm3


def spec_fields(cfg) -> dict[str, Any]:
    return dict(nope=[(il + 1) % NO_ROPE_LAYER_STEP == 0 for il in range(cfg.n_layer)])


def nope_fields(inv_freq: torch.Tensor) -> dict[str, Any]:
    """A NoPE layer's RoPE for the decoder's `Layer`: rotation by angle 0 (an exact identity)."""
    return dict(inv_freq=torch.zeros_like(inv_freq), rope_theta_scale=0.0)
