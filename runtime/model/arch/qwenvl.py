"""qwen2vl (Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni's thinker) and qwen3vl (Qwen3-VL) as llama.cpp
b1-0c1e570 computes them (src/models/qwen2vl.cpp, qwen3vl.cpp): qwen2's / qwen3's decoder with
multi-section RoPE (M-RoPE) and, for qwen3vl, deepstack inputs.

- M-RoPE: every token has four positions (t, h, w, e); `rope.dimension_sections` [4] says which
  rotary pair reads which one. qwen2vl (LLAMA_ROPE_TYPE_MROPE): contiguous sections, pair i (of
  n_rot / 2) in section s when i % sum(sections) falls in s's range; qwen3vl (IMROPE): interleaved,
  pair i reads t, h, w by (i % sum) % 3 within 3 * sections[k], e otherwise (ggml_mrope_cache_init).
  Each pair's angle is the same ggml chain as plain NEOX RoPE (theta_scale^i times the pair's own
  position), so M-RoPE is the plain rope of each position, pair by pair (`mrope`). A text token has
  all four positions equal (plain rope); an image token of mtmd's grid (t = the image's start, h
  = t + row, w = t + column, e = 0).
- deepstack (qwen3vl, `n_deepstack_layers`): the input embeddings are n_embd * (1 + n) wide (text
  tokens: zero-padded); the first n_embd columns enter the model, column block k + 1 is added to
  the output of layer k < n.
"""
from __future__ import annotations

from typing import Any

import torch

ARCHS = ("qwen2vl", "qwen3vl")


def configure(md: dict[str, Any], cfg) -> None:
    arch = cfg.arch
    secs = md.get(f"{arch}.rope.dimension_sections")
    if secs is None:
        raise ValueError(f"{arch}: key not found in model: {arch}.rope.dimension_sections")
    secs = [int(s) for s in list(secs)[:4]] + [0] * max(0, 4 - len(secs))
    if sum(secs) <= 0:
        raise ValueError(f"{arch}: rope.dimension_sections must not all be 0")
    cfg.rope_sections = secs
    cfg.rope_imrope = arch == "qwen3vl"
    cfg.n_deepstack = int(md.get(f"{arch}.n_deepstack_layers", 0) or 0) if arch == "qwen3vl" else 0


def pair_sections(sections: list[int], n_pairs: int, interleaved: bool) -> torch.Tensor:
    """[n_pairs] int64: the position (0 t, 1 h, 2 w, 3 e) each rotary pair reads."""
    total = sum(sections)
    out = torch.empty(n_pairs, dtype=torch.int64)
    s0, s1, s2 = sections[0], sections[1], sections[2]
    for i in range(n_pairs):
        sec = i % total
        if interleaved:
            if sec % 3 == 1 and sec < 3 * s1:
                out[i] = 1
            elif sec % 3 == 2 and sec < 3 * s2:
                out[i] = 2
            elif sec % 3 == 0 and sec < 3 * s0:
                out[i] = 0
            else:
                out[i] = 3
        else:
            out[i] = 0 if sec < s0 else 1 if sec < s0 + s1 else 2 if sec < s0 + s1 + s2 else 3
    return out


def mrope(ops, x: torch.Tensor, pos4: torch.Tensor, inv_freq: torch.Tensor, theta_scale: float,
          pairs: torch.Tensor, mscale: float = 1.0) -> torch.Tensor:
    """x [T, NH, D] with NEOX pairs (i, i + D/2) turned by the position `pairs[i]` selects among
    pos4 [4, T]: the plain rope of each position used, pair by pair."""
    R = pairs.shape[0]
    out = None
    for s in range(4):
        sel = (pairs == s).nonzero().flatten()
        if sel.numel() == 0:
            continue
        r = ops.rope(x, pos4[s], inv_freq, True, theta_scale, mscale)
        if out is None:
            out = r
            continue
        sel = sel.to(x.device)
        out[..., sel] = r[..., sel]
        out[..., sel + R] = r[..., sel + R]
    return out
