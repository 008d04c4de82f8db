"""Compiled grammars: byte-exact token masks from a pushdown recognizer.

Pipeline
  GBNF text --parse_gbnf--> Grammar (rules of char-class / rule-ref elements)
           --Pushdown (pushdown.py)--> a stack machine over code points (llama.cpp's model: a
              parser state is a set of stacks of grammar positions; a counted repetition is one
              frame with a counter), wrapped into a *byte* automaton whose state is (parser
              state, pending bytes of an unfinished UTF-8 character), its transitions memoised in
              a table that grows on demand.
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

import numpy as np
import torch

from .gbnf import Grammar, GrammarError, parse_gbnf
from .pushdown import DEAD as _DEAD
from .pushdown import Pushdown
from .vocab import Vocab

__all__ = ["CompiledGrammar", "GrammarCompiler", "Matcher", "Vocab", "compile_grammar"]


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
        self._pd = Pushdown(grammar)
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
            # llama.cpp's llama_grammar_accept_token wording (llama-server answers it with a 500)
            piece = v.token_pieces[token_id].decode("utf-8", "replace")
            raise GrammarError(f"Unexpected empty grammar stack after accepting piece: {piece} ({token_id})")
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

    def cached(self, gbnf_text: str) -> bool:
        with self._lock:
            return gbnf_text in self._cache
