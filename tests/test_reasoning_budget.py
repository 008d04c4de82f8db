"""runtime/sampling/reasoning_budget.py: llama.cpp's reasoning budget sampler, its own tests
(tests/test-reasoning-budget.cpp of b1-0c1e570) ported, and the sampler chain forcing the tokens."""
from __future__ import annotations

import torch

from runtime.sampling.reasoning_budget import BudgetState, ReasoningBudget, TokenMatcher, utf8_is_complete
from runtime.sampling.sampler import SamplerState, sample_batch
from runtime.tasks import SamplingParams

NEVER = None


def forcing_span(sequence, start, end, forced, budget, state=BudgetState.IDLE):
    """(first, last) index at which the sampler forced one token before accepting sequence[i]."""
    b = ReasoningBudget(start, end, forced, budget, None, state)
    first = last = None
    for i, tok in enumerate(sequence):
        forcing = b.forced_token() is not None
        b.accept(tok)
        if forcing:
            first = i if first is None else first
            last = i
        elif first is not None:
            break
    return first, last


def test_llama_cpp_cases():
    assert forcing_span([100, 50, 51, 101, 52], [[100]], [[101]], [102], 5) == (NEVER, NEVER)
    assert forcing_span([100, 50, 51, 52, 53], [[100]], [[101]], [102, 101], 2) == (3, 4)
    assert forcing_span([100, 50, 51, 52], [[100]], [[101]], [102, 101], 0, BudgetState.COUNTING) == (0, 1)
    assert forcing_span([50, 51, 52, 53], [[]], [[]], [102], 2) == (NEVER, NEVER)
    assert forcing_span([50, 51, 52, 53], [[100]], [[101]], [102, 101], 2, BudgetState.COUNTING) == (2, 3)
    # a second block re-arms the budget
    assert forcing_span([100, 50, 101, 100, 60, 61, 62, 63], [[100]], [[101]], [102, 101], 2) == (6, 7)
    assert forcing_span([110, 111, 50, 51, 52, 53], [[100], [110, 111]], [[101]], [102, 101], 2) == (4, 5)
    assert forcing_span([100, 50, 103, 104, 52], [[100]], [[101], [103, 104]], [102, 101], 5) == (NEVER, NEVER)


def test_force_only_while_counting():
    b = ReasoningBudget([[100]], [[101]], [102, 101], 5)
    assert not b.force() and b.state is BudgetState.IDLE
    b.accept(100)
    b.accept(50)
    assert b.force() and b.state is BudgetState.FORCING
    assert b.forced_token() == 102
    b.accept(102)
    assert b.forced_token() == 101
    b.accept(101)
    assert b.state is BudgetState.DONE and not b.force()
    f = ReasoningBudget([[100]], [[101]], [102, 101], 0, None, BudgetState.FORCING)
    f.accept(102)
    assert not f.force() and f.forced_token() == 101  # no rewind


def test_end_match():
    b = ReasoningBudget([[100]], [[101], [103, 104]], [102, 101], 5)
    for t in (100, 50, 103, 104):
        b.accept(t)
    assert b.end_sequence == [103, 104]
    b.accept(100)
    assert b.end_sequence is None and b.state is BudgetState.COUNTING
    b = ReasoningBudget([[100]], [[104], [103, 104]], [102, 104], 5)
    for t in (100, 103, 104):
        b.accept(t)
    assert b.end_sequence == [103, 104]  # the longest one ending there
    b = ReasoningBudget([[100]], [[101], [103, 104]], [102, 103, 104], 0, None, BudgetState.FORCING)
    for t in (102, 103, 104):
        b.accept(t)
    assert b.end_sequence == [103, 104]
    b = ReasoningBudget([[100]], [[101], [103, 104]], [102], 0, None, BudgetState.FORCING)
    b.accept(102)
    assert b.state is BudgetState.DONE and b.end_sequence is None


def test_token_matcher_restarts_after_a_match():
    m = TokenMatcher([[1, 2], [2, 3]])
    assert [m.advance(t) for t in (1, 2, 3, 2, 3)] == [-1, 0, -1, -1, 1]


def test_utf8_boundaries():
    assert utf8_is_complete(b"") and utf8_is_complete(b"abc") and utf8_is_complete("é".encode())
    assert not utf8_is_complete("é".encode()[:1]) and not utf8_is_complete("€".encode()[:2])
    assert utf8_is_complete("😀".encode()) and not utf8_is_complete("😀".encode()[:3])
    assert not utf8_is_complete(b"\x80\x80\x80\x80")


def test_budget_runs_out_inside_a_utf8_character():
    complete = {50: True, 51: False, 52: True}
    b = ReasoningBudget([[100]], [[101]], [101], 2, complete.get)
    for t in (100, 50, 51):
        b.accept(t)
    assert b.state is BudgetState.WAITING_UTF8 and b.forced_token() is None
    b.accept(52)
    assert b.forced_token() == 101


def test_the_chain_samples_the_forced_token():
    """Greedy or sampled, a forcing budget leaves one candidate; the others' rows are untouched."""
    logits = torch.randn(3, 200)
    logits[:, 7] = 50.0  # the model's favourite
    states = [SamplerState(SamplingParams(temperature=t, seed=1), frozenset()) for t in (0.0, 0.8, 0.8)]
    for st in states[:2]:
        st.budget = ReasoningBudget([[100]], [[101]], [150, 101], 0, None, BudgetState.FORCING)
    out = sample_batch(logits, states)
    assert [o.token for o in out] == [150, 150, 7]
    for st, o in zip(states, out):
        st.accept(o.token)
    assert [o.token for o in sample_batch(logits, states[:1])] == [101]
    states[0].accept(101)
    assert states[0].budget.state is BudgetState.DONE
    assert [o.token for o in sample_batch(logits, states[:1])] == [7]
