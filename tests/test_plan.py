"""The step planner (runtime/serving/plan.py) without a model: decode rows first, chunked prefill
under a cap while others decode, the token budget, logits/hidden/top-k flags, purity."""
from __future__ import annotations

import threading

from runtime.model.kv_store import SeqKV
from runtime.sampling.sampler import SamplerState
from runtime.serving.handle import Outbox, TaskHandle
from runtime.serving.plan import StepPlan, plan_step
from runtime.serving.slots import Request, Slot, SlotState
from runtime.tasks import CompletionTask, EmbeddingTask, SamplingParams

EOG = frozenset({2})


def _slot(i: int, state: SlotState, prompt_len: int = 0, n_past: int = 0, pending: int | None = None,
          params: SamplingParams | None = None, embedding: bool = False, cached: int = 0) -> Slot:
    s = Slot(i, 4096, SeqKV(), tokens=list(range(cached)))
    if state is SlotState.IDLE:
        return s
    prompt = list(range(1000, 1000 + prompt_len))
    task = EmbeddingTask(prompt) if embedding else CompletionTask(prompt, params or SamplingParams(temperature=0))
    r = Request(TaskHandle(task, 0, Outbox(), threading.Event()), prompt, embedding, t_start=0.0, n_past=n_past,
                pending=pending)
    if not embedding:
        r.sampler = SamplerState(task.params, EOG)
    s.req, s.state = r, state
    return s


def _prefill(i, prompt_len, n_past=0, **kw):
    return _slot(i, SlotState.PROMPT, prompt_len, n_past, cached=n_past, **kw)


def _decode(i, n_cached, pending=7, **kw):
    return _slot(i, SlotState.GENERATING, 4, 4, pending, cached=n_cached, **kw)


def _rows(plan: StepPlan):
    return [(s.id, b.n_past, len(b.tokens), b.logits) for b, s in zip(plan.batch, plan.slots)]


def test_nothing_to_do():
    plan = plan_step([_slot(0, SlotState.IDLE), _slot(1, SlotState.IDLE)], 2048, 512)
    assert not plan and plan.batch == [] and plan.slots == [] and plan.n_tokens == 0


def test_decode_rows_come_first_then_prompt_chunks():
    slots = [_prefill(0, 30), _decode(1, 12, pending=99), _prefill(2, 5), _decode(3, 40)]
    plan = plan_step(slots, 2048, 512)
    assert _rows(plan) == [(1, 12, 1, True), (3, 40, 1, True), (0, 0, 30, True), (2, 0, 5, True)]
    assert plan.batch[0].tokens == [99] and plan.batch[0].seq is slots[1].seq
    assert plan.batch[2].tokens == list(range(1000, 1030))
    assert plan.n_tokens == 37


def test_prompt_chunk_is_capped_while_others_decode():
    plan = plan_step([_prefill(0, 2000), _decode(1, 10)], 2048, 512)
    assert _rows(plan) == [(1, 10, 1, True), (0, 0, 512, False)]  # not the last chunk: no logits
    alone = plan_step([_prefill(0, 2000)], 2048, 512)
    assert _rows(alone) == [(0, 0, 2000, True)]  # nobody decodes: the whole budget
    big = plan_step([_prefill(0, 5000)], 2048, 512)
    assert _rows(big) == [(0, 0, 2048, False)]


def test_prompt_continues_where_it_stopped_and_ends_with_logits():
    s = _prefill(0, 1300, n_past=1024)
    plan = plan_step([s, _decode(1, 5)], 2048, 512)
    b = plan.batch[1]
    assert (b.n_past, len(b.tokens), b.logits) == (1024, 276, True)
    assert b.tokens == s.req.prompt[1024:]


def test_budget_is_shared_in_slot_order():
    slots = [_prefill(0, 80), _prefill(1, 80), _prefill(2, 80)]
    assert _rows(plan_step(slots, 100, 512)) == [(0, 0, 80, True), (1, 0, 20, False)]
    # each decode row takes one token of the budget
    slots = [_decode(0, 3), _decode(1, 3), _prefill(2, 80)]
    assert _rows(plan_step(slots, 50, 512)) == [(0, 3, 1, True), (1, 3, 1, True), (2, 0, 48, False)]


def test_decode_rows_are_never_dropped_for_the_budget():
    slots = [_decode(0, 3), _decode(1, 3), _decode(2, 3), _prefill(3, 10)]
    assert _rows(plan_step(slots, 2, 512)) == [(0, 3, 1, True), (1, 3, 1, True), (2, 3, 1, True)]


def test_generating_slot_without_a_pending_token_waits():
    assert not plan_step([_decode(0, 3, pending=None)], 2048, 512)


def test_topk_shortcut_and_banned_eog():
    greedy = _decode(0, 3, params=SamplingParams(temperature=0))
    topk = _decode(1, 3, params=SamplingParams(temperature=0.8, top_k=40, samplers=["top_k", "temperature"]))
    full = _decode(2, 3, params=SamplingParams(temperature=0, n_probs=3))
    no_eos = _prefill(3, 4, params=SamplingParams(temperature=0, ignore_eos=True))
    plan = plan_step([greedy, topk, full, no_eos], 2048, 512)
    assert [(b.topk, b.banned) for b in plan.batch] == [(1, ()), (40, ()), (0, ()), (1, (2,))]


def test_embedding_prompt_asks_for_hidden_states_not_logits():
    plan = plan_step([_prefill(0, 6, embedding=True)], 2048, 512)
    b = plan.batch[0]
    assert (b.hidden, b.logits, b.topk, len(b.tokens)) == (True, False, 0, 6)
    # pooled over one batch (llama-server pools the batch it decodes last): never chunked, it waits
    whole = plan_step([_prefill(0, 600, embedding=True), _decode(1, 3)], 2048, 512)
    assert [(b.hidden, b.logits, len(b.tokens)) for b in whole.batch] == [(False, True, 1), (True, False, 600)]
    waits = plan_step([_prefill(0, 600, embedding=True), _decode(1, 3)], 600, 512)
    assert [(b.hidden, b.logits, len(b.tokens)) for b in waits.batch] == [(False, True, 1)]


def test_planning_changes_nothing_and_keep_filters_rows():
    slots = [_prefill(0, 30, n_past=4), _decode(1, 9)]
    before = [(s.state, list(s.tokens), s.req.n_past, s.req.pending, s.seq.n_tokens, list(s.seq.blocks))
              for s in slots]
    plan = plan_step(slots, 2048, 512)
    assert [(s.state, list(s.tokens), s.req.n_past, s.req.pending, s.seq.n_tokens, list(s.seq.blocks))
            for s in slots] == before
    kept = plan.keep([False, True])
    assert kept.slots == [slots[0]] and kept.batch == [plan.batch[1]]
