"""The block manager: the one owner of the KV cache's blocks and of every sequence's block table.

The K/V tensors are the model room's (`runtime/model/kv_store.py`, `KVStore`); which block belongs
to which sequence is decided here alone. Blocks are handed out from free lists with reference
counts, so a cached prefix can be shared (`share_prefix` increments the counts of its blocks) and
a write into a shared block first copies it (copy on write, in `reserve` and `advance_window`).
Everything in the serving room that changes what the cache holds (the scheduler, the slots'
purge, the RAM prompt cache, slot files, the runner, the warm-up) goes through a `BlockManager`;
the model and the CUDA graphs only read the tables they are handed and write the blocks named there.

The interface (what a caller may use; the rest is private):
- `reserve(seq, n_total)`: blocks for n_total tokens, copy on write of a shared last block;
  raises `OutOfBlocks` leaving the pool unchanged.
- `commit(seq, n_tokens)`: a forward wrote the rows up to n_tokens (the runner, after each step).
- `share_prefix(src, n) -> SeqKV`: a new table sharing src's first n tokens.
- `truncate(seq, n)` / `clear(seq)`: keep the first n tokens / none (draft rollback is a truncate;
  restores a context checkpoint's state where one is needed, below).
- `advance_window(seq, n_past, n_end)`, `window_ok(seq, n_past)`: sliding-window layers (below).
- `checkpoint(seq, keep)`: a context checkpoint after the sequence's tokens (below).
- `attach_recurrent(store, layers)`, `release_cell(seq)`: hybrid models' recurrent cells (below).
- `can_move(seq)`, `move(seq, src, dst, n)`: --cache-reuse chunk moves, keys re-rotated.
- `export(seq, n) -> KVState`, `state_bytes(n)`, `import_(seq, state)`: host rows in the store's
  own types, for the RAM prompt cache and slot files.
- `usage() -> KVUsage`, `swa_blocks_in_use()`: numbers for /metrics and the tests.

Sliding-window layers (the store's SWA pool; not with --swa-full): a sequence has a second block
table `SeqKV.swa_blocks`, indexed like `blocks` (entry j holds positions j*BS .. j*BS + BS - 1),
whose entries for blocks that fell entirely out of the window are `NULL_BLOCK`.
`advance_window(seq, n_past, n_end)`, called before every forward (micro-batch) that writes
positions n_past .. n_end - 1, allocates those the micro-batch writes and marks the blocks below the
first query's window (p < n_past - W + 1, whole blocks only: `SeqKV.swa_lo`); with `swa_keep` 0 it
frees them at once (a sequence then holds at most ceil((W - 1 + rows) / BS) + 1 SWA blocks and a pool
of every slot's window plus one micro-batch, `swa_blocks_for`, never runs out); the server keeps
them, as llama.cpp's SWA cache keeps its masked cells, until the pool needs room (`_make_room`: the
sequence keeping the most of them gives its oldest back first; its pool is at least llama.cpp's cells,
`swa_pool_blocks`). `SeqKV.swa_start`: positions below it have no SWA K/V any more; a
cached prefix can only be resumed at n_past when `window_ok(seq, n_past)` (the next token's window
is still there: llama-server's pos_min check), or when a context checkpoint holds it (`checkpoint`:
`SeqKV.swa_ckpt[c]`, the window's rows before the batch at c, written back by `truncate(seq, c - 1)`).
Exports carry `swa_start` (their SWA rows below it are zeros), not the checkpoints.

Hybrid models (qwen35 / qwen35moe) keep each sequence's recurrent state in the store's
`RecurrentStore` (`attach_recurrent`), so that one owner hands out everything a sequence has
cached: `SeqKV.rs` is the sequence's cell (given by `reserve`, given back by `release_cell`),
holding its state after its n_tokens tokens; `SeqKV.rs_ckpt` its context checkpoints (llama-server's,
for recurrent memory: host copies of the state after c tokens, taken by `checkpoint` before a prompt
batch starting at c). A recurrent state cannot be rolled back: `truncate(seq, n)` to 0 < n < n_tokens
restores the checkpoint at n (`window_ok` says whether one is there) and drops the checkpoints past
n; exports (RAM prompt cache, slot files) carry the state and the checkpoints.
"""
from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field

