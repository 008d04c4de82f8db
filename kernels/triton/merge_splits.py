"""Split-K decode attention, the merge: the partial softmaxes of `paged_decode.py`'s splits of one
query head (rescale each split's sum by exp(m_split - max m), add them up, divide by the rescaled
normalizers). A device function, run inside `_paged_decode_kernel` by the last split of each
(sequence, KV head) to finish (an atomic counter per pair): the separate merge launch it replaces
cost a launch per layer. Reference: `kernels.ref.paged_attention` (all q_len == 1)."""
from __future__ import annotations

import triton
import triton.language as tl

from .. import ref
from .qmatmul_q8 import quant_store_groups

reference = ref.paged_attention


@triton.jit
def merge_head(po_ptr, pm_ptr, pl_ptr, base, out_row, sinks_ptr, h, D, xq_row, xd_row, xs_row, n_groups,
               NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, SINKS: tl.constexpr, QUANT: tl.constexpr):
    """Head h's partials at rows base .. base + NUM_SPLITS - 1 of po [*, D] (float32) and of pm / pl
    (their maxima and normalizers) -> its output row `out_row` [D] (QUANT: and its D / 32 q8_1
    groups, h * D / 32 on, in the q8_1 form of the output row `xq_row`, ...). Loads through L2
    (`.cg`): the partials were written by other programs of this launch."""
    sp = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, BLOCK_D)
    m = tl.load(pm_ptr + base + sp, cache_modifier=".cg")
    lsum = tl.load(pl_ptr + base + sp, cache_modifier=".cg")
    mx = tl.max(m, axis=0)
    if SINKS:  # gpt-oss: one more logit per head, with no value
        sk = tl.load(sinks_ptr + h).to(tl.float32)
        mx = tl.maximum(mx, sk)
    den = tl.sum(lsum * tl.exp(m - mx), axis=0)
    if SINKS:
        den = den + tl.exp(sk - mx)
    # one split's row at a time: a [BLOCK_D] accumulator, not a [NUM_SPLITS, BLOCK_D] tile (registers:
    # this runs at the end of the decode kernel, whose budget is 128)
    o = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for j in range(0, NUM_SPLITS):
        wj = tl.exp(tl.load(pm_ptr + base + j, cache_modifier=".cg") - mx)
        o += tl.load(po_ptr + (base + j).to(tl.int64) * D + d, mask=d < D, other=0.0, cache_modifier=".cg") * wj
    o = (o / den).to(out_row.dtype.element_ty)
    tl.store(out_row + d, o, mask=d < D)
    if QUANT:  # D == BLOCK_D, a multiple of 32
        quant_store_groups(o.to(tl.float32), xq_row, xd_row, xs_row, h * (BLOCK_D // 32), n_groups, BLOCK_D // 32)
