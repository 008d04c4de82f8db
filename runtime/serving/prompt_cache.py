"""Prompt reuse across requests: the longest common prefix, llama.cpp's `--cache-reuse` chunk walk,
and the host-RAM prompt cache (`--cache-ram`) of saved slot states.

`swap_with_ram_cache` and `reusable_prefix` are what a slot does with them when a new prompt
arrives (called by the scheduler while admitting a task), through the block manager
(`runtime/serving/blocks.py`: export, import, clear, move); the rest are pure functions and a small
data structure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from runtime.model.kv_store import KVState
from runtime.serving.blocks import BlockManager, OutOfBlocks
from runtime.serving.slots import Slot, common_prefix


def cache_reuse_plan(cache: list[int], prompt: list[int], n_past: int, n_reuse: int) -> tuple[list[tuple[int, int, int]], int]:
    """llama.cpp's reuse loop: walk the cached tokens after the common prefix and move every run of
    at least `n_reuse` tokens that matches the prompt at the current position to that position.
    Returns ([(src, dst, n), ...], new n_past)."""
    moves = []
    head_c = head_p = n_past
    while head_c < len(cache) and head_p < len(prompt):
        n = 0
        while head_c + n < len(cache) and head_p + n < len(prompt) and cache[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= n_reuse:
            if head_c != head_p:
                moves.append((head_c, head_p, n))
            n_past += n
            head_c += n
            head_p += n
        else:
            head_c += 1
    return moves, n_past


# ---- host-RAM prompt cache -------------------------------------------------------------------

@dataclass
class CacheEntry:
    tokens: list[int]
    state: KVState  # the tokens' K/V rows on the host
    size: int
    checkpoints: list[int] = field(default_factory=list)  # the slot's context checkpoints (Slot.checkpoints)


@dataclass
class PromptCache:
    """Saved slot states, oldest first (FIFO eviction, as llama.cpp's server_prompt_cache). `trace`
    receives llama-server's trace lines of the cache (the server logs them at debug level, -v)."""
    limit_bytes: int | None  # None = no size limit
    limit_tokens: int = 0
    entries: list[CacheEntry] = field(default_factory=list)
    trace: Callable[[str], None] = field(default=lambda line: None, repr=False)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def save(self, tokens: list[int], export, nbytes: int = 0, checkpoints: list[int] | None = None) -> bool:
        """Save a slot's state (`nbytes` once exported) unless an entry already holds these tokens as
        a prefix or it alone exceeds the size limit; entries that the new one fully contains are
        dropped, then the oldest ones while the new one would not fit (server_prompt_cache::alloc)."""
        for e in self.entries:
            if len(e.tokens) >= len(tokens) and e.tokens[: len(tokens)] == tokens:
                return False
        if self.limit_bytes is not None and nbytes > self.limit_bytes:
            self.trace(f"srv          save:  - prompt state size {nbytes / 2**20:.3f} MiB exceeds cache size limit "
                       f"{self.limit_bytes / 2**20:.3f} MiB, skipping")
            return False
        self.entries = [e for e in self.entries
                        if not (len(e.tokens) <= len(tokens) and tokens[: len(e.tokens)] == e.tokens)]
        if self.limit_bytes is not None:
            while self.entries and self.size + nbytes > self.limit_bytes:
                self.entries.pop(0)
        state = export()
        self.entries.append(CacheEntry(list(tokens), state, state.nbytes, list(checkpoints or [])))
        return True

    def take_best(self, cur: list[int], new: list[int]) -> CacheEntry | None:
        """Remove and return the entry that keeps more of itself and covers more of `new` than the
        slot's current content does (entries keeping < 25% of themselves are never used)."""
        if not new:
            return None
        lcp = common_prefix(cur, new)
        f_keep_best = lcp / len(cur) if cur else -1.0
        sim_best = lcp / len(new)
        self.trace(f"srv          load:  - looking for better prompt, base f_keep = {f_keep_best:.3f}, "
                   f"f_sim = {sim_best:.3f}")
        best = None
        for e in self.entries:
            lcp_cur = common_prefix(e.tokens, new)
            f_keep = lcp_cur / len(e.tokens)
            sim = lcp_cur / len(new)
            self.trace(f"srv          load:    - prompt with length {len(e.tokens):7d}, lcp = {lcp_cur:7d}, "
                       f"f_keep = {f_keep:.3f}, f_sim = {sim:.3f}")
            if f_keep < 0.25:
                continue
            if f_keep_best < f_keep and sim_best < sim:
                f_keep_best, sim_best, best = f_keep, sim, e
        if best is not None:
            self.trace(f"srv          load:  - found better prompt with f_keep = {f_keep_best:.3f}, f_sim = {sim_best:.3f}")
            self.entries.remove(best)
        return best

    def update(self) -> None:
        """Evict oldest entries over the size limit, then over the token limit, which grows to what
        the size limit holds at the entries' average size per token (server_prompt_cache::update)."""
        if self.limit_bytes is not None:
            while self.entries and self.size > self.limit_bytes:
                self.entries.pop(0)
        limit_tokens = self.limit_tokens
        if self.limit_bytes:
            per_tok = max(1.0, self.size / max(self.n_tokens, 1))
            limit_tokens = max(limit_tokens, int(self.limit_bytes / per_tok))
        if self.limit_tokens > 0:
            while self.entries and self.n_tokens > limit_tokens:
                self.entries.pop(0)
        mib = 1024.0 * 1024.0
        self.trace(f"srv        update:  - cache state: {len(self.entries)} prompts, {self.size / mib:.3f} MiB "
                   f"(limits: {(self.limit_bytes or 0) / mib:.3f} MiB, {self.limit_tokens} tokens, {limit_tokens} est)")
        for e in self.entries:
            self.trace(f"srv        update:    - prompt {id(e):#x}: {len(e.tokens):7d} tokens, checkpoints:  0, "
                       f"{e.size / mib:9.3f} MiB")


def save_slot(cache: PromptCache, blocks: BlockManager, s: Slot) -> bool:
    """The slot's cached tokens and their KV into the RAM cache (False: not saved)."""
    n = len(s.tokens)
    return cache.save(s.tokens, lambda: blocks.export(s.seq, n), blocks.state_bytes(n), s.checkpoints)


def swap_with_ram_cache(cache: PromptCache, blocks: BlockManager, s: Slot, prompt: list[int], by_lru: bool,
                        reserve: Callable[[Slot, int], None]) -> bool:
    """When the slot's content is mostly lost to the new prompt (or the slot was picked as the least
    recently used one), save it to the RAM cache and load the entry that matches the prompt better,
    if any (`reserve` may purge idle slots to make room; without room the prompt is recomputed)."""
    if not s.tokens and not by_lru:  # a slot asked for by id and empty: llama-server's f_keep is 0/0, no swap
        return False
    lcp = common_prefix(s.tokens, prompt)
    f_keep = lcp / len(s.tokens) if s.tokens else 0.0
    if not (by_lru or f_keep < 0.5):
        return False
    if s.tokens:
        save_slot(cache, blocks, s)
    entry = cache.take_best(s.tokens, prompt)
    if entry is not None:
        blocks.clear(s.seq)  # its content is in the RAM cache now
        s.tokens, s.checkpoints = [], []
        try:
            reserve(s, len(entry.tokens))
            blocks.import_(s.seq, entry.state)
            s.tokens, s.checkpoints = list(entry.tokens), list(entry.checkpoints)
        except OutOfBlocks:
            blocks.clear(s.seq)
    cache.update()
    return True


def cache_idle_slot(cache: PromptCache, blocks: BlockManager, s: Slot, clear: bool) -> bool:
    """`--cache-idle-slots`: an idle slot's content goes to the RAM cache when another slot starts a
    task (False: nothing new to save); with a unified KV cache the slot is then cleared, so its blocks
    serve the running tasks (llama-server's TAG_IDLE_SLOT_CLEAR)."""
    saved = bool(s.tokens) and save_slot(cache, blocks, s)
    if saved:
        cache.update()
    if clear and s.tokens:
        blocks.clear(s.seq)
        s.tokens, s.checkpoints = [], []
    return saved


def reusable_prefix(blocks: BlockManager, s: Slot, prompt: list[int], n_reuse: int) -> int:
    """How many of the prompt's first tokens the slot already holds: the common prefix, extended by
    moving matching chunks of at least `n_reuse` tokens into place (`--cache-reuse`, keys re-rotated)."""
    n_past = common_prefix(s.tokens, prompt)
    if not blocks.can_move(s.seq):  # the sliding-window layers dropped the start: no chunk moves
        n_reuse = 0
    if n_reuse and n_reuse > 0:
        moves, n_past = cache_reuse_plan(s.tokens, prompt, n_past, n_reuse)
        for src, dst, n in moves:
            blocks.move(s.seq, src, dst, n)
            s.tokens[dst:dst + n] = s.tokens[src:src + n]
    return n_past
