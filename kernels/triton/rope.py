"""Rotary embedding, GGML "norm" (adjacent pairs) and "neox" (halves) modes, one program per
(token, head). Positions may be deltas (re-rotating cached keys). Reference: `kernels.ref.rope`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref

reference = ref.rope


@triton.jit
def _rope_kernel(
    x_ptr, pos_ptr, freq_ptr, out_ptr, D, R, mscale,
    stride_xt, stride_xh, stride_xd, stride_ot, stride_oh,
    NEOX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    xrow = x_ptr + t * stride_xt + h * stride_xh
    orow = out_ptr + t * stride_ot + h * stride_oh
    # dims past 2R pass through unchanged
    offs_d = tl.arange(0, BLOCK_D)
    pmask = (offs_d >= 2 * R) & (offs_d < D)
    tl.store(orow + offs_d, tl.load(xrow + offs_d * stride_xd, mask=pmask), mask=pmask)
    i = tl.arange(0, BLOCK_R)
    m = i < R
    ang = tl.load(pos_ptr + t).to(tl.float32) * tl.load(freq_ptr + i, mask=m, other=0.0)
    c = tl.cos(ang) * mscale  # ggml's rope_yarn: YaRN's magnitude factor on cos and sin (1 otherwise)
    s = tl.sin(ang) * mscale
    if NEOX:
        i0 = i
        i1 = i + R
    else:
        i0 = 2 * i
        i1 = 2 * i + 1
    x0 = tl.load(xrow + i0 * stride_xd, mask=m, other=0.0).to(tl.float32)
    x1 = tl.load(xrow + i1 * stride_xd, mask=m, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(orow + i0, (x0 * c - x1 * s).to(ty), mask=m)
    tl.store(orow + i1, (x0 * s + x1 * c).to(ty), mask=m)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool,
         theta_scale: float = 0.0, mscale: float = 1.0) -> torch.Tensor:
    """`kernels.rope`; the angles always from inv_freq (theta_scale, ggml's CPU chain, not followed)."""
    T, NH, D = x.shape
    R = inv_freq.shape[0]
    assert 2 * R <= D, (R, D)
    out = torch.empty(T, NH, D, dtype=x.dtype, device=x.device)
    if T == 0 or NH == 0:
        return out
    pos = positions.to(device=x.device, dtype=torch.int64).contiguous()
    freq = inv_freq.to(device=x.device, dtype=torch.float32).contiguous()
    _rope_kernel[(T, NH)](
        x, pos, freq, out, D, R, float(mscale),
        x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
        NEOX=bool(neox), BLOCK_R=triton.next_power_of_2(R), BLOCK_D=triton.next_power_of_2(D),
        num_warps=1 if D <= 128 else 2,
    )
    return out
