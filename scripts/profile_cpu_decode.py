#!/usr/bin/env python3
"""Where the milliseconds of one CPU decode step go (the engine's forward, op by op).

Loads a GGUF model on the CPU backend, prefills S sequences of --ctx random tokens, then runs
--steps greedy decode steps (one new token per sequence, the top-1 shortcut of the output head as
the server uses it for `temperature: 0`) and prints, per kernel op, the median time per step
(ms) and its share of the step. The step itself is timed as a whole too (the ops' sum misses
the Python between them).

    python scripts/profile_cpu_decode.py /tmp/quantf-lesson.gguf --seqs 1,4 --ctx 600
    python scripts/profile_cpu_decode.py MODEL --ctx 2048 --threads 1 --cpu-time  # shared machine
    TRITIUM_CPU_ISA=avx2 python scripts/profile_cpu_decode.py MODEL   # a forced kernel variant
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from runtime.model.kv_store import SeqKV  # noqa: E402
from runtime.serving.blocks import BlockManager  # noqa: E402
from runtime.model.loader import load_model  # noqa: E402
from runtime.model.decoder import Model, SeqBatch  # noqa: E402


class TimedOps:
    """A kernel Backend whose ops add their wall time to `times[op]`."""

    def __init__(self, ops: kernels.Backend, clock=time.perf_counter):
        self._ops, self.times, self.clock = ops, defaultdict(float), clock

    def __getattr__(self, name):
        fn = getattr(self._ops, name)

        def timed(*a, **k):
            t0 = self.clock()
            r = fn(*a, **k)
            self.times[name] += self.clock() - t0
            return r
        return timed


def profile(model: Model, n_seqs: int, ctx: int, steps: int, clock) -> None:
    kv = BlockManager(model.new_kv_store(n_seqs * (ctx + steps + 16)))
    g = torch.Generator().manual_seed(0)
    seqs = [SeqKV() for _ in range(n_seqs)]
    for s in seqs:  # prefill one sequence at a time, 512-token chunks
        toks = torch.randint(0, model.n_vocab, (ctx,), generator=g).tolist()
        for c in range(0, ctx, 512):
            kv.reserve(s, c + len(toks[c:c + 512]))
            model.forward(kv.store, [SeqBatch(s, toks[c:c + 512], c, logits=False)])
    base = model.ops
    timed = TimedOps(base, clock)
    model.ops = timed
    per_step: dict[str, list[float]] = defaultdict(list)
    totals = []
    try:
        for i in range(steps):
            n = ctx + i
            for s in seqs:
                kv.reserve(s, n + 1)
            batch = [SeqBatch(s, [1 + i], n, logits=True, topk=1) for s in seqs]
            timed.times.clear()
            t0 = clock()
            model.forward(kv.store, batch)
            totals.append(clock() - t0)
            for k, v in timed.times.items():
                per_step[k].append(v)
    finally:
        model.ops = base
    skip = min(2, steps - 1)  # warm-up steps
    total = statistics.median(totals[skip:]) * 1e3
    print(f"-- {n_seqs} sequence(s), context {ctx}: step {total:.2f} ms"
          f"{' (thread CPU time)' if clock is time.thread_time else ''} "
          f"({n_seqs / total * 1e3:.1f} tok/s aggregate), threads {torch.get_num_threads()}")
    rows = sorted(((statistics.median(v[skip:]) * 1e3, k) for k, v in per_step.items()), reverse=True)
    for ms, k in rows:
        print(f"   {k:<18} {ms:8.3f} ms  {100 * ms / total:5.1f}%")
    rest = total - sum(ms for ms, _ in rows)
    print(f"   {'(python, other)':<18} {rest:8.3f} ms  {100 * rest / total:5.1f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--seqs", default="1,4", help="comma-separated numbers of decode sequences")
    ap.add_argument("--ctx", type=int, default=600, help="tokens in each sequence's cache")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the calling thread's CPU time instead of wall time: immune to "
                         "preemption on a shared machine, only meaningful with --threads 1")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    from runtime.serving.bootstrap import _single_threaded_openblas
    _single_threaded_openblas()  # as the server does
    model = Model(load_model(a.model, progress=lambda m: None), "cpu")
    for s in (int(x) for x in a.seqs.split(",")):
        profile(model, s, a.ctx, a.steps, time.thread_time if a.cpu_time else time.perf_counter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
