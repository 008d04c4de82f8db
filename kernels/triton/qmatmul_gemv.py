"""Dequantizing GEMV for decode batches, y[M, N] = x[M, K] @ W[N, K]^T with M <= 16 and W in GGUF
blocks: broadcast-multiply-reduce over [BLOCK_M = next_pow2(M), BLOCK_N, BLOCK_K] tiles, the
weight tile dequantized in registers (`gguf_tl.dequant_tile`), float32 accumulation, output in
x's dtype. The config per (BLOCK_M, N, K, type, x dtype) comes from `tuning.GEMV` (timed at
start-up, kept on disk, never tuned while serving). Reference: `kernels.ref.qmatmul`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from ..qweight import QWeight
from .gguf_tl import dequant_tile, weight_args
from .tuning import Tuner, register

reference = ref.qmatmul
GEMV_MAX_M = 16


def _gemv_prune(configs, meta):
    """At most 128 elements of the [BLOCK_M, BLOCK_N, BLOCK_K] product per thread (registers:
    256 per thread reached 168 registers and spilled on Q6_K, scripts/aot_compile.py)."""
    bm = meta["BLOCK_M"]
    return [c for c in configs if bm * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] <= 128 * 32 * c.num_warps]


# BLOCK_N=32/BLOCK_K=128 was dropped: 148-163 registers at one row, no faster in theory than
# 16 x 128 (same bytes per program, twice the live values)
_GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": 16, "BLOCK_K": 128}, num_warps=4),
    triton.Config({"BLOCK_N": 8, "BLOCK_K": 256}, num_warps=4),
    triton.Config({"BLOCK_N": 16, "BLOCK_K": 256}, num_warps=8),
    triton.Config({"BLOCK_N": 4, "BLOCK_K": 256}, num_warps=2),
    triton.Config({"BLOCK_N": 8, "BLOCK_K": 64}, num_warps=2),
    triton.Config({"BLOCK_N": 2, "BLOCK_K": 256}, num_warps=2),
]
GEMV = register(Tuner("qmm_gemv", _GEMV_CONFIGS, _gemv_prune))


@triton.jit
def _qmm_gemv_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K,
    stride_xm, stride_xk, stride_w, stride_ym, stride_yn,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    mmask = offs_m < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        w = dequant_tile(w_ptr, stride_w, offs_n, offs_k, nmask[:, None] & kmask[None, :], QTYPE)
        xp = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
        x = tl.load(xp, mask=mmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    yp = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def qmatmul_gemv(x: torch.Tensor, w: QWeight, y: torch.Tensor) -> torch.Tensor:
    """y[M, N] (given, 1 <= M <= GEMV_MAX_M) = x[M, K] @ dequant(W)^T."""
    data, stride_w, qt = weight_args(w)
    M, K = x.shape
    N = w.rows
    BM = triton.next_power_of_2(M)

    def run(c):
        _qmm_gemv_kernel[(triton.cdiv(N, c.kwargs["BLOCK_N"]),)](
            x, data, y, M, N, K, x.stride(0), x.stride(1), stride_w, y.stride(0), y.stride(1),
            QTYPE=qt, BLOCK_M=BM, **c.all_kwargs(),
        )
        return y

    GEMV.launch((BM, N, K, qt, x.dtype), {"BLOCK_M": BM}, x.device, run)
    return y
