#!/usr/bin/env python3
"""Where the milliseconds of one decode step go: `runtime.model.decoder.Model.forward` on a GGUF model,
every kernel op timed by the weight or op it serves.

    python scripts/profile_decode.py [--model M.gguf] [--batch 1,4] [--ctx 430] [--steps 20]

The model runs on one thread and the time is the CPU time of that thread (`time.thread_time`),
so the figures hold on a machine shared with other jobs (wall time there is mostly waiting).
Per op: the minimum over the steps of its per-step sum (ms); "python" is the step's CPU time not
spent inside an op (the model's own code, tensor bookkeeping). The same script runs against
another checkout (e.g. main, for a before/after) with `PYTHONPATH=/path/to/checkout`.
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))  # after PYTHONPATH: another checkout given there wins

from runtime.model.kv_store import SeqKV  # noqa: E402
from runtime.serving.blocks import BlockManager  # noqa: E402
from runtime.model.loader import load_model  # noqa: E402
from runtime.model.decoder import Model, SeqBatch  # noqa: E402

DEFAULT_MODEL = "/work/models/qwen2.5-coder-0.5b-q4_k_m.gguf"


class TimedOps:
    """The model's kernel backend with every call timed (thread CPU time) under a label: matmuls
    by the weight they read, the other ops by name."""

    def __init__(self, ops, names: dict[int, str]):
        self._ops, self._names = ops, names
        self.t: collections.Counter = collections.Counter()

    def __getattr__(self, op):
        fn = getattr(self._ops, op)
        if not callable(fn):
            return fn

        def timed(*args, **kw):
            label = op
            if op in ("qmatmul", "topk_logits"):
                label = f"matmul {self._names.get(id(args[1]), '?')}"
            elif op == "embedding":
                label = "embedding"
            t0 = time.thread_time()
            out = fn(*args, **kw)
            self.t[label] += time.thread_time() - t0
            return out
        return timed


def weight_names(m: Model) -> dict[int, str]:
    names = {id(m.output): "output head"}
    for L in m.layers:
        for w in L.wqkv:
            names[id(w)] = "attn q/k/v"
        names[id(L.wo)] = "attn output"
        for w in L.w_gate_up:
            names[id(w)] = "ffn gate/up"
        names[id(L.w_down)] = "ffn down"
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--batch", default="1,4", help="sequences per decode step, comma-separated")
    ap.add_argument("--ctx", type=int, default=430, help="tokens already in each sequence's cache")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    c0 = time.process_time()
    lm = load_model(args.model, progress=lambda msg: None)
    m = Model(lm)
    print(f"model: {Path(args.model).name}  load + prepare: {time.perf_counter() - t0:.2f} s wall, "
          f"{time.process_time() - c0:.2f} s CPU; layouts: "
          f"{sorted({w.layout for L in m.layers for w in [*L.wqkv, L.wo, *L.w_gate_up, L.w_down] if w is not None})}, "
          f"head {m.output.layout}")
    timed = TimedOps(m.ops, weight_names(m))
    m.ops = timed
    for B in (int(b) for b in args.batch.split(",")):
        kv = BlockManager(m.new_kv_store((args.ctx + args.steps + 17) // 16 * 16 * B))
        seqs = [SeqKV() for _ in range(B)]
        for i, s in enumerate(seqs):
            kv.reserve(s, args.ctx + args.steps + 1)
            m.forward(kv.store, [SeqBatch(s, [(17 * j + i) % 1000 + 10 for j in range(args.ctx)], 0)])
        per_step, totals = [], []
        for step in range(args.steps):
            timed.t.clear()
            c = time.thread_time()
            m.forward(kv.store, [SeqBatch(s, [100 + step], args.ctx + step) for s in seqs])
            total = time.thread_time() - c
            per_step.append(dict(timed.t))
            totals.append(total)
        best = min(range(args.steps), key=lambda k: totals[k])
        labels = sorted({k for d in per_step for k in d}, key=lambda k: -min(d.get(k, 0.0) for d in per_step))
        print(f"\ndecode step, batch {B}, context {args.ctx}: {totals[best] * 1e3:.2f} ms CPU (min of {args.steps}; "
              f"median {sorted(totals)[len(totals) // 2] * 1e3:.2f})")
        ops_sum = 0.0
        for k in labels:
            v = min(d.get(k, 0.0) for d in per_step)
            ops_sum += v
            print(f"  {k:24s} {v * 1e3:8.2f} ms")
        print(f"  {'python (rest)':24s} {max(0.0, totals[best] - ops_sum) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
