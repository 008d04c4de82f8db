"""Torch reference dequantizers for the GGUF weight types.

Every quantized type is decoded block-wise and vectorized over all blocks at once (no Python
loop per block); the bit layouts follow ggml-quants.c (`dequantize_row_*`), which
`gguf.quants` mirrors in numpy. Works on any device (CPU or CUDA tensors).

Public API (names are stable; `kernels.ref` and the CPU backend dequantize through them):

- `dequantize(w: QWeight, dtype=torch.float32) -> Tensor [rows, cols]`
- `dequantize_rows(w: QWeight, row_ids: LongTensor [n]) -> Tensor [n, cols]` (float32 by default;
  embedding lookup without dequantizing the whole table)
- `dequantize_blocks(blocks: uint8 [N, type_size], qtype, dtype=float32) -> [N, block_size]`
- `SUPPORTED_TYPES`: the GGML types handled here.
"""
from __future__ import annotations

from typing import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kernels.qweight import FLOAT_TYPES, QWeight

QK_K = 256


# ---------------------------------------------------------------------------------------------
# small helpers


def _f16(b: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 2] (little-endian IEEE half) -> float32 [N, 1]."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _shifts(values: list[int], shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=device).reshape(shape)


def _bits(b: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] -> uint8 [N, K * 8]: bit j of byte k at column k * 8 + j (little-endian)."""
    n = b.shape[0]
    sh = _shifts(list(range(8)), (1, 1, 8), b.device)
    return ((b.unsqueeze(-1) >> sh) & 1).reshape(n, -1)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """uint8 [N, G * group] -> uint8 [N, G * 2 * group]: per group of `group` bytes, first all the
    low nibbles then all the high nibbles."""
    n = qs.shape[0]
    sh = _shifts([0, 4], (1, 1, 2, 1), qs.device)
    return ((qs.reshape(n, -1, 1, group) >> sh) & 0x0F).reshape(n, -1)


# ---------------------------------------------------------------------------------------------
# per-type block decoders: uint8 [N, type_size] -> float32 [N, block_size]


def _deq_q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    q = b[:, 2:].view(torch.int8).to(torch.float32)
    return q.mul_(d)


def _deq_q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 16).to(torch.float32).sub_(8.0)
    return q.mul_(d)


def _deq_q4_1(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    m = _f16(b[:, 2:4])
    q = _nibbles(b[:, 4:], 16).to(torch.float32)
    return q.mul_(d).add_(m)


def _deq_q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    qh = _bits(b[:, 2:6])  # [N, 32]
    ql = _nibbles(b[:, 6:], 16)  # [N, 32]
    q = (ql | (qh << 4)).to(torch.float32).sub_(16.0)
    return q.mul_(d)


def _deq_q5_1(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, :2])
    m = _f16(b[:, 2:4])
    qh = _bits(b[:, 4:8])
    ql = _nibbles(b[:, 8:], 16)
    q = (ql | (qh << 4)).to(torch.float32)
    return q.mul_(d).add_(m)


def _deq_q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, :16]
    qs = b[:, 16:80]
    d = _f16(b[:, 80:82])
    dmin = _f16(b[:, 82:84])
    dl = (d * (scales & 0x0F).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    sh = _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)
    q = ((qs.reshape(n, 2, 1, 32) >> sh) & 3).reshape(n, 16, 16).to(torch.float32)
    return q.mul_(dl).sub_(ml).reshape(n, QK_K)


def _deq_q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask = b[:, :32]
    qs = b[:, 32:96]
    sc = b[:, 96:108]
    d = _f16(b[:, 108:110])
    # 16 6-bit scales: low 4 bits in bytes 0..7 (nibbles), high 2 bits in bytes 8..11
    lo = ((sc[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], (1, 2, 1), b.device)) & 0x0F).reshape(n, 16)
    hi = ((sc[:, 8:].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), b.device)) & 3).reshape(n, 16)
    scales = (lo | (hi << 4)).to(torch.float32) - 32.0
    dl = (d * scales).reshape(n, 16, 1)
    ql = ((qs.reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3)
    qh = ((hmask.reshape(n, 1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), b.device)) & 1)
    # a cleared hmask bit subtracts 4
    q = (ql.reshape(n, 16, 16).to(torch.int8) - ((qh.reshape(n, 16, 16) ^ 1) << 2).to(torch.int8))
    return q.to(torch.float32).mul_(dl).reshape(n, QK_K)


def _scale_min_k4(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K packed 12 bytes -> (scales uint8 [N, 8], mins uint8 [N, 8]), 6 bits each."""
    d = sc[:, 0:4]
    m = sc[:, 4:8]
    md = sc[:, 8:12]
    scales = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scales, mins


def _deq_q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    dmin = _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    dl = (d * sc.to(torch.float32)).reshape(n, 8, 1)
    ml = (dmin * mn.to(torch.float32)).reshape(n, 8, 1)
    q = _nibbles(b[:, 16:], 32).reshape(n, 8, 32).to(torch.float32)
    return q.mul_(dl).sub_(ml).reshape(n, QK_K)


