"""Paged attention, decode: one query per sequence, all query heads of one KV head per program
(GQA: BLOCK_G = the group size rounded up to a power of two, at least 16: a `tl.dot` tile; the
padding rows cost tensor-core work, which is free here, and no registers: the CUDA-core version
this replaced held [G, BLOCK_N, D] products and needed 169-255 registers), KV gathered through the
block table, split-K over the context, the partial softmaxes merged by the last split of each
(sequence, KV head) to finish (`merge_splits.merge_head`; an int32 counter per pair in a zeroed
workspace that the merging program zeroes again, so a CUDA graph replays it as is). The split count is fixed at launch (a CUDA graph keeps its grid) from the
batch and the table's width; each split's share of a sequence comes from its live length in the
kernel, so a short sequence in a wide table still spreads over every split. float32 softmax,
optional tanh soft-capping and sliding window (splits before the window read nothing).
Reference: `kernels.ref.paged_attention` (all q_len == 1)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from .attend_tile import attend_tile_kv
from .kv_quant import type_id
from .merge_splits import merge_head
from .qmatmul_q8 import quant_store_groups

reference = ref.paged_attention


@triton.jit
def _paged_decode_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, lens_ptr, out_ptr, po_ptr, pm_ptr, pl_ptr, sinks_ptr, sem_ptr,
    xq_ptr, xd_ptr, xs_ptr,
    scale, softcap, window, G, D, BS,
    stride_qt, stride_qh, stride_qd,
    stride_cb, stride_ct, stride_ch, stride_cd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, K_TYPE: tl.constexpr, V_TYPE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr = False,
    QUANT: tl.constexpr = False,
):
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    qrow = tl.load(cu_ptr + s).to(tl.int64)
    qlen = tl.load(cu_ptr + s + 1) - tl.load(cu_ptr + s)
    L = tl.load(lens_ptr + s)
    first = 0
    if WINDOW:  # sliding window: the query at L - 1 sees keys L - window .. L - 1
        first = tl.maximum(0, L - window) // BLOCK_N * BLOCK_N
    # this split's share of the live keys, in whole BLOCK_N tiles
    chunk = tl.cdiv(tl.cdiv(L - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * chunk
    end = tl.minimum(L, start + chunk)
    if WINDOW:
        start = tl.maximum(start, L - window)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < G
    dmask = d < D
    heads = kvh * G + g
    q = tl.load(q_ptr + qrow * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    if K_TYPE == 0:
        q = q.to(kc_ptr.dtype.element_ty)
    else:  # a quantized K: dequantized to float16 tiles
        q = q.to(tl.float16)
    m_i = tl.full((BLOCK_G,), -1e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    if qlen == 1:
        for n0 in range(start, end, BLOCK_N):
            tok = n0 + tl.arange(0, BLOCK_N)
            tmask = tok < end
            blk = tl.load(bt_ptr + s * stride_bts + tok // BS, mask=tmask, other=0).to(tl.int64)
            off = blk * stride_cb + (tok % BS) * stride_ct + kvh * stride_ch
            voff = blk * stride_vb + (tok % BS) * stride_vt + kvh * stride_vh
            kvmask = tmask[:, None] & dmask[None, :]
            m_i, l_i, acc = attend_tile_kv(q, kc_ptr, vc_ptr, off, voff, d, stride_cd, stride_vd, kvmask, tmask[None, :],
                                         scale, softcap, m_i, l_i, acc, SOFTCAP, K_TYPE, V_TYPE)
        omask = gmask[:, None] & dmask[None, :]
        if NUM_SPLITS == 1:
            if SINKS:  # gpt-oss: one more logit per head, with no value (split-K: merge_head adds it)
                sk = tl.load(sinks_ptr + heads, mask=gmask, other=0.0).to(tl.float32)
                m_new = tl.maximum(m_i, sk)
                alpha = tl.exp(m_i - m_new)
                l_i = l_i * alpha + tl.exp(sk - m_new)
                acc = acc * alpha[:, None]
            o = (acc / l_i[:, None]).to(out_ptr.dtype.element_ty)
            optr = out_ptr + qrow * stride_ot + heads[:, None] * stride_oh + d[None, :]
            tl.store(optr, o, mask=omask)
            if QUANT:  # the output row's q8_1 form (D == BLOCK_D): this group's heads, D / 32 groups each
                ng = tl.num_programs(1) * G * (BLOCK_D // 32)
                g0 = kvh * G * (BLOCK_D // 32)
                quant_store_groups(tl.reshape(o.to(tl.float32), (BLOCK_G * BLOCK_D,)), xq_ptr + qrow * (ng * 8),
                                   xd_ptr + qrow * ng, xs_ptr + qrow * (ng * 2), g0, g0 + G * (BLOCK_D // 32),
                                   BLOCK_G * BLOCK_D // 32)
        else:
            # partials: po [S, H, NUM_SPLITS, D] float32, pm/pl [S, H, NUM_SPLITS]
            H = G * tl.num_programs(1)
            idx = (s * H + heads) * NUM_SPLITS + split
            tl.store(po_ptr + idx[:, None].to(tl.int64) * D + d[None, :], acc, mask=omask)
            tl.store(pm_ptr + idx, m_i, mask=gmask)
            tl.store(pl_ptr + idx, l_i, mask=gmask)
            # the last split of (s, kvh) to get here merges: every thread's stores made visible
            # (barrier, then a release at GPU scope), the others' seen (acquire, loads through L2)
            tl.debug_barrier()
            sem = sem_ptr + s * tl.num_programs(1) + kvh
            if tl.atomic_add(sem, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1:
                ng = H * (BLOCK_D // 32)
                for gi in range(0, G):
                    h = kvh * G + gi
                    merge_head(po_ptr, pm_ptr, pl_ptr, (s * H + h) * NUM_SPLITS, out_ptr + qrow * stride_ot + h * stride_oh,
                               sinks_ptr, h, D, xq_ptr + qrow * (ng * 8), xd_ptr + qrow * ng, xs_ptr + qrow * (ng * 2),
                               ng, NUM_SPLITS, BLOCK_D, SINKS, QUANT)
                tl.atomic_xchg(sem, 0)  # zero again for the next launch


def num_splits_for(S: int, KVH: int, max_ctx: int, n_sm: int = 132) -> int:
    """Enough programs to fill the GPU twice over, no more splits than 256-key pieces of the table's
    width, a power of two <= 32."""
    want = max(1, (2 * n_sm) // max(1, S * KVH))
    cap = max(1, max_ctx // 256)
    n = min(want, cap, 32)
    return 1 << (n.bit_length() - 1)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device, n: int) -> torch.Tensor:
    """n int32 zeros: the split-K counters. A workspace per device, zeroed once (a growth, outside
    a CUDA graph capture: the runner's warm-up step runs first) and kept zero by the kernel, as
    cuBLAS keeps its workspace; decode attention runs on one stream per device."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf


def paged_decode(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap=0.0,
                 out=None, num_splits: int | None = None, window: int = 0, k_type=None, v_type=None,
                 sinks=None, xq=None):
    """Decode attention for sequences with q_len == 1 (others are left untouched in `out`);
    k_type / v_type: a quantized cache's GGML type (kernels/kv_quant_ref.py), None for a float one;
    `xq`: `qmatmul_q8.act_buffers` of out seen as [T, H * D] (D a power of two >= 32), written too."""
    k_type, v_type = type_id(k_type), type_id(v_type)
    T, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    S = kv_lens.shape[0]
    G = H // KVH
    if out is None:
        out = torch.empty_like(q)
    max_ctx = block_tables.shape[1] * BS
    if num_splits is None:
        n_sm = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
        num_splits = num_splits_for(S, KVH, max_ctx, n_sm)
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_G = max(16, triton.next_power_of_2(G))
    # K and V tiles of 4K elements per 4 warps (head dim 256: 8K per 8 warps): at most 128 registers
    # under triton 3.6 and 3.9, no spills (scripts/gpu_model.py checks it)
    if BLOCK_G > 16:
        BLOCK_N, warps = 16, 4
    elif k_type or v_type:  # tiles dequantized in registers (their codes, scales, offsets): 16 keys
        BLOCK_N, warps = 16, 4 if BLOCK_D <= 128 else 8
    elif BLOCK_D <= 128:
        BLOCK_N, warps = max(16, 4096 // BLOCK_D), 4
    else:
        BLOCK_N, warps = 32, 8
    if num_splits > 1:
        po = torch.empty(S, H, num_splits, D, dtype=torch.float32, device=q.device)
        pm = torch.empty(S, H, num_splits, dtype=torch.float32, device=q.device)
        pl = torch.empty(S, H, num_splits, dtype=torch.float32, device=q.device)
        sem = split_counters(q.device, S * KVH)
    else:
        po = pm = pl = sem = out
    bt = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    _paged_decode_kernel[(S, KVH, num_splits)](
        q, k_cache, v_cache, bt, cu_seqlens_q, kv_lens, out, po, pm, pl, out if sinks is None else sinks, sem,
        *(xq if xq is not None else (out, out, out)),
        float(scale), float(softcap), int(window), G, D, BS,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), bt.stride(0), out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, SOFTCAP=softcap > 0.0, WINDOW=window > 0, K_TYPE=k_type, V_TYPE=v_type,
        BLOCK_G=BLOCK_G, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, SINKS=sinks is not None, QUANT=xq is not None,
        num_warps=warps,
    )
    return out
