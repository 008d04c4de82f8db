"""Dequantize a GGUF-layout weight, or gather and dequantize some of its rows (embedding lookup):
one program per [16 rows x 256 columns] tile, the block decoding of `gguf_tl.dequant_tile`.
References: `kernels.ref.dequantize`, `kernels.ref.embedding`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from ..qweight import QWeight
from .gguf_tl import dequant_tile, weight_args

reference = ref.dequantize
reference_embedding = ref.embedding


@triton.jit
def _dequant_rows_kernel(
    w_ptr, ids_ptr, out_ptr, R, K, stride_w, stride_o,
    QTYPE: tl.constexpr, HAS_IDS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[r, :] = dequant(W[ids[r] if HAS_IDS else r, :]) for r < R."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    rmask = offs_r < R
    if HAS_IDS:
        rows = tl.load(ids_ptr + offs_r, mask=rmask, other=0)
    else:
        rows = offs_r
    mask = rmask[:, None] & (offs_k[None, :] < K)
    val = dequant_tile(w_ptr, stride_w, rows, offs_k, mask, QTYPE)
    optr = out_ptr + offs_r[:, None].to(tl.int64) * stride_o + offs_k[None, :]
    tl.store(optr, val.to(out_ptr.dtype.element_ty), mask=mask)


def _dequant_rows(w: QWeight, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    data, stride_w, qt = weight_args(w)
    R = w.rows if ids is None else ids.numel()
    out = torch.empty(R, w.cols, dtype=dtype, device=data.device)
    if R == 0:
        return out
    BLOCK_R, BLOCK_K = 16, 256
    grid = (triton.cdiv(R, BLOCK_R), triton.cdiv(w.cols, BLOCK_K))
    idt = ids if ids is not None else data  # unused pointer when HAS_IDS=False
    _dequant_rows_kernel[grid](
        data, idt, out, R, w.cols, stride_w, out.stride(0),
        QTYPE=qt, HAS_IDS=ids is not None, BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K,
    )
    return out


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _dequant_rows(w, None, dtype)


def embedding(ids: torch.Tensor, w: QWeight) -> torch.Tensor:
    ids = ids.to(device=w.data.device, dtype=torch.int64).contiguous()
    return _dequant_rows(w, ids, torch.float32)
