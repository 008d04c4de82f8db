"""Benchmark of kernels/cpu/qdot (integer-dot quantized matmul) on the real model's shapes.

For every distinct (type, shape) of the model's matmul weights (first layer's tensors + the output
head): decode at batch 1 and 4 (quantization of the activations included; us, GB/s of weight bytes
read) and prefill at 430 rows (GOPS = 2 M N K / t), against the float-tile kernel on main
(`kernels.cpu.qgemv`, "old"). Timings: minimum over --reps repetitions, the two kernels interleaved
rep by rep (the cores are shared with other jobs: minima, not means).

    python scripts/bench_qdot.py                      # the table
    python scripts/bench_qdot.py --load               # + repack time / RSS of the whole model
    python scripts/bench_qdot.py --no-old --isa avx2  # qdot only, a forced ISA
    python scripts/bench_qdot.py --llama /path/to/llama.cpp   # + llama.cpp's own CPU matmul

--llama: a llama.cpp source tree with a build/ (build/bin/libggml*.so); scripts/bench_qdot_ggml.c is
compiled against it and runs ggml_mul_mat on the CPU backend (weights in the repack buffer type
where llama.cpp puts them) in this process, interleaved with qdot; its output is also compared with
qdot's (relative difference printed: ~1e-7 for the K-quants, ~2e-4 for the 32-blocks, whose
activation scales llama.cpp rounds to fp16).
--cpu-time: per-thread CPU time instead of wall time (only meaningful with --threads 1; immune to
preemption by other jobs on a shared machine).

Default model: /work/models/qwen2.5-coder-0.5b-q4_k_m.gguf (or $TRITIUM_BENCH_MODEL).
"""
from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q  # noqa: E402

from runtime.model.gguf import read_gguf  # noqa: E402


def _np_view(mm: np.ndarray, info) -> np.ndarray:
    """The bytes of one tensor in a uint8 mapping of the file."""
    return mm[info.offset:info.offset + info.n_bytes]


def _load_qdot():
    from kernels.cpu import qdot
    return qdot


CLOCK = time.perf_counter


def tmin(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
    return best


def load_llama(tree: str):
    """scripts/bench_qdot_ggml.c built against a llama.cpp tree -> ctypes library."""
    import ctypes
    import hashlib
    import subprocess
    src = REPO / "scripts" / "bench_qdot_ggml.c"
    tree_p = Path(tree)
    bin_dir = tree_p / "build" / "bin"
    key = hashlib.sha256(src.read_bytes() + str(tree_p.resolve()).encode()).hexdigest()[:12]
    out = Path(os.environ.get("TRITIUM_CACHE", Path.home() / ".cache" / "tritium")) / f"bench_qdot_ggml-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), f"-I{tree_p / 'ggml' / 'include'}", f"-L{bin_dir}",
                        "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{bin_dir}", "-o", str(out)], check=True)
    lb = ctypes.CDLL(str(out))
    p, i = ctypes.c_void_p, ctypes.c_int
    lb.gb_setup.argtypes = [i, i, i, p, i, i, i]
    lb.gb_setup.restype = p
    for name in ("gb_set_x", "gb_get_y"):
        getattr(lb, name).argtypes = [p, p]
    for name in ("gb_run", "gb_repacked", "gb_free"):
        getattr(lb, name).argtypes = [p]
    return lb


