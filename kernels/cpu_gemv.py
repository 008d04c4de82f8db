"""Batched GEMV for the CPU decode path: y[M, N] = x[M, K] @ W^T for small M (<= 16).

BLAS sgemm packs the whole weight matrix on every call when M is small, which on a 151,936 x 256
output head costs 2-3x the time of reading the weights once. This kernel reads the weights once
per call whatever M is: W is repacked at load into tiles of 64 output rows (`pack`: [N/64, K, 64],
each tile one contiguous stream), and for every k it broadcasts x[m, k] against the 64 weights of
row k of the tile, accumulating 4 x 4 vectors of 16 floats in registers (4 rows of x at a time,
no horizontal reductions).

The kernel is plain C (GCC vector extensions), compiled on first use with the system compiler
(-O3 -march=native, OpenMP over tiles) into `$TRITIUM_CACHE` (default ~/.cache/tritium) and
called through ctypes. Without a compiler `available()` is False and callers use BLAS instead.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

MAX_M = 16
TILE = 64

_SOURCE = r"""
#include <string.h>
typedef float v16 __attribute__((vector_size(64)));

static inline v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }

/* Wt: [nt, K, 64] tiles; x: [Mp, K] with Mp a multiple of 4 (zero rows past M);
   y[m * ldy + n] for m < M, n < N */
void bgemv_tiles64(const float *restrict x, const float *restrict Wt, float *restrict y,
                   int M, int Mp, int N, int K, long ldy, int nthreads) {
    const int nt = (N + 63) / 64;
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int t = 0; t < nt; ++t) {
        const float *restrict tile = Wt + (size_t)t * K * 64;
        const int n0 = t * 64, nn = N - n0 < 64 ? N - n0 : 64;
        if (M == 1) {  /* one sequence: 4 accumulators, a quarter of the arithmetic */
            v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int k = 0; k < K; ++k) {
                const float *w = tile + (size_t)k * 64;
                float s = x[k];
                a0 += s * ld(w); a1 += s * ld(w + 16); a2 += s * ld(w + 32); a3 += s * ld(w + 48);
            }
            v16 acc[4] = {a0, a1, a2, a3};
            memcpy(y + n0, acc, (size_t)nn * sizeof(float));
            continue;
        }
        for (int m0 = 0; m0 < Mp; m0 += 4) {
            v16 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0};
            v16 a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
            v16 a20 = {0}, a21 = {0}, a22 = {0}, a23 = {0};
            v16 a30 = {0}, a31 = {0}, a32 = {0}, a33 = {0};
            const float *x0 = x + (size_t)m0 * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
            for (int k = 0; k < K; ++k) {
                const float *w = tile + (size_t)k * 64;
                v16 w0 = ld(w), w1 = ld(w + 16), w2 = ld(w + 32), w3 = ld(w + 48);
                float s0 = x0[k], s1 = x1[k], s2 = x2[k], s3 = x3[k];
                a00 += s0 * w0; a01 += s0 * w1; a02 += s0 * w2; a03 += s0 * w3;
                a10 += s1 * w0; a11 += s1 * w1; a12 += s1 * w2; a13 += s1 * w3;
                a20 += s2 * w0; a21 += s2 * w1; a22 += s2 * w2; a23 += s2 * w3;
                a30 += s3 * w0; a31 += s3 * w1; a32 += s3 * w2; a33 += s3 * w3;
            }
            v16 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13},
                             {a20, a21, a22, a23}, {a30, a31, a32, a33}};
            for (int i = 0; i < 4 && m0 + i < M; ++i) {
                float buf[64];
                memcpy(buf, acc[i], sizeof buf);
                memcpy(y + (size_t)(m0 + i) * ldy + n0, buf, (size_t)nn * sizeof(float));
            }
        }
    }
}
"""

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> Path:
    env = os.environ.get("TRITIUM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tritium"


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None or os.environ.get("TRITIUM_NO_CPU_KERNELS"):
        return None
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
    key = hashlib.sha256((_SOURCE + " ".join(flags) + platform.machine() + platform.node()).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_gemv-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src = Path(tmp) / "cpu_gemv.c"
            src.write_text(_SOURCE)
            so = Path(tmp) / "cpu_gemv.so"
            r = subprocess.run([cc, *flags, str(src), "-o", str(so)], capture_output=True, text=True)
            if r.returncode != 0:
                return None
            os.replace(so, out)  # atomic: concurrent builders see a whole file or none
    lib = ctypes.CDLL(str(out))
    lib.bgemv_tiles64.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_int]
    lib.bgemv_tiles64.restype = None
    return lib


def _get() -> ctypes.CDLL | None:
    global _lib, _tried
    if not _tried:
        with _lock:
            if not _tried:
                try:
                    _lib = _build()
                except OSError:
                    _lib = None
                _tried = True
    return _lib


def available() -> bool:
    return _get() is not None


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
    lib = _get()
    assert lib is not None, "bgemv needs the compiled CPU kernel (check available())"
    M, K = x.shape
    assert M <= MAX_M and tiles.shape[1] == K and tiles.dtype == torch.float32 and x.dtype == torch.float32
    Mp = (M + 3) // 4 * 4
    xp = torch.zeros((Mp, K), dtype=torch.float32)
    xp[:M] = x
    y = torch.empty((M, n_rows), dtype=torch.float32)
    lib.bgemv_tiles64(xp.data_ptr(), tiles.data_ptr(), y.data_ptr(), M, Mp, n_rows, K, n_rows,
                      n_threads or torch.get_num_threads())
    return y
