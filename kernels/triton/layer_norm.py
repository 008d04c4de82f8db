"""LayerNorm (the vision encoder's): one program per row, float32 statistics, optional weight and
bias. Reference: `kernels.ref.layer_norm`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref

reference = ref.layer_norm


@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, C, eps, stride_x, stride_o,
                       HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < C
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / C
    d = tl.where(mask, x - mean, 0.0)
    y = d / tl.sqrt(tl.sum(d * d, axis=0) / C + eps)
    if HAS_W:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    T, C = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(T, C, dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    BLOCK_C = triton.next_power_of_2(C)
    nw = 4 if BLOCK_C <= 2048 else (8 if BLOCK_C <= 8192 else 16)
    w = weight.contiguous() if weight is not None else x
    b = bias.contiguous() if bias is not None else x
    _layer_norm_kernel[(T,)](x, w, b, out, C, float(eps), x.stride(0), out.stride(0),
                             HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_C=BLOCK_C, num_warps=nw)
    return out
