"""Block-allocated (paged) KV cache.

Layout (one definition, see docs/DESIGN.md): per layer `k[l], v[l]: [num_blocks, block_size, n_kv_heads, head_dim]`.
A sequence owns an ordered list of blocks (its block table); token i of the sequence lives in
block `blocks[i // block_size]` at offset `i % block_size`, so its position equals its index.
Keys are stored already rotated by RoPE at that position.

Blocks are reference counted so a cached prefix can be shared between sequences: sharing a
prefix increments the counts of its full blocks, and a write into a shared block first copies it
(copy on write).
"""
from __future__ import annotations

import math
import mmap
from collections import deque
from dataclasses import dataclass, field

import torch

import kernels


class OutOfBlocks(RuntimeError):
    pass


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor; on the CPU in an anonymous mapping whose pages the OS zero-fills on first
    touch, so the cache costs resident memory only for the blocks that have been written."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, max(n, 1)), dtype=torch.uint8)[:n].view(dtype).view(shape)


@dataclass
class BlockPool:
    """Free list and reference counts of KV blocks."""
    num_blocks: int
    free: deque = field(default_factory=deque)
    refs: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.free = deque(range(self.num_blocks - 1, -1, -1))
        self.refs = [0] * self.num_blocks

    def alloc(self) -> int:
        # last freed, first reused: blocks that were never written stay untouched (see _zeros)
        if not self.free:
            raise OutOfBlocks("KV cache is full")
        b = self.free.pop()
        self.refs[b] = 1
        return b

    def incref(self, b: int) -> None:
        assert self.refs[b] > 0
        self.refs[b] += 1

    def release(self, b: int) -> None:
        assert self.refs[b] > 0
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free.append(b)

    @property
    def n_free(self) -> int:
        return len(self.free)