def llama_matmuls(llama, mm, infos, names, M: int, threads: int) -> list:
    """One ggml matmul per weight of `names` (llama.cpp runs them one by one), each with its own
    random float32 input of M rows: [(handle, input)]; `llama.gb_run(handle)` runs one, `gb_free`
    frees it."""
    out = []
    for name in names:
        info = infos[name]
        cols = info.shape[0]
        g_ = llama.gb_setup(int(info.qtype), info.n_elements // cols, cols, _np_view(mm, info).ctypes.data, M, threads, 1)
        xin = torch.randn(M, cols)
        llama.gb_set_x(g_, xin.data_ptr())
        out.append((g_, xin))
    return out


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def step_bench(qdot, gf, mm, args) -> None:
    """All matmuls of one decode step, in model order, with the groups the runtime would use."""
    infos = {t.name: t for t in gf.tensors}
    nl = 1 + max(int(n.split(".")[1]) for n in infos if n.startswith("blk."))

    def prep(name):
        info = infos[name]
        cols = info.shape[0]
        return qdot.prepare(_np_view(mm, info), int(info.qtype), info.n_elements // cols, cols, args.threads)

    t0 = time.perf_counter()
    layers = []
    nbytes = 0
    for i in range(nl):
        b = f"blk.{i}."
        ws = {k: prep(b + k + ".weight") for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
        nbytes += sum(infos[b + k + ".weight"].n_bytes for k in ws)
        layers.append((qdot.group([ws["attn_q"], ws["attn_k"], ws["attn_v"]]), qdot.group([ws["attn_output"]]),
                       qdot.group([ws["ffn_gate"], ws["ffn_up"]]), qdot.group([ws["ffn_down"]])))
    head = qdot.group([prep("output.weight")])
    nbytes += infos["output.weight"].n_bytes
    llama = load_llama(args.llama) if args.llama else None
    order = [f"blk.{i}.{k}.weight" for i in range(nl)
             for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")] + ["output.weight"]
    print(f"step: {nl} layers + head repacked in {time.perf_counter() - t0:.2f} s; {nbytes / 1e6:.0f} MB of weights per step")
    for M in (1, 2, 4, 8):
        h = torch.randn(M, head.K)
        f = torch.randn(M, layers[0][3].K)

        def step():
            for qkv, o, gu, down in layers:
                qdot.matmul_group(h, qkv, n_threads=args.threads)
                qdot.matmul_group(h, o, n_threads=args.threads)
                qdot.matmul_group(h, gu, n_threads=args.threads)
                qdot.matmul_group(f, down, n_threads=args.threads)
            qdot.matmul_group(h, head, n_threads=args.threads)
        gbs = llama_matmuls(llama, mm, infos, order, M, args.threads) if llama else []

        def lstep():
            for g_, _ in gbs:
                llama.gb_run(g_)
        step()
        best = lbest = float("inf")
        for _ in range(max(3, args.reps // 3)):  # interleaved
            best = min(best, tmin(step, 1))
            if gbs:
                lbest = min(lbest, tmin(lstep, 1))
        line = (f"step M={M}: qdot {best * 1e3:.2f} ms ({nbytes / best / 1e9:.1f} GB/s of weights, "
                f"{M / best:.1f} tok/s if matmuls were all)")
        if gbs:
            line += f" | llama.cpp {lbest * 1e3:.2f} ms ({nbytes / lbest / 1e9:.1f} GB/s) | {lbest / best:.2f}x"
            for g_, _ in gbs:
                llama.gb_free(g_)
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("TRITIUM_BENCH_MODEL", "/work/models/qwen2.5-coder-0.5b-q4_k_m.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--prefill", type=int, default=430)
    ap.add_argument("--isa", default=None, help="force TRITIUM_CPU_ISA")
    ap.add_argument("--no-old", action="store_true", help="skip the float-tile kernel of main")
    ap.add_argument("--load", action="store_true", help="time the repack of every quantized weight of the model")
    ap.add_argument("--release", action="store_true", help="--load with prepare(release_source=True)")
    ap.add_argument("--only", default=None, help="comma-separated tensor-name substrings to bench")
    ap.add_argument("--llama", default=None, help="llama.cpp source tree with build/bin/libggml*.so")
    ap.add_argument("--cpu-time", action="store_true", help="thread CPU time (use with --threads 1)")
    ap.add_argument("--step", action="store_true",
                    help="also time the matmuls of one whole decode step (24 x (q/k/v group, o, gate/up group, "
                         "down) + head; weights streamed from DRAM as in a real step) at batch 1, 2, 4, 8")
    ap.add_argument("--warm", action="store_true",
                    help="decode (M < 16) with cache-warm weights (default: before each timed decode call a "
                         "64 MB sweep evicts the caches, so weights come from DRAM as in a real decode step; "
                         "the activations are touched again after the sweep)")
    args = ap.parse_args()
    if args.isa:
        os.environ["TRITIUM_CPU_ISA"] = args.isa
    if args.cpu_time:
        global CLOCK
        CLOCK = time.thread_time
    torch.set_num_threads(args.threads)
    qdot = _load_qdot()
    print(f"qdot ISA: {qdot.current_isa()}  threads: {args.threads}  reps: {args.reps} (min, interleaved)  "
          f"clock: {'thread CPU time' if args.cpu_time else 'wall'}  model: {args.model}")
    llama = load_llama(args.llama) if args.llama else None

    gf = read_gguf(args.model)
    mm = np.memmap(args.model, dtype=np.uint8, mode="r")
    infos = {t.name: t for t in gf.tensors}

    if args.load:
        import gc
        r_start = rss_mib()
        lm = np.memmap(args.model, dtype=np.uint8, mode="r")  # its own mapping, dropped below
        t0 = time.perf_counter()
        c0 = time.process_time()
        handles, gguf_bytes, peak = [], 0, 0.0
        for info in gf.tensors:
            if len(info.shape) < 2 or int(info.qtype) not in qdot.TYPES:
                continue
            cols = info.shape[0]
            rows = info.n_elements // cols
            handles.append(qdot.prepare(_np_view(lm, info), int(info.qtype), rows, cols, args.threads,
                                        release_source=args.release))
            peak = max(peak, rss_mib())
            gguf_bytes += info.n_bytes
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        rep = sum(h.nbytes for h in handles)
        r_mapped = rss_mib()
        del lm
        gc.collect()
        print(f"repack of {len(handles)} tensors ({args.threads} threads): {dt:.2f} s wall, {dc:.2f} s CPU; "
              f"GGUF {gguf_bytes / 2**20:.1f} MiB -> repacked {rep / 2**20:.1f} MiB (+{100 * (rep / gguf_bytes - 1):.3f}%); "
              f"RSS {r_start:.0f} -> {r_mapped:.0f} MiB with the file mapping (peak {peak:.0f}, release_source={args.release}) "
              f"-> {rss_mib():.0f} MiB once it is dropped")
        del handles

    if args.step:
        step_bench(qdot, gf, mm, args)

    # one tensor per distinct (type, shape): first layer + the output head
    picked = collections.OrderedDict()
    counts = collections.Counter()
    for info in gf.tensors:
        if len(info.shape) < 2 or int(info.qtype) not in qdot.TYPES or info.name == "token_embd.weight":
            continue
        key = (info.qtype, tuple(info.shape))
        counts[key] += 1
        picked.setdefault(key, info.name)
    if args.only:
        subs = args.only.split(",")
        picked = collections.OrderedDict((k, v) for k, v in picked.items() if any(s in v for s in subs))

    old = None
    if not args.no_old:
        from kernels.cpu import qgemv as cpu_qgemv
        from kernels.qweight import QWeight
        old = cpu_qgemv if cpu_qgemv.available() else None

    gen = torch.Generator().manual_seed(0)
    flush = np.ones(16 << 20, dtype=np.float32)  # 64 MB, swept by numpy (one thread, no OpenMP pool)
    head = f"{'tensor':24s} {'type':5s} {'rows x cols':>12s} {'n':>3s} | {'M':>4s} {'qdot us':>9s} {'GB/s':>6s} {'GOPS':>6s}"
    if llama:
        head += f" | {'llama us':>9s} {'GB/s':>6s} {'GOPS':>6s} {'vs':>6s}"
    if old:
        head += f" | {'old us':>9s} {'GB/s':>6s} {'GOPS':>6s} {'vs':>6s}"
    print(head)
    per_token = collections.defaultdict(float)
    notes: list[str] = []
    for (qtype, shape), name in picked.items():
        info = infos[name]
        cols, rows = shape[0], info.n_elements // shape[0]
        raw = _np_view(mm, info)
        h = qdot.prepare(raw, int(qtype), rows, cols, args.threads)
        ow = None
        if old:
            ow = old.pack(QWeight(torch.from_numpy(np.array(raw)).reshape(rows, -1), qtype, rows, cols))
        is_head = name == "output.weight"
        for M in (1, 4, args.prefill):
            if M == args.prefill and is_head:
                continue  # prefill only needs the last position's logits
            x = torch.randn(M, cols, generator=gen)
            reps = args.reps if M < 16 else max(3, args.reps // 6)
            if M >= 16 and rows * cols > 10_000_000:
                reps = max(3, reps // 2)
            gbh = None
            if llama:
                gbh = llama.gb_setup(int(qtype), rows, cols, raw.ctypes.data, M, args.threads, 1)
                llama.gb_set_x(gbh, x.data_ptr())
            y = qdot.matmul(x, h, args.threads)
            cold = M < 16 and not args.warm
            xn = x.numpy()

            def timed(fn):
                if cold:
                    flush.sum()  # evict the weights (64 MB > L3), then re-touch the activations
                    xn.sum()
                return tmin(fn, 1)

            tq = tl = to = float("inf")
            for r in range(reps):  # interleaved A/B(/C)
                tq = min(tq, timed(lambda: qdot.matmul(x, h, args.threads)))
                if gbh:
                    tl = min(tl, timed(lambda: llama.gb_run(gbh)))
                if ow is not None and (M < 16 or r < 2):
                    to = min(to, timed(lambda: old.qgemv(x, ow, args.threads)))
            ops = 2.0 * M * rows * cols
            line = (f"{name.replace('.weight', ''):24s} {Q(qtype).name:5s} {rows:>6d}x{cols:<5d} {counts[(qtype, shape)]:>3d} | "
                    f"{M:>4d} {tq * 1e6:>9.1f} {info.n_bytes / tq / 1e9:>6.1f} {ops / tq / 1e9:>6.1f}")
            if gbh:
                yl = torch.empty(M, rows)
                llama.gb_get_y(gbh, yl.data_ptr())
                diff = float((y - yl).norm() / yl.norm())
                line += (f" | {tl * 1e6:>9.1f} {info.n_bytes / tl / 1e9:>6.1f} {ops / tl / 1e9:>6.1f} {tl / tq:>5.2f}x")
                notes.append(f"{name} M={M}: llama.cpp {'repacked' if llama.gb_repacked(gbh) else 'plain'} buffer, "
                             f"|y_qdot - y_llama| / |y_llama| = {diff:.1e}")
                llama.gb_free(gbh)
                per_token[("llama", M)] += tl * counts[(qtype, shape)]
            if ow is not None:
                line += (f" | {to * 1e6:>9.1f} {ow.nbytes / to / 1e9:>6.1f} {ops / to / 1e9:>6.1f} {to / tq:>5.2f}x")
                per_token[("old", M)] += to * counts[(qtype, shape)]
            print(line, flush=True)
            per_token[("qdot", M)] += tq * counts[(qtype, shape)]
        del h, ow
    if not args.only:
        print("\nsum over the model's matmuls (count x time, head not in prefill): " + ", ".join(
            f"{k} M={m}: {v * 1e3:.2f} ms" for (k, m), v in sorted(per_token.items(), key=lambda kv: (kv[0][1], kv[0][0]))))
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
