"""The scheduler: tasks waiting for a slot, the slots' request state machine, and the books
after each forward.

One engine step is `schedule()` -> `ModelRunner.run(plan)` -> `postprocess(plan, out)`:

- `admit()` (between steps) gives waiting tasks an idle slot (`slots.pick_slot`) and starts their
  request: prompt-cache swap and prefix reuse, sampler and grammar, limits, text state;
- `schedule()` frees cancelled slots, plans the step (`plan.plan_step`, pure) and reserves the KV
  blocks of each row through the block manager (purging idle slots when the pool is full); a row
  without room ends its task;
- `postprocess()` records what was fed, finishes prompts (metrics, embeddings), samples the rows
  that asked for logits, applies the stop rules and emits the events.

Everything here runs on the engine thread.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from runtime.model.decoder import Model
from runtime.sampling.sampler import Sampled, sample_batch
from runtime.serving.blocks import BlockManager, OutOfBlocks
from runtime.serving.config import EngineConfig
from runtime.serving.failures import client_message, log_failure
from runtime.serving.handle import TaskHandle
from runtime.serving.media_rows import PromptMedia
from runtime.serving.metrics import Metrics
from runtime.serving.plan import StepPlan, checkpoint_resume, plan_step, prompt_breaks, recurrent_resume
from runtime.serving.prompt_cache import PromptCache, cache_idle_slot, reusable_prefix, swap_with_ram_cache
from runtime.serving.runner import StepOutput, pool_embeddings
from runtime.serving.sampling import GrammarError, Vocabulary, maybe_trigger_grammar, sample_rows
from runtime.serving.slots import Request, Slot, SlotState, pick_slot, release, reserve
from runtime.serving.spec import Speculator
from runtime.serving.spec_draft import DraftModel, DraftRequest, rejection_sample
from runtime.serving.stopping import StopType, TextState, check_stop, effective_n_predict
from runtime.tasks import CompletionResult, EmbeddingTask, PromptProgress, TaskError, Timings, TokenOut


def running_timings(r: Request, now: float) -> Timings:
    """A running task's timings so far (llama-server's slot stats): the prompt clock stops at its
    last batch, the generation clock starts when the prompt is done."""
    prompt_end = r.t_prompt_done or r.t_prompt_last
    return Timings(cache_n=r.n_cached, prompt_n=r.n_past - r.n_cached,
                   prompt_ms=(prompt_end - r.t_start) * 1e3 if prompt_end else 0.0,
                   predicted_n=r.n_decoded,
                   predicted_ms=(now - r.t_prompt_done) * 1e3 if r.t_prompt_done and r.n_decoded else 0.0,
                   draft_n=r.spec.n_draft_total, draft_n_accepted=r.spec.n_draft_accepted)


def send_progress(r: Request) -> None:
    """A `prompt_progress` event, for a streamed task that asked for them."""
    task = r.task
    if task.stream and task.return_progress:
        now = time.perf_counter()
        r.handle.emit(PromptProgress(len(r.prompt), r.n_cached, r.n_past, int((now - r.t_start) * 1e3),
                                     running_timings(r, now)))


class Scheduler:
    def __init__(self, cfg: EngineConfig, slots: list[Slot], blocks: BlockManager, model: Model, vocab: Vocabulary,
                 prompt_cache: PromptCache | None, metrics: Metrics, log: Callable[[str, str], None],
                 kv_unified: bool = False, mm=None, n_ctx: int = 0, spec: Speculator | None = None,
                 drafter: DraftModel | None = None):
        self.cfg, self.slots, self.blocks, self.model, self.vocab = cfg, slots, blocks, model, vocab
        # llama.cpp's context n_ubatch: min(n_ctx, -b, -ub); an embedding's prompt must fit it (pooling)
        self.n_ubatch_ctx = min(n_ctx or cfg.n_batch, cfg.n_batch, cfg.n_ubatch)
        self.spec = spec  # speculative decoding's drafters (--spec-type), or None
        self.drafter = drafter  # the draft model (-md, --spec-type draft-simple), or None
        self.mm = mm  # runtime.vision.Multimodal (--mmproj): encodes a media chunk when it is first planned
        self.kv_unified = kv_unified  # one KV pool for all slots: clearing an idle slot frees room
        self.prompt_cache, self.metrics, self.log = prompt_cache, metrics, log
        self.waiting: list[TaskHandle] = []
        # the server's LoRA adapter scales (--lora, POST /lora-adapters); a task may bring its own
        self.lora_scales: tuple[float, ...] = tuple(0.0 if cfg.lora_init_without_apply else s for _, s in cfg.lora)
        # llama-server ends prompt batches where it saves context checkpoints and resumes a reused
        # prompt from the last one: models with sliding-window layers unless --swa-full (its n_swa > 0)
        # (its n_swa > 0), and hybrid models, whose recurrent state cannot be rolled back: there the
        # checkpoints hold the state (BlockManager.checkpoint)
        self.recurrent = getattr(model, "recurrent", None) is not None
        self.swa_checkpoints = ((any(L.window for L in model.layers) and not cfg.swa_full) or self.recurrent) \
            and cfg.ctx_checkpoints > 0
        self.n_swa = max((L.window for L in model.layers), default=0)

    @property
    def n_busy(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    # ---- admission -------------------------------------------------------------------------
    def admit(self) -> None:
        still = []
        for h in self.waiting:
            if h.abandoned():
                continue
            picked = pick_slot(self.slots, h.task, self.cfg.slot_prompt_similarity)
            if picked is None:
                still.append(h)
                continue
            try:
                self._start(*picked, h)
            except Exception as e:  # noqa: BLE001 - this task alone fails (its slot freed, its cache dropped)
                self.fail_unexpected(picked[0], e, "starting the task", h)
        self.waiting = still

    def _lora(self, task) -> tuple[float, ...]:
        """A task's adapter scales: its own `lora` (unlisted adapters 0, as llama-server's
        construct_lora_list), else the server's."""
        own = getattr(task, "lora", None)
        scales = self.lora_scales if own is None else tuple(float(own.get(i, 0.0)) for i in range(len(self.lora_scales)))
        return scales if any(scales) else ()  # () = the base model

    def _reserve(self, s: Slot, n_total: int) -> None:
        reserve(self.blocks, self.slots, s, n_total, self.log)

    def _start(self, s: Slot, by_lru: bool, h: TaskHandle) -> None:
        task = h.task
        s.id_task, s.last_task = h.id, task
        embedding = isinstance(task, EmbeddingTask)
        r = s.req = Request(h, list(task.prompt_tokens), embedding, t_start=time.perf_counter())
        prompt = r.prompt
        if getattr(task, "media", None):
            r.media = PromptMedia(task.media)
        r.lora = self._lora(task)
        if s.lora != r.lora:  # the cached tokens were computed with other adapters
            self.blocks.clear(s.seq)
            s.tokens, s.lora = [], r.lora
        if embedding:
            if not task.splittable and len(prompt) > self.n_ubatch_ctx:  # b1: pooled within one ubatch
                self.fail(s, 500, f"input ({len(prompt)} tokens) is too large to process. increase the physical "
                                  f"batch size (current batch size: {self.n_ubatch_ctx})", "server_error")
                return
            if not task.splittable and len(prompt) > s.n_ctx:  # (splittable: the api's check)
                self.fail(s, 400, f"input ({len(prompt)} tokens) is larger than the max context size ({s.n_ctx} "
                                  "tokens). skipping", "exceed_context_size_error",
                          {"n_prompt_tokens": len(prompt), "n_ctx": s.n_ctx})
                return
            self.blocks.clear(s.seq)
            s.tokens = []
            s.state = SlotState.PROMPT
            self._cache_idle_slots(s)
            return
        if not prompt:
            s.state = SlotState.GENERATING
            self.finish(s)
            return
        if len(prompt) >= s.n_ctx:
            self.fail(s, 400, f"request ({len(prompt)} tokens) exceeds the available context size ({s.n_ctx} tokens), try increasing it",
                      "exceed_context_size_error", {"n_prompt_tokens": len(prompt), "n_ctx": s.n_ctx})
            return
        # llama-server's RAM prompt cache: completion tasks only (not /infill; embeddings returned above)
        if self.prompt_cache is not None and not task.infill and swap_with_ram_cache(self.prompt_cache, self.blocks, s,
                                                                                     prompt, by_lru, self._reserve):
            self.log("D", "srv  get_availabl: updating prompt cache")
        n_past = 0
        if task.cache_prompt:
            n_reuse = self.cfg.cache_reuse if task.n_cache_reuse is None else task.n_cache_reuse
            n_reuse = 0 if self.recurrent else n_reuse  # no chunk moves under a recurrent state
            n_past = reusable_prefix(self.blocks, s, prompt, n_reuse)
        if self.recurrent:
            n_past, s.checkpoints = recurrent_resume(n_past, len(prompt), s.seq.n_tokens,
                                                     s.checkpoints if self.swa_checkpoints else [])
        elif self.swa_checkpoints:
            n_past, s.checkpoints = checkpoint_resume(n_past, len(prompt), s.checkpoints, self.n_swa)
        if n_past >= len(prompt):
            n_past = len(prompt) - 1  # the last prompt token is always evaluated (its logits are needed)
        if r.media:
            n_past = r.media.align(n_past)  # a cached prefix holds whole media chunks
        if n_past > 0 and not self.blocks.window_ok(s.seq, n_past) and not self.recurrent and self.swa_checkpoints:
            # the sliding-window layers dropped it: resume before the newest context checkpoint that
            # holds the window (llama-server restores its saved SWA cache there; `BlockManager.truncate`)
            c = next((c for c in reversed(s.checkpoints) if 1 < c and c - 1 <= n_past
                      and self.blocks.window_ok(s.seq, c - 1)), None)
            n_past = n_past if c is None else c - 1
        if n_past > 0 and not self.blocks.window_ok(s.seq, n_past):  # the sliding-window layers dropped it
            self.log("W", f"slot update_slots: id {s.id:2d} | task {h.id} | forcing full prompt re-processing due to "
                          "lack of cache data (likely due to SWA or hybrid/recurrent memory, see "
                          "https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)")
            n_past = 0
        self.blocks.truncate(s.seq, n_past)
        s.tokens = s.tokens[:n_past]
        s.checkpoints = [c for c in s.checkpoints if (c <= n_past if self.recurrent else c - 1 <= n_past)]
        r.n_past = r.n_cached = n_past
        if self.swa_checkpoints and not task.infill:
            r.prompt_breaks = prompt_breaks(len(prompt), self.cfg.n_batch, self.cfg.n_ubatch)
            # a chat's user messages: llama-server also ends a batch where the last one begins, and
            # where the first one past the cache begins while the slot holds no checkpoint
            users = [u for u in getattr(task, "user_starts", ()) if u > n_past]
            if users:
                extra = {users[-1]} | ({users[0]} if not s.checkpoints else set())
                r.prompt_breaks = tuple(sorted(set(r.prompt_breaks) | extra))
        s.state = SlotState.PROMPT
        try:
            self.vocab.start_sampler(r, task.grammar_prefix)
        except GrammarError as e:
            self.fail(s, 400, str(e), "invalid_request_error")
            return
        r.n_predict = effective_n_predict(task.n_predict, self.cfg.n_predict)
        r.text = TextState(task.stop_matcher or task.stop, self.vocab.tokenizer)
        send_progress(r)  # the 0% update: nothing read yet but the cached prefix
        self._cache_idle_slots(s)

    def _cache_idle_slots(self, started: Slot) -> None:
        if not self.cfg.cache_idle_slots or self.prompt_cache is None:
            return
        for x in self.slots:
            if x is not started and not x.busy and cache_idle_slot(self.prompt_cache, self.blocks, x, self.kv_unified):
                self.log("D", f"slot launch_slot_: id {x.id:2d} | task {started.id_task} | __TEST_TAG_CACHE_IDLE_SLOT__")

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """The rows of this step, their KV blocks reserved."""
        for s in self.slots:
            if s.busy and s.req.handle.abandoned():
                self._release(s)
        if self.cfg.ctx_shift:
            for s in self.slots:
                if s.state is SlotState.GENERATING and s.busy and len(s.tokens) + 1 >= s.n_ctx:
                    self._context_shift(s)
        if self.spec is not None or self.drafter is not None:
            self._draft()
        plan = plan_step(self.slots, self.cfg.n_batch, self.cfg.n_prefill_chunk)
        if any(s.req.media for s in plan.slots):
            plan = self._media_rows(plan)
        for b, s in zip(plan.batch, plan.slots):
            if self.swa_checkpoints:
                self._checkpoint(s, b.n_past, b.n_past + len(b.tokens))
            try:
                self._reserve(s, b.n_past + len(b.tokens))
            except OutOfBlocks:
                self._context_exceeded()
                return plan.keep([False] * len(plan.slots))
        return plan

    def _context_shift(self, s: Slot) -> None:
        """llama-server's pre_decode context shift (--context-shift): a generating slot whose next
        token would fill its context keeps its first n_keep tokens (the task's n_keep, -1: the
        prompt; one more when the vocabulary adds BOS; at most n_ctx - 4) and drops the n_discard
        after them (the task's, 0: half of the rest; at most the rest less one)."""
        r, task = s.req, s.req.task
        if task.is_parent or task.is_child:
            self.fail(s, 500, "context shift cannot be used for shared prompt", "server_error")
            return
        n_keep = len(r.prompt) if task.n_keep < 0 else task.n_keep
        if getattr(self.vocab.tokenizer, "add_bos", False):
            n_keep += 1
        n_keep = min(s.n_ctx - 4, n_keep)
        n_left = len(s.tokens) - n_keep
        n_discard = task.n_discard if task.n_discard else n_left // 2
        n_discard = min(max(n_discard, 0), max(0, n_left - 1))
        self.log("W", f"slot   operator(): id {s.id:2d} | task {r.handle.id} | slot context shift, n_keep = {n_keep}, "
                      f"n_left = {n_left}, n_discard = {n_discard}")
        self.blocks.shift(s.seq, n_keep, n_discard)
        del s.tokens[n_keep:n_keep + n_discard]
        r.truncated = True
    def _draft(self) -> None:
        """Each generating slot's draft for this step (llama-server's update_slots: at most
        n_ctx - n_tokens - 2 tokens, and one less than the tokens still to predict), within the
        rows of one forward: the verify rows of all slots fit min(n_batch, n_ubatch)."""
        decoding = [s for s in self.slots if s.state is SlotState.GENERATING and s.req.pending is not None]
        budget = min(self.cfg.n_batch, self.cfg.n_ubatch) - len(decoding)
        model_drafts: list[DraftRequest] = []  # the draft model's, after the n-gram drafters (b1's order)
        for s in decoding:
            r = s.req
            r.draft, r.draft_q = [], None
            n_max = s.n_ctx - len(s.tokens) - 2
            n_remaining = r.n_predict - r.n_decoded if r.n_predict >= 0 else -1
            if n_remaining > 0:
                n_max = min(n_max, n_remaining - 1)
            n_max = min(n_max, budget)
            if n_max <= 0:
                continue
            if self.spec is not None:
                r.draft = self.spec.draft(s.id, s.tokens, r.pending, n_max)
            if not r.draft and self.drafter is not None and not r.media:
                n_max = min(n_max, self.drafter.params.n_max)
                model_drafts.append(DraftRequest(s.id, s.tokens, r.pending, n_max, r.sampler))
                budget -= n_max
                continue
            r.spec.n_draft_total += len(r.draft)
            budget -= len(r.draft)
        if model_drafts:
            for d, got in zip(model_drafts, self.drafter.draft(model_drafts)):
                r = self.slots[d.sid].req
                r.draft, r.draft_q = got.tokens, got.q if got.tokens else None
                r.spec.n_draft_total += len(got.tokens)

    def _media_rows(self, plan: StepPlan) -> StepPlan:
        """Rope positions and media embeddings of the rows of requests with media
        (runtime/serving/media_rows.py); a chunk that cannot be encoded ends its task with
        llama-server's 500."""
        keep = []
        for b, s in zip(plan.batch, plan.slots):
            m = s.req.media
            keep.append(True)
            if not m:
                continue
            if s.state is SlotState.GENERATING:
                if m.total_shift:
                    b.pos = [p - m.total_shift for p in range(b.n_past, b.n_past + len(b.tokens))]
                continue
            e = b.n_past + len(b.tokens)
            try:
                b.pos = m.positions(b.n_past, e)
                b.embd = m.rows(b.n_past, e, self.mm.encode)
            except Exception as ex:  # noqa: BLE001 - this task alone fails
                log_failure(self.log, f"slot {s.id}", ex)
                self.fail(s, 500, "failed to process mtmd chunk", "server_error")
                keep[-1] = False
        return plan.keep(keep)

    def _checkpoint(self, s: Slot, start: int, end: int) -> None:
        """llama-server saves a context checkpoint before a completion's prompt batch that starts
        past 0 and ends the prompt or lies within n_ubatch of its end (`plan.checkpoint_resume`)."""
        r = s.req
        if s.state is not SlotState.PROMPT or r.embedding or r.task.infill or start <= 0:
            return
        if r.media and r.media.touches(start):
            return
        n = len(r.prompt)
        users = getattr(r.task, "user_starts", ())
        near = end == n or n < end + self.cfg.n_ubatch
        # ... or starts a user message: the first checkpoint, or the last user message's
        if near or start in users and (not s.checkpoints or start == users[-1]):
            s.checkpoints = [c for c in s.checkpoints if c != start][-(self.cfg.ctx_checkpoints - 1):] + [start] \
                if self.cfg.ctx_checkpoints > 1 else [start]
            self.blocks.checkpoint(s.seq, s.checkpoints)  # hybrid models: the recurrent state after `start`

    def _context_exceeded(self) -> None:
        """The KV pool is full even after purging idle slots (a unified cache shared by slots that
        together outgrow it): as llama-server when llama_decode finds no room, every running task
        ends with a 500 and its slot's cache is cleared."""
        self.log("E", "srv  update_slots: Context size has been exceeded.")
        for s in self.slots:
            if s.busy:
                self.fail(s, 500, "Context size has been exceeded.", "server_error")
                self.blocks.clear(s.seq)
                s.tokens = []

    def postprocess(self, plan: StepPlan, out: StepOutput) -> None:
        """The books of each row, then sampling and the stop rules; a failure in any of these ends
        its own sequence only (`fail_unexpected`), the other rows go on as they would alone."""
        self.metrics.on_forward(len(plan.slots))
        need_sample: list[Slot] = []
        for b, s, hid in zip(plan.batch, plan.slots, out.hidden):
            if s.req is None:  # (failed earlier in this step)
                continue
            try:
                if self._books(s, b, hid) and b.logits:
                    need_sample.append(s)
            except Exception as e:  # noqa: BLE001
                self.fail_unexpected(s, e, "processing the prompt")
        if out.logits is None or not need_sample:
            return
        verify = {id(s) for b, s in zip(plan.batch, plan.slots) if b.n_logits > 1}
        if verify:
            self._verify_drafts(plan, out.logits, [s for s in need_sample if id(s) in verify])
            need_sample = [s for s in need_sample if id(s) not in verify]
        for s, sampled in sample_rows(plan, out.logits, need_sample):
            if isinstance(sampled, BaseException):
                self.fail_unexpected(s, sampled, "sampling")
                continue
            try:
                self._on_token(s, sampled)
            except Exception as e:  # noqa: BLE001
                self.fail_unexpected(s, e, "sampling")

    def _verify_drafts(self, plan: StepPlan, logits: torch.Tensor, slots: list[Slot]) -> None:
        """Speculative rows: each slot samples its rows in order with its own sampler (so penalties,
        grammars and stop rules see the tokens one at a time, as without a draft) and keeps the
        draft up to the first token the model did not choose; the rejected rows leave the KV cache
        (`BlockManager.truncate`). llama-server's common_sampler_sample_and_accept_n."""
        first, row = {}, 0
        for b, s in zip(plan.batch, plan.slots):
            if b.logits:
                first[id(s)] = row
                row += b.n_logits
        for s in slots:
            r, draft, q = s.req, s.req.draft, s.req.draft_q
            r.draft, r.draft_q = [], None
            rows = logits[first[id(s)]:first[id(s)] + len(draft) + 1]
            del s.tokens[len(s.tokens) - len(draft):]  # the cache as one token at a time would hold it
            n_acc = 0
            r.spec.on_verify(self.cfg.spec.n_max())  # before a token's stop rules can end the task
            try:
                for i in range(len(draft) + 1):
                    if q is not None and i < len(draft):  # a sampled draft: the rejection rule (spec_draft.py)
                        sampled = rejection_sample(rows[i], r.sampler, draft[i], q[i])
                    else:
                        sampled = sample_batch(rows[i:i + 1], [r.sampler])[0]
                    if isinstance(sampled, BaseException):
                        raise sampled
                    matched = i < len(draft) and sampled.token == draft[i]
                    if matched:  # counted before the token's stop rules, which may end the task
                        r.spec.on_accepted(n_acc)
                        n_acc += 1
                        r.spec.n_draft_accepted += 1
                    self._on_token(s, sampled)
                    if s.req is not r or not matched:
                        break
                    s.tokens.append(draft[i])
            except Exception as e:  # noqa: BLE001 - this sequence alone fails
                self.fail_unexpected(s, e, "sampling")
            self.blocks.truncate(s.seq, len(s.tokens))
            if self.spec is not None:
                self.spec.accept(s.id, n_acc)

    def _books(self, s: Slot, b, hid) -> bool:
        """Record what row `b` fed; False when the row's task is done (an embedding)."""
        r = s.req
        s.tokens.extend(b.tokens)
        if s.state is SlotState.GENERATING:
            r.pending = None
            return True
        r.n_past += len(b.tokens)
        if not r.embedding:
            r.t_prompt_last = time.perf_counter()
            send_progress(r)
        if r.n_past == len(r.prompt):
            if r.embedding:
                self._finish_embedding(s, hid)
                return False
            r.t_prompt_done = time.perf_counter()
            self.metrics.on_prompt_done(len(r.prompt) - r.n_cached, r.n_cached, r.t_prompt_done - r.t_start)
            s.state = SlotState.GENERATING  # (n_predict 0 too: b1 samples one token, then stops)
            if self.spec is not None:
                self.spec.begin(s.id, s.tokens)
        return True

    def _on_token(self, s: Slot, sampled: Sampled) -> None:
        r, task, tok = s.req, s.req.task, sampled.token
        r.sampler.accept(tok)
        r.n_decoded += 1
        r.generated.append(tok)
        is_eog = tok in self.vocab.eog
        stop_word, delta = r.text.push(self.vocab.piece(tok), is_eog)
        if r.lazy_grammar is not None:
            maybe_trigger_grammar(r)
        ev = TokenOut(tok, delta, n_cached=r.n_cached, n_decoded=r.n_decoded)
        # llama-server's process_token: a token that leaves an incomplete UTF-8 character is neither
        # streamed nor listed in the probabilities; every other one is, its text "" while held back
        complete = not r.text.incomplete
        if task.params.n_probs > 0 and complete:
            ev.probs = [self.vocab.token_prob(t, lp) for t, lp in sampled.top]
            ev.logprob = sampled.logprob
            r.probs.append(ev)
        stop, truncated = check_stop(r.text, stop_word, is_eog, n_cached=len(s.tokens),
                                     n_ctx=0 if self.cfg.ctx_shift else s.n_ctx,
                                     n_decoded=r.n_decoded, n_predict=r.n_predict, n_indent=task.n_indent,
                                     t_max_ms=task.t_max_predict_ms, t_prompt_done=r.t_prompt_done)
        if truncated:
            r.truncated = True
        if stop is not None:
            r.stop_type = stop
        if task.timings_per_token or stop is StopType.WORD:  # when llama-server's partial result has stats
            ev.timings = running_timings(r, time.perf_counter())
        if task.stream and complete:
            r.handle.emit(ev)
        if stop is not None:
            self.finish(s)
        else:
            r.pending = tok

    # ---- the end of a task -----------------------------------------------------------------
    @staticmethod
    def _timings(r: Request) -> Timings:
        now = time.perf_counter()
        done = r.t_prompt_done or now
        return Timings(cache_n=r.n_cached, prompt_n=len(r.prompt) - r.n_cached, prompt_ms=(done - r.t_start) * 1e3,
                       predicted_n=r.n_decoded, predicted_ms=(now - done) * 1e3 if r.t_prompt_done else 0.0,
                       draft_n=r.spec.n_draft_total, draft_n_accepted=r.spec.n_draft_accepted)

    def finish(self, s: Slot) -> None:
        r = s.req
        tim = self._timings(r)
        # n_tokens_max: the most tokens a slot's cache held (b1 reads it after each decode: the
        # last sampled token is never decoded)
        self.metrics.on_finish(r.n_decoded, tim.predicted_ms / 1e3, len(r.prompt) + max(r.n_decoded - 1, 0))
        if r.spec.n_verify_steps:
            self.metrics.on_spec_done(r.spec.n_draft_total, r.spec.n_draft_accepted, r.spec.n_verify_steps,
                                      r.spec.accepted_per_pos)
        text = r.text.final() if r.text is not None else ""
        res = CompletionResult(
            content=text, tokens=list(r.generated), id_slot=s.id, stop_type=r.stop_type.value,
            stopping_word=r.text.stopping_word if r.text is not None else "",
            truncated=r.truncated, n_prompt_tokens=len(r.prompt), n_decoded=r.n_decoded,
            tokens_cached=len(s.tokens), has_new_line=bool(r.text and r.text.has_new_line),
            timings=tim, probs=list(r.probs))
        self._release(s)
        r.handle.emit(res)

    def _release(self, s: Slot) -> None:
        """The slot goes idle; one that ran an extra completion of `n` keeps no cache (llama.cpp's
        slot release: the parent's context is enough)."""
        child = s.req is not None and getattr(s.req.task, "is_child", False)
        release(s)
        if child:
            self.blocks.clear(s.seq)
            s.tokens = []

    def _finish_embedding(self, s: Slot, hid: torch.Tensor) -> None:
        r = s.req
        vecs = pool_embeddings(hid, r.task.pooling, r.task.normalize, self.model.rank_scores)
        self.blocks.clear(s.seq)
        s.tokens = []
        release(s)
        r.handle.emit(vecs)

    def fail(self, s: Slot, code: int, message: str, type: str, extra: dict | None = None) -> None:
        r = s.req
        self._release(s)
        if r is not None:
            r.handle.emit(TaskError(code, message, type, extra or {}))

    def fail_unexpected(self, s: Slot, e: BaseException, what: str, h: TaskHandle | None = None) -> None:
        """An unexpected exception of one sequence: it alone ends with a 500 (the traceback goes to
        the log), its slot is freed and its cache dropped (it may hold rows of a half-done step)."""
        log_failure(self.log, f"slot {s.id}", e)
        handle = s.req.handle if s.req is not None else h
        if s.busy:
            self._release(s)
        self.blocks.clear(s.seq)
        s.tokens, s.checkpoints = [], []
        if handle is not None:
            handle.emit(TaskError(500, client_message(e, what), "server_error", {}))

    def fail_batch(self, plan: StepPlan, e: BaseException) -> None:
        """The forward of a batch failed (nothing says which row): its sequences end, every other
        slot and the engine go on."""
        for s in plan.slots:
            if s.busy:
                self.fail_unexpected(s, e, "running the model")

    def fail_all(self, message: str) -> None:
        """After an unexpected error in a step: every running task ends with a 500."""
        for s in self.slots:
            if s.busy:
                self.fail(s, 500, message, "server_error")