@dataclass
class SeqKV:
    """One sequence's view of the cache: its block table and how many tokens it holds."""
    blocks: list[int] = field(default_factory=list)
    n_tokens: int = 0


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float16, device: str | torch.device = "cpu"):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_size, self.num_blocks, self.dtype = block_size, num_blocks, dtype
        self.device = torch.device(device)
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.k = [_zeros(shape, dtype, self.device) for _ in range(n_layers)]
        self.v = [_zeros(shape, dtype, self.device) for _ in range(n_layers)]
        self.pool = BlockPool(num_blocks)

    # ---- sizes -------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.k[0].element_size()

    def blocks_needed(self, n_tokens: int) -> int:
        return (n_tokens + self.block_size - 1) // self.block_size

    # ---- allocation ----------------------------------------------------------------------
    def reserve(self, seq: SeqKV, n_total: int) -> None:
        """Make room for `n_total` tokens in `seq`, copying the last block first if it is shared
        and about to be written (copy on write). Raises OutOfBlocks."""
        need = self.blocks_needed(n_total)
        if seq.n_tokens < n_total and seq.n_tokens % self.block_size and seq.blocks:
            last_idx = seq.n_tokens // self.block_size
            if last_idx < len(seq.blocks) and self.pool.refs[seq.blocks[last_idx]] > 1:
                seq.blocks[last_idx] = self._copy_block(seq.blocks[last_idx])
        new = []
        try:
            while len(seq.blocks) + len(new) < need:
                new.append(self.pool.alloc())
        except OutOfBlocks:
            for b in new:
                self.pool.release(b)
            raise
        seq.blocks.extend(new)

    def _copy_block(self, src: int) -> int:
        dst = self.pool.alloc()
        self.copy_data(src, dst)
        self.pool.release(src)
        return dst

    def copy_data(self, src: int, dst: int) -> None:
        """Copy block src's K/V into block dst (every layer)."""
        for layer in range(self.n_layers):
            self.k[layer][dst].copy_(self.k[layer][src])
            self.v[layer][dst].copy_(self.v[layer][src])

    def truncate(self, seq: SeqKV, n: int) -> None:
        """Keep the first n tokens of `seq`, releasing blocks past them."""
        n = max(0, min(n, seq.n_tokens))
        keep = self.blocks_needed(n)
        for b in seq.blocks[keep:]:
            self.pool.release(b)
        del seq.blocks[keep:]
        seq.n_tokens = n

    def clear(self, seq: SeqKV) -> None:
        self.truncate(seq, 0)

    def share_prefix(self, src: SeqKV, n: int) -> SeqKV:
        """A new sequence holding the first n tokens of `src`, sharing its blocks."""
        n = min(n, src.n_tokens)
        blocks = src.blocks[: self.blocks_needed(n)]
        for b in blocks:
            self.pool.incref(b)
        return SeqKV(list(blocks), n)

    # ---- addressing ----------------------------------------------------------------------
    def slot_mapping(self, seq: SeqKV, start: int, end: int) -> torch.Tensor:
        """Flat slot index (block * block_size + offset) of tokens [start, end): [end - start] int64."""
        idx = torch.arange(start, end, dtype=torch.int64)
        table = torch.tensor(seq.blocks, dtype=torch.int64)
        return table[idx // self.block_size] * self.block_size + idx % self.block_size

    # ---- moving KV data ----------------------------------------------------------------
    def gather(self, seq: SeqKV, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of K and V of tokens [start, end) per layer: lists of [n, KVH, D]."""
        return self.gather_slots(self.slot_mapping(seq, start, end))

    def gather_slots(self, slots: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of K and V at flat slots [n] per layer: lists of [n, KVH, D]."""
        slots = slots.to(self.device)
        heads = self.k[0].shape[2]
        ks = [self.k[l].view(-1, heads, self.head_dim)[slots].clone() for l in range(self.n_layers)]
        vs = [self.v[l].view(-1, heads, self.head_dim)[slots].clone() for l in range(self.n_layers)]
        return ks, vs

    def scatter(self, seq: SeqKV, start: int, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Write per-layer K/V [n, KVH, D] at token positions [start, start + n) (blocks reserved)."""
        self.scatter_slots(self.slot_mapping(seq, start, start + ks[0].shape[0]), ks, vs)

    def scatter_slots(self, slots: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Write per-layer K/V [n, KVH, D] at flat slots [n]."""
        slots = slots.to(self.device)
        for l in range(self.n_layers):
            kernels.write_kv(ks[l].to(self.device, self.dtype), vs[l].to(self.device, self.dtype),
                             self.k[l], self.v[l], slots)

    def move(self, seq: SeqKV, src: int, dst: int, n: int, inv_freq: torch.Tensor | list[torch.Tensor],
             neox: bool) -> None:
        """Move tokens [src, src + n) to [dst, dst + n) (dst < src), re-rotating keys by the
        position delta (dst - src) as llama.cpp's seq_add does for --cache-reuse. `inv_freq`: one
        for every layer, or a list per layer (gemma3's local layers have their own RoPE base)."""
        assert dst <= src
        if n <= 0 or dst == src:
            return
        ks, vs = self.gather(seq, src, src + n)
        delta = torch.full((n,), dst - src, dtype=torch.int64, device=self.device)
        freqs = inv_freq if isinstance(inv_freq, list) else [inv_freq] * len(ks)
        ks = [kernels.rope(k.float(), delta, f.to(self.device), neox) for k, f in zip(ks, freqs)]
        self.scatter(seq, dst, ks, vs)

    def export(self, seq: SeqKV, n: int | None = None) -> dict:
        """Host copy of the first n tokens' KV: {"k": [L, n, KVH, D], "v": [L, n, KVH, D]}."""
        n = seq.n_tokens if n is None else n
        ks, vs = self.gather(seq, 0, n)
        return {"k": torch.stack(ks).cpu(), "v": torch.stack(vs).cpu()}

    def import_(self, seq: SeqKV, state: dict) -> None:
        """Replace `seq`'s content with an exported state."""
        self.clear(seq)
        n = state["k"].shape[1]
        self.reserve(seq, n)
        self.scatter(seq, 0, list(state["k"].unbind(0)), list(state["v"].unbind(0)))
        seq.n_tokens = n
