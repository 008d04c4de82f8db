"""Tensor parallelism over torch.distributed (`-tp N`).

The model's layers are split across N ranks in the Megatron layout (column-parallel QKV and
gate/up, row-parallel output and down projections with one all-reduce each, vocabulary-parallel
embedding and output head, KV heads split across ranks). Rank 0 runs the HTTP server, the
scheduler and the block manager; it sends each forward's inputs and each KV data operation to the
other ranks (`group.TPGroup.send`), which run the same computation on their shards
(`worker.serve`). Modules:

- `group`: the process group, the command channel and the collectives the model uses;
- `shard`: which part of each weight, head and vocabulary row a rank keeps;
- `kv`: rank 0's KV cache, whose data operations reach every rank's shard of the cache;
- `worker`: the loop of ranks 1..N-1, and `spawn` (one machine: `tritium-server -tp N` starts them).
"""
from runtime.parallel.group import TPGroup, init_from_env
from runtime.parallel.shard import HeadSplit, shard_loaded

__all__ = ["TPGroup", "init_from_env", "HeadSplit", "shard_loaded"]
