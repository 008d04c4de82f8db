"""Block-allocated (paged) KV cache.

Layout (one definition, see docs/DESIGN.md): per layer `k[l], v[l]: [num_blocks, block_size, n_kv_heads, head_dim]`.
A sequence owns an ordered list of blocks (its block table); token i of the sequence lives in
block `blocks[i // block_size]` at offset `i % block_size`, so its position equals its index.
Keys are stored already rotated by RoPE at that position.

Blocks are reference counted so a cached prefix can be shared between sequences: sharing a
prefix increments the counts of its full blocks, and a write into a shared block first copies it
(copy on write).

Sliding-window layers (gemma2/3's local layers; `windows` given, i.e. not --swa-full) keep only
what their attention can still read, in a second pool of their own (`swa_pool`, K/V tensors
`[num_swa_blocks + 1, block_size, KVH, D]` for those layers). A sequence has a second block table
`SeqKV.swa_blocks`, indexed like `blocks` (entry j holds positions j*BS .. j*BS + BS - 1), whose
entries for blocks that fell entirely out of the window are `NULL_BLOCK` (block 0 of the SWA pool,
never allocated and all zeros) so that a table still maps position p to entry p // BS and the
attention kernels, which mask keys before p - W + 1 (and skip whole blocks before the window),
read exactly what they read with the full cache. `advance_window(seq, n_past, n_end)`, called
before every forward (micro-batch) that writes positions n_past .. n_end - 1, frees the blocks
below the first query's window (p < n_past - W + 1, whole blocks only) and allocates those the
micro-batch writes; so a sequence holds at most ceil((W - 1 + rows) / BS) + 1 SWA blocks and the
pool is sized for every slot's window plus one micro-batch (`swa_blocks_for`). `SeqKV.swa_start`:
positions below it have no SWA K/V any more; a cached prefix can only be resumed at n_past when
`window_ok(seq, n_past)` (the next token's window is still there: llama-server's pos_min check),
or when a context checkpoint holds it (`checkpoint`: `SeqKV.swa_ckpt[c]`, the window's rows before
the batch at c, restored by `truncate(seq, c - 1)`). Exports carry `swa_start` (their SWA rows below
it are zeros), not the checkpoints.

Hybrid models (qwen35 / qwen35moe: gated linear-attention layers beside full attention) keep each
sequence's recurrent state (`runtime.model.recurrent.RecurrentStore`, attached as `rs`) here too,
so that one owner holds everything a sequence has cached: `SeqKV.rs` is the sequence's cell (given
by `reserve`), holding its state after its `n_tokens` tokens; `SeqKV.rs_ckpt` its context
checkpoints (llama-server's, for recurrent memory: host copies of the state after c tokens, taken
by `checkpoint` before a prompt batch starting at c). A recurrent state cannot be rolled back:
`truncate(seq, n)` to 0 < n < n_tokens restores the checkpoint at n (`window_ok` says whether one
is there) and drops the checkpoints past n; exports (RAM prompt cache, slot files) carry the state
and the checkpoints.
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


NULL_BLOCK = 0  # the SWA pool's never-allocated zero block: table entries of dropped blocks


@dataclass
class SeqKV:
    """One sequence's view of the cache: its block table and how many tokens it holds; with
    sliding-window layers apart, their table (NULL_BLOCK where dropped) and the first position
    they still hold."""
    blocks: list[int] = field(default_factory=list)
    n_tokens: int = 0
    swa_blocks: list[int] = field(default_factory=list)
    swa_start: int = 0
    rs: int = -1  # hybrid models: this sequence's cell of the recurrent state (-1: none yet)
    # hybrid models: n -> (conv [L, K - 1, C], ssm [L, H, S, S]) host copies of the state after n tokens
    rs_ckpt: dict = field(default_factory=dict)
    # sliding-window models: c -> (first position, K list, V list: the SWA layers' rows [first, c) on
    # the host), the window held before the batch starting at c (a context checkpoint, resumed at c - 1)
    swa_ckpt: dict = field(default_factory=dict)


def swa_blocks_for(window: int, n_seqs: int, n_ubatch: int, block_size: int) -> int:
    """SWA pool size that can never run out: every sequence's window (two partial blocks at its
    ends) plus the rows of one micro-batch."""
    per_seq = (window + block_size - 1) // block_size + 2
    return n_seqs * per_seq + (n_ubatch + block_size - 1) // block_size


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float16, device: str | torch.device = "cpu",
                 windows: list[int] | None = None, num_swa_blocks: int = 0):
        """`windows`: sliding window per layer (0: global); with `num_swa_blocks` > 0 the layers
        with a window live in the SWA pool of that many blocks (see the module docstring)."""
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_size, self.num_blocks, self.dtype = block_size, num_blocks, dtype
        self.device = torch.device(device)
        ws = list(windows or []) if num_swa_blocks > 0 else []
        self.is_swa = [bool(ws[l]) if l < len(ws) else False for l in range(n_layers)]
        self.window = max(ws, default=0) if any(self.is_swa) else 0  # 0: no SWA pool
        assert len({w for w in ws if w}) <= 1, "one window for all local layers"
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        swa_shape = (num_swa_blocks + 1, block_size, n_kv_heads, head_dim)
        self.k = [_zeros(swa_shape if sw else shape, dtype, self.device) for sw in self.is_swa]
        self.v = [_zeros(swa_shape if sw else shape, dtype, self.device) for sw in self.is_swa]
        self.pool = BlockPool(num_blocks)
        self.swa_pool = None
        if self.window:
            self.swa_pool = BlockPool(num_swa_blocks + 1)
            self.swa_pool.free.remove(NULL_BLOCK)  # never handed out: stays zero
            self.swa_pool.refs[NULL_BLOCK] = 1
        self.rs = None  # hybrid models: the recurrent state (`attach_recurrent`)
        self.cell_ext = False  # M-RoPE models: slot files write llama.cpp's cell ext (x, y, token) per cell
        self.recurrent_layers: list[bool] = []
        self._rs_free: list[int] = []

    def attach_recurrent(self, store, recurrent_layers: list[bool]) -> None:
        """Hybrid models: sequences get a cell of `store` (a RecurrentStore) when first reserved;
        `recurrent_layers`: which layers are recurrent (they hold no K/V)."""
        self.rs, self.recurrent_layers = store, list(recurrent_layers)
        self._rs_free = list(range(store.n_cells - 1, -1, -1))

    def release_cell(self, seq: SeqKV) -> None:
        """A sequence that is dropped gives its recurrent cell back (warm-up)."""
        if self.rs is not None and seq.rs >= 0:
            self._rs_free.append(seq.rs)
            seq.rs = -1

    # ---- sizes -------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.k[0].element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of all K/V tensors (both pools)."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def blocks_needed(self, n_tokens: int) -> int:
        return (n_tokens + self.block_size - 1) // self.block_size

    # ---- allocation ----------------------------------------------------------------------
    def reserve(self, seq: SeqKV, n_total: int) -> None:
        """Make room for `n_total` tokens in `seq`, copying the last block first if it is shared
        and about to be written (copy on write). Raises OutOfBlocks."""
        if self.rs is not None and seq.rs < 0:
            if not self._rs_free:
                raise OutOfBlocks("no recurrent state cell left")
            seq.rs = self._rs_free.pop()
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

    def _copy_block(self, src: int, swa: bool = False) -> int:
        """Copy on write: a fresh block of the main (or SWA) pool holding block src's K/V, src released."""
        pool = self.swa_pool if swa else self.pool
        dst = pool.alloc()
        if swa:
            self._copy_layers(src, dst, swa=True)
        else:
            self.copy_data(src, dst)
        pool.release(src)
        return dst

    def copy_data(self, src: int, dst: int) -> None:
        """Copy block src's K/V into block dst (every layer of the main pool)."""
        self._copy_layers(src, dst, swa=False)

    def _copy_layers(self, src: int, dst: int, swa: bool) -> None:
        for layer in range(self.n_layers):
            if self.is_swa[layer] == swa:
                self.k[layer][dst].copy_(self.k[layer][src])
                self.v[layer][dst].copy_(self.v[layer][src])

    def truncate(self, seq: SeqKV, n: int) -> None:
        """Keep the first n tokens of `seq`, releasing blocks past them (hybrid models: the
        recurrent state of the checkpoint at n, which must be there when 0 < n < n_tokens)."""
        n = max(0, min(n, seq.n_tokens))
        if self.rs is not None:
            if 0 < n < seq.n_tokens:
                if n not in seq.rs_ckpt:
                    raise ValueError(f"the recurrent state cannot be rolled back to {n} tokens (no checkpoint)")
                self.rs.load(seq.rs, *seq.rs_ckpt[n])
            seq.rs_ckpt = {c: st for c, st in seq.rs_ckpt.items() if c <= n}
        keep = self.blocks_needed(n)
        for b in seq.blocks[keep:]:
            self.pool.release(b)
        del seq.blocks[keep:]
        seq.n_tokens = n
        if self.window:
            for b in seq.swa_blocks[keep:]:
                if b != NULL_BLOCK:
                    self.swa_pool.release(b)
            del seq.swa_blocks[keep:]
            seq.swa_start = min(seq.swa_start, n) if seq.swa_blocks else 0
            seq.swa_ckpt = {c: st for c, st in seq.swa_ckpt.items() if 1 < c and c - 1 <= n}
            ck = seq.swa_ckpt.get(n + 1)
            if n > 0 and ck is not None and seq.swa_start > max(0, n - self.window + 1):
                self._restore_window(seq, n, *ck)

    def _restore_window(self, seq: SeqKV, n: int, first: int, ks: list, vs: list) -> None:
        """The SWA layers' rows back from a context checkpoint (rows [first, ...)): those the window
        of position n reads, from its first block on, in fresh blocks."""
        BS, table, pool = self.block_size, seq.swa_blocks, self.swa_pool
        lo = max(first, max(0, n - self.window + 1) // BS * BS)
        need = self.blocks_needed(n)
        table.extend([NULL_BLOCK] * (need - len(table)))
        for j in range(lo // BS, need):
            if table[j] != NULL_BLOCK and pool.refs[table[j]] > 1:
                table[j] = self._copy_block(table[j], swa=True)
            if table[j] == NULL_BLOCK:
                table[j] = pool.alloc()
        slots = self.swa_slot_mapping(seq, lo, n).to(self.device)
        a, b = lo - first, n - first
        swa_layers = [l for l in range(self.n_layers) if self.is_swa[l]]
        for i, l in enumerate(swa_layers):
            kernels.write_kv(ks[i][a:b].to(self.device, self.dtype), vs[i][a:b].to(self.device, self.dtype),
                             self.k[l], self.v[l], slots)
        seq.swa_start = lo

    def clear(self, seq: SeqKV) -> None:
        self.truncate(seq, 0)

    def share_prefix(self, src: SeqKV, n: int) -> SeqKV:
        """A new sequence holding the first n tokens of `src`, sharing its blocks."""
        n = min(n, src.n_tokens)
        blocks = src.blocks[: self.blocks_needed(n)]
        for b in blocks:
            self.pool.incref(b)
        swa = src.swa_blocks[: len(blocks)] if self.window else []
        for b in swa:
            if b != NULL_BLOCK:
                self.swa_pool.incref(b)
        return SeqKV(list(blocks), n, list(swa), min(src.swa_start, n) if swa else 0)

    # ---- sliding-window layers -------------------------------------------------------------
    def advance_window(self, seq: SeqKV, n_past: int, n_end: int) -> None:
        """Before a forward writing positions [n_past, n_end): free the SWA blocks that no query
        of it can see (all positions < n_past - W + 1), allocate the ones it writes (copying a
        shared one first). No-op without an SWA pool. Raises OutOfBlocks (not with the pool sized
        by `swa_blocks_for`)."""
        if not self.window:
            return
        BS, table, pool = self.block_size, seq.swa_blocks, self.swa_pool
        lo = max(0, n_past - self.window + 1) // BS
        for j in range(min(lo, len(table))):
            if table[j] != NULL_BLOCK:
                pool.release(table[j])
                table[j] = NULL_BLOCK
        seq.swa_start = max(seq.swa_start, lo * BS)
        need = self.blocks_needed(n_end)
        table.extend([NULL_BLOCK] * (need - len(table)))
        w = n_past // BS  # the block the first new row goes to may be shared
        if w < need and table[w] != NULL_BLOCK and pool.refs[table[w]] > 1:
            table[w] = self._copy_block(table[w], swa=True)
        for j in range(w, need):  # (entries in [lo, w) are held unless resumed past the window)
            if table[j] == NULL_BLOCK:
                table[j] = pool.alloc()
        if seq.swa_start > n_past:  # rewritten from n_past on (after a truncation into dropped blocks)
            seq.swa_start = n_past

    def window_ok(self, seq: SeqKV, n_past: int) -> bool:
        """Whether a token at position n_past (after truncating to n_past) finds its whole window:
        every position from n_past - W + 1 is still held by the SWA layers."""
        if self.rs is not None and 0 < n_past != seq.n_tokens and n_past not in seq.rs_ckpt:
            return False  # the recurrent state is that after n_tokens, or a checkpoint's
        if not self.window or n_past == 0:
            return True
        # (a context checkpoint saved before the batch at n_past + 1 holds the window: `truncate` restores it)
        return seq.swa_start <= max(0, n_past - self.window + 1) or (n_past + 1) in seq.swa_ckpt

    # ---- recurrent state (hybrid models) -------------------------------------------------
    def checkpoint(self, seq: SeqKV, keep: list[int]) -> None:
        """A context checkpoint after the sequence's n_tokens (taken before a batch that starts
        there): hybrid models' recurrent state; sliding-window models' window (the rows the SWA
        layers hold, as llama-server's checkpoint saves its SWA cache). Checkpoints not at a
        position of `keep` are dropped."""
        n = seq.n_tokens
        if self.rs is not None and seq.rs >= 0:
            if n in keep:
                seq.rs_ckpt[n] = self.rs.export(seq.rs)
            seq.rs_ckpt = {c: st for c, st in seq.rs_ckpt.items() if c in keep}
        if self.window and n > 1:
            if n in keep:
                first = min(seq.swa_start, n)
                slots = self.swa_slot_mapping(seq, first, n, write=False).to(self.device)
                H, D = self.k[0].shape[2], self.head_dim
                swa_layers = [l for l in range(self.n_layers) if self.is_swa[l]]
                seq.swa_ckpt[n] = (first, [self.k[l].view(-1, H, D)[slots].cpu() for l in swa_layers],
                                   [self.v[l].view(-1, H, D)[slots].cpu() for l in swa_layers])
            seq.swa_ckpt = {c: st for c, st in seq.swa_ckpt.items() if c in keep}

    def swa_blocks_in_use(self) -> int:
        return 0 if not self.window else self.swa_pool.num_blocks - 1 - self.swa_pool.n_free

    # ---- addressing ----------------------------------------------------------------------
    def _slots(self, blocks: list[int], start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, flat slot = block * block_size + offset) of tokens [start, end) through a block table."""
        idx = torch.arange(start, end, dtype=torch.int64)
        blk = torch.tensor(blocks, dtype=torch.int64)[idx // self.block_size]
        return blk, blk * self.block_size + idx % self.block_size

    def slot_mapping(self, seq: SeqKV, start: int, end: int) -> torch.Tensor:
        """Flat slot index (block * block_size + offset) of tokens [start, end): [end - start] int64."""
        return self._slots(seq.blocks, start, end)[1]

    def swa_slot_mapping(self, seq: SeqKV, start: int, end: int, write: bool = True) -> torch.Tensor:
        """The same in the SWA pool: [end - start] int64; positions in dropped blocks map to -1
        (`write`: skipped by write_kv) or to the zero block (reads)."""
        blk, slots = self._slots(seq.swa_blocks, start, end)
        return torch.where(blk == NULL_BLOCK, -1, slots) if write else slots

    # ---- moving KV data ----------------------------------------------------------------
    def gather(self, seq: SeqKV, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of K and V of tokens [start, end) per layer: lists of [n, KVH, D] (SWA layers:
        zeros for dropped positions)."""
        swa = self.swa_slot_mapping(seq, start, end, write=False) if self.window else None
        return self.gather_slots(self.slot_mapping(seq, start, end), swa)

    def gather_slots(self, slots: torch.Tensor, swa_slots: torch.Tensor | None = None
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of K and V at flat slots [n] per layer (SWA layers: at `swa_slots`): lists of [n, KVH, D]."""
        slots = slots.to(self.device)
        swa_slots = swa_slots.to(self.device) if swa_slots is not None else None
        heads = self.k[0].shape[2]
        at = [swa_slots if self.is_swa[l] else slots for l in range(self.n_layers)]
        ks = [self.k[l].view(-1, heads, self.head_dim)[at[l]].clone() for l in range(self.n_layers)]
        vs = [self.v[l].view(-1, heads, self.head_dim)[at[l]].clone() for l in range(self.n_layers)]
        return ks, vs

    def scatter(self, seq: SeqKV, start: int, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Write per-layer K/V [n, KVH, D] at token positions [start, start + n) (blocks reserved;
        SWA layers: positions in dropped blocks are skipped)."""
        end = start + ks[0].shape[0]
        swa = self.swa_slot_mapping(seq, start, end) if self.window else None
        self.scatter_slots(self.slot_mapping(seq, start, end), ks, vs, swa)

    def scatter_slots(self, slots: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor],
                      swa_slots: torch.Tensor | None = None) -> None:
        """Write per-layer K/V [n, KVH, D] at flat slots [n] (SWA layers: at `swa_slots`)."""
        slots = slots.to(self.device)
        swa_slots = swa_slots.to(self.device) if swa_slots is not None else None
        for l in range(self.n_layers):
            kernels.write_kv(ks[l].to(self.device, self.dtype), vs[l].to(self.device, self.dtype),
                             self.k[l], self.v[l], swa_slots if self.is_swa[l] else slots)

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
        """Host copy of the first n tokens' KV: {"k": [L, n, KVH, D], "v": [L, n, KVH, D]}; with an
        SWA pool also "swa_start" (the SWA layers' rows below it are zeros: not held)."""
        n = seq.n_tokens if n is None else n
        ks, vs = self.gather(seq, 0, n)
        state = {"k": torch.stack(ks).cpu(), "v": torch.stack(vs).cpu()}
        if self.window:
            state["swa_start"] = min(seq.swa_start, n)
        if self.rs is not None:  # the state after n tokens: the cell's (n = n_tokens) or a checkpoint's
            conv, ssm = self.rs.export(seq.rs) if n == seq.n_tokens else seq.rs_ckpt[n]
            ck = sorted(c for c in seq.rs_ckpt if c <= n)
            state.update(rs_conv=conv, rs_ssm=ssm, rs_ckpt_pos=torch.tensor(ck, dtype=torch.int64),
                         rs_ckpt_conv=torch.stack([seq.rs_ckpt[c][0] for c in ck]) if ck else conv[:0],
                         rs_ckpt_ssm=torch.stack([seq.rs_ckpt[c][1] for c in ck]) if ck else ssm[:0])
        return state

    def import_(self, seq: SeqKV, state: dict) -> None:
        """Replace `seq`'s content with an exported state (SWA layers: only what the window of the
        next token needs, and only what the state holds)."""
        self.clear(seq)
        n = state["k"].shape[1]
        self.reserve(seq, n)
        if self.window:
            # a state without "swa_start" (a slot file) vouches for the next token's window only
            first = max(int(state.get("swa_start", n - self.window + 1)), n - self.window, 0)
            seq.swa_blocks = [NULL_BLOCK] * (first // self.block_size)
            seq.swa_start = first
            self.advance_window(seq, first, n)  # allocates the blocks of [first, n)
            seq.swa_start = first
        self.scatter(seq, 0, list(state["k"].unbind(0)), list(state["v"].unbind(0)))
        seq.n_tokens = n
        if self.rs is not None:
            if "rs_conv" not in state:
                raise ValueError("the state holds no recurrent state")
            self.rs.load(seq.rs, state["rs_conv"], state["rs_ssm"])
            pos = state.get("rs_ckpt_pos")
            seq.rs_ckpt = {} if pos is None else {
                int(c): (state["rs_ckpt_conv"][i].clone(), state["rs_ckpt_ssm"][i].clone())
                for i, c in enumerate(pos.tolist())}
