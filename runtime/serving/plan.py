"""What one step computes: a pure function of the slots and the token budget.

The scheduling model (vLLM v1's, without preemption): there are no prefill and decode phases.
Every busy slot is a request with tokens still to feed, and each step gives some of them a
number of new tokens within one budget (`n_batch` tokens per forward):

1. decode rows first: every generating slot whose last sampled token is not yet in the cache
   feeds that one token (so a long prompt never stalls the running generations), followed by its
   speculative draft when it has one (`Request.draft`, runtime/serving/spec.py: logits for every
   token of the row; the scheduler bounds the drafts by the budget);
2. then prompt chunks, slot order: each prompt-reading slot feeds the next
   min(remaining prompt, budget left, chunk cap) tokens, where the chunk cap is `n_prefill_chunk`
   while some slot decodes (chunked prefill) and the whole `n_batch` when none does, and a chunk
   stops at the request's `prompt_breaks`; once the budget is spent the other prompts wait for
   the next step. An embedding's text (pooled over one batch) is never split: it waits for room.

A row asks for logits when its last token's are needed (every decode row; the prompt chunk that
ends a completion's prompt) with the sampler's top-k shortcut (`sampler.topk_needed`); a prompt
chunk of an embedding task asks for hidden states instead.

Admission (a waiting task getting a slot) happens before planning and KV blocks are reserved
after it (`Scheduler.schedule`): a row whose blocks cannot be found is dropped from the plan, its
task ended. Nothing here touches the model, the cache or the slots.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.model.decoder import SeqBatch
from runtime.sampling.sampler import topk_needed
from runtime.serving.slots import Slot, SlotState


@dataclass
class StepPlan:
    """One forward: `batch` is all the model runner sees; `slots[i]` owns `batch[i]`."""
    batch: list[SeqBatch] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.batch)

    @property
    def n_tokens(self) -> int:
        return sum(len(b.tokens) for b in self.batch)

    def keep(self, keep: list[bool]) -> "StepPlan":
        """The plan without the rows whose flag is False."""
        return StepPlan([b for b, k in zip(self.batch, keep) if k], [s for s, k in zip(self.slots, keep) if k])


def prompt_breaks(n_prompt: int, n_batch: int, n_ubatch: int) -> tuple[int, ...]:
    """Where llama-server b1-0c1e570 ends a prompt batch of a completion task on a model with
    sliding-window layers, so that it can save a context checkpoint there: 4 + n_ubatch and 4
    tokens before the prompt's end (server-context.cpp, "process the last few tokens of the prompt
    separately"). The same rows per forward give the same bits (the float order of some of its
    matmuls depends on the batch's row count), so tritium's prompt batches end there too."""
    return tuple(sorted(n_prompt - k for k in {min(n_batch, 4 + n_ubatch), 4} if n_prompt - k > 0))


def checkpoint_resume(n_past: int, n_prompt: int, checkpoints: list[int], n_swa: int) -> tuple[int, list[int]]:
    """Where llama-server b1-0c1e570 resumes a reused prompt on a sliding-window model: it cannot
    roll its sliding-window cache back, so while the sequence is within the window it restores the
    newest context checkpoint at or before the common prefix (a checkpoint saved before the batch
    starting at position c holds positions < c) and evaluates from position c - 1 (at least 1), or
    from 0 without one; checkpoints past that are dropped (server-context.cpp, "search for a
    context checkpoint"). Returns (n_past, the checkpoints kept). Past the window llama-server
    restores a checkpoint's saved state: the scheduler does that where the window was dropped
    (`BlockManager.window_ok` / `truncate` with `SeqKV.swa_ckpt`)."""
    if n_past <= 0 or n_past - n_swa - (0 if n_past < n_prompt else 1) > 0:
        return n_past, checkpoints
    c = next((c for c in reversed(checkpoints) if c - 1 <= n_past), None)
    n_past = 0 if c is None else min(n_past, max(1, c - 1))
    return n_past, [c for c in checkpoints if c - 1 <= n_past]


def recurrent_resume(n_past: int, n_prompt: int, n_cached: int, checkpoints: list[int]) -> tuple[int, list[int]]:
    """Where llama-server b1-0c1e570 resumes a reused prompt on a hybrid model (recurrent layers,
    n_swa 0): the recurrent state is that after the n_cached tokens it holds (its pos_min is
    n_cached - 1), so unless that is exactly the common prefix n_past and a token follows it, it
    restores the newest context checkpoint c (the state after c tokens, saved before the batch
    starting at c) with c - 1 < n_past (c - 1 < n_past - 1 when the whole prompt is cached, so that
    a token is left to evaluate) or c = 1, and evaluates from c; from 0 without one. Checkpoints
    past the resume point are dropped (server-context.cpp, "search for a context checkpoint";
    pos_min = pos_max = c - 1 for recurrent memory). Returns (n_past, the checkpoints kept)."""
    if n_past > 0:
        thold = max(0, n_past - (0 if n_past < n_prompt else 1))
        if n_cached - 1 >= thold:
            c = next((c for c in reversed(checkpoints) if c - 1 <= n_past and (c - 1 < thold or c == 1)), None)
            n_past = 0 if c is None else min(n_past, c)
    return n_past, [c for c in checkpoints if c <= n_past]


def plan_step(slots: list[Slot], n_batch: int, n_prefill_chunk: int) -> StepPlan:
    plan = StepPlan()
    decoding = [s for s in slots if s.state is SlotState.GENERATING and s.req.pending is not None]
    prefilling = [s for s in slots if s.state is SlotState.PROMPT]
    budget = n_batch
    for s in decoding:
        k, banned = topk_needed(s.req.sampler)
        toks = [s.req.pending] + s.req.draft  # a speculating slot's verify row: logits of every token
        plan.batch.append(SeqBatch(s.seq, toks, len(s.tokens), logits=True, n_logits=len(toks), topk=k,
                                   banned=banned, lora=s.req.lora))
        plan.slots.append(s)
        budget -= len(toks)
    chunk_cap = n_prefill_chunk if decoding else n_batch
    for s in prefilling:
        if budget <= 0:
            break
        r = s.req
        # a pooled embedding (mean, cls, none) is that of one batch: its text goes whole (b1's can_split)
        whole = r.embedding and not r.task.splittable
        rest = len(r.prompt) - r.n_past
        n = min(rest, budget, n_batch if whole else chunk_cap)
        n = next((e - r.n_past for e in r.prompt_breaks if r.n_past < e < r.n_past + n), n)
        if r.media:  # text stops before a media chunk, which goes alone and whole (media_rows.py)
            n = r.media.cut(r.n_past, n)
        if whole and n < (r.media.cut(r.n_past, rest) if r.media else rest):
            continue  # no room for it in this step
        last = r.n_past + n == len(r.prompt)
        sample = last and not r.embedding
        k, banned = topk_needed(r.sampler) if sample else (0, ())
        plan.batch.append(SeqBatch(s.seq, r.prompt[r.n_past:r.n_past + n], r.n_past, logits=sample,
                                   hidden=r.embedding, topk=k, banned=banned, lora=r.lora))
        plan.slots.append(s)
        budget -= n
    return plan
