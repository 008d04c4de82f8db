"""Which part of the model a rank keeps (the Megatron layout).

For N ranks, rank r keeps (H heads, KVH KV heads, F FFN rows, V vocabulary rows, D head dim):
- attn_q rows of its H/N query heads, attn_k / attn_v rows of its KV heads (KVH/N of them; when
  KVH < N, each KV head is kept by N/KVH ranks: the one its query heads read), their biases;
- attn_output columns of its query heads (row-parallel: partial sums, all-reduced);
- ffn_gate / ffn_up rows [r F/N, (r+1) F/N), ffn_down those columns (all-reduced);
- token_embd and output rows of its vocabulary block (ceil(V/N) rows; the last block is shorter);
- norms whole.
Quantized blocks are sliced as they are in the file (rows always; columns at block boundaries);
only a column cut through a block (a shape no block size divides) is dequantized, for that
tensor's shard alone. No rank ever holds the whole model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from kernels.qweight import QWeight
from runtime.parallel.group import TPGroup


@dataclass(frozen=True)
class HeadSplit:
    n_head: int
    n_head_kv: int
    world: int
    rank: int

    def __post_init__(self) -> None:
        H, KVH, N = self.n_head, self.n_head_kv, self.world
        if H % N or (KVH % N and N % KVH):
            raise ValueError(f"-tp {N} must divide the {H} attention heads, and divide or be a multiple of "
                             f"the {KVH} KV heads")

    @property
    def q(self) -> tuple[int, int]:
        n = self.n_head // self.world
        return self.rank * n, (self.rank + 1) * n

    @property
    def kv(self) -> tuple[int, int]:
        if self.n_head_kv >= self.world:
            n = self.n_head_kv // self.world
            return self.rank * n, (self.rank + 1) * n
        j = self.rank // (self.world // self.n_head_kv)
        return j, j + 1

    def kv_of(self, rank: int) -> tuple[int, int]:
        return dataclasses.replace(self, rank=rank).kv

    def kv_owners(self) -> list[int]:
        """One rank per distinct block of KV heads, in head order (who exports each head)."""
        owners, seen = [], set()
        for r in range(self.world):
            if self.kv_of(r) not in seen:
                seen.add(self.kv_of(r))
                owners.append(r)
        return owners


@dataclass(frozen=True)
class TPShard:
    """What a model built on one rank needs to know about the split."""
    group: TPGroup
    heads: HeadSplit
    n_vocab: int  # the whole vocabulary
    vocab_chunk: int  # rows per rank's block (the last may hold fewer)

    @property
    def vocab(self) -> tuple[int, int]:
        lo = self.group.rank * self.vocab_chunk
        return lo, min(self.n_vocab, lo + self.vocab_chunk)


def _rows(w: QWeight, r0: int, r1: int) -> QWeight:
    return dataclasses.replace(w, data=w.data[r0:r1], rows=r1 - r0)


def _cols(w: QWeight, c0: int, c1: int) -> QWeight:
    if w.is_float:
        return QWeight(w.data[:, c0:c1].contiguous(), w.qtype, w.rows, c1 - c0)
    bs, ts = w.block_size, w.type_size
    if c0 % bs == 0 and c1 % bs == 0:
        return QWeight(w.data[:, c0 // bs * ts: c1 // bs * ts].contiguous(), w.qtype, w.rows, c1 - c0)
    import kernels  # a cut through blocks: this shard alone, as float32
    return QWeight.from_float(kernels.dequantize(w)[:, c0:c1].float().contiguous())


def _vec(t: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor | None:
    return None if t is None else t[lo:hi].contiguous()


def shard_loaded(lm, group: TPGroup):
    """(a LoadedModel holding this rank's shard, its TPShard). `lm` is the mapped file: only the
    shard's pages are ever read."""
    cfg = lm.config
    if cfg.n_expert:
        raise ValueError(f"{cfg.arch}: tensor parallelism (-tp) is not supported for mixture-of-experts models")
    if any(getattr(cfg, "recurrent_layers", None) or []):
        raise ValueError(f"{cfg.arch}: tensor parallelism (-tp) is not supported for hybrid linear-attention models "
                         "(the recurrent state is not sharded); run it without -tp")
    if cfg.n_embd_per_layer or cfg.n_layer_kv or cfg.head_dim_swa:
        raise ValueError(f"{cfg.arch}: tensor parallelism (-tp) is not supported for Gemma 4 models (per-layer head "
                         "sizes, KV shared across layers, per-layer embeddings are not sharded); run it without -tp")
    heads = HeadSplit(cfg.n_head, cfg.n_head_kv, group.world, group.rank)
    w = dict(lm.weights)
    D = cfg.head_dim
    (q0, q1), (k0, k1) = heads.q, heads.kv
    n_ff = w["blk.0.ffn_down.weight"].cols
    if n_ff % group.world:
        raise ValueError(f"-tp {group.world} must divide the FFN size {n_ff}")
    f0, f1 = group.rank * n_ff // group.world, (group.rank + 1) * n_ff // group.world
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w[p + "attn_q.weight"] = _rows(w[p + "attn_q.weight"], q0 * D, q1 * D)
        for n in "kv":
            w[p + f"attn_{n}.weight"] = _rows(w[p + f"attn_{n}.weight"], k0 * D, k1 * D)
        if p + "attn_q.bias" in w:
            w[p + "attn_q.bias"] = _vec(w[p + "attn_q.bias"], q0 * D, q1 * D)
            for n in "kv":
                w[p + f"attn_{n}.bias"] = _vec(w[p + f"attn_{n}.bias"], k0 * D, k1 * D)
        w[p + "attn_output.weight"] = _cols(w[p + "attn_output.weight"], q0 * D, q1 * D)
        for n in ("ffn_gate", "ffn_up"):
            w[p + n + ".weight"] = _rows(w[p + n + ".weight"], f0, f1)
        w[p + "ffn_down.weight"] = _cols(w[p + "ffn_down.weight"], f0, f1)
    V = w["token_embd.weight"].rows
    chunk = -(-V // group.world)
    shard = TPShard(group, heads, V, chunk)
    v0, v1 = shard.vocab
    for name in ("token_embd.weight", "output.weight"):
        if name in w:
            w[name] = _rows(w[name], v0, v1)
    local_cfg = dataclasses.replace(cfg, n_head=q1 - q0, n_head_kv=k1 - k0)
    return dataclasses.replace(lm, config=local_cfg, weights=w), shard
