"""Triton device functions that dequantize GGUF blocks in registers.

`dequant_tile(w_ptr, row_stride, offs_n[BN], offs_k[BK], mask[BN, BK], QTYPE)` returns the float32
tile W[offs_n, offs_k] read straight from the GGUF block layout of `kernels.qweight.QWeight`
(`row_stride` in bytes for quantized types, in elements for F32/F16/BF16; `weight_args(w)` gives
a kernel the weight's pointer, row stride and type). Each element computes
its block, its byte(s) and its scale(s); repeated scale loads within a block hit L1, so no repack
is needed. Bit layouts follow ggml-quants.c `dequantize_row_*` (documented per type below).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..env import triton_interpreting as interpreting
from ..qweight import QWeight

# GGMLQuantizationType values (gguf.constants)
F32: tl.constexpr = tl.constexpr(0)
F16: tl.constexpr = tl.constexpr(1)
Q4_0: tl.constexpr = tl.constexpr(2)
Q4_1: tl.constexpr = tl.constexpr(3)
Q5_0: tl.constexpr = tl.constexpr(6)
Q5_1: tl.constexpr = tl.constexpr(7)
Q8_0: tl.constexpr = tl.constexpr(8)
Q2_K: tl.constexpr = tl.constexpr(10)
Q3_K: tl.constexpr = tl.constexpr(11)
Q4_K: tl.constexpr = tl.constexpr(12)
Q5_K: tl.constexpr = tl.constexpr(13)
Q6_K: tl.constexpr = tl.constexpr(14)
BF16: tl.constexpr = tl.constexpr(30)
MXFP4: tl.constexpr = tl.constexpr(39)

SUPPORTED = {0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30, 39}


def weight_args(w: QWeight):
    """(data, row stride, GGML type number) of a GGUF-layout weight, as the kernels take them."""
    qt = int(w.qtype)
    if qt not in SUPPORTED:
        raise NotImplementedError(f"no Triton dequantizer for {w.qtype.name}")
    if not w.data.is_contiguous() and w.data.stride(1) != 1:
        raise ValueError("weight rows must be contiguous")
    return w.data, w.data.stride(0), qt


@triton.jit
def _u8(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(p, mask):
    """Little-endian IEEE half at byte pointer p (any alignment) -> float32."""
    lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _i8(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def dequant_tile(w_ptr, row_stride, offs_n, offs_k, mask, QTYPE: tl.constexpr):
    k = offs_k[None, :]
    row = w_ptr + offs_n[:, None].to(tl.int64) * row_stride
    if QTYPE == F32 or QTYPE == F16 or QTYPE == BF16:
        val = tl.load(row + k, mask=mask, other=0.0).to(tl.float32)
    elif QTYPE == Q8_0:  # 34 B: d f16 | qs int8[32]
        bp = row + (k // 32) * 34
        val = _f16(bp, mask) * _i8(bp + 2 + k % 32, mask)
    elif QTYPE == Q4_0:  # 18 B: d | qs[16]; j<16 low nibble of qs[j], else high nibble of qs[j-16]
        j = k % 32
        bp = row + (k // 32) * 18
        b = _u8(bp + 2 + j % 16, mask)
        q = tl.where(j < 16, b & 15, b >> 4)
        val = _f16(bp, mask) * (q - 8).to(tl.float32)
    elif QTYPE == Q4_1:  # 20 B: d | m | qs[16]
        j = k % 32
        bp = row + (k // 32) * 20
        b = _u8(bp + 4 + j % 16, mask)
        q = tl.where(j < 16, b & 15, b >> 4)
        val = _f16(bp, mask) * q.to(tl.float32) + _f16(bp + 2, mask)
    elif QTYPE == Q5_0:  # 22 B: d | qh u32 (bit j = 5th bit of element j) | qs[16]
        j = k % 32
        bp = row + (k // 32) * 22
        b = _u8(bp + 6 + j % 16, mask)
        h = (_u8(bp + 2 + j // 8, mask) >> (j % 8)) & 1
        q = tl.where(j < 16, b & 15, b >> 4) | (h << 4)
        val = _f16(bp, mask) * (q - 16).to(tl.float32)
    elif QTYPE == Q5_1:  # 24 B: d | m | qh u32 | qs[16]
        j = k % 32
        bp = row + (k // 32) * 24
        b = _u8(bp + 8 + j % 16, mask)
        h = (_u8(bp + 4 + j // 8, mask) >> (j % 8)) & 1
        q = tl.where(j < 16, b & 15, b >> 4) | (h << 4)
        val = _f16(bp, mask) * q.to(tl.float32) + _f16(bp + 2, mask)
    elif QTYPE == MXFP4:  # 17 B: e (E8M0) | qs[16]; j<16 low nibble of qs[j], else high nibble of qs[j-16]
        j = k % 32
        bp = row + (k // 32) * 17
        b = _u8(bp + 1 + j % 16, mask)
        c = tl.where(j < 16, b & 15, b >> 4)
        m = c & 7  # E2M1 doubled (kvalues_mxfp4): 0 1 2 3 4 6 8 12, sign in bit 3
        mag = tl.where(m < 4, m, (2 + (m & 1)) << ((m >> 1) - 1))
        q = tl.where(c >= 8, -mag, mag)
        e = _u8(bp, mask)
        # 2^(e - 128) (GGML_E8M0_TO_FP32_HALF): float32 subnormals 0x00200000 << e for e < 2
        bits = tl.where(e < 2, 0x00200000 << tl.minimum(e, 1), (tl.maximum(e, 1) - 1) << 23)
        val = bits.to(tl.float32, bitcast=True) * q.to(tl.float32)
    elif QTYPE == Q2_K:  # 84 B: scales[16] (lo4 scale, hi4 min) | qs[64] | d | dmin
        j = k % 256
        bp = row + (k // 256) * 84
        half = j // 128
        r = j % 128
        shift = r // 32
        l = r % 32
        q = (_u8(bp + 16 + half * 32 + l, mask) >> (2 * shift)) & 3
        sc = _u8(bp + half * 8 + shift * 2 + l // 16, mask)
        val = _f16(bp + 80, mask) * (sc & 15).to(tl.float32) * q.to(tl.float32) - _f16(
            bp + 82, mask
        ) * (sc >> 4).to(tl.float32)
    elif QTYPE == Q3_K:  # 110 B: hmask[32] | qs[64] | scales[12] (16 x 6 bit) | d
        j = k % 256
        bp = row + (k // 256) * 110
        half = j // 128
        r = j % 128
        sh = r // 32
        l = r % 32
        q = (_u8(bp + 32 + half * 32 + l, mask) >> (2 * sh)) & 3
        hbit = (_u8(bp + l, mask) >> (half * 4 + sh)) & 1
        si = half * 8 + sh * 2 + l // 16
        lo = (_u8(bp + 96 + si % 8, mask) >> (4 * (si // 8))) & 15
        hi = (_u8(bp + 104 + si % 4, mask) >> (2 * (si // 4))) & 3
        sc = (lo | (hi << 4)) - 32
        val = _f16(bp + 108, mask) * sc.to(tl.float32) * (q - 4 * (1 - hbit)).to(tl.float32)
    elif QTYPE == Q4_K or QTYPE == Q5_K:
        # Q4_K 144 B: d | dmin | scales[12] (8 x (6 bit scale, 6 bit min)) | qs[128]
        # Q5_K 176 B: d | dmin | scales[12] | qh[32] | qs[128]
        j = k % 256
        if QTYPE == Q4_K:
            bp = row + (k // 256) * 144
        else:
            bp = row + (k // 256) * 176
        chunk = j // 64
        hi_nib = (j % 64) // 32
        l = j % 32
        sub = chunk * 2 + hi_nib
        s = bp + 4
        b_sub = _u8(s + sub, mask)
        b_sub4 = _u8(s + sub + 4, mask)
        b_low = _u8(s + (sub & 3), mask)  # scales[sub - 4] when sub >= 4
        sc = tl.where(sub < 4, b_sub & 63, (b_sub4 & 15) | ((b_low >> 6) << 4))
        mn = tl.where(sub < 4, b_sub4 & 63, (b_sub4 >> 4) | ((b_sub >> 6) << 4))
        if QTYPE == Q4_K:
            qb = _u8(bp + 16 + chunk * 32 + l, mask)
            q = tl.where(hi_nib == 1, qb >> 4, qb & 15)
        else:
            qb = _u8(bp + 48 + chunk * 32 + l, mask)
            h = (_u8(bp + 16 + l, mask) >> (2 * chunk + hi_nib)) & 1
            q = tl.where(hi_nib == 1, qb >> 4, qb & 15) + 16 * h
        val = _f16(bp, mask) * sc.to(tl.float32) * q.to(tl.float32) - _f16(bp + 2, mask) * mn.to(
            tl.float32
        )
    else:  # Q6_K 210 B: ql[128] | qh[64] | scales int8[16] | d
        tl.static_assert(QTYPE == Q6_K)
        j = k % 256
        bp = row + (k // 256) * 210
        half = j // 128
        r = j % 128
        quad = r // 32
        l = r % 32
        qlb = _u8(bp + half * 64 + l + 32 * (quad & 1), mask)
        nib = tl.where(quad >= 2, qlb >> 4, qlb & 15)
        h = (_u8(bp + 128 + half * 32 + l, mask) >> (2 * quad)) & 3
        q = (nib | (h << 4)) - 32
        sc = _i8(bp + 192 + half * 8 + l // 16 + 2 * quad, mask)
        val = _f16(bp + 208, mask) * sc * q.to(tl.float32)
    return val
