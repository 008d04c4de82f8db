"""Dequantizing matmul y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF block format, plus the
standalone dequantize and embedding-gather kernels that share the same register dequantizer.

Two matmul kernels:
- `_qmm_gemv_kernel` for M <= 16 (decode): broadcast-multiply-reduce, BLOCK_M = next_pow2(M);
- `_qmm_tiled_kernel` for prefill: `tl.dot` on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles.
Both dequantize the weight tile in registers (`gguf_tl.dequant_tile`), accumulate in float32 and
store in x's dtype. References: `kernels.ref.qmatmul`, `kernels.ref.dequantize`, `kernels.ref.embedding`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import ref
from .gguf_tl import SUPPORTED, configs_for_mode, dequant_tile, interpreting
from .qweight import QWeight

reference = ref.qmatmul
GEMV_MAX_M = 16


def _w_args(w: QWeight):
    qt = int(w.qtype)
    if qt not in SUPPORTED:
        raise NotImplementedError(f"no Triton dequantizer for {w.qtype.name}")
    if not w.data.is_contiguous() and w.data.stride(1) != 1:
        raise ValueError("weight rows must be contiguous")
    return w.data, w.data.stride(0), qt


# ---------------------------------------------------------------- dequantize / embedding gather
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
    data, stride_w, qt = _w_args(w)
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


# ---------------------------------------------------------------- GEMV (M <= 16)
def _gemv_prune(configs, named_args, **kwargs):
    bm = kwargs.get("BLOCK_M", named_args.get("BLOCK_M", 1))
    keep = [c for c in configs if bm * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] <= 16384]
    return keep or configs[:1]


_GEMV_CONFIGS = configs_for_mode([
    triton.Config({"BLOCK_N": 16, "BLOCK_K": 128}, num_warps=4),
    triton.Config({"BLOCK_N": 8, "BLOCK_K": 256}, num_warps=4),
    triton.Config({"BLOCK_N": 32, "BLOCK_K": 128}, num_warps=4),
    triton.Config({"BLOCK_N": 16, "BLOCK_K": 256}, num_warps=8),
    triton.Config({"BLOCK_N": 4, "BLOCK_K": 256}, num_warps=2),
    triton.Config({"BLOCK_N": 8, "BLOCK_K": 64}, num_warps=2),
    triton.Config({"BLOCK_N": 2, "BLOCK_K": 256}, num_warps=2),
])


@triton.autotune(configs=_GEMV_CONFIGS, key=["BLOCK_M", "N", "K", "QTYPE"],
                 prune_configs_by={"early_config_prune": _gemv_prune})
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


# ---------------------------------------------------------------- tiled tl.dot (prefill)
_TILED_CONFIGS = configs_for_mode([
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=4, num_stages=3),
])


@triton.autotune(configs=_TILED_CONFIGS, key=["M_BUCKET", "N", "K", "QTYPE"])
@triton.jit
def _qmm_tiled_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, M_BUCKET,
    stride_xm, stride_xk, stride_w, stride_ym, stride_yn,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_F32: tl.constexpr,
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
            acc = tl.dot(x, tl.trans(w), acc)
    yp = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :] * stride_yn
    tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y[M, N] = x[M, K] @ dequant(W)^T in x.dtype."""
    M, K = x.shape
    assert K == w.cols, (x.shape, w.cols)
    data, stride_w, qt = _w_args(w)
    N = w.rows
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    if M <= GEMV_MAX_M:
        BLOCK_M = triton.next_power_of_2(M)
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
        _qmm_gemv_kernel[grid](
            x, data, y, M, N, K, x.stride(0), x.stride(1), stride_w, y.stride(0), y.stride(1),
            QTYPE=qt, BLOCK_M=BLOCK_M,
        )
    else:
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
        _qmm_tiled_kernel[grid](
            x, data, y, M, N, K, triton.next_power_of_2(M),
            x.stride(0), x.stride(1), stride_w, y.stride(0), y.stride(1), QTYPE=qt,
            DOT_F32=interpreting() and x.dtype == torch.bfloat16,
        )
    return y
