#!/usr/bin/env python3
"""Speculative decoding on a code-editing workload: tritium against llama-server on one GGUF file,
each with and without the same --spec-type, same run (scripts/bench_servers.py --preset code-edit).

    python scripts/bench_servers.py --preset code-edit [--spec-type ngram-simple] [--reps 3]

The workload: "rewrite this function with one change" prompts (the answer repeats most of the
prompt, where n-gram drafts are accepted), one stream, greedy, 128 tokens. Four servers are
started one at a time on the real Qwen2.5-Coder-0.5B Q4_K_M (`-np 1 -c 4096`): llama-server and
tritium without speculation and with it. Each runs every prompt `--reps` times; a request's decode
speed is its own `timings.predicted_per_second` (both servers time the same span), its wall time
is measured here. Printed: per server the median, min and max tok/s over the requests, the
acceptance (draft_n_accepted / draft_n), the load average before and after, and whether the
greedy tokens agree with the same server without speculation; then the ratios and a markdown table.
The machine may be shared: the spread and the load average say how much the numbers can be trusted.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

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
N_PREDICT = 128


def prompt(code: str, change: str) -> str:
    return ("<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n<|im_start|>user\n"
            f"Rewrite this function. {change} Output the whole function only.\n\n```python\n{code}```<|im_end|>\n"
            "<|im_start|>assistant\n")


def run_one(url: str, reps: int) -> dict:
    speeds, walls, tokens, drafted, accepted = [], [], [], 0, 0
    with httpx.Client(timeout=900, trust_env=False) as c:
        for _ in range(reps):
            for code, change in FUNCS:
                body = {"prompt": prompt(code, change), "n_predict": N_PREDICT, "temperature": 0,
                        "cache_prompt": False, "return_tokens": True}
                t0 = time.perf_counter()
                j = c.post(url + "/completion", json=body).json()
                walls.append(time.perf_counter() - t0)
                t = j["timings"]
                speeds.append(t["predicted_per_second"])
                drafted += t.get("draft_n", 0)
                accepted += t.get("draft_n_accepted", 0)
                tokens.append(j.get("tokens"))
    return {"tok_s": speeds, "wall_s": walls, "tokens": tokens[:len(FUNCS)], "draft_n": drafted,
            "draft_n_accepted": accepted}


def summary(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2)}


def main(args, model: str, start, stop, wait_health, peak_rss_mib, log) -> int:
    spec = ["--spec-type", args.spec_type]
    base = ["-m", model, "-np", "1", "-c", "4096"]
    configs = [("llama", [args.llama, *base], 1), ("llama+spec", [args.llama, *base, *spec], 1),
               ("tritium", [args.tritium, *base], 0), ("tritium+spec", [args.tritium, *base, *spec], 0)]
    res = {}
    for name, cmd, off in configs:
        port = args.port + off
        url = f"http://127.0.0.1:{port}"
        load0 = os.getloadavg()[0]
        p = start([*cmd, "--port", str(port)], f"/tmp/bench_spec-{name}.log")
        try:
            wait_health(url, p, args.wait)
            run_one(url, 1) if args.warmup else None  # first requests pay one-time costs
            r = run_one(url, args.reps)
            r["peak_rss_mib"] = peak_rss_mib(p.pid)
        finally:
            stop(p)
        r["load_before"], r["load_after"] = round(load0, 2), round(os.getloadavg()[0], 2)
        res[name] = r
        line = {"server": name, "tok_s": summary(r["tok_s"]), "wall_s": summary(r["wall_s"]),
                "draft_n": r["draft_n"], "draft_n_accepted": r["draft_n_accepted"], "peak_rss_mib": r["peak_rss_mib"],
                "loadavg_before": r["load_before"], "loadavg_after": r["load_after"], "cmd": " ".join(cmd)}
        print(json.dumps(line), flush=True)
    med = {k: statistics.median(v["tok_s"]) for k, v in res.items()}
    ratios = {"tritium+spec / tritium": med["tritium+spec"] / med["tritium"],
              "tritium+spec / llama+spec": med["tritium+spec"] / med["llama+spec"],
              "llama+spec / llama": med["llama+spec"] / med["llama"],
              "tritium / llama": med["tritium"] / med["llama"]}
    same = {"tritium": res["tritium+spec"]["tokens"] == res["tritium"]["tokens"],
            "llama": res["llama+spec"]["tokens"] == res["llama"]["tokens"]}
    print(json.dumps({"ratios": {k: round(v, 2) for k, v in ratios.items()}, "greedy_same_with_spec": same}), flush=True)
    log(f"\n| code-edit, {args.spec_type}, 1 stream, {N_PREDICT} tokens | decode tok/s median (min-max) | "
        f"accepted / drafted | peak RSS MiB | load avg before/after |\n| --- | --- | --- | --- | --- |")
    for name, r in res.items():
        s = summary(r["tok_s"])
        log(f"| {name} | {s['median']} ({s['min']}-{s['max']}) | {r['draft_n_accepted']} / {r['draft_n']} | "
            f"{r['peak_rss_mib']} | {r['load_before']} / {r['load_after']} |")
    for k, v in ratios.items():
        log(f"| ratio {k} | {v:.2f}x | | | |")
    log(f"| greedy tokens unchanged by speculation | tritium: {same['tritium']}, llama-server: {same['llama']} | | | |")
    return 0
