"""RMSNorm with optional fused residual add: one program per row, float32 statistics.
References: `kernels.ref.rms_norm`, `kernels.ref.add_rms_norm`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref

reference = ref.rms_norm
reference_add = ref.add_rms_norm


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, C, eps,
    stride_x, stride_r, stride_o, stride_s,
    HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < C
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(sum_ptr.dtype.element_ty)  # the sum is returned (and normalized) in x.dtype
        tl.store(sum_ptr + row * stride_s + offs, s, mask=mask)
        x = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (x * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(x, residual, weight, eps):
    T, C = x.shape
    x = _rows(x)
    out = torch.empty(T, C, dtype=x.dtype, device=x.device)
    s = torch.empty(T, C, dtype=x.dtype, device=x.device) if residual is not None else out
    r = _rows(residual) if residual is not None else x
    if T > 0:
        BLOCK_C = triton.next_power_of_2(C)
        nw = 4 if BLOCK_C <= 2048 else (8 if BLOCK_C <= 8192 else 16)
        _rms_norm_kernel[(T,)](
            x, r, weight.contiguous(), out, s, C, float(eps),
            x.stride(0), r.stride(0), out.stride(0), s.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK_C=BLOCK_C, num_warps=nw,
        )
    return out, s


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    return _launch(x, residual, weight, eps)
