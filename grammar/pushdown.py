"""The pushdown recognizer of a lowered grammar, exposed as a byte automaton.

llama.cpp's model: a parser state is a set of stacks of grammar positions, the top always a
character element; stacks are interned as (parent, position, count) triples, tail calls pop the
caller so `x*` runs in constant depth, and a counted repetition `x{m,n}` is one frame whose count
goes up as items match (`{m,}` saturates at m), never m copies. The byte automaton's state is
(parser state, pending bytes of an unfinished UTF-8 character); transitions are memoised in a
dense table `[n_byte_states, 256]` that grows on demand.
"""
from __future__ import annotations

import numpy as np

from .gbnf import MAX_CODEPOINT, Grammar
from .vocab import Vocab

_END, _CHAR, _REF, _REP = 0, 1, 2, 3
_EMPTY = 0  # the empty stack: the root rule is complete
DEAD = 0  # the dead byte state


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


class Pushdown:
    """Interned stacks, parser states and byte states of one grammar, with memoised steps."""

    def __init__(self, g: Grammar):
        self.classes = g.classes
        kind: list[int] = []
        arg: list[int] = []
        self.alt_starts: list[list[int]] = []
        self.rep_bounds: dict[int, tuple[int, int]] = {}  # position of a counter -> (lo, hi; -1 = inf)
        for alts in g.rule_alts:
            starts = []
            for alt in alts:
                starts.append(len(kind))
                for e in alt:
                    if e[0] == "rep":
                        self.rep_bounds[len(kind)] = (e[2], e[3])
                    kind.append(_CHAR if e[0] == "char" else _REF if e[0] == "ref" else _REP)
                    arg.append(e[1])
                kind.append(_END)
                arg.append(-1)
            self.alt_starts.append(starts)
        self.kind, self.arg = kind, arg
        # stacks: id -> (parent id, position, count); id 0 is the empty stack; count is the number of
        # items a counter frame (`x{m,n}`) has matched, 0 elsewhere
        self.st_parent: list[int] = [-1]
        self.st_pos: list[int] = [-1]
        self.st_cnt: list[int] = [0]
        self.st_ids: dict[tuple[int, int, int], int] = {}
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
        self.table[DEAD, :] = DEAD
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
    def _stack(self, parent: int, pos: int, count: int = 0) -> int:
        key = (parent, pos, count)
        sid = self.st_ids.get(key)
        if sid is None:
            sid = len(self.st_parent)
            self.st_ids[key] = sid
            self.st_parent.append(parent)
            self.st_pos.append(pos)
            self.st_cnt.append(count)
        return sid

    def _expand_rule(self, rule: int, ret: int) -> frozenset[int]:
        """Stacks with a char on top (or the empty stack) reached by calling `rule`, returning to `ret`."""
        return self._closure([self._stack(ret, a) for a in self.alt_starts[rule]])

    def _expand(self, sid: int) -> frozenset[int]:
        """All stacks reachable from `sid` without consuming input whose top is a char (or empty)."""
        memo = self._expand_memo.get(sid)
        if memo is None:
            memo = self._expand_memo[sid] = self._closure([sid])
        return memo

    def _closure(self, todo: list[int]) -> frozenset[int]:
        """The char-topped (or empty) stacks reached from the stacks `todo` by moves that consume
        nothing: a rule reference pushes its alternatives (a tail call returns straight to the
        caller's parent), the end of an alternative pops, a counter frame offers one more item or
        what follows. A worklist with a seen set, so a chain of 20000 rules costs 20000 steps and
        no stack depth; the left-recursion check guarantees termination anyway, and the seen set
        keeps shared sub-closures from being walked twice. Expansions already memoised are reused."""
        out: set[int] = set()
        seen: set[int] = set(todo)
        memo = self._expand_memo
        kind, arg, st_pos, st_parent = self.kind, self.arg, self.st_pos, self.st_parent
        while todo:
            sid = todo.pop()
            known = memo.get(sid)
            if known is not None:
                out |= known
                continue
            if sid == _EMPTY:
                out.add(_EMPTY)
                continue
            p = st_pos[sid]
            k = kind[p]
            if k == _CHAR:
                out.add(sid)
                continue
            parent = st_parent[sid]
            if k == _END:
                nxt = [parent]
            elif k == _REF:
                ret = parent if kind[p + 1] == _END else self._stack(parent, p + 1)  # tail call
                nxt = [self._stack(ret, a) for a in self.alt_starts[arg[p]]]
            else:  # _REP: a counter frame that has matched `count` items
                count = self.st_cnt[sid]
                lo, hi = self.rep_bounds[p]
                nxt = []
                if hi < 0 or count < hi:  # one more item, returning to the frame with count + 1
                    ret = self._stack(parent, p, min(count + 1, lo) if hi < 0 else count + 1)
                    nxt.extend(self._stack(ret, a) for a in self.alt_starts[arg[p]])
                if count >= lo:  # or what follows the repetition
                    nxt.append(parent if kind[p + 1] == _END else self._stack(parent, p + 1))
            for s in nxt:
                if s not in seen:
                    seen.add(s)
                    todo.append(s)
        return frozenset(out)

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
                return DEAD if nxt < 0 else self._intern_bs(nxt, b"")
            if _utf8_len(b) == 0:
                return DEAD
            seq = bytes((b,))
        else:
            if not 0x80 <= b <= 0xBF:
                return DEAD
            seq = pending + bytes((b,))
        if len(seq) == _utf8_len(seq[0]):
            try:
                cp = ord(seq.decode("utf-8"))
            except UnicodeDecodeError:
                return DEAD
            nxt = self._step_cp(pid, cp)
            return DEAD if nxt < 0 else self._intern_bs(nxt, b"")
        rng = _utf8_range(seq)
        if rng is None or not self._can_start(pid, *rng):
            return DEAD
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
        out = np.full(len(keys), DEAD, dtype=np.int64)
        if valid.any():
            idx = np.nonzero(valid)[0]
            atoms = np.searchsorted(self.atom_starts, cps[idx], side="right") - 1
            pairs = self.bs_pid[bids[idx]] * len(self.atom_starts) + atoms
            uniq, inv = np.unique(pairs, return_inverse=True)
            res = np.empty(len(uniq), dtype=np.int64)
            for u, pair in enumerate(uniq.tolist()):
                pid, atom = divmod(pair, len(self.atom_starts))
                nxt = self._step_atom(pid, atom)
                res[u] = DEAD if nxt < 0 else self._intern_bs(nxt, b"")
            out[idx] = res[inv]
        # the rest: lead bytes and inner continuation bytes (partial characters), invalid bytes
        slow = ~finishing & (((need == 0) & (byts >= 0x80)) | ((need > 1) & is_cont))
        for k in np.nonzero(slow)[0].tolist():
            out[k] = self._delta(int(bids[k]), int(byts[k]))
        self.table.reshape(-1)[keys] = out

    def is_complete(self, bid: int) -> bool:
        pid, pending = self.bs_info[bid]
        return bid != DEAD and not pending and self.ps_stacks[pid][0] == _EMPTY

    def can_continue(self, bid: int) -> bool:
        pid, pending = self.bs_info[bid]
        return bid != DEAD and (bool(pending) or any(s != _EMPTY for s in self.ps_stacks[pid]))

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
            alive = nxt != DEAD
            if not alive.all():
                ids, st = ids[alive], nxt[alive].astype(np.int64)
            else:
                st = nxt.astype(np.int64)
        else:
            final[ids] = st
        return final
