"""Slots: the cached sequence each slot keeps across tasks, and the state of the task it runs.

A `Slot` owns a KV sequence and the tokens whose K/V it holds (what outlives a task, reused by the
next prompt that shares a prefix). While it runs a task it also holds a `Request`: that task's
prompt, progress, sampler, text and timings, dropped when the task ends. `Slot.state` says which
phase the slot is in.

Policies on slots, as llama.cpp's server applies them: which idle slot a new task gets
(`pick_slot`: the requested id, else the most similar cached prompt, else the least recently
used), making room in a full KV pool by purging idle slots' caches (`reserve`), releasing a slot
(`release`) and the `/slots` view (`slot_view`).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from runtime.model.kv_store import SeqKV
from runtime.sampling.sampler import SamplerState
from runtime.serving.blocks import BlockManager, OutOfBlocks
from runtime.serving.handle import TaskHandle
from runtime.serving.spec import SlotSpec
from runtime.serving.stopping import StopType, TextState
from runtime.tasks import TokenOut


class SlotState(enum.Enum):
    IDLE = "idle"  # no task
    PROMPT = "prompt"  # feeding the task's prompt to the model, a chunk per step
    GENERATING = "generating"  # one sampled token per step (plus its draft when speculating)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.nonzero(x != y)[0]
    return int(diff[0]) if diff.size else n


@dataclass(eq=False)
class Request:
    """Per-task state, alive while the slot runs the task."""
    handle: TaskHandle
    prompt: list[int]
    embedding: bool  # an EmbeddingTask: the prompt's hidden states are pooled, nothing is sampled
    t_start: float
    n_past: int = 0  # prompt tokens already in the cache
    n_cached: int = 0  # of which reused from a cache
    sampler: SamplerState | None = None
    pending: int | None = None  # sampled token not yet decoded
    n_decoded: int = 0
    n_predict: int = -1
    text: TextState | None = None
    generated: list[int] = field(default_factory=list)
    probs: list[TokenOut] = field(default_factory=list)
    t_prompt_done: float = 0.0
    t_prompt_last: float = 0.0  # when the last prompt batch was read
    truncated: bool = False
    stop_type: StopType = StopType.NONE
    lazy_grammar: Any = None  # matcher waiting for a trigger word in the output
    lazy_triggers: list[str] = field(default_factory=list)
    lazy_scan: Any = None  # stop_match.StopScan over lazy_triggers
    lora: tuple[float, ...] = ()  # scale per loaded LoRA adapter for this task
    prompt_breaks: tuple[int, ...] = ()  # prompt positions where a prompt batch ends (`plan.prompt_breaks`)
    media: Any = None  # the prompt's media chunks (runtime.serving.media_rows.PromptMedia), or None
    draft: list[int] = field(default_factory=list)  # speculative tokens fed after `pending` this step
    draft_q: Any = None  # a sampled draft's distributions (spec_draft.Draft.q): verified by the rejection rule
    spec: SlotSpec = field(default_factory=SlotSpec)  # draft_n / draft_n_accepted of this task

    @property
    def task(self):
        return self.handle.task


@dataclass(eq=False)
class Slot:
    """A slot and its cached sequence."""
    id: int
    n_ctx: int
    seq: SeqKV = field(default_factory=SeqKV)
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is in seq
    t_last_used: float = 0.0
    last_task: Any = None  # the task the slot ran last (llama-server's /slots shows its params)
    id_task: int = -1
    state: SlotState = SlotState.IDLE
    req: Request | None = None  # the running task; None exactly when state is IDLE
    lora: tuple[float, ...] = ()  # the adapter scales its cached tokens were computed with
    # llama-server's context checkpoints of the cached sequence (sliding-window models): the prompt
    # positions where a batch started (`plan.checkpoint_resume`)
    checkpoints: list[int] = field(default_factory=list)
    last_spec: SlotSpec | None = None  # the speculation numbers of its last task (/slots)

    @property
    def busy(self) -> bool:
        return self.req is not None


def new_slots(n_slots: int, n_ctx_slot: int) -> list[Slot]:
    return [Slot(i, n_ctx_slot) for i in range(n_slots)]


def pick_slot(slots: list[Slot], task, similarity: float) -> tuple[Slot, bool] | None:
    """The slot for a new task and whether it was chosen as the least recently used one; None while
    the slot it needs is busy. A task's `id_slot` wins; else the idle slot whose cached tokens
    cover the largest share (> `similarity`) of the prompt; else the least recently used."""
    id_slot = getattr(task, "id_slot", -1)
    if id_slot is not None and id_slot >= 0:
        s = slots[id_slot % len(slots)]
        return None if s.busy else (s, False)
    idle = [s for s in slots if not s.busy]
    if not idle:
        return None
    prompt = task.prompt_tokens
    best, sim_best = None, 0.0
    if similarity != 0.0 and prompt:
        for s in idle:
            if not s.tokens:
                continue
            sim = common_prefix(s.tokens, prompt) / len(prompt)
            if sim > sim_best and sim > similarity:
                best, sim_best = s, sim
    if best is not None:
        return best, False
    # llama.cpp keeps the last of equally old slots (`t_last_used <= t_last`): a fresh server's
    # first task goes to its highest slot id
    return min(reversed(idle), key=lambda s: s.t_last_used), True


def reserve(blocks: BlockManager, slots: list[Slot], s: Slot, n_total: int, log: Callable[[str, str], None]) -> None:
    """Blocks for n_total tokens of slot s; when the (unified) pool is full, idle slots' cached
    prompts are purged one at a time in slot order, as llama.cpp's try_clear_idle_slots. Raises
    OutOfBlocks when even that is not enough."""
    while True:
        try:
            blocks.reserve(s.seq, n_total)
            return
        except OutOfBlocks:
            idle = [x for x in slots if not x.busy and x.tokens and x is not s]
            if not idle:
                raise
            victim = idle[0]
            log("W", f"srv  update_slots: purging slot {victim.id} with {len(victim.tokens)} tokens")
            blocks.clear(victim.seq)
            victim.tokens = []


def release(s: Slot) -> None:
    """The task is over (finished, failed or cancelled): the slot keeps its cache and goes idle."""
    if s.req is not None:
        s.last_spec = s.req.spec
    s.req = None
    s.state = SlotState.IDLE
    s.t_last_used = time.perf_counter()


def slot_view(s: Slot, speculative: bool = False, draft_cap: int | None = None) -> dict:
    """One entry of /slots as llama-server b1-0c1e570 prints it: a slot that never ran a task shows
    id, n_ctx, speculative and is_processing only; the others add their last task's id and counts,
    `task` (that task: the API prints its params) and next_token (reset while idle). A speculating
    server adds tritium's `speculative_stats` (b1 has none there): the running or last task's
    draft_n / draft_n_accepted (timings' names), its verify steps, accepted tokens per draft
    position, and `draft_n_max`, the longest draft the slot's acceptance allows now (spec_adapt.py)."""
    r = s.req
    d: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": speculative, "is_processing": r is not None}
    if s.last_task is not None:
        n_remain = -1
        if r is not None and r.n_predict >= 0:
            n_remain = max(r.n_predict - r.n_decoded, 0)
        d.update({
            "id_task": s.id_task,
            "n_prompt_tokens": len(s.tokens) + (1 if r is not None and r.pending is not None else 0),
            "n_prompt_tokens_processed": max(len(r.prompt) - r.n_cached, 0) if r is not None else 0,
            "n_prompt_tokens_cache": r.n_cached if r is not None else 0,
            "task": s.last_task,
            "next_token": [{
                "has_next_token": r is not None,
                "has_new_line": bool(r is not None and r.text and r.text.has_new_line),
                "n_remain": n_remain,
                "n_decoded": r.n_decoded if r is not None else 0,
            }],
        })
        st = r.spec if r is not None else s.last_spec
        if speculative and st is not None:
            d["speculative_stats"] = {"draft_n": st.n_draft_total, "draft_n_accepted": st.n_draft_accepted,
                                      "n_verify_steps": st.n_verify_steps,
                                      "n_accepted_per_pos": list(st.accepted_per_pos),
                                      "draft_n_max": draft_cap}
    return d
