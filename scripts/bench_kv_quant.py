#!/usr/bin/env python3
"""CPU decode attention over quantized KV caches (kernels/cpu/kv_quant.c) against the f16 cache's
(fattn.c) in the same run: one decode row, H query heads over KVH KV heads of D, L keys.

    python scripts/bench_kv_quant.py [--keys 1024] [--heads 14] [--kv-heads 2] [--dim 64] [--reps 50]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from kernels import kv_quant_ref as R
    from kernels.cpu import attention as A
    from kernels.cpu import kv_quant as C

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    H, KVH, D, BS, L = a.heads, a.kv_heads, a.dim, 16, a.keys
    NB = (L + BS - 1) // BS
    g = torch.Generator().manual_seed(0)
    x = torch.randn(NB * BS, KVH, D, generator=g)
    bt = torch.arange(NB, dtype=torch.int32)[None]
    cu, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([L], dtype=torch.int32)
    q = torch.randn(1, H, D, generator=g)
    kf = x.half().reshape(NB, BS, KVH, D)
    runs = [("f16", lambda: A.paged_attention(q, kf, kf, bt, cu, lens, 0.125))]
    for t in R.KV_QUANT_TYPES:
        kq = C.quantize_rows(x, t).reshape(NB, BS, KVH, -1)
        runs.append((t.name.lower(), lambda t=t, kq=kq: C.paged_attention(q, kq, kq, bt, cu, lens, 0.125,
                                                                          k_type=t, v_type=t)))
    base = None
    for name, fn in runs:
        fn()
        t0 = time.perf_counter()
        for _ in range(a.reps):
            fn()
        ms = (time.perf_counter() - t0) / a.reps * 1e3
        base = base or ms
        print(f"{name:7s} {ms:7.3f} ms  x{ms / base:.2f} of f16")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
