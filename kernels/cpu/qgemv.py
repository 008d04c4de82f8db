"""Quantized weights on the CPU path: every GGUF quantized type repacked once, exactly, into
affine-integer tiles that one C GEMV kernel reads (`qgemv.c`: `qgemv_tiles64_c8` / `_c4`).

Each GGUF type stores, per group of 16 or 32 weights of a row, small integer codes and one or two
float factors. Written as W[r, k] = A[g, r] * code[r, k] + B[g, r] (g = k // group), every type
fits one of two code widths without changing a single value:

| type | codes | group | A | B |
| --- | --- | --- | --- | --- |
| Q8_0 | int8 q | 32 | d | 0 |
| Q5_0 | int8 q - 16 | 32 | d | 0 |
| Q5_1 | int8 q (0..31) | 32 | d | m |
| Q5_K | int8 q (0..31) | 32 | d * sc | -dmin * m |
| Q6_K | int8 q - 32 | 16 | d * sc | 0 |
| Q4_0 | 4-bit q | 32 | d | -8 d |
| Q4_1 | 4-bit q | 32 | d | m |
| Q4_K | 4-bit q | 32 | d * sc | -dmin * m |
| Q3_K | 4-bit q + 4 (0..7) | 16 | d * sc | -4 d * sc |
| Q2_K | 4-bit q (0..3) | 16 | d * sc | -dmin * m |

(every product above is exact in float32, so `unpack` reproduces `kernels.dequant_ref` bit for
bit; `tests/test_cpu_kernels.py` checks it for every type). Rows are grouped into tiles of 64
(`QWeight.layout` "tiles64_c8": codes [nt, cols, 64] int8; "tiles64_c4": [nt, cols, 32] bytes,
byte j holding row j in its low nibble and row j + 32 in its high one; A and B [nt, cols / group, 64]
float32, B not stored where it is zero), so the kernel, like the float one in `gemv.py`, streams each tile once per decode
step: 0.75 (Q4_K) to 1.25 (Q8_0, Q6_K) bytes per weight instead of 4 for float32. The same
kernel serves prefill (any number of rows, two at a time against a tile that stays in L2).
"""
from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from . import native
from ..dequant_ref import QK_K, _bits, _f16, _nibbles, _scale_min_k4, _shifts
from ..qweight import QWeight

TILE = 64
LAYOUTS = ("tiles64_c8", "tiles64_c4")


def _q8_0(b):
    return b[:, 2:].view(torch.int8).to(torch.int16), _f16(b[:, :2]), None


def _q4_0(b):
    d = _f16(b[:, :2])
    return _nibbles(b[:, 2:], 16).to(torch.int16), d, -8.0 * d


def _q4_1(b):
    return _nibbles(b[:, 4:], 16).to(torch.int16), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b):
    q = (_nibbles(b[:, 6:], 16) | (_bits(b[:, 2:6]) << 4)).to(torch.int16) - 16
    return q, _f16(b[:, :2]), None


def _q5_1(b):
    q = (_nibbles(b[:, 8:], 16) | (_bits(b[:, 4:8]) << 4)).to(torch.int16)
    return q, _f16(b[:, :2]), _f16(b[:, 2:4])


def _q2_k(b):
    n = b.shape[0]
    scales = b[:, :16]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    sh = _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)
    q = ((b[:, 16:80].reshape(n, 2, 1, 32) >> sh) & 3).reshape(n, QK_K).to(torch.int16)
    return q, d * (scales & 0x0F).to(torch.float32), -(dmin * (scales >> 4).to(torch.float32))


def _q3_k(b):
    n = b.shape[0]
    hmask, qs, sc = b[:, :32], b[:, 32:96], b[:, 96:108]
    d = _f16(b[:, 108:110])
    lo = ((sc[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], (1, 2, 1), b.device)) & 0x0F).reshape(n, 16)
    hi = ((sc[:, 8:].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), b.device)) & 3).reshape(n, 16)
    dl = d * ((lo | (hi << 4)).to(torch.float32) - 32.0)
    ql = (qs.reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3
    qh = (hmask.reshape(n, 1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), b.device)) & 1
    q = ql.reshape(n, QK_K).to(torch.int16) + (qh.reshape(n, QK_K).to(torch.int16) << 2)  # q_signed + 4
    return q, dl, -4.0 * dl


