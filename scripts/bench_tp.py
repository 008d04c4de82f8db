"""What -tp costs per decode step on the CPU (gloo): the all-reduces alone, and a whole step with
one rank and with N ranks, on the same model file.

    python scripts/bench_tp.py MODEL.gguf [--ranks 2] [--steps 50] [--batch 1]

Prints, per rank count: ms per decode step (median), and for N > 1 the ms spent in the 2 x n_layer
all-reduces of a step ([batch, n_embd] float32) plus the logits gather, timed on their own.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.multiprocessing as mp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(model, kv, batch: int, steps: int) -> list[float]:
    """Decode steps over `kv` (a BlockManager) after a 16-token prefill: wall time of each."""
    from runtime.model.decoder import SeqBatch
    from runtime.model.kv_store import SeqKV
    seqs = [SeqKV() for _ in range(batch)]
    for s in seqs:
        kv.reserve(s, 16)
    model.forward(kv.store, [SeqBatch(s, list(range(1, 17)), 0) for s in seqs])
    for s in seqs:
        s.n_tokens = 16
    times = []
    for i in range(steps):
        for s in seqs:
            kv.reserve(s, s.n_tokens + 1)
        t0 = time.perf_counter()
        model.forward(kv.store, [SeqBatch(s, [i % 100 + 1], s.n_tokens) for s in seqs])
        times.append(time.perf_counter() - t0)
        for s in seqs:
            s.n_tokens += 1
    return times


def _rank(rank: int, world: int, port: int, path: str, batch: int, steps: int, threads: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank))
    torch.set_num_threads(threads)
    from runtime.model.kv_store import KVStore
    from runtime.model.loader import load_model
    from runtime.model.decoder import Model
    from runtime.parallel import init_from_env, shard_loaded
    from runtime.parallel.kv import TPKVStore
    from runtime.parallel.worker import serve
    from runtime.serving.blocks import BlockManager
    lm = load_model(path, progress=lambda m: None)
    group = init_from_env("cpu")
    local, shard = shard_loaded(lm, group)
    model = Model(local, "cpu", tp=shard)
    n_blocks = batch * (16 + steps + 16) // 16 + batch
    if rank:
        serve(model, KVStore(len(model.layers), model.n_head_kv, model.head_dim, n_blocks, 16))
        # then time the collectives alone, in step with rank 0
    else:
        kv = BlockManager(TPKVStore(shard, len(model.layers), model.head_dim, n_blocks, 16, torch.float16, "cpu"))
        out["step"] = _steps(model, kv, batch, steps)
        group.send(("stop",))
    x = torch.randn(batch, lm.config.n_embd)
    logits = torch.randn(batch, shard.vocab_chunk)
    coll = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for _ in range(2 * lm.config.n_layer + 1):   # 2 per layer + the embedding
            group.all_reduce(x)
        group.all_gather_cols(logits, shard.n_vocab)
        coll.append(time.perf_counter() - t0)
    if rank == 0:
        out["collectives"] = coll
    group.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    from runtime.model.kv_store import KVStore
    from runtime.model.loader import load_model
    from runtime.model.decoder import Model
    from runtime.serving.blocks import BlockManager
    torch.set_num_threads(cores)
    model = Model(load_model(args.model, progress=lambda m: None), "cpu")
    n_blocks = args.batch * (16 + args.steps + 16) // 16 + args.batch
    one = _steps(model, BlockManager(KVStore(len(model.layers), model.n_head_kv, model.head_dim, n_blocks, 16)),
                 args.batch, args.steps)
    del model
    out = mp.Manager().dict()
    mp.start_processes(_rank, args=(args.ranks, _port(), args.model, args.batch, args.steps,
                                    max(1, cores // args.ranks), out),
                       nprocs=args.ranks, join=True, start_method="spawn")
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    print(f"decode step, batch {args.batch}: 1 rank ({cores} threads) {ms(one):.2f} ms; "
          f"{args.ranks} ranks ({max(1, cores // args.ranks)} threads each) {ms(out['step']):.2f} ms; "
          f"collectives alone {ms(out['collectives']):.2f} ms per step")


if __name__ == "__main__":
    main()
