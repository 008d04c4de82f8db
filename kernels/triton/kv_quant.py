"""The quantized KV cache in Triton (reference: `kernels.kv_quant_ref`): `load_kv_rows`, the device
function the paged-attention kernels read a tile of quantized rows with (dequantized in registers,
no copy of the cache), and `_write_kv_quant_kernel`, the KV write that quantizes each new row.

A quantized cache is uint8 [NB, BS, KVH, row_bytes] (kernels/kv_quant_ref.py); `TYPE` is the GGML
type id (8 Q8_0, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 20 IQ4_NL; 0: a float cache, loaded as it is).
The write computes llama.cpp's quantize_row_*_ref per 32-block (Q8_0: round half to even, as its
AVX2 write) in float32: the same codes and scales as the reference, except IQ4_NL, whose refitted
scale (sum(w q x) / sum(w q q)) is summed here as a tree, not in order, and whose all-zero blocks
(d = 0) get zero codes (ggml keeps the previous block's): the same values within float32 rounding.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import kv_quant_ref

reference = kv_quant_ref.write_kv

_BLOCK_BYTES = {8: 34, 2: 18, 3: 20, 6: 22, 7: 24, 20: 18}


@triton.jit
def _f16_at(ptr, off, mask):
    """the little-endian float16 at byte offsets `off`, as float32"""
    lo = tl.load(ptr + off, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(ptr + off + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _iq4nl_value(i):
    """kvalues_iq4nl[i] (i: int32 0..15) as float32: byte i % 8 of one of two 64-bit words"""
    w = tl.where(i < 8, -654466911485192063, 8167635493787864321).to(tl.int64)
    return ((w >> ((i & 7) * 8).to(tl.int64)) & 255).to(tl.int8).to(tl.float32)


@triton.jit
def load_kv_rows(ptr, off, d, mask, stride_cd, TYPE: tl.constexpr):
    """A tile of cache rows -> [N, BLOCK_D] float32 (TYPE 0: the float cache's elements, stride_cd
    apart). off: [N] offsets of the rows (bytes for a quantized cache); d: [BLOCK_D] elements;
    mask: [N, BLOCK_D]."""
    if TYPE == 0:
        return tl.load(ptr + off[:, None] + d[None, :] * stride_cd, mask=mask, other=0.0).to(tl.float32)
    b = (d // 32)[None, :]
    j = (d % 32)[None, :]
    if TYPE == 8:  # Q8_0: d, 32 int8
        base = off[:, None] + b * 34
        c = tl.load(ptr + base + 2 + j, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        return c * _f16_at(ptr, base, mask)
    elif TYPE == 2 or TYPE == 20:  # Q4_0 / IQ4_NL: d, 16 bytes of nibbles (element j: low, j + 16: high)
        base = off[:, None] + b * 18
        byte = tl.load(ptr + base + 2 + j % 16, mask=mask, other=0).to(tl.int32)
        nib = (byte >> ((j // 16) * 4)) & 15
        if TYPE == 2:
            return (nib - 8).to(tl.float32) * _f16_at(ptr, base, mask)
        else:
            return _f16_at(ptr, base, mask) * _iq4nl_value(nib)
    elif TYPE == 3:  # Q4_1: d, m, nibbles
        base = off[:, None] + b * 20
        byte = tl.load(ptr + base + 4 + j % 16, mask=mask, other=0).to(tl.int32)
        nib = (byte >> ((j // 16) * 4)) & 15
        return nib.to(tl.float32) * _f16_at(ptr, base, mask) + _f16_at(ptr, base + 2, mask)
    elif TYPE == 6:  # Q5_0: d, qh (bit j: element j's fifth bit), nibbles
        base = off[:, None] + b * 22
        byte = tl.load(ptr + base + 6 + j % 16, mask=mask, other=0).to(tl.int32)
        hb = (tl.load(ptr + base + 2 + j // 8, mask=mask, other=0).to(tl.int32) >> (j % 8)) & 1
        code = ((byte >> ((j // 16) * 4)) & 15) | (hb << 4)
        return (code - 16).to(tl.float32) * _f16_at(ptr, base, mask)
    else:  # Q5_1: d, m, qh, nibbles
        base = off[:, None] + b * 24
        byte = tl.load(ptr + base + 8 + j % 16, mask=mask, other=0).to(tl.int32)
        hb = (tl.load(ptr + base + 4 + j // 8, mask=mask, other=0).to(tl.int32) >> (j % 8)) & 1
        code = ((byte >> ((j // 16) * 4)) & 15) | (hb << 4)
        return code.to(tl.float32) * _f16_at(ptr, base, mask) + _f16_at(ptr, base + 2, mask)


@triton.jit
def _store_f16(ptr, off, x):
    bits = x.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.int32)
    tl.store(ptr + off, (bits & 255).to(tl.uint8))
    tl.store(ptr + off + 1, ((bits >> 8) & 255).to(tl.uint8))


@triton.jit
def _rint(x):
    """round half to even (|x| < 2^22)"""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _first_absmax(lo, hi, j):
    """the value of largest |x| over lo (elements 0..15) then hi (16..31), the first such"""
    amax = tl.maximum(tl.max(tl.abs(lo), axis=0), tl.max(tl.abs(hi), axis=0))
    idx = tl.minimum(tl.min(tl.where(tl.abs(lo) == amax, j, 64), axis=0),
                     tl.min(tl.where(tl.abs(hi) == amax, j + 16, 64), axis=0))
    return tl.sum(tl.where(j == idx, lo, 0.0), axis=0) + tl.sum(tl.where(j + 16 == idx, hi, 0.0), axis=0), amax


@triton.jit
def _store_qh(ptr, off, clo, chi, j):
    """the fifth bits of the 32 codes as llama.cpp's little-endian uint32 qh"""
    h_lo = (clo >> 4) & 1
    h_hi = (chi >> 4) & 1
    for k in tl.static_range(2):  # bytes 0, 1: elements 0..15; bytes 2, 3: elements 16..31
        sel = (j // 8) == k
        tl.store(ptr + off + k, tl.sum(tl.where(sel, h_lo << (j % 8), 0), axis=0).to(tl.uint8))
        tl.store(ptr + off + 2 + k, tl.sum(tl.where(sel, h_hi << (j % 8), 0), axis=0).to(tl.uint8))


@triton.jit
def _best_index(al):
    """ggml's best_index_int8 over the IQ4_NL values"""
    ml = tl.zeros(al.shape, dtype=tl.int32)
    for i in tl.static_range(1, 15):
        ml += (al >= _iq4nl_value(tl.full(al.shape, i, tl.int32))).to(tl.int32)
    lo = _iq4nl_value(ml)
    hi = _iq4nl_value(ml + 1)
    idx = tl.where(al - lo < hi - al, ml, ml + 1)
    idx = tl.where(al <= -127.0, 0, idx)
    return tl.where(al >= 113.0, 15, idx)


@triton.jit
def _write_kv_quant_kernel(x_ptr, c_ptr, slot_ptr, stride_xt, stride_xh, stride_cb, stride_ct, stride_ch, BS,
                           TYPE: tl.constexpr, BB: tl.constexpr):
    """One (token, KV head, 32-block): x [T, KVH, D] float -> the cache's block (negative slot: skipped)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    b = tl.program_id(2)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        j = tl.arange(0, 16)
        src = x_ptr + t * stride_xt + h * stride_xh + b * 32
        lo = tl.load(src + j).to(tl.float32)
        hi = tl.load(src + 16 + j).to(tl.float32)
        out = (slot // BS) * stride_cb + (slot % BS) * stride_ct + h * stride_ch + b * BB
        if TYPE == 8:  # Q8_0
            amax = tl.maximum(tl.max(tl.abs(lo), axis=0), tl.max(tl.abs(hi), axis=0))
            idv = tl.where(amax != 0.0, 127.0 / amax, 0.0)
            _store_f16(c_ptr, out, amax / 127.0)
            tl.store(c_ptr + out + 2 + j, _rint(lo * idv).to(tl.int32).to(tl.int8).to(tl.uint8, bitcast=True))
            tl.store(c_ptr + out + 18 + j, _rint(hi * idv).to(tl.int32).to(tl.int8).to(tl.uint8, bitcast=True))
        elif TYPE == 2 or TYPE == 6:  # Q4_0 / Q5_0: d = max / -8 (-16)
            mx, amax = _first_absmax(lo, hi, j)
            dd = mx / (-8.0 if TYPE == 2 else -16.0)
            idv = tl.where(dd != 0.0, 1.0 / dd, 0.0)
            off = 8.5 if TYPE == 2 else 16.5
            lim = 15 if TYPE == 2 else 31
            clo = tl.minimum((lo * idv + off).to(tl.int32), lim)
            chi = tl.minimum((hi * idv + off).to(tl.int32), lim)
            _store_f16(c_ptr, out, dd)
            qs = 2 if TYPE == 2 else 6
            tl.store(c_ptr + out + qs + j, ((clo & 15) | ((chi & 15) << 4)).to(tl.uint8))
            if TYPE == 6:
                _store_qh(c_ptr, out + 2, clo, chi, j)
        elif TYPE == 3 or TYPE == 7:  # Q4_1 / Q5_1: d = (max - min) / 15 (31), m = min
            mn = tl.minimum(tl.min(lo, axis=0), tl.min(hi, axis=0))
            mx = tl.maximum(tl.max(lo, axis=0), tl.max(hi, axis=0))
            dd = (mx - mn) / (15.0 if TYPE == 3 else 31.0)
            idv = tl.where(dd != 0.0, 1.0 / dd, 0.0)
            lim = 15 if TYPE == 3 else 31
            clo = tl.minimum(((lo - mn) * idv + 0.5).to(tl.int32), lim)
            chi = tl.minimum(((hi - mn) * idv + 0.5).to(tl.int32), lim)
            _store_f16(c_ptr, out, dd)
            _store_f16(c_ptr, out + 2, mn)
            qs = 4 if TYPE == 3 else 8
            tl.store(c_ptr + out + qs + j, ((clo & 15) | ((chi & 15) << 4)).to(tl.uint8))
            if TYPE == 7:
                _store_qh(c_ptr, out + 4, clo, chi, j)
        else:  # IQ4_NL: d = max / -127, codes by nearest value, d refitted
            mx, amax = _first_absmax(lo, hi, j)
            d0 = mx / -127.0
            idv = 1.0 / d0
            llo = _best_index(idv * lo)
            lhi = _best_index(idv * hi)
            qlo = _iq4nl_value(llo)
            qhi = _iq4nl_value(lhi)
            sumqx = tl.sum(lo * lo * qlo * lo, axis=0) + tl.sum(hi * hi * qhi * hi, axis=0)
            sumq2 = tl.sum(lo * lo * qlo * qlo, axis=0) + tl.sum(hi * hi * qhi * qhi, axis=0)
            dd = tl.where(sumq2 > 0.0, sumqx / sumq2, 0.0)
            small = amax < 1e-15
            dd = tl.where(small, 0.0, dd)
            _store_f16(c_ptr, out, dd)
            llo = tl.where(small, 0, llo)
            lhi = tl.where(small, 0, lhi)
            tl.store(c_ptr + out + 2 + j, (llo | (lhi << 4)).to(tl.uint8))


def type_id(t) -> int:
    """The kernels' K_TYPE / V_TYPE of a cache type: 0 for a float cache (None), else the GGML id."""
    return int(t) if kv_quant_ref.is_quantized(t) else 0


def write_rows(x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, qtype) -> None:
    """x [T, KVH, D] float -> the quantized cache [NB, BS, KVH, row_bytes] at slots (int64)."""
    T, KVH, D = x.shape
    if T == 0:
        return
    t = int(qtype)
    assert cache.dtype == torch.uint8 and D % 32 == 0 and x.stride(2) == 1
    _write_kv_quant_kernel[(T, KVH, D // 32)](x, cache, slots, x.stride(0), x.stride(1), *cache.stride()[:3],
                                              cache.shape[1], TYPE=t, BB=_BLOCK_BYTES[t])


def write_kv(k, v, k_cache, v_cache, slot_mapping, k_type=None, v_type=None) -> None:
    """`kv_quant_ref.write_kv`'s contract: each quantized cache's rows quantized in the kernel."""
    from .write_kv import write_kv as write_float

    slots = slot_mapping.to(device=k_cache.device, dtype=torch.int64).contiguous()
    for x, cache, t in ((k, k_cache, k_type), (v, v_cache, v_type)):
        if kv_quant_ref.is_quantized(t):
            write_rows(x if x.stride(2) == 1 else x.contiguous(), cache, slots, t)
        else:
            write_float(x, x, cache, cache, slots)  # the float kernel writes k and v alike: one cache here