def _q4_k(b):
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    return _nibbles(b[:, 16:], 32).to(torch.int16), d * sc.to(torch.float32), -(dmin * mn.to(torch.float32))


def _q5_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    ql = _nibbles(b[:, 48:], 32).reshape(n, 8, 32)
    hb = (b[:, 16:48].reshape(n, 1, 32) >> _shifts(list(range(8)), (1, 8, 1), b.device)) & 1
    q = (ql | (hb << 4)).reshape(n, QK_K).to(torch.int16)
    return q, d * sc.to(torch.float32), -(dmin * mn.to(torch.float32))


def _q6_k(b):
    n = b.shape[0]
    lo = _nibbles(b[:, :128], 64).reshape(n, 8, 32)
    hi = ((b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3).reshape(n, 8, 32)
    q = (lo | (hi << 4)).reshape(n, QK_K).to(torch.int16) - 32
    return q, _f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).to(torch.float32), None


# type -> (codes/A/B of blocks uint8 [N, type_size], code bits, group size)
_AFFINE = {
    T.Q8_0: (_q8_0, 8, 32), T.Q5_0: (_q5_0, 8, 32), T.Q5_1: (_q5_1, 8, 32), T.Q5_K: (_q5_k, 8, 32),
    T.Q6_K: (_q6_k, 8, 16), T.Q4_0: (_q4_0, 4, 32), T.Q4_1: (_q4_1, 4, 32), T.Q4_K: (_q4_k, 4, 32),
    T.Q3_K: (_q3_k, 4, 16), T.Q2_K: (_q2_k, 4, 16),
}


def available() -> bool:
    """The C kernel exists and widens its codes with vector instructions (AVX-512 or AVX2)."""
    lib = native.lib()
    return lib is not None and bool(lib.i8_widening_is_vectorized())


def supports(w: QWeight) -> bool:
    return w.layout == "rows" and w.qtype in _AFFINE and w.data.device.type == "cpu"


