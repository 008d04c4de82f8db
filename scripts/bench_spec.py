#!/usr/bin/env python3
"""Speculative decoding: tritium against llama-server on one GGUF file, each with and without the
same --spec-type, same run (scripts/bench_servers.py --preset code-edit).

    python scripts/bench_servers.py --preset code-edit [--spec-type ngram-simple] [--reps 2]
    python scripts/bench_spec.py --verify-cost [MODEL]   # tritium's cost of k verify rows (spec_adapt.ROW_COST)

Three workloads, greedy, `--n-predict` (128) tokens a request: `code` ("rewrite this function with one change":
the answer repeats most of the prompt, where n-gram drafts are accepted) and `prose` (open-ended
writing, where they mostly are not), one stream each; then `code x4`, four code requests at once
(continuous batching; aggregate tokens/s = all tokens / the wall time of the four). Four servers
are started one at a time on the real Qwen2.5-Coder-0.5B Q4_K_M (`-np 4 -c 16384`): llama-server
and tritium, without speculation and with it. Each runs the workloads `--reps` times; a request's
decode speed is its own `timings.predicted_per_second` (both servers time the same span).
Printed: per server and workload the median, min and max, the acceptance (draft_n_accepted /
draft_n), the peak RSS, the load average before and after, whether the greedy tokens agree with
the same server without speculation; then every ratio and a markdown table (stderr). The machine
may be shared: the spread and the load average say how much the numbers can be trusted.

The prompts are this module's (`FUNCS`, `code_prompt`, `PROSE`); tests/test_speculative.py uses the same.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

FUNCS = [
    ('''def merge_intervals(intervals):
    if not intervals:
        return []
    intervals.sort(key=lambda x: x[0])
    merged = [intervals[0]]
    for start, end in intervals[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged
''', "Rename the variable `merged` to `result`."),
    ('''def word_counts(text):
    counts = {}
    for line in text.splitlines():
        for word in line.split():
            word = word.strip(".,;:!?").lower()
            if not word:
                continue
            counts[word] = counts.get(word, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ordered
''', "Add a parameter `min_len=1` and skip words shorter than it."),
    ('''def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
''', "Add a docstring that explains the return value."),
]
PROSE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain to a curious teenager why the sky is blue and sunsets are red.",
    "Describe a busy morning market in a coastal town, with its sounds and smells.",
]
N_PREDICT = 128
SYSTEM = "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n"


def code_prompt(code: str, change: str) -> str:
    """The code-editing request (Qwen2.5 chat format, raw /completion prompt)."""
    return (f"{SYSTEM}<|im_start|>user\nRewrite this function. {change} Output the whole function only.\n\n"
            f"```python\n{code}```<|im_end|>\n<|im_start|>assistant\n")


def prose_prompt(topic: str) -> str:
    return f"{SYSTEM}<|im_start|>user\n{topic}<|im_end|>\n<|im_start|>assistant\n"


WORKLOADS = {"code": [code_prompt(c, ch) for c, ch in FUNCS], "prose": [prose_prompt(t) for t in PROSE]}


def request(c: httpx.Client, url: str, text: str, n_predict: int = N_PREDICT) -> dict:
    body = {"prompt": text, "n_predict": n_predict, "temperature": 0, "cache_prompt": False, "return_tokens": True}
    t0 = time.perf_counter()
    j = c.post(url + "/completion", json=body).json()
    t = j["timings"]
    return {"tok_s": t["predicted_per_second"], "n": t["predicted_n"], "wall_s": time.perf_counter() - t0,
            "draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0), "tokens": j.get("tokens")}


def run_stream(url: str, prompts: list[str], reps: int, n_predict: int = N_PREDICT) -> dict:
    """One stream: each prompt `reps` times, one after another."""
    rs = []
    with httpx.Client(timeout=900, trust_env=False) as c:
        for _ in range(reps):
            rs += [request(c, url, p, n_predict) for p in prompts]
    return {"values": [r["tok_s"] for r in rs], "draft_n": sum(r["draft_n"] for r in rs),
            "draft_n_accepted": sum(r["draft_n_accepted"] for r in rs), "tokens": [r["tokens"] for r in rs[:len(prompts)]]}


def run_parallel(url: str, prompts: list[str], reps: int, n_predict: int = N_PREDICT, n: int = 4) -> dict:
    """n streams at once (the prompts cycled), `reps` rounds: aggregate tokens/s of each round."""
    agg, drafted, accepted = [], 0, 0
    batch = [prompts[i % len(prompts)] for i in range(n)]
    with httpx.Client(timeout=900, trust_env=False, limits=httpx.Limits(max_connections=n)) as c, \
            concurrent.futures.ThreadPoolExecutor(n) as ex:
        for _ in range(reps):
            t0 = time.perf_counter()
            rs = list(ex.map(lambda p: request(c, url, p, n_predict), batch))
            agg.append(sum(r["n"] for r in rs) / (time.perf_counter() - t0))
            drafted += sum(r["draft_n"] for r in rs)
            accepted += sum(r["draft_n_accepted"] for r in rs)
    return {"values": agg, "draft_n": drafted, "draft_n_accepted": accepted, "tokens": None}


def summary(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2)}


def main(args, model: str, start, stop, wait_health, peak_rss_mib, log) -> int:
    spec = ["--spec-type", args.spec_type]
    base = ["-m", model, "-np", "4", "-c", "16384"]
    configs = [("llama", [args.llama, *base], 1), ("llama+spec", [args.llama, *base, *spec], 1),
               ("tritium", [args.tritium, *base], 0), ("tritium+spec", [args.tritium, *base, *spec], 0)]
    res: dict[str, dict] = {}
    for name, cmd, off in configs:
        port = args.port + off
        url = f"http://127.0.0.1:{port}"
        load0 = os.getloadavg()[0]
        p = start([*cmd, "--port", str(port)], f"/tmp/bench_spec-{name}.log")
        try:
            wait_health(url, p, args.wait)
            if args.warmup:  # first requests pay one-time costs
                run_stream(url, WORKLOADS["code"][:1] + WORKLOADS["prose"][:1], 1, 16)
            n = args.n_predict
            r = {"code": run_stream(url, WORKLOADS["code"], args.reps, n),
                 "prose": run_stream(url, WORKLOADS["prose"], args.reps, n),
                 "code x4": run_parallel(url, WORKLOADS["code"], args.reps, n)}
            r["peak_rss_mib"] = peak_rss_mib(p.pid)
        finally:
            stop(p)
        r["load"] = (round(load0, 2), round(os.getloadavg()[0], 2))
        res[name] = r
        for w in WORKLOADS.keys() | {"code x4"}:
            print(json.dumps({"server": name, "workload": w, "tok_s": summary(r[w]["values"]),
                              "draft_n": r[w]["draft_n"], "draft_n_accepted": r[w]["draft_n_accepted"],
                              "peak_rss_mib": r["peak_rss_mib"], "loadavg_before_after": r["load"],
                              "cmd": " ".join(cmd)}), flush=True)
    workloads = ["code", "prose", "code x4"]
    med = {(k, w): statistics.median(v[w]["values"]) for k, v in res.items() for w in workloads}
    pairs = [("tritium+spec", "tritium"), ("tritium+spec", "llama+spec"), ("llama+spec", "llama"), ("tritium", "llama")]
    ratios = {f"{a} / {b}": {w: round(med[a, w] / med[b, w], 2) for w in workloads} for a, b in pairs}
    same = {srv: {w: res[f"{srv}+spec"][w]["tokens"] == res[srv][w]["tokens"] for w in ("code", "prose")}
            for srv in ("tritium", "llama")}
    print(json.dumps({"ratios": ratios, "greedy_same_with_spec": same}), flush=True)
    log(f"\n| {args.spec_type}, {args.n_predict} tokens, decode tok/s median (min-max) | code, 1 stream | prose, 1 stream "
        f"| code, 4 streams (aggregate) | accepted / drafted (code, prose, x4) | peak RSS MiB | load avg before/after |"
        "\n| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in res.items():
        cells = [f"{s['median']} ({s['min']}-{s['max']})" for s in (summary(r[w]["values"]) for w in workloads)]
        acc = ", ".join(f"{r[w]['draft_n_accepted']}/{r[w]['draft_n']}" for w in workloads)
        log(f"| {name} | {' | '.join(cells)} | {acc} | {r['peak_rss_mib']:.0f} | {r['load'][0]} / {r['load'][1]} |")
    for k, v in ratios.items():
        log(f"| ratio {k} | {v['code']:.2f}x | {v['prose']:.2f}x | {v['code x4']:.2f}x | | | |")
    log(f"| greedy tokens unchanged by speculation (code, prose) | tritium: {same['tritium']['code']}, "
        f"{same['tritium']['prose']}; llama-server: {same['llama']['code']}, {same['llama']['prose']} | | | | | |")
    return 0


def verify_cost(model_file: str, ks=(0, 1, 2, 4, 8, 16, 32, 48), ctx: int = 300, reps: int = 7) -> dict[int, float]:
    """tritium's time for one slot's forward of 1 + k rows, logits of all (a verify step), over
    the 1-row time: what spec_adapt.ROW_COST models as 1 + c k (CPU backend, the real model)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from runtime.model.decoder import Model, SeqBatch
    from runtime.model.kv_store import SeqKV
    from runtime.model.loader import load_model
    from runtime.serving.blocks import BlockManager
    from runtime.serving.bootstrap import _single_threaded_openblas

    _single_threaded_openblas()  # as the server does
    model = Model(load_model(model_file, progress=lambda m: None), "cpu")
    kv = BlockManager(model.new_kv_store(ctx + 2 * max(ks) + 64))
    g = torch.Generator().manual_seed(0)
    s = SeqKV()
    kv.reserve(s, ctx)
    model.forward(kv.store, [SeqBatch(s, torch.randint(0, model.n_vocab, (ctx,), generator=g).tolist(), 0, logits=False)])
    kv.reserve(s, ctx + max(ks) + 1)
    times = {}
    for k in [*ks, *ks]:  # twice: the first pass warms up
        ts = []
        for _ in range(reps):
            toks = torch.randint(0, model.n_vocab, (k + 1,), generator=g).tolist()
            t0 = time.perf_counter()
            model.forward(kv.store, [SeqBatch(s, toks, ctx, logits=True, n_logits=k + 1, topk=1)])
            ts.append(time.perf_counter() - t0)
        times[k] = statistics.median(ts)
    return {k: round(times[k] / times[0], 3) for k in ks}


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--verify-cost":
        path = sys.argv[2] if len(sys.argv) > 2 else str(Path.home() / ".cache/tritium/models/qwen2.5-coder-0.5b-q4_k_m.gguf")
        rel = verify_cost(path)
        print(json.dumps({"model": path, "forward_1_plus_k_rows_over_1_row": rel,
                          "c_per_row": {k: round((v - 1) / k, 3) for k, v in rel.items() if k}}))
        sys.exit(0)
    sys.exit("run it through scripts/bench_servers.py --preset code-edit, or --verify-cost [MODEL]")
