"""Dense attention over contiguous keys and values with an optional boolean mask (the vision
encoder's bidirectional / windowed attention, a prompt's image spans): flash attention, one program
per (query tile, query head), float32 online softmax (`attend_tile`), optional tanh soft-cap.
Reference: `kernels.ref.dense_attention`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from .attend_tile import attend_tile

reference = ref.dense_attention


@triton.jit
def _dense_attention_kernel(
    q_ptr, k_ptr, v_ptr, m_ptr, out_ptr,
    T, S, G, D, scale, softcap,
    stride_qt, stride_qh, stride_qd, stride_ks, stride_kh, stride_kd,
    stride_mt, stride_ot, stride_oh,
    HAS_MASK: tl.constexpr, SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    mt = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // G
    rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < T
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    r64 = rows.to(tl.int64)
    q = tl.load(q_ptr + r64[:, None] * stride_qt + h * stride_qh + d[None, :] * stride_qd,
                mask=rmask[:, None] & dmask[None, :], other=0.0)
    q = q.to(k_ptr.dtype.element_ty)
    m_i = tl.full((BLOCK_M,), -1e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for n0 in range(0, S, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        tmask = tok < S
        off = tok.to(tl.int64) * stride_ks + kvh * stride_kh
        kvmask = tmask[:, None] & dmask[None, :]
        valid = rmask[:, None] & tmask[None, :]
        if HAS_MASK:
            mv = tl.load(m_ptr + r64[:, None] * stride_mt + tok[None, :], mask=valid, other=0)
            valid = valid & (mv != 0)
        m_i, l_i, acc = attend_tile(q, k_ptr, v_ptr, off, d, stride_kd, kvmask, valid, scale, softcap,
                                    m_i, l_i, acc, SOFTCAP)
    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_i[:, None]
    tl.store(out_ptr + r64[:, None] * stride_ot + h * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              mask: torch.Tensor | None = None, softcap: float = 0.0) -> torch.Tensor:
    """Same contract as `kernels.ref.dense_attention`. q is rounded to k's dtype for the products (as
    the paged kernels round it to the cache's); v must have k's dtype and strides."""
    T, H, D = q.shape
    S, KVH, _ = k.shape
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    k = k.contiguous()
    v = v.to(k.dtype).contiguous()
    m = mask.to(device=q.device, dtype=torch.int8).contiguous() if mask is not None else k
    BLOCK_D = max(16, triton.next_power_of_2(D))
    # tiles within the registers and shared memory of sm_80 / sm_90 (scripts/aot_compile.py: no spills)
    if k.dtype == torch.float32:
        BLOCK_M, BLOCK_N = 32, 16
    else:
        BLOCK_M, BLOCK_N = (32, 32) if BLOCK_D > 128 else (64, 32)
    grid = (triton.cdiv(T, BLOCK_M), H)
    _dense_attention_kernel[grid](
        q, k, v, m, out, T, S, H // KVH, D, float(scale), float(softcap),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        m.stride(0) if mask is not None else 0, out.stride(0), out.stride(1),
        HAS_MASK=mask is not None, SOFTCAP=softcap > 0.0,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=4 if BLOCK_M <= 32 else 8, num_stages=2)
    return out
