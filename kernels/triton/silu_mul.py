"""silu(gate) * up, float32 math. For decode rows (`qmatmul_q8.fuses_quant`) each program also
writes its block's q8_1 form (`qmatmul_q8.quant_store_groups`), attached to the output for the
down projection's GEMV (`qmatmul_q8.attach`): no activation quantizer launch before it.
Reference: `kernels.ref.silu_mul` (the q8_1 form: `qmatmul_q8.quantize_act` of the output, bit for bit)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from .qmatmul_q8 import act_buffers, attach, fuses_quant, quant_store_groups

reference = ref.silu_mul


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, xq_ptr, xd_ptr, xs_ptr, F, stride_g, stride_u, stride_o,
                     BLOCK: tl.constexpr, QUANT: tl.constexpr = False):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < F
    g = tl.load(g_ptr + t * stride_g + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + t * stride_u + offs, mask=m, other=0.0).to(tl.float32)
    y = (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_o + offs, y, mask=m)
    if QUANT:  # F % 32 == 0, BLOCK a multiple of 32: this block's groups
        ng = F // 32
        quant_store_groups(y.to(tl.float32), xq_ptr + t * (ng * 8), xd_ptr + t * ng, xs_ptr + t * (ng * 2),
                           tl.program_id(1) * (BLOCK // 32), ng, BLOCK // 32)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    T, F = gate.shape
    gate = gate if gate.stride(1) == 1 else gate.contiguous()
    up = up if up.stride(1) == 1 else up.contiguous()
    out = torch.empty(T, F, dtype=gate.dtype, device=gate.device)
    if T > 0:
        BLOCK = min(1024, triton.next_power_of_2(F))
        quant = fuses_quant(T, F)
        xq = act_buffers(T, F, gate.device) if quant else (out, out, out)
        _silu_mul_kernel[(T, triton.cdiv(F, BLOCK))](
            gate, up, out, *xq, F, gate.stride(0), up.stride(0), out.stride(0), BLOCK=BLOCK, QUANT=quant
        )
        if quant:
            attach(out, xq)
    return out
