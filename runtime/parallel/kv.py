"""Rank 0's KV store under -tp: the block manager (runtime/serving/blocks.py) is rank 0's alone
(block ids and slots travel with each step), and each rank keeps the K/V of its own KV heads. Data
operations that are not part of a forward (copy on write, the prompt caches' export / import, slot
files, --cache-reuse moves) are sent to every rank; reads are assembled into whole-head tensors, so
that slot files and RAM-cache entries look exactly as with one rank."""
from __future__ import annotations

import torch

from runtime.model.kv_store import KeyRotation, KVStore
from runtime.parallel.shard import TPShard


class TPKVStore(KVStore):
    def __init__(self, shard: TPShard, n_layers: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device, rope: KeyRotation | None = None, **types):
        """`types`: the store's type_k, type_v and attn_rot (-ctk / -ctv: each rank's heads quantized
        as a whole-head store's rows are, so assembled reads are those of one rank)."""
        k0, k1 = shard.heads.kv
        super().__init__(n_layers, k1 - k0, head_dim, num_blocks, block_size, dtype, device, rope=rope, **types)
        self.shard = shard
        self.n_kv_heads = shard.heads.n_head_kv  # what exports, slot files and sizes see: all heads

    def copy_block(self, src: int, dst: int, swa: bool = False) -> None:
        assert not swa, "no SWA pool with -tp"
        self.shard.group.send(("kv_copy", src, dst))
        super().copy_block(src, dst)

    def gather_slots(self, slots: torch.Tensor, swa_slots=None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        assert swa_slots is None, "no SWA pool with -tp"
        self.shard.group.send(("kv_gather", slots.cpu()))
        return assemble(self.shard, self.shard.group.gather(_cpu(super().gather_slots(slots))))

    def scatter_slots(self, slots: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor],
                      swa_slots=None) -> None:
        assert swa_slots is None, "no SWA pool with -tp"
        ks, vs = [k.cpu() for k in ks], [v.cpu() for v in vs]
        self.shard.group.send(("kv_scatter", slots.cpu(), ks, vs))
        super().scatter_slots(slots, *local_heads(self.shard, ks, vs))


def _cpu(kvs):
    ks, vs = kvs
    return [k.cpu() for k in ks], [v.cpu() for v in vs]


def local_heads(shard: TPShard, ks: list[torch.Tensor], vs: list[torch.Tensor]):
    """This rank's heads of whole-head K/V lists ([n, KVH, D] per layer)."""
    k0, k1 = shard.heads.kv
    return [k[:, k0:k1] for k in ks], [v[:, k0:k1] for v in vs]


def assemble(shard: TPShard, parts: list) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Whole-head K/V lists from every rank's (ks, vs), taking each head from one rank that holds it."""
    owners = shard.heads.kv_owners()
    n_layers = len(parts[0][0])
    ks = [torch.cat([parts[r][0][l] for r in owners], dim=1) for l in range(n_layers)]
    vs = [torch.cat([parts[r][1][l] for r in owners], dim=1) for l in range(n_layers)]
    return ks, vs
