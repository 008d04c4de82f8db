"""Time every Triton kernel at real layer shapes against torch, on one CUDA GPU.

Prints achieved GB/s and TFLOP/s next to the measured peaks (device-copy bandwidth, fp16
torch.matmul) plus each kernel's relative error against the torch baseline at that shape.
`--smoke` runs the same code paths at tiny shapes (on CPU with TRITON_INTERPRET=1) so the script
itself can be checked without a GPU. Budget: well under 8 minutes on an H100/H200.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from kernels import ref  # noqa: E402
from tests.kernel_oracles import Q, random_qweight, rel_err  # noqa: E402

OPS = kernels.Backend("triton")

# (name, rows=N, cols=K) per model: fused qkv, attention output, fused gate/up, down
MODELS = {
    "llama3-8b": dict(H=32, KVH=8, D=128, C=4096, F=14336),
    "qwen2.5-7b": dict(H=28, KVH=4, D=128, C=3584, F=18944),
}


def linear_shapes(m):
    H, KVH, D, C, Fd = m["H"], m["KVH"], m["D"], m["C"], m["F"]
    return [("qkv", (H + 2 * KVH) * D, C), ("o", C, H * D), ("gate_up", 2 * Fd, C), ("down", C, Fd)]


SMOKE = "--smoke" in sys.argv


def timeit(fn, dev, warmup=3, rep=20, budget_s=1.0):
    """Median seconds per call."""
    if SMOKE:
        warmup, rep = 0, 1
    for _ in range(warmup):
        fn()
    times = []
    t_end = time.perf_counter() + budget_s
    for _ in range(rep):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end and len(times) >= 3:
            break
    times.sort()
    return times[len(times) // 2]


def peaks(dev, smoke):
    n = (1 << 28) if not smoke else (1 << 16)  # 1 GiB of float32
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    t = timeit(lambda: b.copy_(a), dev)
    bw = 2 * a.numel() * 4 / t
    del a, b
    s = 8192 if not smoke else 64
    x = torch.randn(s, s, device=dev, dtype=torch.float16 if dev == "cuda" else torch.float32)
    t = timeit(lambda: x @ x, dev)
    return bw, 2 * s**3 / t


class Report:
    def __init__(self, bw, fl):
        self.bw, self.fl = bw, fl
        self.rows: list[dict] = []
        print(f"measured peak: {bw / 1e9:8.1f} GB/s (device copy), {fl / 1e12:7.1f} TFLOP/s (fp16 matmul)")
        print(f"{'kernel':58s} {'ms':>9s} {'GB/s':>8s} {'%bw':>5s} {'TFLOP/s':>8s} {'%fl':>5s} "
              f"{'torch ms':>9s} {'speedup':>7s} {'rel.err':>8s}")

    def row(self, name, t, nbytes, flops, t_ref=None, err=None):
        gb = nbytes / t
        fl = flops / t
        ref_s = f"{t_ref * 1e3:9.3f} {t_ref / t:7.2f}" if t_ref else f"{'-':>9s} {'-':>7s}"
        err_s = f"{err:8.1e}" if err is not None else f"{'-':>8s}"
        print(f"{name:58s} {t * 1e3:9.3f} {gb / 1e9:8.1f} {100 * gb / self.bw:5.1f} {fl / 1e12:8.2f} "
              f"{100 * fl / self.fl:5.1f} {ref_s} {err_s}", flush=True)
        self.rows.append({"name": name, "ms": t * 1e3, "GBps": gb / 1e9, "pct_bw": 100 * gb / self.bw,
                          "TFLOPs": fl / 1e12, "torch_ms": t_ref * 1e3 if t_ref else None,
                          "speedup_vs_torch": t_ref / t if t_ref else None, "rel_err": err})

    def find(self, prefix):
        return next((r for r in self.rows if r["name"].startswith(prefix)), None)

    def summary(self) -> dict:
        """The figures the GPU check's summary shows (issue 14): GEMV bandwidth against the copy
        bandwidth at the 8B down projection, paged decode against SDPA."""
        out = {"copy_GBps": self.bw / 1e9, "fp16_matmul_TFLOPs": self.fl / 1e12}
        for q in ("Q4_K", "Q8_0"):
            r = self.find(f"qmatmul llama3-8b.down {q} M=1 ")
            out[f"gemv_{q}_4096x14336_pct_copy_bw"] = r and r["pct_bw"]
        for r in self.rows:
            if r["name"].startswith("paged_decode"):
                out[f"{r['name']} speedup_vs_sdpa"] = r["speedup_vs_torch"]
        return out


def guarded(fn):
    def run(*a, **k):
        try:
            fn(*a, **k)
        except Exception:  # keep going: one broken shape must not hide the others
            print(f"FAILED {fn.__name__}{a[1:] if len(a) > 1 else ''}:", flush=True)
            traceback.print_exc(limit=3)
    return run


@guarded
def bench_qmatmul(rep, name, N, K, qtype, M, dev, act):
    w = random_qweight(qtype, N, K, device=dev)
    wd = ref.dequantize(w, act) if dev == "cpu" else OPS.dequantize(w, act)
    x = torch.randn(M, K, device=dev, dtype=act)
    t = timeit(lambda: OPS.qmatmul(x, w), dev)
    t_ref = timeit(lambda: x @ wd.T, dev)
    err = rel_err(OPS.qmatmul(x, w).float(), (x.float() @ wd.float().T))
    nbytes = w.nbytes + x.numel() * x.element_size() + M * N * x.element_size()
    rep.row(f"qmatmul {name} {qtype.name} M={M} N={N} K={K}", t, nbytes, 2 * M * N * K, t_ref, err)


def paged_kv(S, L, KVH, D, BS, dev, dtype):
    nb = (L + BS - 1) // BS
    NB = S * nb
    perm = torch.randperm(NB, device=dev).to(torch.int32)
    bt = perm.view(S, nb)
    kc = torch.randn(NB, BS, KVH, D, device=dev, dtype=dtype)
    vc = torch.randn(NB, BS, KVH, D, device=dev, dtype=dtype)
    return kc, vc, bt


def gather(cache, bt, L):
    S, nb = bt.shape
    NB, BS, KVH, D = cache.shape
    return cache[bt.long()].reshape(S, nb * BS, KVH, D)[:, :L].permute(0, 2, 1, 3)  # [S, KVH, L, D]


@guarded
def bench_decode(rep, name, m, S, L, dev, dtype, BS=16):
    H, KVH, D = m["H"], m["KVH"], m["D"]
    kc, vc, bt = paged_kv(S, L, KVH, D, BS, dev, dtype)
    q = torch.randn(S, H, D, device=dev, dtype=dtype)
    cu = torch.arange(S + 1, device=dev, dtype=torch.int32)
    lens = torch.full((S,), L, device=dev, dtype=torch.int32)
    scale = 1 / math.sqrt(D)
    call = lambda: OPS.paged_attention(q, kc, vc, bt, cu, lens, scale)  # noqa: E731
    t = timeit(call, dev)
    K = gather(kc, bt, L).repeat_interleave(H // KVH, 1).contiguous()
    V = gather(vc, bt, L).repeat_interleave(H // KVH, 1).contiguous()
    qq = q[:, :, None, :]
    ref = lambda: F.scaled_dot_product_attention(qq, K, V, scale=scale)  # noqa: E731
    t_ref = timeit(ref, dev)
    err = rel_err(call().float(), ref()[:, :, 0].float())
    nbytes = 2 * S * L * KVH * D * kc.element_size() + 2 * q.numel() * q.element_size()
    rep.row(f"paged_decode {name} S={S} ctx={L}", t, nbytes, 4 * S * H * L * D, t_ref, err)


@guarded
def bench_prefill(rep, name, m, ql, L, dev, dtype, BS=16):
    H, KVH, D = m["H"], m["KVH"], m["D"]
    kc, vc, bt = paged_kv(1, L, KVH, D, BS, dev, dtype)
    q = torch.randn(ql, H, D, device=dev, dtype=dtype)
    cu = torch.tensor([0, ql], device=dev, dtype=torch.int32)
    lens = torch.tensor([L], device=dev, dtype=torch.int32)
    scale = 1 / math.sqrt(D)
    call = lambda: OPS.paged_attention(q, kc, vc, bt, cu, lens, scale)  # noqa: E731
    t = timeit(call, dev)
    K = gather(kc, bt, L).repeat_interleave(H // KVH, 1)
    V = gather(vc, bt, L).repeat_interleave(H // KVH, 1)
    qq = q.permute(1, 0, 2)[None]
    mask = torch.arange(L, device=dev)[None, :] <= (L - ql + torch.arange(ql, device=dev))[:, None]
    ref = lambda: F.scaled_dot_product_attention(qq, K, V, attn_mask=mask, scale=scale)  # noqa: E731
    t_ref = timeit(ref, dev)
    err = rel_err(call().float(), ref()[0].permute(1, 0, 2).float())
    causal_pairs = ql * (L - ql) + ql * (ql + 1) / 2
    nbytes = 2 * L * KVH * D * kc.element_size() + 2 * q.numel() * q.element_size()
    rep.row(f"paged_prefill {name} q={ql} ctx={L}", t, nbytes, 4 * H * D * causal_pairs, t_ref, err)


@guarded
def bench_small(rep, m, T, dev, dtype):
    C, Fd, H, KVH, D = m["C"], m["F"], m["H"], m["KVH"], m["D"]
    x = torch.randn(T, C, device=dev, dtype=dtype)
    r = torch.randn(T, C, device=dev, dtype=dtype)
    w = torch.randn(C, device=dev, dtype=torch.float32)
    e = x.element_size()
    t = timeit(lambda: OPS.rms_norm(x, w, 1e-6), dev)
    t_ref = timeit(lambda: ref.rms_norm(x, w, 1e-6), dev)
    err = rel_err(OPS.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    rep.row(f"rms_norm T={T} C={C}", t, 2 * T * C * e, 0, t_ref, err)
    t = timeit(lambda: OPS.add_rms_norm(x, r, w, 1e-6), dev)
    t_ref = timeit(lambda: ref.add_rms_norm(x, r, w, 1e-6), dev)
    rep.row(f"add_rms_norm T={T} C={C}", t, 4 * T * C * e, 0, t_ref)
    q = torch.randn(T, H, D, device=dev, dtype=dtype)
    pos = torch.arange(T, device=dev) + 1000
    inv = 1.0 / (500000 ** (torch.arange(D // 2, device=dev, dtype=torch.float32) * 2 / D))
    t = timeit(lambda: OPS.rope(q, pos, inv, False), dev)
    t_ref = timeit(lambda: ref.rope(q, pos, inv, False), dev)
    err = rel_err(OPS.rope(q, pos, inv, False), ref.rope(q, pos, inv, False))
    rep.row(f"rope T={T} H={H} D={D}", t, 2 * q.numel() * e, 0, t_ref, err)
    gu = torch.randn(T, 2 * Fd, device=dev, dtype=dtype)
    g, u = gu[:, :Fd], gu[:, Fd:]
    t = timeit(lambda: OPS.silu_mul(g, u), dev)
    t_ref = timeit(lambda: ref.silu_mul(g, u), dev)
    rep.row(f"silu_mul T={T} F={Fd}", t, 3 * T * Fd * e, 0, t_ref,
            rel_err(OPS.silu_mul(g, u), ref.silu_mul(g, u)))
    NB, BS = max(64, 4 * T), 16
    kc = torch.zeros(NB, BS, KVH, D, device=dev, dtype=dtype)
    vc = torch.zeros_like(kc)
    k = torch.randn(T, KVH, D, device=dev, dtype=dtype)
    slots = torch.randperm(NB * BS, device=dev)[:T]
    t = timeit(lambda: OPS.write_kv(k, k, kc, vc, slots), dev)
    t_ref = timeit(lambda: ref.write_kv(k, k, kc, vc, slots), dev)
    rep.row(f"write_kv T={T} KVH={KVH} D={D}", t, 4 * k.numel() * e, 0, t_ref)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter ok)")
    ap.add_argument("--out", default=None, help="write timings.json (every row + the summary) here")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not args.smoke:
        sys.exit("no CUDA device: use --smoke (with TRITON_INTERPRET=1) to check the script only")
    act = torch.bfloat16 if dev == "cuda" else torch.float32  # the engine's activations on CUDA
    t0 = time.time()
    if dev == "cuda":
        print(torch.cuda.get_device_name(), "torch", torch.__version__)
    rep = Report(*peaks(dev, args.smoke))
    if args.smoke:
        models = {"tiny": dict(H=4, KVH=2, D=64, C=256, F=256)}
        batches, contexts, prefills = [1, 20], [40], [(8, 40)]
        fmt_sweep = [Q.Q4_K]
        all_fmts = [Q.Q8_0]
    else:  # one 8B model: fits the GPU check's time budget (scripts/gpu_check.sh)
        models = {"llama3-8b": MODELS["llama3-8b"]}
        batches, contexts = [1, 8, 64], [512, 4096, 32768]
        prefills = [(512, 512), (4096, 4096)]
        fmt_sweep = [Q.Q4_K, Q.Q6_K, Q.Q8_0]
        all_fmts = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                    Q.F16, Q.BF16]
    first = next(iter(models.values()))
    from kernels.triton.tuning import tuning

    with tuning():  # each matmul key's configs timed once (as the engine's start-up does)
        run_plan(rep, args, dev, act, models, batches, contexts, prefills, fmt_sweep, all_fmts, first)
    print(f"total {time.time() - t0:.0f} s")
    summary = rep.summary()
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "timings.json").write_text(json.dumps({"rows": rep.rows, "summary": summary}, indent=1))


def run_plan(rep, args, dev, act, models, batches, contexts, prefills, fmt_sweep, all_fmts, first):
    for qt in all_fmts:  # every format once, decode and prefill, at the 8B down projection
        for M in (1, batches[-1]):
            bench_qmatmul(rep, f"{next(iter(models))}.down", first["C"], first["F"], qt, M, dev, act)
    for mname, m in models.items():
        for lname, N, K in linear_shapes(m)[2:3] if args.smoke else linear_shapes(m):
            for qt in fmt_sweep:
                for M in batches:
                    if lname == "down" and qt in all_fmts and M in (1, batches[-1]):
                        continue  # done above
                    bench_qmatmul(rep, f"{mname}.{lname}", N, K, qt, M, dev, act)
        for S in batches[:1] if args.smoke else batches:
            for L in contexts:
                if S * L > 64 * 32768 // 2 and not args.smoke and S > 8:
                    continue  # 64 x 32k: 8.6 GB of KV per layer, skip to bound memory/time
                bench_decode(rep, mname, m, S, L, dev, act)
        for ql, L in prefills:
            bench_prefill(rep, mname, m, ql, L, dev, act)
        for T in batches[:1] if args.smoke else batches:
            bench_small(rep, m, T, dev, act)


if __name__ == "__main__":
    main()
