"""Paged attention, prefill / mixed batches: varlen causal flash attention over cached prefix
blocks plus the new tokens (all already written to the cache). One program per (query tile,
sequence, query head). float32 online softmax, optional tanh soft-capping and sliding window
(keys before the tile's window are skipped).
Reference: `kernels.ref.paged_attention`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from .attend_tile import attend_tile_kv
from .kv_quant import type_id

reference = ref.paged_attention


@triton.jit
def _paged_prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, lens_ptr, out_ptr, sinks_ptr,
    scale, softcap, window, G, D, BS,
    stride_qt, stride_qh, stride_qd,
    stride_cb, stride_ct, stride_ch, stride_cd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts, stride_ot, stride_oh,
    SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, K_TYPE: tl.constexpr, V_TYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SINKS: tl.constexpr = False,
):
    mt = tl.program_id(0)
    s = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // G
    q0 = tl.load(cu_ptr + s)
    qlen = tl.load(cu_ptr + s + 1) - q0
    L = tl.load(lens_ptr + s)
    mstart = mt * BLOCK_M
    if mstart < qlen:
        rows = mstart + tl.arange(0, BLOCK_M)
        rmask = rows < qlen
        pos = L - qlen + rows  # absolute position of each query
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        qoff = (q0 + rows).to(tl.int64)
        q = tl.load(q_ptr + qoff[:, None] * stride_qt + h * stride_qh + d[None, :] * stride_qd,
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        if K_TYPE == 0:
            q = q.to(kc_ptr.dtype.element_ty)
        else:  # a quantized K: dequantized to float16 tiles
            q = q.to(tl.float16)
        m_i = tl.full((BLOCK_M,), -1e30, dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        kv_end = tl.minimum(L, L - qlen + mstart + BLOCK_M)
        kv_start = 0
        if WINDOW:  # sliding window: the tile's first query sees keys from its position - window + 1
            kv_start = tl.maximum(0, L - qlen + mstart - window + 1) // BLOCK_N * BLOCK_N
        for n0 in range(kv_start, kv_end, BLOCK_N):
            tok = n0 + tl.arange(0, BLOCK_N)
            tmask = tok < kv_end
            blk = tl.load(bt_ptr + s * stride_bts + tok // BS, mask=tmask, other=0).to(tl.int64)
            off = blk * stride_cb + (tok % BS) * stride_ct + kvh * stride_ch
            voff = blk * stride_vb + (tok % BS) * stride_vt + kvh * stride_vh
            kvmask = tmask[:, None] & dmask[None, :]
            valid = tmask[None, :] & (tok[None, :] <= pos[:, None])  # causal
            if WINDOW:
                valid = valid & (tok[None, :] > pos[:, None] - window)
            m_i, l_i, acc = attend_tile_kv(q, kc_ptr, vc_ptr, off, voff, d, stride_cd, stride_vd, kvmask, valid,
                                         scale, softcap, m_i, l_i, acc, SOFTCAP, K_TYPE, V_TYPE)
        if SINKS:  # gpt-oss: one more logit per head, with no value
            sk = tl.load(sinks_ptr + h).to(tl.float32)
            m_new = tl.maximum(m_i, sk)
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.exp(sk - m_new)
            acc = acc * alpha[:, None]
        o = acc / l_i[:, None]
        optr = out_ptr + qoff[:, None] * stride_ot + h * stride_oh + d[None, :]
        tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def paged_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap=0.0,
                  max_q_len: int | None = None, out=None, window: int = 0, k_type=None, v_type=None,
                  sinks=None):
    k_type, v_type = type_id(k_type), type_id(v_type)
    T, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    S = kv_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item()) if S else 0
    if max_q_len == 0:
        return out
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_M = 16 if max_q_len <= 16 else (32 if BLOCK_D > 128 else 64)
    BLOCK_N = 32 if BLOCK_D > 128 else 64
    warps = 4 if BLOCK_M <= 32 else 8
    if k_type or v_type:  # tiles dequantized in registers: half the keys, head dim 256 on 8 warps
        BLOCK_N //= 2
        warps = 8 if BLOCK_D > 128 else warps
    bt = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    _paged_prefill_kernel[(triton.cdiv(max_q_len, BLOCK_M), S, H)](
        q, k_cache, v_cache, bt, cu_seqlens_q, kv_lens, out, out if sinks is None else sinks,
        float(scale), float(softcap), int(window), H // KVH, D, BS,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), bt.stride(0), out.stride(0), out.stride(1),
        SOFTCAP=softcap > 0.0, WINDOW=window > 0, K_TYPE=k_type, V_TYPE=v_type, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
        SINKS=sinks is not None, num_warps=warps, num_stages=2,
    )
    return out
