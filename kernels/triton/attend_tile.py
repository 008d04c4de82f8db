"""The online-softmax step over one tile of cached keys and values that the paged-attention
kernels share (`paged_decode.py`, `paged_prefill.py`): a Triton device function, no kernel."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def attend_tile(q, kc_ptr, vc_ptr, off, d, stride_cd, kvmask, valid, scale, softcap, m_i, l_i, acc,
                 SOFTCAP: tl.constexpr):
    """One online-softmax step over a tile of cached keys/values (shared by the decode and the
    prefill kernels). q: [R, BLOCK_D]; off: [BLOCK_N] element offsets of the tile's tokens;
    valid: [R, BLOCK_N] score mask. Returns the updated (m_i [R], l_i [R], acc [R, BLOCK_D])."""
    k = tl.load(kc_ptr + off[:, None] + d[None, :] * stride_cd, mask=kvmask, other=0.0)
    sc = tl.dot(q, tl.trans(k)) * scale  # [R, BLOCK_N] float32
    if SOFTCAP:
        sc = softcap * _tanh(sc / softcap)
    sc = tl.where(valid, sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(vc_ptr + off[:, None] + d[None, :] * stride_cd, mask=kvmask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
