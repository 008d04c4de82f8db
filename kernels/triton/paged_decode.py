"""Paged attention, decode: one query per sequence, all query heads of one KV head per program
(GQA: BLOCK_G = the group size rounded to a power of two; groups under 16 heads use
`attend_tile_fma` on the CUDA cores, not 16-row `tl.dot` tiles that would be mostly padding), KV
gathered through the block table, split-K over the context for long sequences with a second kernel
merging the partial softmaxes (`merge_splits.py`). float32 softmax, optional tanh soft-capping
and sliding window (splits before the window read nothing).
Reference: `kernels.ref.paged_attention` (all q_len == 1)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from .attend_tile import attend_tile, attend_tile_fma
from .merge_splits import merge_splits

reference = ref.paged_attention


@triton.jit
def _paged_decode_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, lens_ptr, out_ptr, po_ptr, pm_ptr, pl_ptr,
    scale, softcap, window, G, D, BS, chunk,
    stride_qt, stride_qh, stride_qd,
    stride_cb, stride_ct, stride_ch, stride_cd,
    stride_bts, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    qrow = tl.load(cu_ptr + s).to(tl.int64)
    qlen = tl.load(cu_ptr + s + 1) - tl.load(cu_ptr + s)
    L = tl.load(lens_ptr + s)
    start = split * chunk
    end = tl.minimum(L, start + chunk)
    if WINDOW:  # sliding window: the query at L - 1 sees keys L - window .. L - 1
        start = tl.maximum(start, L - window)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gmask = g < G
    dmask = d < D
    heads = kvh * G + g
    q = tl.load(q_ptr + qrow * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=gmask[:, None] & dmask[None, :], other=0.0)
    q = q.to(kc_ptr.dtype.element_ty)
    m_i = tl.full((BLOCK_G,), -1e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    if qlen == 1:
        for n0 in range(start, end, BLOCK_N):
            tok = n0 + tl.arange(0, BLOCK_N)
            tmask = tok < end
            blk = tl.load(bt_ptr + s * stride_bts + tok // BS, mask=tmask, other=0).to(tl.int64)
            off = blk * stride_cb + (tok % BS) * stride_ct + kvh * stride_ch
            kvmask = tmask[:, None] & dmask[None, :]
            if BLOCK_G >= 16:
                m_i, l_i, acc = attend_tile(q, kc_ptr, vc_ptr, off, d, stride_cd, kvmask, tmask[None, :],
                                             scale, softcap, m_i, l_i, acc, SOFTCAP)
            else:
                m_i, l_i, acc = attend_tile_fma(q, kc_ptr, vc_ptr, off, d, stride_cd, kvmask, tmask[None, :],
                                                 scale, softcap, m_i, l_i, acc, SOFTCAP)
        omask = gmask[:, None] & dmask[None, :]
        if NUM_SPLITS == 1:
            o = acc / l_i[:, None]
            optr = out_ptr + qrow * stride_ot + heads[:, None] * stride_oh + d[None, :]
            tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=omask)
        else:
            # partials: po [S, H, NUM_SPLITS, D] float32, pm/pl [S, H, NUM_SPLITS]
            H = G * tl.num_programs(1)
            idx = (s * H + heads) * NUM_SPLITS + split
            tl.store(po_ptr + idx[:, None].to(tl.int64) * D + d[None, :], acc, mask=omask)
            tl.store(pm_ptr + idx, m_i, mask=gmask)
            tl.store(pl_ptr + idx, l_i, mask=gmask)


def num_splits_for(S: int, KVH: int, max_ctx: int, n_sm: int = 132) -> int:
    """Enough programs to fill the GPU, each split at least 256 keys, a power of two <= 32."""
    want = max(1, (2 * n_sm) // max(1, S * KVH))
    cap = max(1, max_ctx // 256)
    n = min(want, cap, 32)
    return 1 << (n.bit_length() - 1)


def paged_decode(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap=0.0,
                 out=None, num_splits: int | None = None, window: int = 0):
    """Decode attention for sequences with q_len == 1 (others are left untouched in `out`)."""
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
    BLOCK_G = triton.next_power_of_2(G)
    if BLOCK_G >= 16:  # tl.dot tiles
        BLOCK_N, warps = (64 if D <= 128 else 32), 4
    else:  # CUDA-core products: R x BLOCK_N x BLOCK_D within 16K elements (64 per thread)
        BLOCK_N, warps = max(16, min(64, 16384 // (BLOCK_G * BLOCK_D))), 8
    chunk = triton.cdiv(triton.cdiv(max_ctx, num_splits), BLOCK_N) * BLOCK_N
    if num_splits > 1:
        po = torch.empty(S, H, num_splits, D, dtype=torch.float32, device=q.device)
        pm = torch.empty(S, H, num_splits, dtype=torch.float32, device=q.device)
        pl = torch.empty(S, H, num_splits, dtype=torch.float32, device=q.device)
    else:
        po = pm = pl = out
    bt = block_tables if block_tables.stride(1) == 1 else block_tables.contiguous()
    _paged_decode_kernel[(S, KVH, num_splits)](
        q, k_cache, v_cache, bt, cu_seqlens_q, kv_lens, out, po, pm, pl,
        float(scale), float(softcap), int(window), G, D, BS, chunk,
        *q.stride(), *k_cache.stride(), bt.stride(0), out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, SOFTCAP=softcap > 0.0, WINDOW=window > 0,
        BLOCK_G=BLOCK_G, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=warps,
    )
    if num_splits > 1:
        merge_splits(po, pm, pl, cu_seqlens_q, out)
    return out
