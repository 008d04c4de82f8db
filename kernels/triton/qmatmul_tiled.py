"""Dequantizing matmul for prefill-sized batches, y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF
blocks: `tl.dot` on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles (grouped program order), the
weight tile dequantized in registers (`gguf_tl.dequant_tile`) and rounded to x's dtype, float32
accumulation; float32 x multiplies as 3xTF32 (`PRECISION`). The config per (M bucket, N, K, type,
x dtype) comes from `tuning.TILED` (timed at start-up, kept on disk, never tuned while serving).
BLOCK_M=32/BLOCK_N=64/BLOCK_K=128 was dropped: it spilled on every K-quant; 128 x 64 x 64 runs 8
warps (255 registers on Q6_K with 4) (scripts/aot_compile.py). Reference: `kernels.ref.qmatmul`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from ..qweight import QWeight
from .gguf_tl import dequant_tile, interpreting, weight_args
from .packed import dequant_packed_tile, pack_args
from .qmatmul_q8 import fit_groups
from .tuning import Tuner, register

reference = ref.qmatmul


_TILED_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3),
]
TILED = register(Tuner("qmm_tiled", _TILED_CONFIGS))


@triton.jit
def _qmm_tiled_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K,
    stride_xm, stride_xk, stride_w, stride_ym, stride_yn,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % gsize
    pid_n = (pid % (GROUP_M * num_n)) // gsize
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        xp = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk
        x = tl.load(xp, mask=mmask[:, None] & kmask[None, :], other=0.0)
        w = dequant_tile(w_ptr, stride_w, offs_n, offs_k, nmask[:, None] & kmask[None, :], QTYPE)
        w = w.to(x.dtype)
        if DOT_F32:  # the interpreter's bf16 tl.dot is wrong; same rounding, float32 product
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    yp = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn
    tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def qmatmul_tiled(x: torch.Tensor, w: QWeight, y: torch.Tensor) -> torch.Tensor:
    """y[M, N] (given, M >= 1) = x[M, K] @ dequant(W)^T."""
    data, stride_w, qt = weight_args(w)
    M, K = x.shape
    N = w.rows
    dot_f32 = interpreting() and x.dtype == torch.bfloat16
    # float32 inputs: three TF32 products (about float32's accuracy on tensor cores), not one;
    # 16-bit inputs: exact products, float32 accumulation (the setting is moot for them)
    precision = "tf32x3" if x.dtype == torch.float32 else "tf32"

    def run(c):
        grid = (triton.cdiv(M, c.kwargs["BLOCK_M"]) * triton.cdiv(N, c.kwargs["BLOCK_N"]),)
        _qmm_tiled_kernel[grid](
            x, data, y, M, N, K, x.stride(0), x.stride(1), stride_w, y.stride(0), y.stride(1),
            QTYPE=qt, DOT_F32=dot_f32, PRECISION=precision, **c.all_kwargs(),
        )
        return y

    TILED.launch((triton.next_power_of_2(M), N, K, qt, x.dtype), {}, x.device, run)
    return y


# the repacked ("gpu") weights: BLOCK_K = 32 G; the 16- and 32-row tiles serve decode batches past
# the GEMV's rows (kernels/README.md), the larger ones prompts
def _packed_prune(configs, meta):
    bm = meta["BLOCK_M"]  # the batch's rows rounded to a power of two: no tile taller than the batch
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(16, bm)]
    return keep or configs[:1]


_PACKED_CONFIGS = [
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "G": 2, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "G": 4, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "G": 4, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "G": 4, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "G": 2, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "G": 2, "GROUP_M": 8}, num_warps=8, num_stages=3),
]
PACKED_TILED = register(Tuner("qmm_packed_tiled", _PACKED_CONFIGS, _packed_prune))


@triton.jit
def _qmm_packed_tiled_kernel(
    x_ptr, pk_lo, pk_hi, pk_d, pk_sc, pk_mn, y_ptr, M, N, K, stride_xm, stride_xk, stride_ym,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
):
    """`_qmm_tiled_kernel` on the repacked layout: each [BLOCK_N, 32 G] weight tile dequantized
    from 16-byte code loads (`packed.dequant_packed_tile`)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % gsize
    pid_n = (pid % (GROUP_M * num_n)) // gsize
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    n_groups = K // 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g0 in range(0, n_groups, G):
        offs_k = g0 * 32 + tl.arange(0, G * 32)
        xp = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk
        x = tl.load(xp, mask=mmask[:, None], other=0.0)
        w = dequant_packed_tile(pk_lo, pk_hi, pk_d, pk_sc, pk_mn, offs_n, g0, n_groups, nmask, G, QTYPE)
        w = w.to(x.dtype)
        if DOT_F32:  # the interpreter's bf16 tl.dot is wrong; same rounding, float32 product
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    yp = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def qmatmul_packed_tiled(x: torch.Tensor, w: QWeight, y: torch.Tensor) -> torch.Tensor:
    """y[M, N] (given, rows contiguous) = x[M, K] @ dequant(W)^T, W in the "gpu" layout."""
    M, K = x.shape
    N = w.rows
    dot_f32 = interpreting() and x.dtype == torch.bfloat16
    precision = "tf32x3" if x.dtype == torch.float32 else "tf32"
    bm = triton.next_power_of_2(M)

    def run(c):
        grid = (triton.cdiv(M, c.kwargs["BLOCK_M"]) * triton.cdiv(N, c.kwargs["BLOCK_N"]),)
        kw = dict(c.all_kwargs(), G=fit_groups(c.kwargs["G"], K // 32))
        _qmm_packed_tiled_kernel[grid](
            x, *pack_args(w), y, M, N, K, x.stride(0), x.stride(1), y.stride(0),
            QTYPE=int(w.qtype), DOT_F32=dot_f32, PRECISION=precision, **kw)
        return y

    PACKED_TILED.launch((bm, N, K, int(w.qtype), x.dtype), {"BLOCK_M": bm}, x.device, run)
    return y