def _affine_rows(w: QWeight, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes int16 [n, cols], A and B float32 [n, cols / group] of rows r0:r1."""
    fn, _, group = _AFFINE[T(w.qtype)]
    block, type_size = GGML_QUANT_SIZES[T(w.qtype)]
    n = r1 - r0
    q, a, b = fn(w.data[r0:r1].reshape(n * (w.cols // block), type_size))
    ng = w.cols // group
    a = a.expand(-1, block // group) if a.shape[1] == 1 else a
    if b is not None:
        b = (b.expand(-1, block // group) if b.shape[1] == 1 else b).reshape(n, ng).float()
    return q.reshape(n, w.cols), a.reshape(n, ng).float(), b


def pack(w: QWeight) -> QWeight:
    """A quantized "rows" QWeight -> the same values as affine-integer tiles (layout tiles64_c8 or
    tiles64_c4, `scales`/`offsets` A and B, `group`). Works through 64-row tiles in chunks to keep
    the temporaries small."""
    fn, bits, group = _AFFINE[T(w.qtype)]
    has_b = fn not in (_q8_0, _q5_0, _q6_k)  # B is zero for these: not stored, not read
    N, K = w.rows, w.cols
    nt = (N + TILE - 1) // TILE
    ng = K // group
    cb = TILE if bits == 8 else TILE // 2
    codes = torch.zeros((nt, K, cb), dtype=torch.uint8)
    A = torch.zeros((nt, ng, TILE), dtype=torch.float32)
    B = torch.zeros((nt, ng, TILE), dtype=torch.float32) if has_b else None
    step = max(1, (1 << 22) // max(1, K * TILE))  # tiles per chunk (~4M weights)
    for t0 in range(0, nt, step):
        t1 = min(nt, t0 + step)
        r0, r1 = t0 * TILE, min(N, t1 * TILE)
        q, a, b = _affine_rows(w, r0, r1)
        pad = (t1 - t0) * TILE - (r1 - r0)
        if pad:
            q = torch.cat([q, q.new_zeros(pad, K)])
            a = torch.cat([a, a.new_zeros(pad, ng)])
            b = None if b is None else torch.cat([b, b.new_zeros(pad, ng)])
        qt = q.view(t1 - t0, TILE, K).transpose(1, 2)  # [tiles, K, 64]
        if bits == 8:
            codes[t0:t1] = qt.to(torch.int8).view(torch.uint8)
        else:
            codes[t0:t1] = (qt[:, :, :32] | (qt[:, :, 32:] << 4)).to(torch.uint8)
        A[t0:t1] = a.view(t1 - t0, TILE, ng).transpose(1, 2)
        if B is not None:
            B[t0:t1] = b.view(t1 - t0, TILE, ng).transpose(1, 2)
    return QWeight(codes, w.qtype, N, K, "tiles64_c8" if bits == 8 else "tiles64_c4",
                   scales=A, offsets=B, group=group)


def _codes(w: QWeight, tiles: slice = slice(None)) -> torch.Tensor:
    """Codes of the tiles as float32 [n_tiles, cols, 64]."""
    c = w.data[tiles]
    if w.layout == "tiles64_c8":
        return c.view(torch.int8).float()
    return torch.cat([c & 0x0F, c >> 4], dim=2).float()


def unpack(w: QWeight, r0: int = 0, r1: int | None = None) -> torch.Tensor:
    """Rows r0:r1 (default all) as float32 [n, cols], bit-identical to `dequant_ref.dequantize`."""
    r1 = w.rows if r1 is None else r1
    t0, t1 = r0 // TILE, (r1 + TILE - 1) // TILE
    sl = slice(t0, t1)
    vals = _codes(w, sl).mul_(w.scales[sl].repeat_interleave(w.group, dim=1))  # [tiles, cols, 64]
    if w.offsets is not None:  # A * code + B, as the GGUF dequantizers round
        vals.add_(w.offsets[sl].repeat_interleave(w.group, dim=1))
    vals = vals.transpose(1, 2).reshape((t1 - t0) * TILE, w.cols)
    return vals[r0 - t0 * TILE: r1 - t0 * TILE]


def rows(w: QWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` [n] as float32 [n, cols] (embedding lookups from a tied output head)."""
    t, r = ids // TILE, ids % TILE
    if w.layout == "tiles64_c8":
        c = w.data[t, :, r].view(torch.int8).float()  # [n, cols]
    else:
        byte = w.data[t, :, r % 32]
        c = torch.where((r >= 32)[:, None], byte >> 4, byte & 0x0F).float()
    c.mul_(w.scales[t, :, r].repeat_interleave(w.group, dim=1))
    if w.offsets is not None:
        c.add_(w.offsets[t, :, r].repeat_interleave(w.group, dim=1))
    return c


def qgemv(x: torch.Tensor, w: QWeight, n_threads: int | None = None) -> torch.Tensor:
    """x: [M, cols] float32 times the packed weight -> y: [M, rows] float32."""
    lib = native.lib()
    assert lib is not None and w.layout in LAYOUTS
    M, K = x.shape
    assert K == w.cols
    Mp = M + (M & 1)
    xp = torch.zeros((Mp, K), dtype=torch.float32)
    xp[:M] = x
    xs = xp.view(Mp, K // w.group, w.group).sum(dim=2).contiguous()  # [Mp, groups]
    y = torch.empty((M, w.rows), dtype=torch.float32)
    fn = lib.qgemv_tiles64_c8 if w.layout == "tiles64_c8" else lib.qgemv_tiles64_c4
    fn(xp.data_ptr(), xs.data_ptr(), w.data.data_ptr(), w.scales.data_ptr(),
       None if w.offsets is None else w.offsets.data_ptr(), y.data_ptr(),
       M, w.rows, K, w.group, w.rows, n_threads or torch.get_num_threads())
    return y
