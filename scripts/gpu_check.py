"""The GPU check's measurements (scripts/gpu_check.sh), on one CUDA GPU.

`--out DIR` (timings): every Triton kernel at Llama-3-8B shapes, as the engine runs it (weights
repacked at load, bfloat16 activations), against torch: achieved GB/s and TFLOP/s next to the
measured peaks (device copy, bf16 torch.matmul), and each kernel's relative error against its
torch reference at that shape; a kernel over its tolerance (`TOL`) fails the run (exit 1) after
every row is printed. Writes DIR/timings.json.

`--agreement MODEL.gguf --out DIR`: the CUDA path against the CPU path (the CPU backend, llama.cpp's
numerics) on the same model: 8 prompts x 32 greedy tokens each way, and the CUDA path fed the CPU
path's tokens (teacher-forced: top-1 agreement, logits' relative error). Writes DIR/agreement.json.

`--smoke` runs the same code at tiny shapes (on the CPU with TRITON_INTERPRET=1), so the script
itself is checked without a GPU (`gpu_check.sh --dry-run`, CI).
"""
from __future__ import annotations

import argparse
import contextlib
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
# relative error allowed against the torch reference, by kernel family (bf16 activations; the
# decode GEMV quantizes them to 8 bits per 32, kernels/triton/qmatmul_q8.py)
TOL = {"qmatmul": 3e-2, "paged_decode": 1e-2, "paged_prefill": 1e-2, "rms_norm": 1e-2, "rope": 1e-2,
       "silu_mul": 1e-2, "embedding": 1e-6, "write_kv": 0.0}

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
    x = torch.randn(s, s, device=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
    t = timeit(lambda: x @ x, dev)
    return bw, 2 * s**3 / t


class Report:
    def __init__(self, bw, fl):
        self.bw, self.fl = bw, fl
        self.rows: list[dict] = []
        self.failures: list[str] = []
        print(f"measured peak: {bw / 1e9:8.1f} GB/s (device copy), {fl / 1e12:7.1f} TFLOP/s (bf16 matmul)")
        print(f"{'kernel':58s} {'ms':>9s} {'GB/s':>8s} {'%bw':>5s} {'TFLOP/s':>8s} {'%fl':>5s} "
              f"{'torch ms':>9s} {'speedup':>7s} {'rel.err':>8s}")

    def row(self, name, t, nbytes, flops, t_ref=None, err=None):
        family = name.split()[0]
        if err is not None and (not math.isfinite(err) or err > TOL.get(family, 1e-2)):
            self.failures.append(f"{name}: relative error {err:.2e} > {TOL.get(family, 1e-2):.0e}")
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
        out = {"copy_GBps": self.bw / 1e9, "bf16_matmul_TFLOPs": self.fl / 1e12}
        for q in ("Q4_K", "Q6_K", "Q8_0"):
            r = self.find(f"qmatmul llama3-8b.down {q} M=1 ")
            out[f"gemv_{q}_4096x14336_pct_copy_bw"] = r and r["pct_bw"]
        out["kernel_failures"] = len(self.failures)
        for r in self.rows:
            if r["name"].startswith("paged_decode"):
                out[f"{r['name']} speedup_vs_sdpa"] = r["speedup_vs_torch"]
        return out


def guarded(fn):
    def run(rep, *a, **k):
        try:
            fn(rep, *a, **k)
        except Exception as e:  # keep going: one broken shape must not hide the others
            print(f"FAILED {fn.__name__}{a}:", flush=True)
            traceback.print_exc(limit=3)
            rep.failures.append(f"{fn.__name__}{a}: {type(e).__name__}: {e}")
    return run


@guarded
def bench_qmatmul(rep, name, N, K, qtype, M, dev, act):
    """As the engine runs it: the weight prepared at load (repacked where the type has a repack)."""
    w = random_qweight(qtype, N, K, device=dev)
    wd = ref.dequantize(w, torch.float32)
    wp = OPS.prepare_weight(w)
    x = torch.randn(M, K, device=dev, dtype=act)
    t = timeit(lambda: OPS.qmatmul(x, wp), dev)
    wh = wd.to(act)
    t_ref = timeit(lambda: x @ wh.T, dev)
    err = rel_err(OPS.qmatmul(x, wp).float(), (x.float() @ wd.T))
    nbytes = wp.nbytes + x.numel() * x.element_size() + M * N * x.element_size()
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
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
    ref.write_kv(k, k, kc2, vc2, slots)
    rep.row(f"write_kv T={T} KVH={KVH} D={D}", t, 4 * k.numel() * e, 0, t_ref, rel_err(kc, kc2))
    emb = random_qweight(Q.Q4_K, 4096, C, device=dev)
    ids = torch.randint(0, 4096, (T,), device=dev)
    t = timeit(lambda: OPS.embedding(ids, emb), dev)
    t_ref = timeit(lambda: ref.embedding(ids, emb), dev)
    rep.row(f"embedding T={T} C={C} Q4_K", t, T * emb.nbytes / 4096 + 4 * T * C, 0, t_ref,
            rel_err(OPS.embedding(ids, emb), ref.embedding(ids, emb)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter ok)")
    ap.add_argument("--out", default=None, help="write timings.json / agreement.json here")
    ap.add_argument("--agreement", metavar="MODEL", default=None, help="CUDA path vs CPU path on this GGUF")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not args.smoke:
        sys.exit("no CUDA device: use --smoke (with TRITON_INTERPRET=1) to check the script only")
    if args.agreement:
        return agreement(args.agreement, dev, args.out, args.smoke)
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
        batches, contexts = [1, 8, 32], [512, 4096]
        prefills = [(512, 512), (4096, 4096)]
        fmt_sweep = [Q.Q4_K, Q.Q6_K]
        all_fmts = [Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q3_K, Q.Q5_K]  # the other repacked types, and one that is not
    first = next(iter(models.values()))
    from kernels.triton.tuning import tuning

    # each matmul key's configs checked and timed once (as the engine's start-up does); --smoke takes the first
    # config (every config's check under the interpreter: tests/test_kernels_triton.py's tuning tests)
    with tuning() if not args.smoke else contextlib.nullcontext():
        run_plan(rep, args, dev, act, models, batches, contexts, prefills, fmt_sweep, all_fmts, first)
    print(f"total {time.time() - t0:.0f} s")
    summary = rep.summary()
    print(json.dumps(summary, indent=1))
    for f in rep.failures:
        print(f"KERNEL FAILURE {f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "timings.json").write_text(json.dumps({"rows": rep.rows, "summary": summary,
                                                                 "failures": rep.failures}, indent=1))
    return 1 if rep.failures else 0


