"""Compiled grammars: byte-exact token masks from a pushdown recognizer.

Pipeline
  GBNF text --parse_gbnf--> Grammar (rules of char-class / rule-ref elements)
           --_Pushdown--> a stack machine over code points (llama.cpp's model: a parser state is a
              set of stacks of grammar positions, the top always a character element; stacks are
              interned as (parent, position) pairs, tail calls pop the caller so `x*` runs in
              constant depth), wrapped into a *byte* automaton whose state is
              (parser state, pending bytes of an unfinished UTF-8 character). Transitions are
              memoised in a dense table `[n_byte_states, 256]` that grows on demand.
           --mask--> for a byte state, every token's bytes are run through the table at once
              (numpy, tokens sorted by length so step j touches only tokens longer than j); a
              token is allowed when it does not reach the dead state. Masks are cached per byte
              state, so a state seen again (inside a string, between list items...) costs nothing.

EOG handling (llama.cpp semantics): an end-of-generation token is allowed exactly when the
grammar can be complete here; when the grammar is complete and nothing can follow, only EOG
tokens are allowed.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from .gbnf import MAX_CODEPOINT, Grammar, GrammarError, parse_gbnf

_END, _CHAR, _REF = 0, 1, 2
_EMPTY = 0  # the empty stack: the root rule is complete
_DEAD = 0  # the dead byte state


# ----------------------------------------------------------------------------------------------
# vocabulary
# ----------------------------------------------------------------------------------------------
@dataclass
class Vocab:
    """Per-model token bytes, prepared once for mask computation.

    token_pieces[i] is token i's bytes (b"" for tokens that never match text);
    eog_ids are the end-of-generation tokens (allowed only where the grammar can end).
    """
    token_pieces: list[bytes]
    eog_ids: frozenset[int]
    n_vocab: int = 0
    order: np.ndarray = field(default=None, repr=False)  # [n_walk] token ids, by length desc
    counts: list[int] = field(default=None, repr=False)  # counts[j] = #walked tokens longer than j
    cols: list[np.ndarray] = field(default=None, repr=False)  # cols[j]: [counts[j]] uint8 byte j
    eog_index: torch.Tensor = field(default=None, repr=False)  # [n_eog] int64

    def __init__(self, token_pieces: list[bytes], eog_ids) -> None:
        self.token_pieces = [bytes(p) for p in token_pieces]
        self.n_vocab = len(self.token_pieces)
        self.eog_ids = frozenset(int(i) for i in eog_ids if 0 <= int(i) < self.n_vocab)
        lens = np.array([len(p) for p in self.token_pieces], dtype=np.int64)
        for i in self.eog_ids:
            lens[i] = 0
        walk = np.nonzero(lens > 0)[0]
        self.order = walk[np.argsort(-lens[walk], kind="stable")]
        sorted_lens = lens[self.order]
        max_len = int(sorted_lens[0]) if len(sorted_lens) else 0
        self.counts = [int(np.count_nonzero(sorted_lens > j)) for j in range(max_len)]
        # byte matrix [n_walk, max_len] built row by row would be large; build ragged columns
        flat = np.frombuffer(b"".join(self.token_pieces[i] for i in self.order), dtype=np.uint8)
        starts = np.zeros(len(self.order) + 1, dtype=np.int64)
        np.cumsum(sorted_lens, out=starts[1:])
        self.cols = [flat[starts[: self.counts[j]] + j] for j in range(max_len)]
        self.eog_index = torch.tensor(sorted(self.eog_ids), dtype=torch.int64)


# ----------------------------------------------------------------------------------------------
# pushdown recognizer over code points, exposed as a byte automaton
# ----------------------------------------------------------------------------------------------
def _utf8_len(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0  # continuation byte or invalid lead


_UTF8_MIN = {2: 0x80, 3: 0x800, 4: 0x10000}


def _utf8_range(pending: bytes) -> tuple[int, int] | None:
    """Code points that can start with the incomplete UTF-8 sequence `pending` (None: none)."""
    n = _utf8_len(pending[0])
    val = pending[0] & (0x7F >> n)
    for b in pending[1:]:
        val = (val << 6) | (b & 0x3F)
    rest = 6 * (n - len(pending))
    lo, hi = max(val << rest, _UTF8_MIN[n]), min((val << rest) | ((1 << rest) - 1), 0x10FFFF)
    if lo > hi or (0xD800 <= lo and hi <= 0xDFFF):
        return None
    return lo, hi


class _Pushdown:
    """Interned stacks, parser states and byte states of one grammar, with memoised steps."""

    def __init__(self, g: Grammar):
        self.classes = g.classes
        kind: list[int] = []
        arg: list[int] = []
        self.alt_starts: list[list[int]] = []
        for alts in g.rule_alts:
            starts = []
            for alt in alts:
                starts.append(len(kind))
                for e in alt:
                    kind.append(_CHAR if e[0] == "char" else _REF)
                    arg.append(e[1])
                kind.append(_END)
                arg.append(-1)
            self.alt_starts.append(starts)
        self.kind, self.arg = kind, arg
        # stacks: id -> (parent id, position); id 0 is the empty stack
        self.st_parent: list[int] = [-1]
        self.st_pos: list[int] = [-1]
        self.st_ids: dict[tuple[int, int], int] = {}
        self._expand_memo: dict[int, frozenset[int]] = {}
        self._adv_memo: dict[int, frozenset[int]] = {}
        # parser states: id -> sorted tuple of stack ids (tops are char elements or the empty stack)
        self.ps_stacks: list[tuple[int, ...]] = []
        self.ps_ids: dict[tuple[int, ...], int] = {}
        self._step_memo: dict[tuple[int, int], int] = {}
        # byte states: id -> (parser state, pending UTF-8 bytes); id 0 is dead
        self.bs_info: list[tuple[int, bytes]] = [(-1, b"")]
        self.bs_ids: dict[tuple[int, bytes], int] = {}
        self.table = np.full((64, 256), -1, dtype=np.int32)  # [capacity, 256] next byte state
        self.table[_DEAD, :] = _DEAD
        # per byte state, for vectorised fills: parser state, bits of the pending character so far,
        # bytes still needed to finish it (0: none pending), smallest valid code point for its length
        self.bs_pid = np.full(64, -1, dtype=np.int64)
        self.bs_val = np.zeros(64, dtype=np.int64)
        self.bs_need = np.zeros(64, dtype=np.int64)
        self.bs_min = np.zeros(64, dtype=np.int64)
        # code point "atoms": intervals on which every character class of the grammar agrees
        bounds = {0, MAX_CODEPOINT + 1}
        for cc in self.classes:
            for a, b in cc.ranges:
                bounds.add(a)
                bounds.add(b + 1)
        self.atom_starts = np.array(sorted(bounds)[:-1], dtype=np.int64)
        start = self._intern_ps(self._expand_rule(g.root, _EMPTY))
        self.initial = self._intern_bs(start, b"")

    # --- stacks ------------------------------------------------------------------------------
    def _stack(self, parent: int, pos: int) -> int:
        key = (parent, pos)
        sid = self.st_ids.get(key)
        if sid is None:
            sid = len(self.st_parent)
            self.st_ids[key] = sid
            self.st_parent.append(parent)
            self.st_pos.append(pos)
        return sid

    def _expand_rule(self, rule: int, ret: int) -> frozenset[int]:
        out: set[int] = set()
        for a in self.alt_starts[rule]:
            out |= self._expand(self._stack(ret, a))
        return frozenset(out)

    def _expand(self, sid: int) -> frozenset[int]:
        """All stacks reachable from `sid` without consuming input whose top is a char (or empty)."""
        memo = self._expand_memo.get(sid)
        if memo is not None:
            return memo
        if sid == _EMPTY:
            res = frozenset((_EMPTY,))
        else:
            p = self.st_pos[sid]
            k = self.kind[p]
            if k == _CHAR:
                res = frozenset((sid,))
            elif k == _END:
                res = self._expand(self.st_parent[sid])
            else:
                parent = self.st_parent[sid]
                ret = parent if self.kind[p + 1] == _END else self._stack(parent, p + 1)  # tail call
                res = self._expand_rule(self.arg[p], ret)
        self._expand_memo[sid] = res
        return res

    def _advance(self, sid: int) -> frozenset[int]:
        """Stacks after the char element on top of `sid` has matched."""
        memo = self._adv_memo.get(sid)
        if memo is None:
            p = self.st_pos[sid]
            parent = self.st_parent[sid]
            nxt = parent if self.kind[p + 1] == _END else self._stack(parent, p + 1)
            memo = self._adv_memo[sid] = self._expand(nxt)
        return memo

    # --- parser states -----------------------------------------------------------------------
    def _intern_ps(self, stacks) -> int:
        key = tuple(sorted(stacks))
        pid = self.ps_ids.get(key)
        if pid is None:
            pid = len(self.ps_stacks)
            self.ps_ids[key] = pid
            self.ps_stacks.append(key)
        return pid

    def _step_cp(self, pid: int, cp: int) -> int:
        """Parser state after code point `cp` (-1: rejected)."""
        return self._step_atom(pid, int(np.searchsorted(self.atom_starts, cp, side="right")) - 1)

    def _step_atom(self, pid: int, atom: int) -> int:
        key = (pid, atom)
        res = self._step_memo.get(key)
        if res is None:
            cp = int(self.atom_starts[atom])
            out: set[int] = set()
            for sid in self.ps_stacks[pid]:
                if sid != _EMPTY and self.classes[self.arg[self.st_pos[sid]]].matches(cp):
                    out |= self._advance(sid)
            res = self._intern_ps(out) if out else -1
            self._step_memo[key] = res
        return res

    def _can_start(self, pid: int, lo: int, hi: int) -> bool:
        return any(sid != _EMPTY and self.classes[self.arg[self.st_pos[sid]]].intersects(lo, hi)
                   for sid in self.ps_stacks[pid])

    # --- byte states -------------------------------------------------------------------------
    def _intern_bs(self, pid: int, pending: bytes) -> int:
        key = (pid, pending)
        bid = self.bs_ids.get(key)
        if bid is None:
            bid = len(self.bs_info)
            self.bs_ids[key] = bid
            self.bs_info.append(key)
            if bid >= self.table.shape[0]:
                cap = self.table.shape[0]
                grown = np.full((cap * 2, 256), -1, dtype=np.int32)
                grown[:cap] = self.table
                self.table = grown
                for name in ("bs_pid", "bs_val", "bs_need", "bs_min"):
                    arr = getattr(self, name)
                    new = np.zeros(cap * 2, dtype=arr.dtype)
                    new[:cap] = arr
                    setattr(self, name, new)
            self.bs_pid[bid] = pid
            if pending:
                n = _utf8_len(pending[0])
                val = pending[0] & (0x7F >> n)
                for b in pending[1:]:
                    val = (val << 6) | (b & 0x3F)
                self.bs_val[bid], self.bs_need[bid], self.bs_min[bid] = val, n - len(pending), _UTF8_MIN[n]
        return bid

    def _delta(self, bid: int, b: int) -> int:
        pid, pending = self.bs_info[bid]
        if not pending:
            if b < 0x80:
                nxt = self._step_cp(pid, b)
                return _DEAD if nxt < 0 else self._intern_bs(nxt, b"")
            if _utf8_len(b) == 0:
                return _DEAD
            seq = bytes((b,))
        else:
            if not 0x80 <= b <= 0xBF:
                return _DEAD
            seq = pending + bytes((b,))
        if len(seq) == _utf8_len(seq[0]):
            try:
                cp = ord(seq.decode("utf-8"))
            except UnicodeDecodeError:
                return _DEAD
            nxt = self._step_cp(pid, cp)
            return _DEAD if nxt < 0 else self._intern_bs(nxt, b"")
        rng = _utf8_range(seq)
        if rng is None or not self._can_start(pid, *rng):
            return _DEAD
        return self._intern_bs(pid, seq)

    def next_state(self, bid: int, b: int) -> int:
        nxt = int(self.table[bid, b])
        if nxt < 0:
            nxt = self._delta(bid, b)
            self.table[bid, b] = nxt
        return nxt

    def fill(self, keys: np.ndarray) -> None:
        """Compute missing table entries for flat keys `bid * 256 + byte` ([k] int64, unique).

        Bytes that finish a character (ASCII, or the last byte of a multi-byte sequence) are
        handled together: their code points are mapped to atoms and only the distinct
        (parser state, atom) pairs are stepped in Python. Other bytes go through `_delta`."""
        bids, byts = keys // 256, keys % 256
        need = self.bs_need[bids]
        is_cont = (byts & 0xC0) == 0x80
        ascii_ = (need == 0) & (byts < 0x80)
        last = (need == 1) & is_cont
        finishing = ascii_ | last
        cps = np.where(ascii_, byts, (self.bs_val[bids] << 6) | (byts & 0x3F))
        valid = finishing & (ascii_ | ((cps >= self.bs_min[bids]) & ((cps < 0xD800) | (cps > 0xDFFF))
                                       & (cps <= MAX_CODEPOINT)))
        out = np.full(len(keys), _DEAD, dtype=np.int64)
        if valid.any():
            idx = np.nonzero(valid)[0]
            atoms = np.searchsorted(self.atom_starts, cps[idx], side="right") - 1
            pairs = self.bs_pid[bids[idx]] * len(self.atom_starts) + atoms
            uniq, inv = np.unique(pairs, return_inverse=True)
            res = np.empty(len(uniq), dtype=np.int64)
            for u, pair in enumerate(uniq.tolist()):
                pid, atom = divmod(pair, len(self.atom_starts))
                nxt = self._step_atom(pid, atom)
                res[u] = _DEAD if nxt < 0 else self._intern_bs(nxt, b"")
            out[idx] = res[inv]
        # the rest: lead bytes and inner continuation bytes (partial characters), invalid bytes
        slow = ~finishing & (((need == 0) & (byts >= 0x80)) | ((need > 1) & is_cont))
        for k in np.nonzero(slow)[0].tolist():
            out[k] = self._delta(int(bids[k]), int(byts[k]))
        self.table.reshape(-1)[keys] = out

    def is_complete(self, bid: int) -> bool:
        pid, pending = self.bs_info[bid]
        return bid != _DEAD and not pending and self.ps_stacks[pid][0] == _EMPTY

    def can_continue(self, bid: int) -> bool:
        pid, pending = self.bs_info[bid]
        return bid != _DEAD and (bool(pending) or any(s != _EMPTY for s in self.ps_stacks[pid]))

    def final_states(self, start: int, vocab: Vocab) -> np.ndarray:
        """[n_walk] byte state each walked token (vocab.order) ends in when fed from `start`."""
        n_walk = len(vocab.order)
        final = np.zeros(n_walk, dtype=np.int32)
        ids = np.arange(n_walk, dtype=np.int64)  # positions in vocab.order still alive
        st = np.full(n_walk, start, dtype=np.int64)
        for j, col in enumerate(vocab.cols):
            k = int(np.searchsorted(ids, vocab.counts[j]))
            if k < len(ids):  # tokens of length j end here
                final[ids[k:]] = st[k:]
                ids, st = ids[:k], st[:k]
            if k == 0:
                break
            keys = st * 256 + col[ids]
            nxt = self.table.reshape(-1)[keys]
            missing = nxt < 0
            if missing.any():
                self.fill(np.unique(keys[missing]))
                nxt = self.table.reshape(-1)[keys]
            alive = nxt != _DEAD
            if not alive.all():
                ids, st = ids[alive], nxt[alive].astype(np.int64)
            else:
                st = nxt.astype(np.int64)
        else:
            final[ids] = st
        return final


# ----------------------------------------------------------------------------------------------
# compiled grammar and matcher
# ----------------------------------------------------------------------------------------------
class CompiledGrammar:
    """A grammar bound to a vocabulary; shared by every request using the same grammar text.

    Mutable caches (state tables, masks) are guarded by a lock, so matchers of one grammar may
    live in different threads.
    """

    def __init__(self, grammar: Grammar, vocab: Vocab, text: str = "", mask_cache_size: int = 256):
        self.text = text
        self.grammar = grammar
        self.vocab = vocab
        self._pd = _Pushdown(grammar)
        self._lock = threading.RLock()
        self._masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._mask_cache_size = mask_cache_size
        self.mask(self._pd.initial)  # compile the first step before generation

    @property
    def initial_state(self) -> int:
        return self._pd.initial

    def matcher(self) -> "Matcher":
        return Matcher(self)

    def mask(self, bid: int) -> torch.Tensor:
        """[n_vocab] bool allowed tokens in byte state `bid` (cached; do not modify)."""
        with self._lock:
            m = self._masks.get(bid)
            if m is not None:
                self._masks.move_to_end(bid)
                return m
            vocab = self.vocab
            final = self._pd.final_states(bid, vocab)
            allowed = np.zeros(vocab.n_vocab, dtype=np.bool_)
            allowed[vocab.order] = final != _DEAD
            m = torch.from_numpy(allowed)
            if len(vocab.eog_index):
                m[vocab.eog_index] = self._pd.is_complete(bid)
            self._masks[bid] = m
            if len(self._masks) > self._mask_cache_size:
                self._masks.popitem(last=False)
            return m

    def step(self, bid: int, token_id: int) -> int:
        """Byte state after `token_id` (dead state 0 when not allowed). EOG is not handled here."""
        with self._lock:
            for b in self.vocab.token_pieces[token_id]:
                bid = self._pd.next_state(bid, b)
                if bid == _DEAD:
                    break
            return bid

    def step_bytes(self, bid: int, data: bytes) -> int:
        """Byte state after `data` from `bid` (dead state 0 when not allowed)."""
        with self._lock:
            for b in data:
                bid = self._pd.next_state(bid, b)
                if bid == _DEAD:
                    break
            return bid

    def accepts_bytes(self, data: bytes) -> bool:
        """True when `data` is a complete string of the grammar."""
        bid = self._pd.initial
        with self._lock:
            for b in data:
                bid = self._pd.next_state(bid, b)
                if bid == _DEAD:
                    return False
            return self._pd.is_complete(bid)

    def is_complete(self, bid: int) -> bool:
        return self._pd.is_complete(bid)

    def can_continue(self, bid: int) -> bool:
        return self._pd.can_continue(bid)

    @property
    def n_states(self) -> int:
        return len(self._pd.bs_info)


class Matcher:
    """Per-request grammar position. `allowed_mask()` -> [n_vocab] bool; `advance(token_id)`."""

    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self.state = compiled.initial_state
        self.finished = False  # an EOG token was accepted

    def allowed_mask(self) -> torch.Tensor:
        """[n_vocab] bool, True = allowed. Shared cached tensor: copy before modifying."""
        if self.finished:
            return torch.zeros(self.compiled.vocab.n_vocab, dtype=torch.bool)
        return self.compiled.mask(self.state)

    allowed = allowed_mask  # name used in docs/DESIGN.md

    def fill_mask(self, out_row: torch.Tensor) -> None:
        """Copy the allowed mask into `out_row` ([n_vocab] bool, any device)."""
        out_row.copy_(self.allowed_mask(), non_blocking=True)

    def advance(self, token_id: int) -> None:
        token_id = int(token_id)
        v = self.compiled.vocab
        if self.finished:
            raise GrammarError("grammar already finished (end-of-generation token accepted)")
        if not 0 <= token_id < v.n_vocab:
            raise GrammarError(f"token id {token_id} out of range")
        if token_id in v.eog_ids:
            if not self.compiled.is_complete(self.state):
                raise GrammarError(f"end-of-generation token {token_id} not allowed: grammar is incomplete")
            self.finished = True
            return
        nxt = self.compiled.step(self.state, token_id) if v.token_pieces[token_id] else _DEAD
        if nxt == _DEAD:
            raise GrammarError(f"token {token_id} ({v.token_pieces[token_id]!r}) not allowed by the grammar")
        self.state = nxt

    def advance_bytes(self, data: bytes) -> None:
        """Accept raw text (a lazy grammar's trigger and what followed it in the output)."""
        if self.finished:
            raise GrammarError("grammar already finished (end-of-generation token accepted)")
        nxt = self.compiled.step_bytes(self.state, data)
        if nxt == _DEAD:
            raise GrammarError(f"text {data[:40]!r} not allowed by the grammar")
        self.state = nxt

    def is_complete(self) -> bool:
        """The text so far is a complete string of the grammar (EOG is allowed now)."""
        return self.finished or self.compiled.is_complete(self.state)

    def only_eog_allowed(self) -> bool:
        """Complete and nothing more can follow: the sampler may stop right away."""
        return self.finished or (self.compiled.is_complete(self.state) and not self.compiled.can_continue(self.state))

    def copy(self) -> "Matcher":
        m = Matcher(self.compiled)
        m.state, m.finished = self.state, self.finished
        return m


def compile_grammar(gbnf_text: str, vocab: Vocab) -> CompiledGrammar:
    """Parse and compile without caching (raises GrammarError)."""
    return CompiledGrammar(parse_gbnf(gbnf_text), vocab, gbnf_text)


class GrammarCompiler:
    """Owned by the engine: one per model vocabulary, with an LRU of compiled grammars by text."""

    def __init__(self, vocab: Vocab, cache_size: int = 16):
        self.vocab = vocab
        self.cache_size = cache_size
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, gbnf_text: str) -> CompiledGrammar:
        with self._lock:
            hit = self._cache.get(gbnf_text)
            if hit is not None:
                self._cache.move_to_end(gbnf_text)
                return hit
        compiled = compile_grammar(gbnf_text, self.vocab)
        with self._lock:
            self._cache[gbnf_text] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, gbnf_text: str) -> Matcher:
        return self.compile(gbnf_text).matcher()
