"""Batched GEMV for the CPU decode path: y[M, N] = x[M, K] @ W^T for small M (<= 16).

BLAS sgemm packs the whole weight matrix on every call when M is small, which on a 151,936 x 256
output head costs 2-3x the time of reading the weights once. This kernel (C, `cpu_native`) reads
the weights once per call whatever M is: W is repacked at load into tiles of 64 output rows
(`pack`: [N/64, K, 64], each tile one contiguous stream), and for every k it broadcasts x[m, k]
against the 64 weights of row k of the tile, accumulating 4 x 4 vectors of 16 floats in registers.
Without a compiler `available()` is False and callers use BLAS instead.
"""
from __future__ import annotations

import torch

from . import cpu_native

MAX_M = 16
TILE = 64


def available() -> bool:
    return cpu_native.lib() is not None


def pack(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N / 64), K, 64] float32 tiles (rows past N are zero)."""
    N, K = w.shape
    nt = (N + TILE - 1) // TILE
    out = torch.zeros((nt * TILE, K), dtype=torch.float32)
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
    """x: [M, K] float32 (M <= MAX_M) times the packed [n_rows, K] weight -> y: [M, n_rows].
    `n_threads`: OpenMP threads (default torch's count)."""
    assert tiles.dtype == torch.float32
    return _run("bgemv_tiles64", x, tiles, n_rows, n_threads)


def pack_bf16(tiles: torch.Tensor) -> torch.Tensor:
    """float32 tiles -> the same tiles as bfloat16 bit patterns (int16 storage, round to nearest)."""
    return tiles.to(torch.bfloat16).view(torch.int16).contiguous()


def bgemv_bf16(x: torch.Tensor, tiles_bf16: torch.Tensor, n_rows: int) -> torch.Tensor:
    """`bgemv` on bfloat16 tiles: each product uses the weight rounded to bfloat16 (relative error
    <= 2^-8 per weight), accumulated in float32."""
    assert tiles_bf16.dtype == torch.int16
    return _run("bgemv_tiles64_bf16", x, tiles_bf16, n_rows, None)


def _run(fn: str, x: torch.Tensor, tiles: torch.Tensor, n_rows: int, n_threads: int | None) -> torch.Tensor:
    lib = cpu_native.lib()
    assert lib is not None, "the batched GEMV needs the compiled CPU kernels (check available())"
    M, K = x.shape
    assert M <= MAX_M and tiles.shape[1] == K and x.dtype == torch.float32
    Mp = (M + 3) // 4 * 4
    xp = torch.zeros((Mp, K), dtype=torch.float32)
    xp[:M] = x
    y = torch.empty((M, n_rows), dtype=torch.float32)
    getattr(lib, fn)(xp.data_ptr(), tiles.data_ptr(), y.data_ptr(), M, Mp, n_rows, K, n_rows,
                     n_threads or torch.get_num_threads())
    return y
