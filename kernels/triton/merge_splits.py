"""Split-K decode attention, second pass: merge the partial softmaxes of `paged_decode.py`'s splits
(per sequence and query head: rescale each split's sum by exp(m_split - max m), add them up,
divide by the rescaled normalizers). Reference: `kernels.ref.paged_attention` (all q_len == 1)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref

reference = ref.paged_attention


@triton.jit
def _merge_splits_kernel(
    po_ptr, pm_ptr, pl_ptr, cu_ptr, out_ptr, sinks_ptr, H, D, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr = False,
):
    s = tl.program_id(0)
    h = tl.program_id(1)
    qlen = tl.load(cu_ptr + s + 1) - tl.load(cu_ptr + s)
    if qlen == 1:
        qrow = tl.load(cu_ptr + s).to(tl.int64)
        sp = tl.arange(0, NUM_SPLITS)
        d = tl.arange(0, BLOCK_D)
        base = (s * H + h) * NUM_SPLITS
        m = tl.load(pm_ptr + base + sp)
        lsum = tl.load(pl_ptr + base + sp)
        mx = tl.max(m, axis=0)
        if SINKS:  # gpt-oss: one more logit per head, with no value
            sk = tl.load(sinks_ptr + h).to(tl.float32)
            mx = tl.maximum(mx, sk)
        w = tl.exp(m - mx)
        po = tl.load(po_ptr + (base + sp)[:, None].to(tl.int64) * D + d[None, :], mask=d[None, :] < D, other=0.0)
        den = tl.sum(lsum * w, axis=0)
        if SINKS:
            den = den + tl.exp(sk - mx)
        o = tl.sum(po * w[:, None], axis=0) / den
        tl.store(out_ptr + qrow * stride_ot + h * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d < D)


def merge_splits(po, pm, pl, cu_seqlens_q, out: torch.Tensor, sinks=None) -> torch.Tensor:
    """po [S, H, NUM_SPLITS, D] float32 partial outputs, pm / pl [S, H, NUM_SPLITS] their maxima
    and normalizers -> the rows of `out` [T, H, D] whose sequences have q_len == 1; `sinks` [H]:
    gpt-oss's attention sinks, one more logit per head in the merged softmax."""
    S, H, num_splits, D = po.shape
    _merge_splits_kernel[(S, H)](
        po, pm, pl, cu_seqlens_q, out, out if sinks is None else sinks, H, D, out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, BLOCK_D=triton.next_power_of_2(D), SINKS=sinks is not None,
    )
    return out
