"""The GPU layout of quantized weights ("gpu" `QWeight.layout`, `kernels.qweight.GpuPack`): repacked
once at load from the GGUF blocks (`pack`), read by the decode GEMV (`qmatmul_q8.py`), the prefill
matmul (`qmatmul_tiled.py`) and the dequantizer below with 128-bit loads.

Every supported type is cut into 32-element groups; element e = 8w + 4h + b of a group (w 0..3,
h 0..1, b 0..3) is byte b of word w of the group's "part" h, so that the codes of a part come as
one 16-byte load of 4 words, each word 4 consecutive codes as bytes (one mask, at most one shift),
and the activations are packed the same way (`qmatmul_q8.quantize_act`). The weight is

    w = A * c + B          Q6_K: w = A * sc16 * (c - 32), sc16 the 16-element half's int8 scale

| type | `lo` (per group) | `hi` (per group) | A | B |
| --- | --- | --- | --- | --- |
| Q8_0 | 8 words, int8 codes (part 0, part 1) | - | d | 0 |
| Q4_0 | 4 words, nibbles (low: part 0, high: part 1) | - | d | -8 d |
| Q5_0 | 4 words, nibbles | 1 word: bit 4h + w of byte b = 5th bit | d | -16 d |
| Q4_K | 4 words, nibbles | - | d sc | -dmin m |
| Q5_K | 4 words, nibbles | 1 word, 5th bits | d sc | -dmin m |
| Q6_K | 4 words, nibbles | 2 words (word h, bits 2w of byte b): 2-bit high parts | d | (c - 32) |

The scale factors keep their GGUF precision in arrays of their own: `d` float16 [rows, K/32]
(Q8_0, Q4_0, Q5_0), [rows, K/256, 2] (d, dmin of Q4_K/Q5_K), [rows, K/256] (Q6_K); `sc` uint8
6-bit scales [rows, K/32] (Q4_K, Q5_K) or int8 [rows, K/16] (Q6_K); `mn` uint8 6-bit mins [rows,
K/32]. Bits per weight: Q4_K 4.625 (GGUF 4.5: a byte per 6-bit scale and min), Q5_K 5.625, Q6_K
6.5625, Q8_0 8.5, Q4_0 4.5, Q5_0 5.5.

Reference: `kernels.ref.dequantize` of the GGUF bytes (`tests/test_kernels_triton.py`: the
repacked weight dequantizes to exactly the same floats).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from .. import ref
from ..qweight import GpuPack, QWeight

reference = ref.dequantize

PACKED_TYPES = (Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)

# GGMLQuantizationType values, as the kernels' QTYPE constexpr
Q4_0: tl.constexpr = tl.constexpr(2)
Q5_0: tl.constexpr = tl.constexpr(6)
Q8_0: tl.constexpr = tl.constexpr(8)
Q4_K: tl.constexpr = tl.constexpr(12)
Q5_K: tl.constexpr = tl.constexpr(13)
Q6_K: tl.constexpr = tl.constexpr(14)


# ---------------------------------------------------------------------------------------------
# the repack (torch, on the weight's device, exact)

def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] float16 (little-endian bytes)."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def _parts(c: torch.Tensor) -> torch.Tensor:
    """[R, G, 32] in element order -> [R, G, 2 (h), 4 (w), 4 (b)]: element 8w + 4h + b."""
    R, G, _ = c.shape
    return c.to(torch.uint8).reshape(R, G, 4, 2, 4).permute(0, 1, 3, 2, 4)


def _words(b: torch.Tensor) -> torch.Tensor:
    """uint8 [R, G, ..., 4] -> int32 [R, G * n]."""
    return b.contiguous().view(torch.int32).reshape(b.shape[0], -1)


def _nibble_words(c: torch.Tensor) -> torch.Tensor:
    """codes [R, G, 32] (0..15) -> int32 [R, G * 4]: word w, byte b = part 0 | part 1 << 4."""
    p = _parts(c)
    return _words(p[:, :, 0] | (p[:, :, 1] << 4))


def _plane_words(c: torch.Tensor, bits: int) -> torch.Tensor:
    """high parts [R, G, 32] -> int32: 1 bit: [R, G], bit 4h + w of byte b; 2 bits: [R, G * 2],
    word h, bits 2w of byte b."""
    p = _parts(c)  # [R, G, h, w, b]
    R, G = p.shape[:2]
    if bits == 1:
        t = torch.arange(8, device=c.device, dtype=torch.uint8).view(1, 1, 8, 1)
        return _words((p.reshape(R, G, 8, 4) << t).sum(2, dtype=torch.uint8))
    sh = (torch.arange(4, device=c.device, dtype=torch.uint8) * 2).view(1, 1, 1, 4, 1)
    return _words((p << sh).sum(3, dtype=torch.uint8))


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K 12-byte scale fields [R, nb, 12] -> 6-bit (scales, mins) uint8 [R, nb * 8]
    (ggml's get_scale_min_k4)."""
    s = s.to(torch.int32)
    lo, hi4, top = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([lo & 63, (top & 15) | ((lo >> 6) << 4)], -1)
    mn = torch.cat([hi4 & 63, (top >> 4) | ((hi4 >> 6) << 4)], -1)
    R = s.shape[0]
    return sc.to(torch.uint8).reshape(R, -1), mn.to(torch.uint8).reshape(R, -1)


