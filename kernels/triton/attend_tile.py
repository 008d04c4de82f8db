"""The online-softmax step over one tile of cached keys and values that the attention kernels share
(`attend_tile`: dense_attention.py; `attend_tile_kv`, the paged caches with their own layouts and
types, quantized ones included: `paged_decode.py`, `paged_prefill.py`): Triton device functions."""
from __future__ import annotations

import triton
import triton.language as tl

from .kv_quant import load_kv_rows


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


@triton.jit
def attend_tile_kv(q, kc_ptr, vc_ptr, koff, voff, d, stride_kd, stride_vd, kvmask, valid, scale, softcap, m_i, l_i,
                   acc, SOFTCAP: tl.constexpr, K_TYPE: tl.constexpr, V_TYPE: tl.constexpr):
    """`attend_tile` over paged caches of their own layouts and types (K_TYPE / V_TYPE: 0 a float
    cache, else the GGML type of a quantized one, dequantized here by `kv_quant.load_kv_rows` to
    float16, the dtype q then has); koff / voff: [BLOCK_N] offsets of the tile's rows in each."""
    if K_TYPE == 0:
        k = tl.load(kc_ptr + koff[:, None] + d[None, :] * stride_kd, mask=kvmask, other=0.0)
    else:
        k = load_kv_rows(kc_ptr, koff, d, kvmask, stride_kd, K_TYPE).to(tl.float16)
    sc = tl.dot(q, tl.trans(k)) * scale  # [R, BLOCK_N] float32
    if SOFTCAP:
        sc = softcap * _tanh(sc / softcap)
    sc = tl.where(valid, sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if V_TYPE == 0:
        v = tl.load(vc_ptr + voff[:, None] + d[None, :] * stride_vd, mask=kvmask, other=0.0)
    else:
        v = load_kv_rows(vc_ptr, voff, d, kvmask, stride_vd, V_TYPE).to(tl.float16)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc
