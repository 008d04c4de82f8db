"""Batched GEMV for the CPU decode path: y[M, N] = x[M, K] @ W^T for small M.

BLAS sgemm packs the whole weight matrix on every call when M is small, which on a 151,936 x 256
output head costs 2-3x the time of reading the weights once. This kernel (C, `gemv.c`) reads
the weights once per call whatever M is: W is repacked at load into tiles of 64 output rows
(`pack`: [N/64, K, 64], each tile one contiguous stream); for every k, x[m, k] is broadcast
against a chunk of the 64 weights of row k of the tile, the sums of 4 rows of x x (16 or 64)
columns kept in registers, each chunk walked once per 4 rows while it sits in L1/L2.

Every output is the fma chain acc = fma(x[m, k], w[n, k], acc) over k = 0 .. K-1 in order
(float16 / bfloat16 / int8 weights widened exactly first; int8 sums then times the row scale):
the AVX-512, AVX2 and portable builds (`native.float_isa()`) give the same bits, for every M.
Without a compiler `available()` is False and callers use BLAS instead; with only the portable
build (`vectorized()` False: no AVX2 + FMA) they use BLAS too, it is slower.
"""
from __future__ import annotations

import torch

from . import native

MAX_M = 16  # callers' bound for "decode-sized" batches; the kernel itself takes any M
TILE = 64


def available() -> bool:
    return native.lib() is not None


def vectorized() -> bool:
    """Whether the kernels are a vector build (AVX-512 or AVX2 + FMA), not the portable one."""
    lib = native.lib()
    return lib is not None and bool(lib.i8_widening_is_vectorized())


def isa() -> str | None:
    """The instruction set of the loaded build ("avx512", "avx2", "scalar"), None without one."""
    lib = native.lib()
    return None if lib is None else lib.cpu_kernels_isa().decode()


_KERNELS = {torch.float32: "bgemv_tiles64", torch.float16: "bgemv_tiles64_f16", torch.bfloat16: "bgemv_tiles64_bf16"}


def pack(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N / 64), K, 64] tiles of the same dtype (float32, float16 or bfloat16;
    rows past N are zero)."""
    N, K = w.shape
    nt = (N + TILE - 1) // TILE
    out = torch.zeros((nt * TILE, K), dtype=w.dtype)
    out[:N] = w
    return out.view(nt, TILE, K).transpose(1, 2).contiguous()


def unpack(tiles: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Inverse of `pack`: [N, K]."""
    nt, K, _ = tiles.shape
    return tiles.transpose(1, 2).reshape(nt * TILE, K)[:n_rows]


