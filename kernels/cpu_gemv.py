"""Batched GEMV for the CPU decode path: y[M, N] = x[M, K] @ W[N, K]^T for small M (<= 16).

BLAS sgemm packs the whole weight matrix for every call when M is small, which on a 151,936 x 256
output head costs 2-3x the time of reading the weights once. This kernel reads each weight row
once and computes its M dot products while the row sits in L1, so a decode step over M sequences
costs about what one sequence costs (memory bound).

The kernel is plain C compiled on first use with the system compiler (gcc/cc, -O3 -march=native,
OpenMP over rows) into `$TRITIUM_CACHE` (default ~/.cache/tritium) and called through ctypes.
Without a compiler `available()` is False and callers fall back to BLAS.
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

_SOURCE = r"""
#include <stddef.h>
/* y[m * ldy + n] = sum_k x[m * K + k] * W[n * K + k], rows n in [0, N) */
void bgemv_f32(const float *restrict x, const float *restrict W, float *restrict y,
               int M, int N, int K, long ldy, int nthreads) {
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int n = 0; n < N; ++n) {
        const float *restrict w = W + (size_t)n * K;
        for (int m = 0; m < M; ++m) {
            const float *restrict xm = x + (size_t)m * K;
            float s = 0.0f;
            #pragma omp simd reduction(+:s)
            for (int k = 0; k < K; ++k) s += xm[k] * w[k];
            y[(size_t)m * ldy + n] = s;
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
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-ffp-contract=fast"]
    key = hashlib.sha256((_SOURCE + " ".join(flags) + platform.machine() + platform.node()).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_gemv-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "cpu_gemv.c"
            src.write_text(_SOURCE)
            so = Path(tmp) / "cpu_gemv.so"
            r = subprocess.run([cc, *flags, str(src), "-o", str(so)], capture_output=True, text=True)
            if r.returncode != 0:
                return None
            os.replace(so, out) if Path(tmp).stat().st_dev == out.parent.stat().st_dev else shutil.copy(so, out)
    lib = ctypes.CDLL(str(out))
    lib.bgemv_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long, ctypes.c_int]
    lib.bgemv_f32.restype = None
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


def bgemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x: [M, K] float32 (M <= MAX_M), w: [N, K] float32 contiguous, CPU -> y: [M, N] float32."""
    lib = _get()
    assert lib is not None, "bgemv needs the compiled CPU kernel (check available())"
    M, K = x.shape
    N = w.shape[0]
    assert M <= MAX_M and w.shape[1] == K and w.dtype == torch.float32 and x.dtype == torch.float32
    x = x.contiguous()
    y = torch.empty((M, N), dtype=torch.float32)
    lib.bgemv_f32(x.data_ptr(), w.data_ptr(), y.data_ptr(), M, N, K, N, torch.get_num_threads())
    return y
