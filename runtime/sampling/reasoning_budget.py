"""llama.cpp's reasoning budget sampler (common/reasoning-budget.cpp of b1-0c1e570).

It limits the tokens generated inside a reasoning block (between the template's start tag, e.g.
`<think>`, and an end tag, `</think>`): once `budget` tokens were generated there (or at once when
asked: `force()`, the `/v1/chat/completions/control` action `reasoning_end`), it forces the
budget message and the first end tag token by token (every other logit -inf).

States: IDLE (waiting for a start sequence) -> COUNTING -> WAITING_UTF8 (the budget ran out inside
a UTF-8 sequence) -> FORCING -> DONE (a new start sequence re-arms it). Sequences are matched on
token ids with an Aho-Corasick automaton, as llama.cpp's token_matcher.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


def utf8_is_complete(b: bytes) -> bool:
    """Whether `b` ends on a UTF-8 character boundary (common_utf8_is_complete)."""
    if not b:
        return True
    for back in range(1, min(4, len(b)) + 1):
        c = b[-back]
        if c & 0xC0 != 0x80:  # the last lead (or ASCII) byte: does its sequence fit?
            return back >= (4 if c >= 0xF0 else 3 if c >= 0xE0 else 2 if c >= 0xC0 else 1)
    return False


class BudgetState(enum.Enum):
    IDLE = 0
    COUNTING = 1
    FORCING = 2
    WAITING_UTF8 = 3
    DONE = 4


class TokenMatcher:
    """Aho-Corasick over token sequences: `advance(tok)` -> index of the longest sequence ending
    here (the matcher restarts after a match), else -1 (common_aho_corasick + token_matcher)."""

    def __init__(self, seqs: list[list[int]]):
        self.seqs: list[list[int]] = []
        for s in seqs:
            if s and s not in self.seqs:
                self.seqs.append(list(s))
        self.goto: list[dict[int, int]] = [{}]
        self.fail: list[int] = [0]
        self.out: list[int] = [-1]  # the longest sequence ending at a node (own or through fail links)
        for k, s in enumerate(self.seqs):
            node = 0
            for t in s:
                if t not in self.goto[node]:
                    self.goto.append({})
                    self.fail.append(0)
                    self.out.append(-1)
                    self.goto[node][t] = len(self.goto) - 1
                node = self.goto[node][t]
            if self.out[node] < 0 or len(self.seqs[self.out[node]]) < len(s):
                self.out[node] = k
        queue = list(self.goto[0].values())
        while queue:
            node = queue.pop(0)
            for t, child in self.goto[node].items():
                f = self.fail[node]
                while f and t not in self.goto[f]:
                    f = self.fail[f]
                self.fail[child] = self.goto[f].get(t, 0) if self.goto[f].get(t, 0) != child else 0
                if self.out[child] < 0:
                    self.out[child] = self.out[self.fail[child]]
                queue.append(child)
        self.state = 0

    def advance(self, tok: int) -> int:
        node = self.state
        while node and tok not in self.goto[node]:
            node = self.fail[node]
        node = self.goto[node].get(tok, 0)
        match = self.out[node]
        self.state = 0 if match >= 0 else node
        return match

    def reset(self) -> None:
        self.state = 0


@dataclass
class ReasoningBudget:
    """One request's budget sampler. `utf8_complete(tok)`: whether the token's piece ends on a
    UTF-8 character boundary (None: always)."""
    start: list[list[int]]
    end: list[list[int]]
    forced: list[int]
    budget: int
    utf8_complete: object = None
    state: BudgetState = BudgetState.IDLE
    remaining: int = 0
    force_pos: int = 0
    end_match: int = -1
    start_matcher: TokenMatcher = field(init=False)
    end_matcher: TokenMatcher = field(init=False)

    def __post_init__(self) -> None:
        self.start_matcher, self.end_matcher = TokenMatcher(self.start), TokenMatcher(self.end)
        self.remaining = self.budget
        if self.state is BudgetState.COUNTING and self.budget <= 0:  # an initial state, as llama.cpp's init
            self.state = BudgetState.FORCING

    @property
    def end_sequence(self) -> list[int] | None:
        """The end sequence that ended the block (common_reasoning_budget_get_end_match)."""
        return self.end_matcher.seqs[self.end_match] if self.end_match >= 0 else None

    def _arm(self) -> None:
        self.state, self.remaining = BudgetState.COUNTING, self.budget
        if self.remaining <= 0:
            self.state, self.force_pos = BudgetState.FORCING, 0

    def accept(self, tok: int) -> None:
        s = self.state
        if s is BudgetState.IDLE:
            if self.start_matcher.advance(tok) >= 0:
                self._arm()
        elif s in (BudgetState.COUNTING, BudgetState.WAITING_UTF8):
            match = self.end_matcher.advance(tok)
            if match >= 0:
                self.state, self.end_match = BudgetState.DONE, match
                return
            complete = True if self.utf8_complete is None else bool(self.utf8_complete(tok))
            if s is BudgetState.WAITING_UTF8:
                if complete:
                    self.state, self.force_pos = BudgetState.FORCING, 0
                    self.end_matcher.reset()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.state = BudgetState.FORCING if complete else BudgetState.WAITING_UTF8
                    self.force_pos = 0
                    self.end_matcher.reset()
        elif s is BudgetState.FORCING:
            match = self.end_matcher.advance(tok)
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.state, self.end_match = BudgetState.DONE, match
        else:  # DONE: a new start tag re-arms it (several reasoning blocks in one answer)
            if self.start_matcher.advance(tok) >= 0:
                self.end_matcher.reset()
                self.end_match = -1
                self._arm()

    def forced_token(self) -> int | None:
        """The token every other logit yields to now, or None (common_reasoning_budget_apply)."""
        if self.state is BudgetState.FORCING and self.force_pos < len(self.forced):
            return self.forced[self.force_pos]
        return None

    def force(self) -> bool:
        """End the reasoning now (only while counting): common_reasoning_budget_force."""
        if self.state is not BudgetState.COUNTING:
            return False
        self.state, self.force_pos = BudgetState.FORCING, 0
        self.end_matcher.reset()
        return True
