#!/usr/bin/env python3
"""Prompt processing of long prompts, tritium against llama-server, same run, same file.

    python scripts/bench_prefill.py http://127.0.0.1:8091 --compare http://127.0.0.1:8081 \
        --lengths 200 1000 1900 --reps 2

Both servers must serve the same GGUF with the same flags (e.g. `-np 2 -c 4096`). Each request is
`/completion` with a prompt of N random token ids (the same ids for both servers, a fresh set per
repetition), `n_predict` 1 and `cache_prompt` false, so `timings.prompt_ms` is the whole prompt's
processing; the servers are asked alternately. Prints each time and the ratio of the medians.
"""
from __future__ import annotations

import argparse
import random
import statistics

import httpx


def prompt_ms(url: str, tokens: list[int]) -> float:
    r = httpx.post(url + "/completion", json={"prompt": tokens, "n_predict": 1, "cache_prompt": False,
                                              "temperature": 0}, timeout=1800)
    r.raise_for_status()
    return float(r.json()["timings"]["prompt_ms"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url", help="tritium-server base URL")
    ap.add_argument("--compare", required=True, help="llama-server base URL")
    ap.add_argument("--lengths", type=int, nargs="+", default=[200, 1000, 1900])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab-range", type=int, nargs=2, default=[200, 20000], metavar=("LO", "HI"),
                    help="token ids are drawn from [LO, HI)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(f"{'tokens':>7} {'tritium ms':>12} {'llama ms':>12} {'ratio':>7}")
    for n in args.lengths:
        ours, theirs = [], []
        for _ in range(args.reps):
            tokens = [rng.randrange(*args.vocab_range) for _ in range(n)]
            ours.append(prompt_ms(args.url, tokens))
            theirs.append(prompt_ms(args.compare, tokens))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{n:>7} {a:>12.0f} {b:>12.0f} {a / b:>7.2f}   ({', '.join(f'{x:.0f}' for x in ours)} / "
              f"{', '.join(f'{x:.0f}' for x in theirs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
