"""RoPE of q and k and the KV write in one launch (decode and prefill): per token, programs over
blocks of q heads (rotated into a new q), of k heads (rotated, rounded to k's dtype as `rope`
returns it, stored at the token's cache slot) and of v heads (stored at the slot); each program
computes its token's cos / sin once for all its heads. GGML "norm" (adjacent pairs) and "neox"
(halves) modes, partial rotary (dims past 2R pass through), negative slots skip the write.
Reference: `kernels.ref.rope_write_kv` (`ref.rope` of q and k, then `ref.write_kv`): q and the
cache rows equal `rope.py` + `write_kv.py`'s bit for bit (`tests/test_kernels_triton.py`)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref

reference = ref.rope_write_kv


@triton.jit
def _rope_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, freq_ptr, qo_ptr, kc_ptr, vc_ptr, slot_ptr,
    H, KVH, D, R, BS, NQB, NKB, mscale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kch, stride_vb, stride_vs, stride_vch,
    NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # q, k, v: [T, heads, D] rows with unit stride along D; caches [NB, BS, KVH, D] likewise
    t = tl.program_id(0).to(tl.int64)
    pb = tl.program_id(1)
    slot = tl.load(slot_ptr + t)
    blk = slot // BS
    off = slot % BS
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    i = tl.arange(0, BLOCK_R)[None, :]
    if pb < NQB + NKB:  # a block of q or k heads: rotate
        is_q = pb < NQB
        if is_q:
            hh = pb * BLOCK_H + h
            hm = hh < H
            src = q_ptr + t * stride_qt + hh * stride_qh
        else:
            hh = (pb - NQB) * BLOCK_H + h
            hm = hh < KVH
            src = k_ptr + t * stride_kt + hh * stride_kh
        rm = hm & (i < R)
        ang = tl.load(pos_ptr + t).to(tl.float32) * tl.load(freq_ptr + i, mask=i < R, other=0.0)  # [1, BLOCK_R]
        c = tl.cos(ang) * mscale  # ggml's rope_yarn: YaRN's magnitude factor on cos and sin (1 otherwise)
        s = tl.sin(ang) * mscale
        if NEOX:
            i0 = i
            i1 = i + R
        else:
            i0 = 2 * i
            i1 = 2 * i + 1
        x0 = tl.load(src + i0, mask=rm, other=0.0)
        x1 = tl.load(src + i1, mask=rm, other=0.0)
        ty = x0.dtype  # rotated values rounded to the input's dtype, as `rope` returns them
        y0 = (x0.to(tl.float32) * c - x1.to(tl.float32) * s).to(ty)
        y1 = (x0.to(tl.float32) * s + x1.to(tl.float32) * c).to(ty)
        pm = hm & (d >= 2 * R) & (d < D)  # dims past the rotated ones pass through
        rest = tl.load(src + d, mask=pm)
        if is_q:
            dst = qo_ptr + t * stride_ot + hh * stride_oh
            tl.store(dst + i0, y0, mask=rm)
            tl.store(dst + i1, y1, mask=rm)
            tl.store(dst + d, rest, mask=pm)
        elif slot >= 0:
            dst = kc_ptr + blk * stride_kb + off * stride_ks + hh * stride_kch
            cty = kc_ptr.dtype.element_ty
            tl.store(dst + i0, y0.to(cty), mask=rm)
            tl.store(dst + i1, y1.to(cty), mask=rm)
            tl.store(dst + d, rest.to(cty), mask=pm)
    elif slot >= 0:  # a block of v heads: stored as they are
        hh = (pb - NQB - NKB) * BLOCK_H + h
        m = (hh < KVH) & (d < D)
        v = tl.load(v_ptr + t * stride_vt + hh * stride_vh + d, mask=m)
        dst = vc_ptr + blk * stride_vb + off * stride_vs + hh * stride_vch + d
        tl.store(dst, v.to(vc_ptr.dtype.element_ty), mask=m)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def rope_write_kv(q, k, v, positions, inv_freq, neox: bool, theta_scale: float, mscale: float, k_cache, v_cache,
                  slot_mapping, k_type=None, v_type=None) -> torch.Tensor:
    """`kernels.rope_write_kv`: q [T, H, D], k / v [T, KVH, D] -> rotated q (a new tensor); the
    rotated k and v written at their slots. The angles always from inv_freq, cos and sin times
    `mscale` (as `rope.py`). A quantized cache: `rope.py` then `kv_quant.py`'s write (two launches
    more)."""
    if k_type is not None or v_type is not None:
        from .rope import rope
        from .write_kv import write_kv
        extra = () if mscale == 1.0 else (mscale,)  # (YaRN's magnitude factor: `rope`'s last argument)
        write_kv(rope(k, positions, inv_freq, neox, theta_scale, *extra), v, k_cache, v_cache, slot_mapping, k_type,
                 v_type)
        return rope(q, positions, inv_freq, neox, theta_scale, *extra)
    T, H, D = q.shape
    KVH = k.shape[1]
    R = inv_freq.shape[0]
    assert 2 * R <= D and k.shape == v.shape == (T, KVH, D), (q.shape, k.shape, v.shape, R)
    assert k_cache.shape[2:] == (KVH, D) and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    q, k, v = _rows(q), _rows(k), _rows(v)
    pos = positions.to(device=q.device, dtype=torch.int64).contiguous()
    freq = inv_freq.to(device=q.device, dtype=torch.float32).contiguous()
    slots = slot_mapping.to(device=q.device, dtype=torch.int64).contiguous()
    # one head per program, one warp (the cos / sin of a head's pairs, 2 per thread at head dim 128):
    # the transcendental code is the cost (its slow path, compiled in, dwarfs the loads)
    BLOCK_H = 1
    nqb, nkb = triton.cdiv(H, BLOCK_H), triton.cdiv(KVH, BLOCK_H)
    BLOCK_D = triton.next_power_of_2(D)
    _rope_write_kv_kernel[(T, nqb + 2 * nkb)](
        q, k, v, pos, freq, out, k_cache, v_cache, slots, H, KVH, D, R, k_cache.shape[1], nqb, nkb, float(mscale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NEOX=bool(neox), BLOCK_H=BLOCK_H, BLOCK_R=triton.next_power_of_2(R), BLOCK_D=BLOCK_D,
        num_warps=1 if BLOCK_D <= 128 else 2,
    )
    return out