from runtime.model.kv_store import NULL_BLOCK, KVState, KVStore, SeqKV


class OutOfBlocks(RuntimeError):
    pass


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
        # last freed, first reused: blocks that were never written stay untouched (kv_store._zeros)
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


def swa_blocks_for(window: int, n_seqs: int, n_ubatch: int, block_size: int) -> int:
    """SWA pool size that can never run out: every sequence's window (two partial blocks at its
    ends) plus the rows of one micro-batch."""
    per_seq = (window + block_size - 1) // block_size + 2
    return n_seqs * per_seq + (n_ubatch + block_size - 1) // block_size


def swa_cells(window: int, n_seqs: int, n_ubatch: int, n_ctx_seq: int, unified: bool) -> int:
    """The cells of llama.cpp b1's SWA cache, all streams: GGML_PAD(min(n_ctx_seq, n_swa * (n_seq if
    unified else 1) + n_ubatch), 256) per stream (llama_kv_cache_iswa), one stream or one per sequence."""
    cells = min(n_ctx_seq, window * (n_seqs if unified else 1) + n_ubatch)
    return (cells + 255) // 256 * 256 * (1 if unified else n_seqs)


def swa_pool_blocks(window: int, n_seqs: int, n_ubatch: int, n_ctx_seq: int, unified: bool, block_size: int) -> int:
    """The SWA pool of a server: at least llama.cpp's cells (`swa_cells`) in blocks, one partial block
    per sequence more, and never less than `swa_blocks_for` (what the windows and a micro-batch need)."""
    cells = swa_cells(window, n_seqs, n_ubatch, n_ctx_seq, unified)
    return max(swa_blocks_for(window, n_seqs, n_ubatch, block_size), (cells + block_size - 1) // block_size + n_seqs)


@dataclass(frozen=True)
class KVUsage:
    """Blocks of the main pool and of the SWA pool (0 without one), in all and free."""
    n_blocks: int
    n_free: int
    n_swa_blocks: int = 0
    n_swa_free: int = 0

    @property
    def ratio(self) -> float:
        """Share of the main pool's blocks held by sequences (/metrics' kv_cache_usage_ratio)."""
        return 1.0 - self.n_free / max(1, self.n_blocks)


class BlockManager:
    def __init__(self, store: KVStore, swa_keep: int = 0):
        """`swa_keep` > 0: sliding-window layers keep the blocks below their window until the SWA pool
        needs them (llama.cpp's SWA cache; the pool is `swa_pool_blocks`), and an import restores up to
        that many positions below the window (the pool's blocks beyond `swa_blocks_for`, in positions);
        0: they release them at once."""
        self.store = store
        self.swa_keep = swa_keep
        self.swa_retain = swa_keep > 0
        # sequences holding SWA blocks (the ones `_make_room` may take blocks below the window from)
        self._swa_holders: weakref.WeakValueDictionary[int, SeqKV] = weakref.WeakValueDictionary()
        self.block_size = store.block_size
        self.window = store.window  # 0: no SWA pool
        self.pool = BlockPool(store.num_blocks)
        self.swa_pool = None
        if self.window:
            self.swa_pool = BlockPool(store.num_swa_blocks + 1)
            self.swa_pool.free.remove(NULL_BLOCK)  # never handed out: stays zero
            self.swa_pool.refs[NULL_BLOCK] = 1
        self._rs_free: list[int] = []  # hybrid models: recurrent cells no sequence holds

    def attach_recurrent(self, rs, recurrent_layers: list[bool]) -> None:
        """Hybrid models: the store keeps `rs` (a RecurrentStore; `recurrent_layers`: which layers
        are recurrent, they hold no K/V); sequences get one of its cells when first reserved."""
        self.store.rs, self.store.recurrent_layers = rs, list(recurrent_layers)
        self._rs_free = list(range(rs.n_cells - 1, -1, -1))

    def release_cell(self, seq: SeqKV) -> None:
        """A sequence that is dropped gives its recurrent cell back (the warm-up's)."""
        if self.store.rs is not None and seq.rs >= 0:
            self._rs_free.append(seq.rs)
            seq.rs = -1

    def blocks_needed(self, n_tokens: int) -> int:
        return (n_tokens + self.block_size - 1) // self.block_size

    # ---- allocation ----------------------------------------------------------------------
    def reserve(self, seq: SeqKV, n_total: int) -> None:
        """Make room for `n_total` tokens in `seq`, copying the last block first if it is shared
        and about to be written (copy on write); hybrid models: a recurrent cell for a sequence
        without one. Raises OutOfBlocks."""
        if self.store.rs is not None and seq.rs < 0:
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

    def commit(self, seq: SeqKV, n_tokens: int) -> None:
        """A forward wrote `seq`'s rows up to n_tokens (its blocks were reserved): it holds them now."""
        seq.n_tokens = n_tokens

    def _copy_block(self, src: int, swa: bool = False) -> int:
        """Copy on write: a fresh block of the main (or SWA) pool holding block src's K/V, src released."""
        pool = self.swa_pool if swa else self.pool
        dst = pool.alloc()
        self.store.copy_block(src, dst, swa)
        pool.release(src)
        return dst

    def truncate(self, seq: SeqKV, n: int) -> None:
        """Keep the first n tokens of `seq`, releasing blocks past them (hybrid models: the recurrent
        state of the checkpoint at n, which must be there when 0 < n < n_tokens; sliding-window
        layers: the window of a checkpoint at n + 1 written back where it had been dropped)."""
        n = max(0, min(n, seq.n_tokens))
        rs = self.store.rs
        if rs is not None:
            if 0 < n < seq.n_tokens:
                if n not in seq.rs_ckpt:
                    raise ValueError(f"the recurrent state cannot be rolled back to {n} tokens (no checkpoint)")
                rs.load(seq.rs, *seq.rs_ckpt[n])
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
            seq.swa_lo = min(seq.swa_lo, max(0, n - self.window + 1) // self.block_size)
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
        if self.swa_retain:
            self._make_room(sum(1 for j in range(lo // BS, need) if table[j] == NULL_BLOCK or pool.refs[table[j]] > 1))
        for j in range(lo // BS, need):
            if table[j] != NULL_BLOCK and pool.refs[table[j]] > 1:
                table[j] = self._copy_block(table[j], swa=True)
            if table[j] == NULL_BLOCK:
                table[j] = pool.alloc()
        a, b = lo - first, n - first
        self.store.write_window(seq, lo, [k[a:b] for k in ks], [v[a:b] for v in vs])
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
        out = SeqKV(list(blocks), n, list(swa), min(src.swa_start, n) if swa else 0,
                    min(src.swa_lo, max(0, n - self.window + 1) // self.block_size) if swa else 0)
        if swa:
            self._swa_holders[id(out)] = out
        return out

    # ---- sliding-window layers -------------------------------------------------------------
    def advance_window(self, seq: SeqKV, n_past: int, n_end: int) -> None:
        """Before a forward writing positions [n_past, n_end): mark the SWA blocks that no query
        of it can see (all positions < n_past - W + 1: `SeqKV.swa_lo`) and free them (`swa_keep` 0),
        or leave them until the pool needs room (`_make_room`); allocate the ones it writes (copying a
        shared one first). No-op without an SWA pool. Raises OutOfBlocks (not with the pool sized
        by `swa_blocks_for`)."""
        if not self.window:
            return
        BS, table, pool = self.block_size, seq.swa_blocks, self.swa_pool
        lo = max(0, n_past - self.window + 1) // BS
        need = self.blocks_needed(n_end)
        table.extend([NULL_BLOCK] * (need - len(table)))
        w = n_past // BS  # the block the first new row goes to may be shared
        seq.swa_lo = max(seq.swa_lo, lo)
        if not self.swa_retain:
            self._drop_below(seq, lo)
        else:  # kept until the pool needs them (llama.cpp's SWA cache overwrites masked cells only then)
            n_new = sum(1 for j in range(w, need) if table[j] == NULL_BLOCK)
            self._make_room(n_new + (w < need and table[w] != NULL_BLOCK and pool.refs[table[w]] > 1))
        self._swa_holders[id(seq)] = seq
        if w < need and table[w] != NULL_BLOCK and pool.refs[table[w]] > 1:
            table[w] = self._copy_block(table[w], swa=True)
        for j in range(w, need):  # (entries in [lo, w) are held unless resumed past the window)
            if table[j] == NULL_BLOCK:
                table[j] = pool.alloc()
        if seq.swa_start > n_past:  # rewritten from n_past on (after a truncation into dropped blocks)
            seq.swa_start = n_past

    def _drop_below(self, seq: SeqKV, j_end: int) -> int:
        """Release `seq`'s SWA blocks of table entries < j_end (oldest first); the count released."""
        n = 0
        for j in range(min(j_end, len(seq.swa_blocks))):
            if seq.swa_blocks[j] != NULL_BLOCK:
                self.swa_pool.release(seq.swa_blocks[j])
                seq.swa_blocks[j] = NULL_BLOCK
                n += 1
        seq.swa_start = max(seq.swa_start, j_end * self.block_size)
        return n

    def _make_room(self, n: int) -> None:
        """At least n free SWA blocks: blocks below a sequence's window released, oldest first, from
        the sequence that keeps the most of them first (under pressure every sequence keeps a like
        share of the pool). Those are never short of what the windows and a micro-batch need
        (the pool is at least `swa_blocks_for`)."""
        pool = self.swa_pool
        if pool.n_free >= n:
            return
        kept = {}
        for key, s in list(self._swa_holders.items()):
            c = sum(1 for b in s.swa_blocks[:s.swa_lo] if b != NULL_BLOCK)
            if c:
                kept[key] = c
        while pool.n_free < n and kept:
            key = max(kept, key=kept.get)
            s = self._swa_holders[key]
            j = next(j for j in range(s.swa_lo) if s.swa_blocks[j] != NULL_BLOCK)
            self._drop_below(s, j + 1)
            kept[key] -= 1
            if not kept[key]:
                del kept[key]

    def window_ok(self, seq: SeqKV, n_past: int) -> bool:
        """Whether a token at position n_past (after truncating to n_past) finds its whole window:
        every position from n_past - W + 1 is still held by the SWA layers (or a context checkpoint
        saved before the batch at n_past + 1 holds it: `truncate` restores it); hybrid models:
        whether the recurrent state after n_past tokens is there (the cell's or a checkpoint's)."""
        if self.store.rs is not None and 0 < n_past != seq.n_tokens and n_past not in seq.rs_ckpt:
            return False
        if not self.window or n_past == 0:
            return True
        return seq.swa_start <= max(0, n_past - self.window + 1) or (n_past + 1) in seq.swa_ckpt

    # ---- context checkpoints -----------------------------------------------------------------
    def checkpoint(self, seq: SeqKV, keep: list[int]) -> None:
        """A context checkpoint after the sequence's n_tokens (taken before a batch that starts
        there): hybrid models' recurrent state; sliding-window models' window (the rows the SWA
        layers hold, as llama-server's checkpoint saves its SWA cache). Checkpoints not at a
        position of `keep` are dropped."""
        n = seq.n_tokens
        if self.store.rs is not None and seq.rs >= 0:
            if n in keep:
                seq.rs_ckpt[n] = self.store.rs.export(seq.rs)
            seq.rs_ckpt = {c: st for c, st in seq.rs_ckpt.items() if c in keep}
        if self.window and n > 1:
            if n in keep:  # (the rows `truncate(seq, n - 1)` writes back: from the window's first block)
                first = min(max(seq.swa_start, max(0, n - self.window) // self.block_size * self.block_size), n)
                seq.swa_ckpt[n] = (first, *self.store.read_window(seq, first, n))
            seq.swa_ckpt = {c: st for c, st in seq.swa_ckpt.items() if c in keep}

    # ---- moving KV data ----------------------------------------------------------------
    def can_move(self, seq: SeqKV) -> bool:
        """Whether `move` may shift `seq`'s tokens: not once its sliding-window layers dropped any,
        nor under a recurrent state (it holds every token in order)."""
        return not (self.window and seq.swa_start > 0) and self.store.rs is None

    def move(self, seq: SeqKV, src: int, dst: int, n: int) -> None:
        """Move tokens [src, src + n) to [dst, dst + n) (dst <= src), re-rotating keys by the
        position delta (dst - src) as llama.cpp's seq_add does for --cache-reuse (the store's
        `KeyRotation`). The blocks are the sequence's own; n_tokens is the caller's to truncate."""
        assert dst <= src
        if n <= 0 or dst == src:
            return
        self.store.move(seq, src, dst, n)

    def shift(self, seq: SeqKV, n_keep: int, n_discard: int) -> None:
        """llama.cpp's context shift (`seq_rm(n_keep, n_keep + n_discard)`, then `seq_add` of
        -n_discard to the rest): tokens [n_keep + n_discard, n) move down to n_keep, their keys
        re-rotated by -n_discard, and the sequence holds n - n_discard tokens. Shared blocks that
        the move writes are copied first. Not with an SWA pool (`can_move`)."""
        n = seq.n_tokens
        assert self.can_move(seq) and 0 <= n_keep and 0 <= n_discard and n_keep + n_discard <= n
        if n_discard == 0:
            return
        for i in range(n_keep // self.block_size, self.blocks_needed(n - n_discard)):
            if self.pool.refs[seq.blocks[i]] > 1:
                seq.blocks[i] = self._copy_block(seq.blocks[i])
        self.move(seq, n_keep + n_discard, n_keep, n - n_keep - n_discard)
        self.truncate(seq, n - n_discard)

    def export(self, seq: SeqKV, n: int | None = None) -> KVState:
        """Host copy of the first n tokens' K/V in the store's rows; with an SWA pool also
        `swa_start` (the SWA layers' rows below it are zeros: not held); hybrid models also the
        recurrent state after n tokens (the cell's, n = n_tokens, or a checkpoint's) and the
        checkpoints up to n."""
        n = seq.n_tokens if n is None else n
        state = self.store.read(seq, n)
        if self.window:
            state.swa_start = min(seq.swa_start, n)
        if self.store.rs is not None:
            state.rs = self.store.rs.export(seq.rs) if n == seq.n_tokens else seq.rs_ckpt[n]
            state.rs_ckpt = {c: seq.rs_ckpt[c] for c in sorted(seq.rs_ckpt) if c <= n}
        return state

    def state_bytes(self, n_tokens: int) -> int:
        """What `export` of n tokens holds (the RAM cache's size check before it exports)."""
        return n_tokens * self.store.bytes_per_token

    def import_(self, seq: SeqKV, state: KVState) -> None:
        """Replace `seq`'s content with an exported state (SWA layers: only what the window of the
        next token needs, and only what the state holds). Raises OutOfBlocks (the caller clears `seq`)."""
        self.clear(seq)
        n = state.n_tokens
        self.reserve(seq, n)
        if self.window:
            # a state without swa_start (a slot file) vouches for the next token's window only; of a
            # state's rows, its window and up to `swa_keep` positions before it
            held = state.swa_start if state.swa_start is not None else n - self.window + 1
            span = self.window + self.swa_keep
            first = max(held, n - span, 0)
            seq.swa_blocks = [NULL_BLOCK] * (first // self.block_size)
            seq.swa_start = first
            self.advance_window(seq, first, n)  # allocates the blocks of [first, n)
            seq.swa_start = first
            seq.swa_lo = max(0, n - self.window + 1) // self.block_size
        self.store.write(seq, state)
        seq.n_tokens = n
        if self.store.rs is not None:
            if state.rs is None:
                raise ValueError("the state holds no recurrent state")
            self.store.rs.load(seq.rs, *state.rs)
            seq.rs_ckpt = {c: (conv.clone(), ssm.clone()) for c, (conv, ssm) in state.rs_ckpt.items()}

    # ---- numbers ---------------------------------------------------------------------------
    def usage(self) -> KVUsage:
        if not self.window:
            return KVUsage(self.pool.num_blocks, self.pool.n_free)
        return KVUsage(self.pool.num_blocks, self.pool.n_free, self.swa_pool.num_blocks - 1, self.swa_pool.n_free)

    def swa_blocks_in_use(self) -> int:
        u = self.usage()
        return u.n_swa_blocks - u.n_swa_free