def agreement(path: str, dev: str, out: str | None, smoke: bool, n_prompts: int = 8, n_tokens: int = 32) -> int:
    """Greedy tokens of the CUDA path (Triton, bfloat16 activations) and of the CPU path (the CPU
    backend) on the same GGUF, and the CUDA path teacher-forced on the CPU path's tokens."""
    import random

    from runtime.model.decoder import Model, SeqBatch
    from runtime.model.kv_store import SeqKV
    from runtime.model.loader import load_model
    from runtime.serving.blocks import BlockManager

    t0 = time.time()
    if smoke:  # a prefill and one decode step
        n_prompts, n_tokens = 2, 2
    lm = load_model(path, progress=lambda m: None)
    rng = random.Random(0)
    V = lm.config.n_vocab
    prompts = [[rng.randrange(V) for _ in range(rng.randrange(8, 48))] for _ in range(n_prompts)]

    def run(model, forced=None):
        kv = BlockManager(model.new_kv_store(n_prompts * (64 + n_tokens + 16), block_size=16, dtype=torch.float16))
        seqs = [SeqKV() for _ in prompts]
        for s, p in zip(seqs, prompts):
            kv.reserve(s, len(p))
        logits, _ = model.forward(kv.store, [SeqBatch(s, p, 0) for s, p in zip(seqs, prompts)])
        for s, p in zip(seqs, prompts):
            kv.commit(s, len(p))
        steps = [logits.float().cpu()]
        toks = [logits.argmax(-1).tolist()]
        for i in range(n_tokens - 1):
            feed = forced[i] if forced is not None else toks[-1]
            for s in seqs:
                kv.reserve(s, s.n_tokens + 1)
            logits, _ = model.forward(kv.store, [SeqBatch(s, [t], s.n_tokens) for s, t in zip(seqs, feed)])
            for s in seqs:
                kv.commit(s, s.n_tokens + 1)
            steps.append(logits.float().cpu())
            toks.append(logits.argmax(-1).tolist())
        return torch.stack(steps), toks  # [n_tokens, n_prompts, V], [n_tokens][n_prompts]

    cpu = Model(lm, "cpu")
    cpu_logits, cpu_toks = run(cpu)
    t_cpu = time.time() - t0
    del cpu
    gpu = Model(lm, dev, backend="triton")
    gpu_logits, gpu_toks = run(gpu)
    # teacher-forced on the CPU path's tokens: the same feed as the free run where those agree
    forced_logits, forced_toks = (gpu_logits, gpu_toks) if gpu_toks == cpu_toks else run(gpu, forced=cpu_toks)
    same_seq = sum(all(cpu_toks[i][p] == gpu_toks[i][p] for i in range(n_tokens)) for p in range(n_prompts))
    first_div = [next((i for i in range(n_tokens) if cpu_toks[i][p] != gpu_toks[i][p]), n_tokens)
                 for p in range(n_prompts)]
    forced_top1 = sum(forced_toks[i][p] == cpu_toks[i][p] for i in range(n_tokens) for p in range(n_prompts))
    top2 = cpu_logits.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).flatten()
    res = {"prompts": n_prompts, "tokens": n_tokens, "greedy_identical_sequences": same_seq,
           "greedy_tokens_before_divergence_mean": sum(first_div) / n_prompts,
           "forced_top1_agreement": forced_top1 / (n_prompts * n_tokens),
           "forced_logits_rel_err": float((forced_logits - cpu_logits).norm() / cpu_logits.norm()),
           "cpu_top1_margin_median": float(margin.median()), "seconds": time.time() - t0, "cpu_seconds": t_cpu}
    print("AGREEMENT " + json.dumps(res))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "agreement.json").write_text(json.dumps(res, indent=1))
    return 0


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
    if not args.smoke:  # the output head: Q6_K, 128256 rows, float32 input (Model._head)
        for M in (1, batches[-1]):
            bench_qmatmul(rep, "llama3-8b.head", 128256, first["C"], Q.Q6_K, M, dev, torch.float32)


if __name__ == "__main__":
    sys.exit(main())
