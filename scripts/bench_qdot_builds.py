#!/usr/bin/env python3
"""Builds of the qdot kernels against each other on one decode step's matmuls, interleaved.

Every build compiles kernels/cpu/qdot_*.c with its own `-D` defines (the tuning knobs of
qdot_mk_avx2.h, qdot_gemm.c: QD_PF, QD_PF_MR, QD_CHUNK_BYTES, ...), runs the matmuls of one decode step of MODEL
(per layer the q/k/v group, o, the gate/up group, down; then the head; the groups the server uses)
at batch M, and the builds take turns rep by rep, so that a shared machine's swings in memory
bandwidth (+-15 % here from one minute to the next) hit them alike. Every build must give the same
bits. --llama adds llama.cpp's own CPU matmuls of the same weights (scripts/bench_qdot_ggml.c, one
ggml matmul per weight as llama.cpp runs them) as one more contestant.

    python scripts/bench_qdot_builds.py MODEL cur= nopf=-DQD_PF_MR=5 --m 1 --reps 20 \\
        --llama /work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp

Prints min / p25 / median ms per step for each build; --per-kind also the median time of each kind
of matmul over a step (q/k/v, o, gate/up, down, head; llama.cpp's q, k, v and gate, up apart), each
call timed alone. The weights are repacked once (the layout is the same for every build: defines
that change it are not comparable here).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernels.cpu import qdot, qdot_lib  # noqa: E402
from runtime.model.gguf import read_gguf  # noqa: E402
from scripts.bench_qdot import _np_view, llama_matmuls, load_llama  # noqa: E402

SRC = REPO / "kernels" / "cpu"
FLAGS = ["-O3", "-mtune=native", "-std=gnu11", "-ffp-contract=off", *qdot_lib.ISA_FLAGS["avx512vnni"],
         "-fopenmp", "-shared", "-fPIC"]


def build(name: str, defines: list[str]) -> ctypes.CDLL:
    sources = [SRC / s for s in qdot_lib._SOURCES]
    text = " ".join(defines) + "".join(p.read_text() for p in [*sources, *sorted(SRC.glob("*.h"))])
    cache = Path(os.environ.get("TRITIUM_CACHE", Path.home() / ".cache" / "tritium"))
    out = cache / f"qdot-build-{name}-{hashlib.sha1(text.encode()).hexdigest()[:12]}.so"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", *FLAGS, *defines, *map(str, sources), "-o", str(out), "-lm"], check=True)
    lb = ctypes.CDLL(str(out))
    p, i, l_ = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    lb.qd_group_run.argtypes = [p, p, l_, i, p, l_, i]
    lb.qd_group_run.restype = i
    return lb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("builds", nargs="+", help="NAME=-DX=1,-DY=2 (NAME= for the sources as they are)")
    ap.add_argument("--m", type=int, default=1, help="activation rows (sequences in the decode batch)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama", default=None, help="llama.cpp source tree with build/bin/libggml*.so")
    ap.add_argument("--per-kind", action="store_true", help="also time each kind of matmul of a step")
    args = ap.parse_args()
    if "avx512vnni" not in qdot_lib.supported_isas():
        sys.exit("this script builds the AVX-512 VNNI kernels; this CPU cannot run them")
    libs = {}
    for spec in args.builds:
        name, _, defs = spec.partition("=")
        libs[name] = build(name, [d for d in defs.split(",") if d])

    gf = read_gguf(args.model)
    mm = np.memmap(args.model, dtype=np.uint8, mode="r")
    infos = {t.name: t for t in gf.tensors}

    def prep(name):
        info = infos[name]
        cols = info.shape[0]
        return qdot.prepare(_np_view(mm, info), int(info.qtype), info.n_elements // cols, cols, args.threads)

    nl = 1 + max(int(n.split(".")[1]) for n in infos if n.startswith("blk."))
    kinds = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    groups = []
    for i in range(nl):
        w = {k: prep(f"blk.{i}.{k}.weight") for k in kinds}
        groups += [qdot.group([w["attn_q"], w["attn_k"], w["attn_v"]]), qdot.group([w["attn_output"]]),
                   qdot.group([w["ffn_gate"], w["ffn_up"]]), qdot.group([w["ffn_down"]])]
    head = "output.weight" if "output.weight" in infos else "token_embd.weight"
    groups.append(qdot.group([prep(head)]))
    M = args.m
    xs = {K: torch.randn(M, K) for K in {g.K for g in groups}}
    ys = [torch.empty(M, g.rows) for g in groups]

    group_kinds = ["q/k/v", "o", "gate/up", "down"] * nl + ["head"]

    def step(lb, per_kind=None):
        for g, y, kind in zip(groups, ys, group_kinds):
            x = xs[g.K]
            t0 = time.perf_counter()
            lb.qd_group_run(g._ptr, x.data_ptr(), x.stride(0), M, y.data_ptr(), y.stride(0), args.threads)
            if per_kind is not None:
                per_kind[kind] = per_kind.get(kind, 0.0) + time.perf_counter() - t0

    steps = {name: (lambda lb=lb: step(lb)) for name, lb in libs.items()}
    ref = None
    for name, lb in libs.items():
        step(lb)
        if ref is None:
            ref = [y.clone() for y in ys]
        elif not all(torch.equal(a, b) for a, b in zip(ref, ys)):
            sys.exit(f"build {name} gives other bits than {next(iter(libs))}")
    if args.llama:
        ll = load_llama(args.llama)
        gbs = llama_matmuls(ll, mm, infos, [f"blk.{i}.{k}.weight" for i in range(nl) for k in kinds] + [head],
                            M, args.threads)

        llama_kinds = [k.removeprefix("attn_").removeprefix("ffn_") for k in kinds] * nl + ["head"]

        def lstep(per_kind=None):
            for (g_, _), kind in zip(gbs, llama_kinds):
                t0 = time.perf_counter()
                ll.gb_run(g_)
                if per_kind is not None:
                    per_kind[kind] = per_kind.get(kind, 0.0) + time.perf_counter() - t0
        steps["llama.cpp"] = lstep
    times = {name: [] for name in steps}
    for _ in range(args.reps):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"{args.model}: {nl} layers + head, M={M}, {args.threads} threads, {args.reps} reps interleaved")
    for name, t in times.items():
        print(f"  {name:14s} min {min(t) * 1e3:7.2f}  p25 {np.percentile(t, 25) * 1e3:7.2f}  "
              f"median {statistics.median(t) * 1e3:7.2f} ms")
    if args.per_kind:  # the first build and llama.cpp, each call timed alone, median over reps
        first = next(iter(libs))
        runs = {first: lambda d: step(libs[first], d)}
        if args.llama:
            runs["llama.cpp"] = lstep
        acc: dict[str, dict[str, list[float]]] = {name: {} for name in runs}
        for _ in range(args.reps):
            for name, fn in runs.items():
                d: dict[str, float] = {}
                fn(d)
                for kind, v in d.items():
                    acc[name].setdefault(kind, []).append(v)
        for name, by_kind in acc.items():
            print(f"  {name:14s} " + ", ".join(f"{k} {statistics.median(v) * 1e3:.2f}" for k, v in by_kind.items())
                  + " ms per step")


if __name__ == "__main__":
    main()
