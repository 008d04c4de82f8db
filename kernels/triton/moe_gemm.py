"""Fused mixture-of-experts FFN: tokens grouped by expert, a dequantizing grouped GEMM per expert.

The T x k (token, slot) pairs are sorted by expert on the device (`moe_align`: counting, a stable
sort and prefix sums in torch, no host sync, so a CUDA graph can hold it) into per-expert runs
padded to BLOCK_M; each program of `_moe_gemm_kernel` takes one BLOCK_M run of one expert and one
BLOCK_N slice of that expert's output rows, gathers the rows of its tokens, and multiplies them by
the expert's weight tile dequantized in registers from the stacked GGUF tensor (`gguf_tl.
dequant_tile`, expert e's rows at e * rows_per_expert): each expert's weights are read once per
BLOCK_M of its tokens. Two launches:

- GATED: h[pair] = silu(x[tok] @ gate_e^T) * (x[tok] @ up_e^T), both products in one program
  (the SwiGLU fused into the epilogue), h [T * k, n_ff] in x's dtype;
- down: y[pair] = route_weight[pair] * (h[pair] @ down_e^T), float32 [T * k, n_embd];

then out[t] = sum over its k slots (torch). The grid is sized for the worst case (T * k / BLOCK_M
+ min(E, T * k) runs); programs past the last run return at once. Float32 accumulation; float32
inputs multiply as 3xTF32 on tensor cores (as `qmatmul_tiled`). Reference: `kernels.ref.moe_ffn`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from ..qweight import Experts
from .gguf_tl import dequant_tile, interpreting, weight_args

reference = ref.moe_ffn


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w1_ptr, w2_ptr, out_ptr, pairs_ptr, block_expert_ptr, route_w_ptr,
    N_PAIRS, N, K, stride_am, stride_w1, stride_w2, stride_om,
    TOPK: tl.constexpr, GATED: tl.constexpr, QTYPE1: tl.constexpr, QTYPE2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:  # past the last run
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + offs_m)
    mmask = pair < N_PAIRS  # padding rows of the run hold N_PAIRS
    if GATED:
        row = pair // TOPK  # the token
    else:
        row = pair
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    wrow = e.to(tl.int64) * N + offs_n  # the expert's rows in the stacked weight
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < K
        ap = a_ptr + row[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        a = tl.load(ap, mask=mmask[:, None] & kmask[None, :], other=0.0)
        wmask = nmask[:, None] & kmask[None, :]
        w1 = dequant_tile(w1_ptr, stride_w1, wrow, offs_k, wmask, QTYPE1).to(a.dtype)
        if DOT_F32:  # the interpreter's bf16 tl.dot is wrong; same rounding, float32 product
            acc1 = tl.dot(a.to(tl.float32), tl.trans(w1.to(tl.float32)), acc1)
        else:
            acc1 = tl.dot(a, tl.trans(w1), acc1, input_precision=PRECISION)
        if GATED:
            w2 = dequant_tile(w2_ptr, stride_w2, wrow, offs_k, wmask, QTYPE2).to(a.dtype)
            if DOT_F32:
                acc2 = tl.dot(a.to(tl.float32), tl.trans(w2.to(tl.float32)), acc2)
            else:
                acc2 = tl.dot(a, tl.trans(w2), acc2, input_precision=PRECISION)
    if GATED:
        res = acc1 / (1.0 + tl.exp(-acc1)) * acc2
    else:
        rw = tl.load(route_w_ptr + pair, mask=mmask, other=0.0)
        res = acc1 * rw[:, None]
    op = out_ptr + pair[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(op, res.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def moe_align(ids: torch.Tensor, n_expert: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids [T, k] -> (pairs [n_blocks * block_m] int32: the flat (token * k + slot) indices
    grouped by expert, each expert's run padded to a multiple of block_m with T * k; block_expert
    [n_blocks] int32: the expert of each block_m run, -1 past the last). n_blocks is the worst case
    for T * k pairs, so nothing is read back on the host."""
    flat = ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    dev = flat.device
    counts = torch.zeros(n_expert, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pend = torch.cumsum(padded, 0)
    cstart = torch.cumsum(counts, 0) - counts
    order = torch.sort(flat, stable=True).indices
    sorted_e = flat[order]
    dest = (pend - padded)[sorted_e] + torch.arange(n, device=dev) - cstart[sorted_e]
    n_blocks = n // block_m + min(n_expert, n) + 1
    pairs = torch.full((n_blocks * block_m,), n, dtype=torch.int32, device=dev)
    pairs[dest] = order.to(torch.int32)
    starts = torch.arange(n_blocks, device=dev, dtype=torch.int64) * block_m
    block_expert = torch.searchsorted(pend, starts, right=True)
    block_expert = torch.where(block_expert < n_expert, block_expert, -1).to(torch.int32)
    return pairs, block_expert


def _blocks(M: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for M (token, slot) pairs: one small config under the
    interpreter. Decode-sized pair counts take runs of 16, prefill runs of 64 on 8 warps; float32
    inputs (3xTF32: three products per tile) take smaller tiles on 8 warps, 2 stages (BLOCK_K 16 at
    prefill: BLOCK_K 32 spilled 8 B on Q4_1 on sm_80). Checked with scripts/aot_compile.py --only moe
    --arch 80,90 (every type, f32/f16/bf16): no spills. Dropped: BLOCK_K 64 for decode (spilled on Q6_K), 4 warps for prefill
    (Q5_0 Q5_1 Q2_K Q3_K Q6_K), float32 64 x 64 x 64 tiles (every type), 32 x 32 x 32 (4 types)."""
    if interpreting():
        return 16, 32, 32, 4, 1
    if dtype == torch.float32:
        return (16, 32, 32, 8, 2) if M <= 64 else (64, 32, 16, 8, 2)
    return (16, 32, 32, 4, 3) if M <= 64 else (64, 64, 64, 8, 3)


def moe_ffn(x: torch.Tensor, experts: Experts, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`kernels.ref.moe_ffn`'s contract: x [T, C], weights / ids [T, k] -> [T, C] in x.dtype. gpt-oss's
    biased experts (`experts.bias`) go through `ref.moe_biased` with this backend's matmul kernels
    (GGUF blocks dequantized in registers, MXFP4 included) and torch's swiglu_oai."""
    if experts.bias is not None:
        from . import qmatmul

        return ref.moe_biased(x, experts, weights, ids, qmatmul,
                              ref.swiglu_oai if experts.act == "swiglu_oai" else ref.silu_mul)
    T, C = x.shape
    k = ids.shape[1]
    F = experts.n_ff
    if T == 0:
        return torch.zeros(T, C, dtype=x.dtype, device=x.device)
    x = x if x.stride(1) == 1 else x.contiguous()
    gate, sg, qg = weight_args(experts.gate)
    up, su, qu = weight_args(experts.up)
    down, sd, qd = weight_args(experts.down)
    n_pairs = T * k
    BM, BN, BK, nw, ns = _blocks(n_pairs, x.dtype)
    pairs, block_expert = moe_align(ids, experts.n_expert, BM)
    route_w = weights.reshape(-1).to(torch.float32).contiguous()
    dot_f32 = interpreting() and x.dtype == torch.bfloat16
    precision = "tf32x3" if x.dtype == torch.float32 else "tf32"
    h = torch.empty(n_pairs, F, dtype=x.dtype, device=x.device)
    nb = block_expert.shape[0]
    _moe_gemm_kernel[(nb, triton.cdiv(F, BN))](
        x, gate, up, h, pairs, block_expert, route_w, n_pairs, F, C, x.stride(0), sg, su, h.stride(0),
        TOPK=k, GATED=True, QTYPE1=qg, QTYPE2=qu, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
        DOT_F32=dot_f32, PRECISION=precision, num_warps=nw, num_stages=ns)
    y = torch.empty(n_pairs, C, dtype=torch.float32, device=x.device)
    _moe_gemm_kernel[(nb, triton.cdiv(C, BN))](
        h, down, down, y, pairs, block_expert, route_w, n_pairs, C, F, h.stride(0), sd, sd, y.stride(0),
        TOPK=k, GATED=False, QTYPE1=qd, QTYPE2=qd, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
        DOT_F32=dot_f32, PRECISION=precision, num_warps=nw, num_stages=ns)
    return y.view(T, k, C).sum(1).to(x.dtype)
