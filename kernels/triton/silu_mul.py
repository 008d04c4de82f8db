"""silu(gate) * up, float32 math. Reference: `kernels.ref.silu_mul`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref

reference = ref.silu_mul


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, F, stride_g, stride_u, stride_o, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < F
    g = tl.load(g_ptr + t * stride_g + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + t * stride_u + offs, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + t * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    T, F = gate.shape
    gate = gate if gate.stride(1) == 1 else gate.contiguous()
    up = up if up.stride(1) == 1 else up.contiguous()
    out = torch.empty(T, F, dtype=gate.dtype, device=gate.device)
    if T > 0:
        BLOCK = min(1024, triton.next_power_of_2(F))
        _silu_mul_kernel[(T, triton.cdiv(F, BLOCK))](
            gate, up, out, F, gate.stride(0), up.stride(0), out.stride(0), BLOCK=BLOCK
        )
    return out
