"""Decode GEMV on the repacked weights (`packed.py`), y[M, N] = x[M, K] @ W[N, K]^T for a few rows:
each program reads the codes of BLOCK_N rows once (16-byte loads) for all M rows of x.

The activations are first quantized per 32 elements (`_quant_act_kernel`, llama.cpp's q8_1:
scale amax / 127, codes rounded to nearest, packed in the weights' part order, with their sums
per 16), then each 4-code word of weights meets its 4 activation codes in one `dp4a` (integer
dot product of 4 bytes), and a group's int32 sum is scaled once: y += dx (A sum(c q) + B sum(q))
(Q6_K: dx A (sum(S c q) - 32 sum(S q))). Chosen over dequantizing to float32 and FMA by the
instructions per weight of the compiled sm_90 code (kernels/README.md, `scripts/gpu_model.py`,
which compiles both: `_qmm_fma_gemv_kernel` is that alternative, not dispatched). Under
TRITON_INTERPRET=1 (no inline assembly) the dot product is computed bytewise: the same integers.

Config per (M bucket, N, K, type) from `tuning.Q8GEMV`. Reference: `kernels.ref.qmatmul` of the
activations rounded to their codes (exact to float32 rounding; the float product within ~1%),
`tests/test_kernels_triton.py`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref
from ..env import triton_interpreting as interpreting
from ..qweight import QWeight
from .packed import Q6_K, codes_parts, dequant_packed_tile, factors_tile, pack_args
from .tuning import Tuner, register

reference = ref.qmatmul
Q8_MAX_M = 8  # above: the tensor-core kernel (qmatmul_tiled.py) costs fewer instructions per weight


def fit_groups(g: int, n_groups: int) -> int:
    """The largest power of two <= g that divides n_groups (a config's G where K / 32 is odd...)."""
    while n_groups % g:
        g //= 2
    return g


def _prune(configs, meta):
    """The [BLOCK_M, BLOCK_N, G, 4] int32 products within 32 values per thread (16 for the two-part
    launch, whose second type's code is compiled in too: 8 B of spills at 32 under triton 3.6)."""
    bm = meta["BLOCK_M"]
    per = 16 if meta.get("PARTS", 1) > 1 else 32
    keep = [c for c in configs if bm * c.kwargs["BLOCK_N"] * 4 * c.kwargs["G"] <= per * 32 * c.num_warps]
    return keep or configs[-1:]


_CONFIGS = [
    triton.Config({"BLOCK_N": 32, "G": 8}, num_warps=4),
    triton.Config({"BLOCK_N": 16, "G": 8}, num_warps=4),
    triton.Config({"BLOCK_N": 32, "G": 4}, num_warps=4),
    triton.Config({"BLOCK_N": 16, "G": 4}, num_warps=2),
    triton.Config({"BLOCK_N": 8, "G": 4}, num_warps=1),
    triton.Config({"BLOCK_N": 4, "G": 2}, num_warps=1),
    triton.Config({"BLOCK_N": 2, "G": 1}, num_warps=1),
]
# every config computes the same integer sums: outputs differ only by the float order of the groups
Q8GEMV = register(Tuner("qmm_q8_gemv", _CONFIGS, _prune, tol=1e-4))


@triton.jit
def _dp4a(a, b, c, ASM: tl.constexpr):
    """Per element: c + the dot product of the 4 signed bytes of a and b (int32)."""
    if ASM:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        s = c + ((a << 24) >> 24) * ((b << 24) >> 24)
        s += ((a << 16) >> 24) * ((b << 16) >> 24)
        s += ((a << 8) >> 24) * ((b << 8) >> 24)
        s += (a >> 24) * (b >> 24)
        return s


@triton.jit
def _round_codes(x, inv):
    """round(x * inv) as int32 (to nearest even: (v + 1.5 * 2^23) keeps the integer in its low bits)."""
    return ((x * inv) + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000


@triton.jit
def _quant_act_kernel(x_ptr, xq_ptr, xd_ptr, xs_ptr, n_groups, stride_xm, GB: tl.constexpr):
    """Row m, groups g .. g + GB - 1: codes (words [M, n_groups * 8], part order), scales
    amax / 127 [M, n_groups] float32, code sums per 16 elements [M, n_groups * 2] int32."""
    m = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    gm = g < n_groups
    xr = x_ptr + m * stride_xm
    xn = tl.load(xr + g[:, None] * 32 + tl.arange(0, 32)[None, :], mask=gm[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(xn), axis=1)
    inv = tl.where(amax > 0.0, 127.0 / amax, 0.0)
    q = _round_codes(xn, inv[:, None])
    qs = tl.sum(tl.reshape(q, (GB, 2, 16)), axis=2)  # [GB, 2]
    tl.store(xd_ptr + m * n_groups + g, amax / 127.0, mask=gm)
    tl.store(xs_ptr + m * (n_groups * 2) + g[:, None] * 2 + tl.arange(0, 2)[None, :], qs, mask=gm[:, None])
    # element 8w + 4h + b -> byte b of word 4h + w
    h = tl.arange(0, 2)[None, :, None, None]
    w = tl.arange(0, 4)[None, None, :, None]
    b = tl.arange(0, 4)[None, None, None, :]
    gg = g[:, None, None, None]
    xp = tl.load(xr + gg * 32 + 8 * w + 4 * h + b, mask=gm[:, None, None, None], other=0.0).to(tl.float32)
    qp = _round_codes(xp, inv[:, None, None, None])
    words = tl.sum((qp & 0xFF) << (b * 8), axis=3)  # [GB, 2, 4]
    slot = g[:, None, None] * 8 + 4 * tl.arange(0, 2)[None, :, None] + tl.arange(0, 4)[None, None, :]
    tl.store(xq_ptr + m * (n_groups * 8) + slot, words, mask=gm[:, None, None])


@triton.jit
def quant_store_groups(y, xq_row, xd_row, xs_row, g0, n_groups, NG: tl.constexpr):
    """The epilogue of the kernels that produce a matmul's activations (`norm.py`, `silu_mul.py`):
    y [NG * 32] float32, the values as stored (rounded to the output's dtype), groups g0 ..
    g0 + NG - 1 of one row (those >= n_groups masked off) -> their q8_1 codes, scales and sums in
    `_quant_act_kernel`'s layout, the same bits as that kernel on the stored row."""
    g = g0 + tl.arange(0, NG)
    gm = g < n_groups
    y2 = tl.reshape(y, (NG, 32))
    amax = tl.max(tl.abs(y2), axis=1)
    inv = tl.where(amax > 0.0, 127.0 / amax, 0.0)
    q = _round_codes(y2, inv[:, None])  # [NG, 32]
    qs = tl.sum(tl.reshape(q, (NG, 2, 16)), axis=2)  # [NG, 2]
    tl.store(xd_row + g, amax / 127.0, mask=gm)
    tl.store(xs_row + g[:, None] * 2 + tl.arange(0, 2)[None, :], qs, mask=gm[:, None])
    # element 8w + 4h + b -> byte b of word 4h + w
    q4 = tl.reshape(q, (NG, 4, 2, 4))  # [group, w, h, b]
    b = tl.arange(0, 4)[None, None, None, :]
    words = tl.sum((q4 & 0xFF) << (b * 8), axis=3)  # [NG, 4, 2]
    slot = g[:, None, None] * 8 + 4 * tl.arange(0, 2)[None, None, :] + tl.arange(0, 4)[None, :, None]
    tl.store(xq_row + slot, words, mask=gm[:, None, None])


def act_buffers(M: int, K: int, device):
    """Empty q8_1 buffers of x [M, K]: (codes int32 [M, K / 4], scales float32 [M, K / 32], sums
    int32 [M, K / 16])."""
    ng = K // 32
    return (torch.empty(M, ng * 8, dtype=torch.int32, device=device),
            torch.empty(M, ng, dtype=torch.float32, device=device),
            torch.empty(M, ng * 2, dtype=torch.int32, device=device))


def fuses_quant(M: int, K: int) -> bool:
    """Whether the kernel producing activations x [M, K] also writes their q8_1 form (decode rows)."""
    return 0 < M <= Q8_MAX_M and K % 32 == 0


_ATTR = "_tritium_q8"


def attach(x: torch.Tensor, xq) -> torch.Tensor:
    """Keep x's q8_1 form (`act_buffers`, written by the kernel that wrote x) with the tensor, for
    the matmuls that read x (`attached`). Valid while x's data are what that kernel wrote: the
    form names x's data pointer, shape and strides, and no op of the dispatch surface writes into
    an activation it returned (inference tensors have no version counter to check)."""
    setattr(x, _ATTR, (xq, x.data_ptr(), tuple(x.shape), x.stride()))
    return x


def attached(x: torch.Tensor):
    """x's q8_1 form from `attach` on x or on the tensor x views, when it names x's own data pointer,
    shape and strides (the attention output [T, H * D], returned as [T, H, D], seen as [T, H * D]
    again by o_proj), else None."""
    r = getattr(x, _ATTR, None)
    if r is None and x._base is not None:
        r = getattr(x._base, _ATTR, None)
    if r is None or r[1] != x.data_ptr() or r[2] != tuple(x.shape) or r[3] != x.stride():
        return None
    return r[0]


def quantize_act(x: torch.Tensor):
    """x [M, K] (K % 32 == 0) -> (codes int32 [M, K / 4], scales float32 [M, K / 32], sums int32 [M, K / 16])."""
    M, K = x.shape
    ng = K // 32
    xq, xd, xs = act_buffers(M, K, x.device)
    GB = 16
    _quant_act_kernel[(M, triton.cdiv(ng, GB))](x, xq, xd, xs, ng, x.stride(0), GB=GB, num_warps=4)
    return xq, xd, xs


@triton.jit
def _qmm_q8_gemv_kernel(
    xq_ptr, xd_ptr, xs_ptr, pk_lo, pk_hi, pk_d, pk_sc, pk_mn, y_ptr, M, N, K, stride_ym,
    qb_lo, qb_hi, qb_d, qb_sc, qb_mn, NB,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, ASM: tl.constexpr,
    QTYPE_B: tl.constexpr = 0,
):
    """Rows 0..N-1 of the weight (pk_*, type QTYPE) into y[:, :N]; with QTYPE_B, a second weight of
    that type (qb_*, NB rows, read from the same activations) into y[:, N:N + NB] by the programs
    after the first weight's: q/k and a v of another type in one launch."""
    pid = tl.program_id(0)
    if QTYPE_B == 0:
        _gemv_rows(xq_ptr, xd_ptr, xs_ptr, pk_lo, pk_hi, pk_d, pk_sc, pk_mn, y_ptr, pid, M, N, K, stride_ym,
                   QTYPE, BLOCK_M, BLOCK_N, G, ASM)
    else:
        na = tl.cdiv(N, BLOCK_N)
        if pid < na:
            _gemv_rows(xq_ptr, xd_ptr, xs_ptr, pk_lo, pk_hi, pk_d, pk_sc, pk_mn, y_ptr, pid, M, N, K, stride_ym,
                       QTYPE, BLOCK_M, BLOCK_N, G, ASM)
        else:
            _gemv_rows(xq_ptr, xd_ptr, xs_ptr, qb_lo, qb_hi, qb_d, qb_sc, qb_mn, y_ptr + N, pid - na, M, NB, K,
                       stride_ym, QTYPE_B, BLOCK_M, BLOCK_N, G, ASM)


@triton.jit
def _gemv_rows(
    xq_ptr, xd_ptr, xs_ptr, pk_lo, pk_hi, pk_d, pk_sc, pk_mn, y_ptr, pid, M, N, K, stride_ym,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, ASM: tl.constexpr,
):
    """BLOCK_N rows of one weight from program `pid`: the GEMV's body."""
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rows < N
    m = tl.arange(0, BLOCK_M)
    mmask = m < M
    n_groups = K // 32
    # activations are loaded straight in the [BM, BN, G, 4] shape of the products (the BN axis with
    # stride 0): each thread reads the words its rows need (L1 hits), no layout shuffle in between
    zn = (rows * 0)[None, :, None, None]
    mr = m[:, None, None, None].to(tl.int64) + zn
    mm = mmask[:, None, None, None] & (zn == 0)
    zn3 = (rows * 0)[None, :, None]
    mr3 = m[:, None, None].to(tl.int64) + zn3
    mm3 = mmask[:, None, None] & (zn3 == 0)
    w = tl.arange(0, 4)[None, None, None, :]
    h2 = tl.arange(0, 2)[None, None, None, :]
    # per group partial sums, reduced over the groups once after the loop
    acc = tl.zeros((BLOCK_M, BLOCK_N, G), dtype=tl.float32)
    for g0 in range(0, n_groups, G):
        gi = (g0 + tl.arange(0, G))[None, None, :, None]
        xb = xq_ptr + mr * (n_groups * 8) + gi * 8 + w
        x0 = tl.load(xb, mask=mm, other=0)  # [BM, BN, G, 4] words of part 0 (the same for every row)
        x1 = tl.load(xb + 4, mask=mm, other=0)
        dx = tl.load(xd_ptr + mr3 * n_groups + (g0 + tl.arange(0, G))[None, None, :], mask=mm3, other=0.0)  # [BM, BN, G]
        qs2 = tl.load(xs_ptr + mr * (n_groups * 2) + gi * 2 + h2, mask=mm, other=0)  # [BM, BN, G, 2]
        c0, c1 = codes_parts(pk_lo, pk_hi, rows, g0, n_groups, nmask, G, QTYPE)  # [BN, G, 4]
        a, b, s = factors_tile(pk_d, pk_sc, pk_mn, rows, g0, n_groups, nmask, G, QTYPE)  # [BN, G]
        p = _dp4a(tl.broadcast_to(c0[None], x0.shape), x0, tl.zeros(x0.shape, tl.int32), ASM)
        p = _dp4a(tl.broadcast_to(c1[None], x1.shape), x1, p, ASM)
        if QTYPE == Q6_K:  # word w lies in half w // 2: its int8 scale inside the integer sum
            s4 = tl.reshape(tl.join(s, s), (BLOCK_N, G, 4))
            isum = tl.sum(p * s4[None], axis=3) - 32 * tl.sum(s[None] * qs2, axis=3)  # [BM, BN, G]
            acc += isum.to(tl.float32) * (a[None] * dx)
        else:
            qs = tl.sum(qs2, axis=3).to(tl.float32)  # [BM, BN, G]
            isum = tl.sum(p, axis=3).to(tl.float32)
            acc += (a[None] * isum + b[None] * qs) * dx
    yp = y_ptr + m[:, None].to(tl.int64) * stride_ym + rows[None, :]
    tl.store(yp, tl.sum(acc, axis=2).to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _qmm_fma_gemv_kernel(
    x_ptr, pk_lo, pk_hi, pk_d, pk_sc, pk_mn, y_ptr, M, N, K, stride_xm, stride_ym,
    QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
):
    """The alternative: dequantize the tile to float32 and multiply-add x (compiled by
    scripts/gpu_model.py for the comparison; `qmatmul` does not launch it)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rows < N
    m = tl.arange(0, BLOCK_M)
    mmask = m < M
    n_groups = K // 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g0 in range(0, n_groups, G):
        k = g0 * 32 + tl.arange(0, G * 32)
        x = tl.load(x_ptr + m[:, None].to(tl.int64) * stride_xm + k[None, :], mask=mmask[:, None], other=0.0)
        wt = dequant_packed_tile(pk_lo, pk_hi, pk_d, pk_sc, pk_mn, rows, g0, n_groups, nmask, G, QTYPE)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * wt[None, :, :], axis=2)
    yp = y_ptr + m[:, None].to(tl.int64) * stride_ym + rows[None, :]
    tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


def qmatmul_q8(x: torch.Tensor, w: QWeight, y: torch.Tensor, xq=None, w2: QWeight | None = None) -> torch.Tensor:
    """y[M, N] (given, M <= Q8_MAX_M, rows contiguous) = x[M, K] @ W^T, W in the "gpu" layout;
    `xq`: x already quantized (`quantize_act`), shared by weights that read the same input; `w2`:
    a second weight (another type) whose rows follow W's in y, in the same launch."""
    M, K = x.shape
    N = w.rows
    NB = w2.rows if w2 is not None else 0
    xq, xd, xs = xq if xq is not None else quantize_act(x)
    BM = triton.next_power_of_2(M)
    asm = not interpreting()
    second = pack_args(w2) if w2 is not None else pack_args(w)
    qb = int(w2.qtype) if w2 is not None else 0

    def run(c):
        kw = dict(c.all_kwargs(), G=fit_groups(c.kwargs["G"], K // 32))
        bn = c.kwargs["BLOCK_N"]
        _qmm_q8_gemv_kernel[(triton.cdiv(N, bn) + triton.cdiv(NB, bn),)](
            xq, xd, xs, *pack_args(w), y, M, N, K, y.stride(0), *second, NB, QTYPE=int(w.qtype), BLOCK_M=BM, ASM=asm,
            QTYPE_B=qb, **kw)
        return y

    key = (BM, N, K, int(w.qtype)) if w2 is None else (BM, N, K, int(w.qtype), NB, qb)
    Q8GEMV.launch(key, {"BLOCK_M": BM, "PARTS": 1 if w2 is None else 2}, x.device, run)
    return y


def qmatmul_fma(x: torch.Tensor, w: QWeight, y: torch.Tensor, block_n: int = 32, groups: int = 8,
                num_warps: int = 4) -> torch.Tensor:
    """The dequantize-to-FMA alternative on the same weights (float activations), launched only by
    the static model's comparison (`aot_cases`) and its test; `qmatmul` takes the dp4a kernel."""
    M, K = x.shape
    _qmm_fma_gemv_kernel[(triton.cdiv(w.rows, block_n),)](
        x, *pack_args(w), y, M, w.rows, K, x.stride(0), y.stride(0), QTYPE=int(w.qtype),
        BLOCK_M=triton.next_power_of_2(M), BLOCK_N=block_n, G=fit_groups(groups, K // 32), num_warps=num_warps)
    return y