def _deq_q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, :2])
    dmin = _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qh = b[:, 16:48]
    dl = (d * sc.to(torch.float32)).reshape(n, 8, 1)
    ml = (dmin * mn.to(torch.float32)).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:], 32).reshape(n, 8, 32)
    hb = ((qh.reshape(n, 1, 32) >> _shifts(list(range(8)), (1, 8, 1), b.device)) & 1)  # [N, 8, 32]
    q = (ql | (hb << 4)).to(torch.float32)
    return q.mul_(dl).sub_(ml).reshape(n, QK_K)


def _deq_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, :128]
    qh = b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(b[:, 208:210])
    dl = (d * scales).reshape(n, 16, 1)
    lo = _nibbles(ql, 64).reshape(n, 8, 32)
    hi = ((qh.reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3)
    hi = hi.reshape(n, 8, 32)
    q = (lo | (hi << 4)).to(torch.float32).sub_(32.0)
    return q.reshape(n, 16, 16).mul_(dl).reshape(n, QK_K)


# MXFP4's E2M1 values doubled (ggml's kvalues_mxfp4); the block scale is 2^(e - 128), i.e. ggml's
# GGML_E8M0_TO_FP32_HALF, so that value = kvalue * scale exactly
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 exponents -> float32 2^(e - 128) (ggml_e8m0_to_fp32_half: e < 2 as float32
    subnormals 0x00200000 << e, else exponent bits e - 1)."""
    e32 = e.to(torch.int32)
    bits = torch.where(e32 < 2, torch.bitwise_left_shift(torch.full_like(e32, 0x00200000), e32), (e32 - 1) << 23)
    return bits.view(torch.float32)


def _deq_mxfp4(b: torch.Tensor) -> torch.Tensor:
    """17 B: e (E8M0) | qs[16]; element j < 16 is the low nibble of qs[j], j >= 16 the high nibble of
    qs[j - 16] (dequantize_row_mxfp4)."""
    d = e8m0_half(b[:, :1].contiguous())
    lut = torch.tensor(KVALUES_MXFP4, dtype=torch.float32, device=b.device)
    q = _nibbles(b[:, 1:], 16).long()
    return lut[q].mul_(d)


_DECODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLQuantizationType.Q8_0: _deq_q8_0,
    GGMLQuantizationType.Q4_0: _deq_q4_0,
    GGMLQuantizationType.Q4_1: _deq_q4_1,
    GGMLQuantizationType.Q5_0: _deq_q5_0,
    GGMLQuantizationType.Q5_1: _deq_q5_1,
    GGMLQuantizationType.Q2_K: _deq_q2_k,
    GGMLQuantizationType.Q3_K: _deq_q3_k,
    GGMLQuantizationType.Q4_K: _deq_q4_k,
    GGMLQuantizationType.Q5_K: _deq_q5_k,
    GGMLQuantizationType.Q6_K: _deq_q6_k,
    GGMLQuantizationType.MXFP4: _deq_mxfp4,
}

SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset(_DECODERS) | frozenset(FLOAT_TYPES)

# elements decoded per chunk: bounds the temporaries of big tables (an embedding of 151936 x 4096)
_CHUNK_ELEMS = 1 << 22


def dequantize_blocks(blocks: torch.Tensor, qtype: GGMLQuantizationType,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [N, type_size] -> [N, block_size] of `dtype` (computed in float32) for a quantized
    GGML type."""
    qtype = GGMLQuantizationType(qtype)
    fn = _DECODERS.get(qtype)
    if fn is None:
        raise NotImplementedError(f"dequantization of {qtype.name} is not supported")
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != type_size:
        raise ValueError(f"{qtype.name} blocks must be uint8 [N, {type_size}], got "
                         f"{blocks.dtype} {tuple(blocks.shape)}")
    n = blocks.shape[0]
    chunk = max(1, _CHUNK_ELEMS // block_size)
    if n <= chunk:
        out = fn(blocks)
        return out if dtype == torch.float32 else out.to(dtype)
    out = torch.empty(n, block_size, dtype=dtype, device=blocks.device)
    for s in range(0, n, chunk):  # a few large chunks, not a loop per block
        out[s:s + chunk] = fn(blocks[s:s + chunk])
    return out


def _dequant_data(data: torch.Tensor, qtype: GGMLQuantizationType, cols: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """data: the [n, row_bytes] uint8 rows (or [n, cols] float rows) of a QWeight."""
    if qtype in FLOAT_TYPES:
        return data.to(dtype)
    n = data.shape[0]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = data.reshape(n * (cols // block_size), type_size)
    return dequantize_blocks(blocks, qtype, dtype).reshape(n, cols)


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """QWeight -> dense [rows, cols] tensor of `dtype` on the weight's device."""
    return _dequant_data(w.data, GGMLQuantizationType(w.qtype), w.cols, dtype)


def dequantize_rows(w: QWeight, row_ids: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows `row_ids` ([n] int64) of the dense matrix: [n, cols] of `dtype`."""
    rows = w.data.index_select(0, row_ids.to(device=w.data.device, dtype=torch.long).reshape(-1))
    return _dequant_data(rows, GGMLQuantizationType(w.qtype), w.cols, dtype)
