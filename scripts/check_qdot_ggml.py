#!/usr/bin/env python3
"""qdot's matmuls in llama.cpp's float order against llama.cpp's own CPU matmul, bit for bit.

For every quantized type and a range of activation row counts (each of llama.cpp's paths: vec_dot
for one row, its repacked gemv/gemm, the tiled K-quant matmul from 8 rows, llamafile's tinyBLAS
from 2), a random weight of that type goes through ggml_mul_mat on the CPU backend of a llama.cpp
build (scripts/bench_qdot_ggml.c: the weight in the repack buffer where llama.cpp's loader puts it)
and through `qdot.matmul(..., exact=1)` (kernels/cpu/qdot_exact.c, chosen by qd_route); prints, per
type, the row counts whose outputs are the same float32 bits and those that are not.

    python scripts/check_qdot_ggml.py [--llama /path/to/llama.cpp] [--types Q4_1,Q5_1] [--threads 2]

--llama: a llama.cpp source tree with build/bin/libggml*.so (default: scripts/build_llama_server.sh's,
/work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp). Exit status 1 when any differs. The
answer holds for the float order of the machine it runs on (llama.cpp's AVX2 and AVX-512 builds
differ; kernels/README.md, "Numerics").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 33]


def main() -> int:
    from kernels.cpu import qdot
    from scripts.bench_qdot import load_llama
    from tests.kernel_oracles import random_qweight

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama", default="/work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-N", type=int, default=64, help="weight rows (a multiple of 8: llama.cpp repacks)")
    ap.add_argument("-K", type=int, default=768, help="weight columns (a multiple of 256)")
    a = ap.parse_args()
    llama = load_llama(a.llama)
    bad = 0
    for name in a.types.split(","):
        qt = Q[name]
        gen = torch.Generator().manual_seed(int(qt))
        w = random_qweight(qt, a.N, a.K, gen)
        raw = np.ascontiguousarray(w.data.numpy())
        h = qdot.prepare(raw, int(qt), a.N, a.K)
        same, differ = [], []
        for M in map(int, a.rows.split(",")):
            x = torch.randn(M, a.K, generator=gen) * 2
            x[:, ::29] *= 7
            g = llama.gb_setup(int(qt), a.N, a.K, raw.ctypes.data, M, a.threads, 1)
            repacked = llama.gb_repacked(g)
            xn = np.ascontiguousarray(x.numpy(), dtype=np.float32)
            llama.gb_set_x(g, xn.ctypes.data)
            llama.gb_run(g)
            want = np.empty((M, a.N), dtype=np.float32)
            llama.gb_get_y(g, want.ctypes.data)
            llama.gb_free(g)
            got = qdot.matmul(x, h, n_threads=a.threads, exact=1).numpy()
            if np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                same.append(M)
            else:
                n = int((got.view(np.uint32) != want.view(np.uint32)).sum())
                err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))
                differ.append(f"{M} ({n}/{got.size} differ, max rel {err:.1e})")
        bad += bool(differ)
        print(f"{name:5s} {'repacked' if repacked else 'plain   '}  same bits at rows {same or '-'}"
              + (f"; differ at rows {', '.join(differ)}" if differ else ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