def rows(tiles: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of the packed matrix: [len(ids), K]."""
    return tiles[ids // TILE, :, ids % TILE]


def bgemv(x: torch.Tensor, tiles: torch.Tensor, n_rows: int, n_threads: int | None = None) -> torch.Tensor:
    """x: [M, K] float32 (any M: one pass over the weights) times the packed [n_rows, K] weight (float32, float16 or
    bfloat16 tiles, widened exactly) -> y: [M, n_rows] float32. `n_threads`: OpenMP threads
    (default torch's count)."""
    return _run(_KERNELS[tiles.dtype], x, tiles, n_rows, n_threads)


def i8_fast() -> bool:
    """Whether the int8 GEMV widens with vector instructions (AVX-512 or AVX2 builds); elsewhere it
    is slower than the float32 one and callers should not use it."""
    return vectorized()


def pack_i8(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """float tiles [nt, K, 64] -> (int8 tiles [nt, K, 64], row scales [nt * 64] float32,
    row error norms [nt * 64] float64, row norms [nt * 64] float64): row r is approximated by
    scale_r * q_r with q_r = round(w_r / scale_r), scale_r = max |w_r| / 127, and
    err_r = |w_r - scale_r q_r|_2 (computed in float64), which bounds the error of any dot product
    with that row; the norms |w_r|_2 come from the same pass."""
    nt, K, _ = tiles.shape
    q = torch.empty((nt, K, TILE), dtype=torch.int8)
    scale = torch.empty(nt * TILE, dtype=torch.float32)
    err = torch.empty(nt * TILE, dtype=torch.float64)
    norm = torch.empty(nt * TILE, dtype=torch.float64)
    lib = native.lib()
    if lib is not None and tiles.dtype == torch.float32:  # one pass in C (gemv.c), the same arithmetic
        t = tiles.contiguous()
        lib.pack_i8_f32(t.data_ptr(), q.data_ptr(), scale.data_ptr(), err.data_ptr(), norm.data_ptr(), nt, K,
                        torch.get_num_threads())
        return q, scale, err, norm
    step = max(1, (1 << 22) // max(1, K * TILE))  # tiles per chunk: bounded float64 temporaries
    for t0 in range(0, nt, step):
        t1 = min(nt, t0 + step)
        w = tiles[t0:t1].float()
        s = w.abs().amax(dim=1) / 127.0  # [tiles, 64]
        s = torch.where(s > 0, s, torch.ones_like(s))
        qc = torch.round(w / s[:, None, :]).clamp_(-127, 127)
        q[t0:t1] = qc.to(torch.int8)
        scale[t0 * TILE:t1 * TILE] = s.reshape(-1)
        wd = w.double()
        e = wd - qc.double() * s.double()[:, None, :]
        err[t0 * TILE:t1 * TILE] = e.pow(2).sum(dim=1).sqrt().reshape(-1)
        norm[t0 * TILE:t1 * TILE] = wd.pow(2).sum(dim=1).sqrt().reshape(-1)
    return q, scale, err, norm


def interleave_i8(q: torch.Tensor) -> torch.Tensor:
    """int8 tiles [nt, K, 64] -> [nt, K4 / 4, 64, 4] (K4 = K rounded up to 4, zero-padded): 4
    consecutive k of one row in 4 bytes, the layout of `head_scan_i8`."""
    nt, K, _ = q.shape
    K4 = (K + 3) // 4 * 4
    qp = torch.zeros((nt, K4, TILE), dtype=torch.int8)
    qp[:, :K] = q
    return qp.view(nt, K4 // 4, 4, TILE).transpose(2, 3).contiguous()


def quantize_rows(x: torch.Tensor, K4: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 -> (qx int8 [M, K4] zero-padded, sx float32 [M]): qx = round(x / sx)
    with sx = max |x| / 127 per row (1 for an all-zero row)."""
    M, K = x.shape
    sx = x.abs().amax(dim=1) / 127.0
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    qx = torch.zeros((M, K4), dtype=torch.int8)
    qx[:, :K] = torch.round(x / sx[:, None]).clamp_(-127, 127).to(torch.int8)
    return qx, sx


def head_scan_i8(qx: torch.Tensor, sx: torch.Tensor, q4: torch.Tensor, scale: torch.Tensor, n_rows: int,
                 n_threads: int | None = None) -> torch.Tensor:
    """y[m, r] = ((float)(qx[m] . q[r]) * sx[m]) * scale[r] in float32, the dot product exact in
    int32 (gemv.c `head_scan_i8`): qx, sx from `quantize_rows`, q4 from `interleave_i8`."""
    lib = native.lib()
    assert lib is not None and qx.dtype == torch.int8 and q4.dtype == torch.int8 and sx.dtype == torch.float32
    M, K4 = qx.shape
    assert q4.shape[1] * 4 == K4 and scale.numel() >= q4.shape[0] * TILE and K4 * 127 * 127 < 2 ** 31
    y = torch.empty((M, n_rows), dtype=torch.float32)
    lib.head_scan_i8(qx.contiguous().data_ptr(), sx.contiguous().data_ptr(), q4.data_ptr(), scale.data_ptr(),
                     y.data_ptr(), M, n_rows, K4, n_rows, n_threads or torch.get_num_threads())
    return y


def _run(fn: str, x: torch.Tensor, tiles: torch.Tensor, n_rows: int, n_threads: int | None) -> torch.Tensor:
    lib = native.lib()
    assert lib is not None, "the batched GEMV needs the compiled CPU kernels (check available())"
    M, K = x.shape
    assert tiles.shape[1] == K and x.dtype == torch.float32
    xp = x.contiguous()
    y = torch.empty((M, n_rows), dtype=torch.float32)
    getattr(lib, fn)(xp.data_ptr(), tiles.data_ptr(), None,
                     y.data_ptr(), M, M, n_rows, K, n_rows, n_threads or torch.get_num_threads())
    return y
