"""RMSNorm, the fused residual add + RMSNorm, and RoPE on the CPU: the contracts of `kernels.ref`'s
ops, float32 CPU tensors through one C call each (`pointwise.c`), anything else (other dtypes, no
compiler) through the reference. Same arithmetic as the reference up to float32 rounding (the
mean of squares is summed in float64; cos/sin from the C library)."""
from __future__ import annotations

import torch

from .. import ref
from . import native

MAX_ROPE_PAIRS = 512  # pointwise.c's angle buffers


def _lib(*tensors: torch.Tensor):
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return None
    return native.lib()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    lib = _lib(x, weight)
    if lib is None or weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        return ref.rms_norm(x, weight, eps)
    xc, w = x.contiguous(), weight.contiguous()
    out = torch.empty_like(xc)
    C = w.shape[0]
    lib.add_rms_norm_f32(xc.data_ptr(), None, w.data_ptr(), out.data_ptr(), None, xc.numel() // C, C, float(eps))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    lib = _lib(x, residual, weight)
    if lib is None or weight.dim() != 1 or x.shape != residual.shape or x.shape[-1] != weight.shape[0]:
        return ref.add_rms_norm(x, residual, weight, eps)
    xc, rc, w = x.contiguous(), residual.contiguous(), weight.contiguous()
    out, s = torch.empty_like(xc), torch.empty_like(xc)
    C = w.shape[0]
    lib.add_rms_norm_f32(xc.data_ptr(), rc.data_ptr(), w.data_ptr(), out.data_ptr(), s.data_ptr(),
                         xc.numel() // C, C, float(eps))
    return out, s


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool) -> torch.Tensor:
    lib = _lib(x, inv_freq)
    R = inv_freq.shape[0]
    if lib is None or x.dim() != 3 or positions.device.type != "cpu" or R > MAX_ROPE_PAIRS or 2 * R > x.shape[2]:
        return ref.rope(x, positions, inv_freq, neox)
    T, NH, D = x.shape
    xc, f = x.contiguous(), inv_freq.contiguous()
    pos = positions.to(torch.int64).contiguous()
    out = torch.empty_like(xc)
    lib.rope_f32(xc.data_ptr(), pos.data_ptr(), f.data_ptr(), out.data_ptr(), T, NH, D, R, int(neox))
    return out
