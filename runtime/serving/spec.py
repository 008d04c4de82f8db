"""Draft-free speculative decoding: llama.cpp b1-0c1e570's n-gram drafters (common/speculative.cpp,
common/ngram-map.cpp (in ngram_map.py), common/ngram-mod.cpp) and the per-slot numbers llama-server reports.

A generating slot whose drafter proposes tokens feeds its last sampled token and the draft in one
row (the verify step: a small prefill through the ordinary batched path, logits for every row);
the scheduler then samples the rows in order with the slot's own sampler, keeps the draft up to
the first token the target model did not choose, and truncates the rest from the KV cache through
the block manager. Greedy outputs are the tokens the slot would have produced one step at a time.

`Speculator` is the engine's (one per engine, like llama-server's `common_speculative` over its
n_parallel sequences): its drafters in llama.cpp's order of preference (ngram-simple, ngram-map-k,
ngram-map-k4v, ngram-mod, ngram-cache (in ngram_cache.py): the first that drafts for a sequence wins), per-slot state
indexed by slot id. Everything here is plain token-list work on the engine thread; nothing
touches the model or the cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime.serving.spec_adapt import DraftLength
from runtime.spec_config import DRAFT_FREE, NgramMapParams, NgramModParams, SpecConfig, SpecType


# ---- ngram-simple (common_ngram_simple_draft) ---------------------------------------------------
def ngram_simple_draft(size_n: int, size_m: int, tokens: np.ndarray, sampled: int) -> list[int]:
    """The m-gram that followed the latest earlier occurrence of the last n tokens (the cached ones
    and `sampled`); [] without one, or when it would be shorter than n. `tokens`: int64 [cur_len]."""
    cur_len = len(tokens)
    if cur_len <= size_n + size_m + 1:
        return []
    pattern = np.empty(size_n, dtype=np.int64)
    pattern[:-1] = tokens[cur_len - size_n + 1:]
    pattern[-1] = sampled
    # positions j in [1, cur_len - n - 1], searched backwards (position 0 counts as no match)
    hi = cur_len - size_n - 1
    cand = np.flatnonzero(tokens[1:hi + 1] == pattern[0]) + 1
    match_pos = 0
    for j in cand[::-1]:
        if np.array_equal(tokens[j:j + size_n], pattern):
            match_pos = int(j)
            break
    if match_pos == 0:
        return []
    copy_max = min(size_m, cur_len - (match_pos + size_n))
    if copy_max < size_n:
        return []
    return tokens[match_pos + size_n:match_pos + size_n + copy_max].tolist()


# ---- ngram-mod (common_ngram_mod: one hash table shared by every sequence) ----------------------
_MOD_MUL = 6364136223846793005
_MOD_SIZE = 4 * 1024 * 1024
_M64 = (1 << 64) - 1


class NgramMod:
    """llama.cpp's common_ngram_mod: entry[hash(n tokens) % size] = the token that followed them;
    a dict over the same indices (`used` is its size)."""

    def __init__(self, n: int, size: int = _MOD_SIZE):
        self.n, self.size = n, size
        self.entries: dict[int, int] = {}

    def _idx(self, toks) -> int:
        res = 0
        for t in toks:
            res = (res * _MOD_MUL + (t & _M64)) & _M64
        return res % self.size

    def add_range(self, tokens: np.ndarray, lo: int, hi: int) -> None:
        """add(tokens + i) for i in [lo, hi): the n-gram at i maps to tokens[i + n]."""
        if hi <= lo:
            return
        n = self.n
        with np.errstate(over="ignore"):
            res = np.zeros(hi - lo, dtype=np.uint64)
            for k in range(n):
                res = res * np.uint64(_MOD_MUL) + tokens[lo + k:hi + k].astype(np.uint64)
        idx = (res % np.uint64(self.size)).tolist()
        nxt = tokens[lo + n:hi + n].tolist()
        self.entries.update(zip(idx, nxt))  # later positions overwrite earlier ones, as the C++ loop

    def get(self, toks) -> int:
        return self.entries.get(self._idx(toks), -1)

    def reset(self) -> None:
        self.entries.clear()

    @property
    def used(self) -> int:
        return len(self.entries)


@dataclass
class _ModSeq:
    i_last: int = 0
    n_draft_last: int = 0
    n_low: int = 0


class NgramModDrafter:
    def __init__(self, p: NgramModParams, n_seq: int, log=None):
        self.p, self.mod = p, NgramMod(p.n_match)
        self.seqs = [_ModSeq() for _ in range(n_seq)]
        self.log = log

    def begin(self, sid: int, prompt: np.ndarray) -> None:
        si = self.seqs[sid]
        si.i_last = si.n_draft_last = 0
        n = self.mod.n
        if len(prompt) < n:
            return
        self.mod.add_range(prompt, 0, len(prompt) - n)
        si.i_last = len(prompt) - n
        if self.mod.used / self.mod.size > 0.25:
            if self.log:
                self.log("W", f"common_speculative_impl_ngram_mod: ngram_mod occupancy "
                              f"{self.mod.used / self.mod.size:.2f} exceeds threshold (0.25) - resetting")
            self.mod.reset()

    def draft(self, sid: int, prompt: np.ndarray, id_last: int) -> list[int]:
        si = self.seqs[sid]
        si.n_draft_last = 0
        cur_len, n = len(prompt), self.mod.n
        if cur_len < n:
            return []
        if si.i_last + 32 < cur_len:  # new n-grams, in chunks
            self.mod.add_range(prompt, si.i_last, cur_len - n)
            si.i_last = cur_len - n
        ctx = prompt[cur_len - n + 1:].tolist() + [id_last]
        out: list[int] = []
        for i in range(self.p.n_max):
            tok = self.mod.get(ctx[i:i + n])
            if tok == -1:
                if i < self.p.n_min:
                    return []
                break
            ctx.append(tok)
            out.append(tok)
        si.n_draft_last = len(out)
        return out

    def accept(self, sid: int, n_accepted: int, is_other: bool) -> None:
        if is_other:
            return
        si = self.seqs[sid]
        if si.n_draft_last > 0:
            if n_accepted / si.n_draft_last < 0.25:
                si.n_low += 1
                if si.n_low >= 5:
                    self.mod.reset()
                    si.n_low = 0
                    si.i_last = 0
            else:
                si.n_low = 0


class NgramSimpleDrafter:
    def __init__(self, p: NgramMapParams):
        self.p = p

    def begin(self, sid: int, prompt: np.ndarray) -> None:
        pass

    def draft(self, sid: int, prompt: np.ndarray, id_last: int) -> list[int]:
        return ngram_simple_draft(self.p.size_n, self.p.size_m, prompt, id_last)

    def accept(self, sid: int, n_accepted: int, is_other: bool) -> None:
        pass


@dataclass
class SlotSpec:
    """A slot's speculation numbers for its running task (llama-server's slot stats)."""
    n_draft_total: int = 0  # draft tokens proposed (timings.draft_n)
    n_draft_accepted: int = 0  # of which accepted (timings.draft_n_accepted)
    n_verify_steps: int = 0
    drafter: int = -1  # index of the drafter that made the last draft (-1: none)
    accepted_per_pos: list[int] = field(default_factory=list)  # verify steps that accepted position i

    def on_verify(self, n_pos: int) -> None:
        """A verify step begins; accepted positions are counted up to n_pos (llama-server's
        n_accepted_per_pos, sized by common_speculative_n_max)."""
        self.n_verify_steps += 1
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * n_pos

    def on_accepted(self, pos: int) -> None:
        """The draft token at `pos` was accepted."""
        if pos < len(self.accepted_per_pos):
            self.accepted_per_pos[pos] += 1


class Speculator:
    """The engine's drafters (llama.cpp's common_speculative) over `n_seq` slots."""

    def __init__(self, cfg: SpecConfig, n_seq: int, log=None):
        self.cfg = cfg
        self.impls: list = []
        wanted = set(cfg.types)
        for t in DRAFT_FREE:
            if t not in wanted:
                continue
            if t is SpecType.NGRAM_SIMPLE:
                self.impls.append(NgramSimpleDrafter(cfg.ngram_simple))
            elif t is SpecType.NGRAM_MAP_K:
                from runtime.serving.ngram_map import NgramMapDrafter  # (the key-map bookkeeping)
                self.impls.append(NgramMapDrafter(cfg.ngram_map_k, True, n_seq))
            elif t is SpecType.NGRAM_MAP_K4V:
                from runtime.serving.ngram_map import NgramMapDrafter
                self.impls.append(NgramMapDrafter(cfg.ngram_map_k4v, False, n_seq))
            elif t is SpecType.NGRAM_MOD:
                self.impls.append(NgramModDrafter(cfg.ngram_mod, n_seq, log))
            else:
                from runtime.serving.ngram_cache import NgramCacheDrafter  # (-lcs / -lcd files read here)
                self.impls.append(NgramCacheDrafter(n_seq, cfg.lookup_cache_static, cfg.lookup_cache_dynamic))
        self.last = [-1] * n_seq  # which impl drafted last, per slot
        self.n_last = [0] * n_seq  # and how many tokens went to the verify step
        self.lengths = [DraftLength(self.n_max) for _ in range(n_seq)]  # per slot: spec_adapt.py

    @property
    def n_max(self) -> int:
        return self.cfg.n_max()

    def begin(self, sid: int, prompt: list[int]) -> None:
        self.lengths[sid] = DraftLength(self.n_max)
        arr = text_tokens(prompt)
        for impl in self.impls:
            impl.begin(sid, arr)

    def draft(self, sid: int, tokens: list[int], id_last: int, n_max: int) -> list[int]:
        """The first drafter's non-empty draft (at most n_max tokens, and what the slot's acceptance
        allows: spec_adapt.py); [] when none drafts (or the draft is not worth verifying)."""
        self.last[sid], self.n_last[sid] = -1, 0
        arr = text_tokens(tokens)
        for i, impl in enumerate(self.impls):
            d = impl.draft(sid, arr, id_last)
            if d:
                d = d[:n_max] if n_max > 0 else d
                if not getattr(impl, "own_length", False):
                    d = d[:self.lengths[sid].allow(len(d))]
                if d:
                    self.last[sid], self.n_last[sid] = i, len(d)
                return d
        return []

    def accept(self, sid: int, n_accepted: int) -> None:
        last = self.last[sid]
        if last < 0:
            return
        self.lengths[sid].update(self.n_last[sid], n_accepted)
        for i, impl in enumerate(self.impls):
            impl.accept(sid, n_accepted, i != last)


def make_speculator(cfg: SpecConfig, n_seq: int, log=None, recurrent: bool = False) -> Speculator | None:
    """The engine's speculator for --spec-type, or None (no type, only types tritium does not
    implement, or a model with recurrent layers, whose state tritium does not roll back to a draft's
    accepted prefix (llama-server restores a checkpoint there): a warning says so)."""
    if not cfg.enabled:
        return None
    if recurrent:
        if log is not None:
            log("W", "srv    load_model: speculative decoding is not supported with recurrent layers in tritium: "
                     "decoding without it (same output)")
        return None
    other = [t.value for t in cfg.types if t not in (SpecType.NONE, SpecType.DRAFT_SIMPLE) and t not in DRAFT_FREE]
    if other and log is not None:
        log("W", f"srv    load_model: speculative type(s) {','.join(other)} not implemented in tritium "
                 "(draft models): ignored (same output, decoded without them)")
    if not any(t in DRAFT_FREE for t in cfg.types):
        return None
    if log is not None:
        log("I", f"srv    load_model: speculative decoding: {','.join(t.value for t in cfg.types if t in DRAFT_FREE)}")
    return Speculator(cfg, n_seq, log)


def text_tokens(tokens: list[int]) -> np.ndarray:
    """The cached sequence as llama-server's drafters see it: text tokens only (media rows dropped)."""
    arr = np.asarray(tokens, dtype=np.int64)
    return arr[arr >= 0] if arr.size and arr.min() < 0 else arr
