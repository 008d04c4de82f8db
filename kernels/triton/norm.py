"""RMSNorm with optional fused residual add: one program per row, float32 statistics. For decode
rows (`qmatmul_q8.fuses_quant`) the same program also writes the normed row's q8_1 form (codes,
scales, sums: `qmatmul_q8.quant_store_groups`), attached to the output for the decode GEMVs that
read it (`qmatmul_q8.attach`): the activation quantizer's launch before q/k/v and gate/up is gone.
References: `kernels.ref.rms_norm`, `kernels.ref.add_rms_norm` (the q8_1 form:
`qmatmul_q8.quantize_act` of the output, bit for bit)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from .qmatmul_q8 import act_buffers, attach, fuses_quant, quant_store_groups

reference = ref.rms_norm
reference_add = ref.add_rms_norm


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, xq_ptr, xd_ptr, xs_ptr, C, eps,
    stride_x, stride_r, stride_o, stride_s,
    HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr, QUANT: tl.constexpr = False,
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
    y = (x * inv * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + offs, y, mask=mask)
    if QUANT:  # C % 32 == 0: the row's C / 32 groups (masked lanes are 0 and their groups masked off)
        ng = C // 32
        quant_store_groups(y.to(tl.float32), xq_ptr + row * (ng * 8), xd_ptr + row * ng, xs_ptr + row * (ng * 2),
                           0, ng, BLOCK_C // 32)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(x, residual, weight, eps):
    T, C = x.shape
    x = _rows(x)
    out = torch.empty(T, C, dtype=x.dtype, device=x.device)
    s = torch.empty(T, C, dtype=x.dtype, device=x.device) if residual is not None else out
    r = _rows(residual) if residual is not None else x
    if T > 0:
        quant = fuses_quant(T, C)
        xq = act_buffers(T, C, x.device) if quant else (out, out, out)
        BLOCK_C = triton.next_power_of_2(C)
        nw = 4 if BLOCK_C <= 2048 else (8 if BLOCK_C <= 8192 else 16)
        _rms_norm_kernel[(T,)](
            x, r, weight.contiguous(), out, s, *xq, C, float(eps),
            x.stride(0), r.stride(0), out.stride(0), s.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK_C=BLOCK_C, QUANT=quant, num_warps=nw,
        )
        if quant:
            attach(out, xq)
    return out, s


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    return _launch(x, residual, weight, eps)