def packs(w: QWeight) -> bool:
    return w.layout == "rows" and w.qtype in PACKED_TYPES and w.cols % 32 == 0


def pack(w: QWeight) -> QWeight:
    """`w` ("rows", GGUF blocks) in the "gpu" layout (module docstring); same values."""
    R, K = w.rows, w.cols
    bs, ts = GGML_QUANT_SIZES[w.qtype]
    blk = w.data.reshape(R, K // bs, ts)
    qt = w.qtype
    hi = sc = mn = None
    if qt == Q.Q8_0:
        d = _f16(blk[..., 0:2])
        lo = _words(_parts(blk[..., 2:]))  # int8 codes, part 0 then part 1
    elif qt in (Q.Q4_0, Q.Q5_0):
        d = _f16(blk[..., 0:2])
        qs = blk[..., -16:].to(torch.int32)
        c = torch.cat([qs & 15, qs >> 4], -1)  # [R, G, 32]: element j < 16 low nibble of qs[j]
        if qt == Q.Q5_0:
            qh = blk[..., 2:6].contiguous().view(torch.int32)  # [R, G, 1]
            bit = (qh >> torch.arange(32, device=qh.device, dtype=torch.int32)) & 1
            hi = _plane_words(bit, 1)
        lo = _nibble_words(c)
    elif qt in (Q.Q4_K, Q.Q5_K):
        nb = K // 256
        d = blk[..., 0:4].contiguous().view(torch.float16).reshape(R, nb * 2)  # (d, dmin) per super-block
        sc, mn = _k_scales(blk[..., 4:16])
        qs = blk[..., -128:].to(torch.int32).reshape(R, nb, 4, 32)  # [chunk, l]
        c = torch.stack([qs & 15, qs >> 4], 3).reshape(R, nb * 8, 32)  # sub-block 2 chunk + nibble
        if qt == Q.Q5_K:
            qh = blk[..., 16:48].to(torch.int32)  # byte l, bit 2 chunk + nibble: element's 5th bit
            bit = (qh[:, :, None, :] >> torch.arange(8, device=qh.device, dtype=torch.int32)[None, None, :, None]) & 1
            hi = _plane_words(bit.reshape(R, nb * 8, 32), 1)
        lo = _nibble_words(c)
    else:  # Q6_K
        assert qt == Q.Q6_K, qt
        nb = K // 256
        ql = blk[..., 0:128].to(torch.int32).reshape(R, nb, 2, 64)  # per half: byte b: lo element b, hi 64 + b
        qh = blk[..., 128:192].to(torch.int32).reshape(R, nb, 2, 32)  # per half: byte l: 2 bits per quad
        low = torch.cat([ql & 15, ql >> 4], -1)  # [R, nb, 2, 128]: element of the half
        quad = torch.arange(4, device=qh.device, dtype=torch.int32)
        high = ((qh[:, :, :, None, :] >> (2 * quad)[None, None, None, :, None]) & 3).reshape(R, nb, 2, 128)
        lo = _nibble_words(low.reshape(R, nb * 8, 32))
        hi = _plane_words(high.reshape(R, nb * 8, 32), 2)
        sc = blk[..., 192:208].contiguous().view(torch.int8).reshape(R, nb * 16)
        d = _f16(blk[..., 208:210])
    gp = GpuPack(lo.contiguous(), None if hi is None else hi.contiguous(), d.contiguous(),
                 None if sc is None else sc.contiguous(), None if mn is None else mn.contiguous())
    return QWeight(gp.lo, w.qtype, R, K, layout="gpu", gpu=gp)


# ---------------------------------------------------------------------------------------------
# device functions: codes and factors of a tile of groups

@triton.jit
def codes_parts(pk_lo, pk_hi, rows, g0, n_groups, nmask, G: tl.constexpr, QTYPE: tl.constexpr):
    """The codes of groups g0 .. g0 + G - 1 of `rows` [BN]: (part 0, part 1), int32 words [BN, G, 4]
    (module docstring: word w of part h, byte b = code of element 8w + 4h + b)."""
    r = rows[:, None, None].to(tl.int64)
    gi = (g0 + tl.arange(0, G))[None, :, None]
    w = tl.arange(0, 4)[None, None, :]
    m = nmask[:, None, None]
    if QTYPE == Q8_0:
        base = pk_lo + r * (n_groups * 8) + gi * 8 + w
        c0 = tl.load(base, mask=m, other=0)
        c1 = tl.load(base + 4, mask=m, other=0)
    else:
        cw = tl.load(pk_lo + r * (n_groups * 4) + gi * 4 + w, mask=m, other=0)
        c0 = cw & 0x0F0F0F0F
        c1 = (cw >> 4) & 0x0F0F0F0F
    if QTYPE == Q5_0 or QTYPE == Q5_K:
        hw = tl.load(pk_hi + r * n_groups + gi, mask=m, other=0)  # [BN, G, 1]
        c0 = c0 | (((hw >> w) & 0x01010101) << 4)
        c1 = c1 | (((hw >> (w + 4)) & 0x01010101) << 4)
    if QTYPE == Q6_K:
        hp = pk_hi + r * (n_groups * 2) + gi * 2
        h0 = tl.load(hp, mask=m, other=0)
        h1 = tl.load(hp + 1, mask=m, other=0)
        c0 = c0 | (((h0 >> (2 * w)) & 0x03030303) << 4)
        c1 = c1 | (((h1 >> (2 * w)) & 0x03030303) << 4)
    return c0, c1


@triton.jit
def factors_tile(pk_d, pk_sc, pk_mn, rows, g0, n_groups, nmask, G: tl.constexpr, QTYPE: tl.constexpr):
    """(A, B, S) of the tile's groups: A, B float32 [BN, G] (w = A c + B); Q6_K: A = d, B unused,
    S int32 [BN, G, 2] the halves' scales (w = A S (c - 32)); S is A otherwise (unused)."""
    r = rows[:, None].to(tl.int64)
    gi = (g0 + tl.arange(0, G))[None, :]
    m = nmask[:, None]
    if QTYPE == Q6_K:
        a = tl.load(pk_d + r * (n_groups // 8) + gi // 8, mask=m, other=0.0).to(tl.float32)
        hi = tl.arange(0, 2)[None, None, :]
        s = tl.load(pk_sc + r[:, :, None] * (n_groups * 2) + gi[:, :, None] * 2 + hi, mask=m[:, :, None],
                    other=0).to(tl.int32)
        b = a
    elif QTYPE == Q4_K or QTYPE == Q5_K:
        sc = tl.load(pk_sc + r * n_groups + gi, mask=m, other=0).to(tl.float32)
        mn = tl.load(pk_mn + r * n_groups + gi, mask=m, other=0).to(tl.float32)
        dp = pk_d + r * (n_groups // 4) + gi // 8 * 2
        a = tl.load(dp, mask=m, other=0.0).to(tl.float32) * sc
        b = -(tl.load(dp + 1, mask=m, other=0.0).to(tl.float32) * mn)
        s = a
    else:
        a = tl.load(pk_d + r * n_groups + gi, mask=m, other=0.0).to(tl.float32)
        if QTYPE == Q4_0:
            b = -8.0 * a
        elif QTYPE == Q5_0:
            b = -16.0 * a
        else:
            b = a * 0.0
        s = a
    return a, b, s


@triton.jit
def dequant_packed_tile(pk_lo, pk_hi, pk_d, pk_sc, pk_mn, rows, g0, n_groups, nmask,
                        G: tl.constexpr, QTYPE: tl.constexpr):
    """float32 [BN, G * 32]: the weights of groups g0 .. g0 + G - 1 of `rows`, in element order."""
    c0, c1 = codes_parts(pk_lo, pk_hi, rows, g0, n_groups, nmask, G, QTYPE)
    a, b, s = factors_tile(pk_d, pk_sc, pk_mn, rows, g0, n_groups, nmask, G, QTYPE)
    BN: tl.constexpr = c0.shape[0]
    c = tl.join(c0, c1)  # [BN, G, 4 (w), 2 (h)]
    v = (c[:, :, :, :, None] >> (tl.arange(0, 4) * 8)[None, None, None, None, :]) & 0xFF  # [.., 4 (b)]
    # exact small integers to float without the slow I2F: (2^23 + v) - 2^23; Q8_0: v + 128, v signed
    if QTYPE == Q8_0:
        f = ((v ^ 0x80) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
    else:
        f = (v | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    if QTYPE == Q6_K:  # half w // 2 of each group
        s4 = tl.reshape(tl.join(s, s), (BN, G, 4)).to(tl.float32)
        w = (a[:, :, None] * s4)[:, :, :, None, None] * (f - 32.0)
    else:
        w = a[:, :, None, None, None] * f + b[:, :, None, None, None]
    return tl.reshape(w, (BN, G * 32))


def pack_args(w: QWeight):
    """(lo, hi, d, sc, mn) of a "gpu" weight; absent arrays are replaced by `lo` (never read)."""
    g = w.gpu
    return tuple(t if t is not None else g.lo for t in (g.lo, g.hi, g.d, g.sc, g.mn))


@triton.jit
def _dequant_packed_kernel(
    lo, hi, d, sc, mn, ids_ptr, out_ptr, R, n_groups, stride_o,
    QTYPE: tl.constexpr, HAS_IDS: tl.constexpr, BLOCK_R: tl.constexpr, G: tl.constexpr,
):
    """out[r, :] = dequant(W[ids[r] if HAS_IDS else r]) for r < R, [BLOCK_R, 32 G] per program."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = offs_r < R
    rows = tl.load(ids_ptr + offs_r, mask=rmask, other=0) if HAS_IDS else offs_r
    g0 = tl.program_id(1) * G
    w = dequant_packed_tile(lo, hi, d, sc, mn, rows, g0, n_groups, rmask, G, QTYPE)
    k = g0 * 32 + tl.arange(0, G * 32)
    optr = out_ptr + offs_r[:, None].to(tl.int64) * stride_o + k[None, :]
    tl.store(optr, w.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & (k[None, :] < n_groups * 32))


def dequantize_packed(w: QWeight, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    R = w.rows if ids is None else ids.numel()
    out = torch.empty(R, w.cols, dtype=dtype, device=w.data.device)
    if R == 0:
        return out
    G = 8 if w.cols % 256 == 0 else 1
    BLOCK_R = 16
    idt = ids if ids is not None else w.gpu.lo
    _dequant_packed_kernel[(triton.cdiv(R, BLOCK_R), w.cols // (32 * G))](
        *pack_args(w), idt, out, R, w.cols // 32, out.stride(0),
        QTYPE=int(w.qtype), HAS_IDS=ids is not None, BLOCK_R=BLOCK_R, G=G,
    )
    return out
