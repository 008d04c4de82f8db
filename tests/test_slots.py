"""Slots (runtime/serving/slots.py) without a model: slot choice (id_slot, prompt similarity,
least recently used), purging idle caches when the KV pool is full, release, the /slots view."""
from __future__ import annotations

import threading

import pytest
import torch

from runtime.model.kv_store import KVStore
from runtime.serving.blocks import BlockManager, OutOfBlocks
from runtime.serving.handle import Outbox, TaskHandle
from runtime.serving.slots import Request, SlotState, new_slots, pick_slot, release, reserve, slot_view
from runtime.serving.stopping import TextState
from runtime.tasks import CompletionTask, SamplingParams


def _busy(s, prompt=(1, 2, 3), n_predict=-1):
    task = CompletionTask(list(prompt), SamplingParams())
    s.req = Request(TaskHandle(task, 0, Outbox(), threading.Event()), list(prompt), False, t_start=0.0,
                    n_predict=n_predict)
    s.state, s.last_task, s.id_task = SlotState.PROMPT, task, 17
    return s


def test_slot_state_is_an_enum_and_idle_means_no_request():
    slots = new_slots(3, 512)
    assert [(s.id, s.n_ctx, s.state, s.busy) for s in slots] == [(i, 512, SlotState.IDLE, False) for i in range(3)]
    _busy(slots[1])
    assert slots[1].busy and slots[1].state is SlotState.PROMPT
    slots[1].tokens = [5, 6]
    release(slots[1])
    assert slots[1].req is None and slots[1].state is SlotState.IDLE and slots[1].tokens == [5, 6]
    assert slots[1].t_last_used > 0


def test_pick_slot_by_id():
    slots = new_slots(2, 512)
    assert pick_slot(slots, CompletionTask([1], id_slot=1), 0.1) == (slots[1], False)
    assert pick_slot(slots, CompletionTask([1], id_slot=3), 0.1) == (slots[1], False)  # modulo the slot count
    _busy(slots[1])
    assert pick_slot(slots, CompletionTask([1], id_slot=1), 0.1) is None  # waits for that slot


def test_pick_slot_by_prompt_similarity_then_lru():
    slots = new_slots(3, 512)
    prompt = list(range(100))
    slots[0].tokens, slots[0].t_last_used = prompt[:5] + [9] * 20, 3.0  # 5% of the prompt
    slots[1].tokens, slots[1].t_last_used = prompt[:40], 2.0  # 40%
    slots[2].tokens, slots[2].t_last_used = prompt[:30], 1.0  # 30%
    assert pick_slot(slots, CompletionTask(prompt), 0.1) == (slots[1], False)
    _busy(slots[1])
    assert pick_slot(slots, CompletionTask(prompt), 0.1) == (slots[2], False)
    assert pick_slot(slots, CompletionTask(prompt), 0.5) == (slots[2], True)  # none similar enough: LRU
    assert pick_slot(slots, CompletionTask(prompt), 0.0) == (slots[2], True)  # similarity off
    assert pick_slot(slots, CompletionTask([]), 0.1) == (slots[2], True)
    fresh = new_slots(3, 512)  # equally old: the last one, as llama.cpp's `t_last_used <= t_last`
    assert pick_slot(fresh, CompletionTask(prompt), 0.1) == (fresh[2], True)
    _busy(fresh[2])
    assert pick_slot(fresh, CompletionTask(prompt), 0.1) == (fresh[1], True)
    _busy(slots[0]), _busy(slots[2])
    assert pick_slot(slots, CompletionTask(prompt), 0.1) is None


def _kv(num_blocks):
    return BlockManager(KVStore(n_layers=1, n_kv_heads=1, head_dim=4, num_blocks=num_blocks, block_size=4,
                                dtype=torch.float32))


def test_reserve_purges_idle_slots_in_slot_order():
    kv = _kv(6)
    slots = new_slots(4, 64)
    for s, n, t in zip(slots[:3], (8, 8, 4), (2.0, 1.0, 3.0)):
        kv.reserve(s.seq, n)
        s.seq.n_tokens, s.tokens, s.t_last_used = n, list(range(n)), t
    _busy(slots[2])  # busy slots are never purged
    logs = []
    reserve(kv, slots, slots[3], 4, lambda lv, msg: logs.append((lv, msg)))  # two blocks are still free
    assert logs == []
    reserve(kv, slots, slots[3], 12, lambda lv, msg: logs.append((lv, msg)))
    # llama.cpp's try_clear_idle_slots: the first idle slot holding tokens, whatever its age
    assert slots[0].tokens == [] and slots[0].seq.blocks == []
    assert slots[1].tokens and len(slots[3].seq.blocks) == 3
    assert logs == [("W", "srv  update_slots: purging slot 0 with 8 tokens")]
    with pytest.raises(OutOfBlocks):  # slot 1 purged too, still not enough: the busy slot keeps its blocks
        reserve(kv, slots, slots[3], 28, lambda lv, msg: logs.append((lv, msg)))
    assert slots[1].tokens == [] and len(slots[2].seq.blocks) == 1


def test_slot_view_fresh_busy_and_idle():
    s = new_slots(1, 256)[0]
    assert slot_view(s) == {"id": 0, "n_ctx": 256, "speculative": False, "is_processing": False}
    _busy(s, prompt=range(10), n_predict=8)
    s.tokens = list(range(10))
    r = s.req
    r.n_cached, r.n_decoded, r.pending, r.text = 4, 3, 42, TextState([])
    r.text.push(b"a\nb")
    v = slot_view(s)
    assert v["is_processing"] and v["id_task"] == 17 and v["task"] is s.last_task
    assert (v["n_prompt_tokens"], v["n_prompt_tokens_processed"], v["n_prompt_tokens_cache"]) == (11, 6, 4)
    assert v["next_token"] == [{"has_next_token": True, "has_new_line": True, "n_remain": 5, "n_decoded": 3}]
    release(s)
    v = slot_view(s)
    assert not v["is_processing"] and v["id_task"] == 17
    assert (v["n_prompt_tokens"], v["n_prompt_tokens_processed"], v["n_prompt_tokens_cache"]) == (10, 0, 0)
    assert v["next_token"] == [{"has_next_token": False, "has_new_line": False, "n_remain": -1, "n_decoded": 0}]
