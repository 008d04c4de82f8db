"""The engine object: the thread that runs the steps, its inbox and outbox, and what `api/` calls.

`api/` talks to it through `submit()` (plain dataclasses from `runtime/tasks.py`) and a few
read-only views; everything mutable is touched only by the loop thread (slot actions and metric
reads from the API are queued to it through the inbox and run between steps).

With `--sleep-idle-seconds N`, after N seconds without a task the loop releases the model, the KV
cache and the RAM prompt cache (the tokenizer and chat template stay, for /props and /models);
`wake()` (the API calls it before any route that needs the model) loads them again. While asleep,
/metrics shows the values of the moment it fell asleep (llama-server's cached responses).

One step = `Scheduler.schedule()` (the batch: a decode token for each generating slot plus
prompt chunks of slots still reading their prompts) -> `ModelRunner.run(plan)` (one batched
forward) -> `Scheduler.postprocess(plan, out)` (books, sampling, stop rules, events).

Failures are isolated per sequence (runtime/serving/failures.py): an exception while one task is
admitted, sampled, masked or stopped ends that task alone with a 500; a failed forward ends the
sequences of its batch; the loop's own catch-all (every running task) is the last resort.
"""
from __future__ import annotations

import concurrent.futures
import gc
import itertools
import queue
import sys
import threading
import time
import traceback
from typing import Any, Callable

from runtime.serving import bootstrap
from runtime.serving.config import EngineConfig
from runtime.serving.handle import Outbox, TaskHandle
from runtime.serving.metrics import WINDOW_GAUGES, Metrics
from runtime.serving.scheduler import Scheduler
from runtime.serving.slot_files import check_action, erase_slot, restore_slot, save_slot
from runtime.serving.slots import Slot, new_slots, slot_view
from runtime.serving.spec import Speculator, make_speculator
from runtime.serving.spec_draft import make_drafter
from runtime.serving.stop_match import StopMatcher
from runtime.tasks import CompletionTask, EmbeddingTask


class Engine:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.loaded = False
        # set by load()
        self.model = self.blocks = self.runner = self.tokenizer = self.chat_template = None
        self.mm = None  # runtime.vision.Multimodal (--mmproj)
        self.prompt_cache = None
        self.scheduler: Scheduler | None = None
        self.model_info: dict[str, Any] = {}
        self.slots: list[Slot] = []
        self.n_slots = self.n_ctx = self.n_ctx_slot = 0
        self.kv_unified = False
        self.vocab = None
        self.spec = None  # runtime.serving.spec.Speculator (--spec-type), set by load()
        self.drafter = None  # runtime.serving.spec_draft.DraftModel (-md, --spec-type draft-simple), set by load()
        # --sleep-idle-seconds
        self.sleeping = False
        self._t_active = time.monotonic()  # when the last task arrived or the last step ran
        self._sleep_metrics: dict[str, float] | None = None  # /metrics while asleep
        self._reset_window_on_wake = False  # a scrape while asleep reported the window
        self._lora_scales: tuple[float, ...] = ()
        # the loop thread and what crosses into it
        self._inbox: queue.Queue = queue.Queue()
        self._outbox = Outbox()  # events for asyncio handles, sent once per step
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._metrics = Metrics()
        self._task_ids = itertools.count()
        # request preparation off the engine thread (long stop lists)
        self._prepare = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tritium-prepare")

    def _log(self, level: str, msg: str) -> None:
        if self.cfg.log is not None:
            self.cfg.log(level, msg)
        elif self.cfg.verbosity >= 3 or level in "WE":
            print(f"{level} {msg}", file=sys.stderr, flush=True)

    # ---- life cycle ------------------------------------------------------------------------
    def load(self) -> None:
        """Blocking: model, tokenizer, chat template, KV cache, slots, warm-up (bootstrap.py)."""
        b = bootstrap.load(self.cfg, self._log)
        self.model, self.blocks, self.runner = b.model, b.blocks, b.runner
        self.tokenizer, self.chat_template, self.model_info = b.tokenizer, b.chat_template, b.model_info
        self.n_ctx, self.n_slots, self.n_ctx_slot, self.kv_unified = b.n_ctx, b.n_slots, b.n_ctx_slot, b.kv_unified
        self.prompt_cache, self.vocab, self.mm = b.prompt_cache, b.vocab, b.mm
        self.slots = new_slots(b.n_slots, b.n_ctx_slot)
        recurrent = getattr(b.model, "recurrent", None) is not None
        self.spec = make_speculator(self.cfg.spec, b.n_slots, self._log, recurrent=recurrent)
        self.drafter, ok = make_drafter(self.cfg, b.tokenizer, b.n_slots, b.n_ctx, self._log, recurrent,
                                        tp=getattr(b.model, "tp", None) is not None)
        if not ok:  # llama-server's common_speculative_init threw: no speculation at all
            self.spec = None
        elif self.drafter is not None and self.spec is None:  # (draft-simple alone: the per-slot books, no n-gram drafter)
            self.spec = Speculator(self.cfg.spec, b.n_slots, self._log)
        self.scheduler = Scheduler(self.cfg, self.slots, b.blocks, b.model, b.vocab, b.prompt_cache, self._metrics,
                                   self._log, b.kv_unified, b.mm, b.n_ctx, self.spec, self.drafter)
        if self.cfg.cache_idle_slots and not self.sleeping:
            if self.prompt_cache is None:
                self._log("W", "srv          init: --cache-idle-slots requires --cache-ram, disabling")
            else:
                self._log("I", "srv          init: idle slots will be saved to prompt cache"
                               + (" and cleared upon starting a new task" if self.kv_unified else " upon starting a new task"))
                self._log("D", "srv          init: __TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")
        self.loaded = True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tritium-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        tp = getattr(self.model, "tp", None)
        if tp is not None and (self._thread is None or not self._thread.is_alive()):
            tp.group.send(("stop",))  # the other ranks' loops end (no command is in flight now)

    # ---- API-facing ------------------------------------------------------------------------
    def submit(self, task: CompletionTask | EmbeddingTask) -> TaskHandle:
        """Thread-safe (call it from asyncio or from a plain thread). What grows with the request
        is prepared off the engine thread first: its grammar compiled, a long stop list's matcher
        built; the task is queued when both are done."""
        h = TaskHandle(task, next(self._task_ids), self._outbox, self._wake)
        grammar = getattr(getattr(task, "params", None), "grammar", "")
        pending = []
        if grammar and self.vocab is not None and (f := self.vocab.precompile(grammar)) is not None:
            pending.append(f)
        stops = getattr(task, "stop", None)
        if stops and getattr(task, "stop_matcher", None) is None:
            if len(stops) <= 64:
                task.stop_matcher = StopMatcher(stops)
            else:
                pending.append(self._prepare.submit(lambda: setattr(task, "stop_matcher", StopMatcher(stops))))
        if not pending:
            self._inbox.put(("task", h))
            self._wake.set()
            return h
        left = [len(pending)]
        lock = threading.Lock()

        def done(_):
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            self._inbox.put(("task", h))
            self._wake.set()
        for f in pending:
            f.add_done_callback(done)
        return h

    @property
    def modalities(self) -> dict[str, bool]:
        """/props `modalities`: what the --mmproj file encodes."""
        mm = self.mm
        vision = bool(mm is not None and mm.has_vision)  # video: llama-server's build decodes videos with
        return {"vision": vision, "video": vision, "audio": bool(mm is not None and mm.has_audio)}  # ffmpeg

    def tokenize_media(self, text: str, files: list[bytes], marker: str):
        """Thread-safe: a prompt with media markers and its files -> `runtime.vision.MediaPrompt`
        (tokens, media chunks); raises `runtime.vision.MediaError` for a file that is no usable media."""
        if self.mm is None:
            raise ValueError("Multimodal data provided, but model does not support multimodal requests.")
        return self.mm.tokenize(text, files, marker)

    def run_on_loop(self, fn: Callable[[], Any], timeout: float = 600) -> Any:
        """Run fn on the engine thread between steps and return its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", (fn, fut)))
        self._wake.set()
        return fut.result(timeout=timeout)

    def idle_slot_available(self) -> bool:
        return any(not s.busy for s in self.slots)

    def slots_info(self) -> list[dict]:
        """/slots (see slots.slot_view)."""
        return [slot_view(s, self.spec is not None or self.drafter is not None,
                          self.spec.lengths[s.id].cap() if self.spec is not None else None) for s in self.slots]

    def metrics(self) -> dict[str, float]:
        """Counters (cumulative) and gauges (averaged over the window since the last call)."""
        def snapshot():
            if self.sleeping:  # what it was on falling asleep; the window is reported once
                values = dict(self._sleep_metrics)
                self._sleep_metrics.update({k: 0.0 for k in WINDOW_GAUGES})
                self._reset_window_on_wake = True
                return values
            return self._metric_values()
        if self._thread is None or not self._thread.is_alive():
            return snapshot()
        return self.run_on_loop(snapshot, timeout=30)

    def _metric_values(self, reset: bool = True) -> dict[str, float]:
        deferred = len(self.scheduler.waiting) if self.scheduler is not None else 0
        values = self._metrics.snapshot(sum(1 for s in self.slots if s.busy), deferred, reset)
        if self.blocks is not None:  # share of the KV blocks held by sequences (slots and cached prefixes)
            values["kv_cache_usage_ratio"] = self.blocks.usage().ratio
        return values

    def lora_adapters(self) -> list[dict]:
        scales = self.scheduler.lora_scales if self.scheduler is not None else ()
        return [{"id": i, "path": ad.path, "scale": scales[i] if i < len(scales) else 0.0,
                 "task_name": ad.task_name, "prompt_prefix": ad.prompt_prefix}
                for i, ad in enumerate(self.model.adapters if self.model is not None else [])]

    def set_lora(self, scales: dict[int, float]) -> None:
        """New tasks use these scales (llama-server's construct_lora_list: unlisted adapters 0)."""
        n = len(self.model.adapters) if self.model is not None else 0
        self.scheduler.lora_scales = tuple(float(scales.get(i, 0.0)) for i in range(n))

    def slot_action(self, id_slot: int, action: str, filename: str | None = None) -> dict:
        """save | restore | erase an idle slot's cache; raises slot_files.SlotError."""
        check_action(action, id_slot, len(self.slots), self.cfg.slot_save_path, filename)
        s = self.slots[id_slot]
        n_stream = 1 if self.kv_unified else self.n_slots  # llama.cpp's KV streams: one per slot unless unified
        if action == "save":
            return self.run_on_loop(lambda: save_slot(self.blocks, s, self.cfg.slot_save_path, filename, n_stream))
        if action == "restore":
            return self.run_on_loop(lambda: restore_slot(self.blocks, s, self.cfg.slot_save_path, filename, n_stream))
        return self.run_on_loop(lambda: erase_slot(self.blocks, s))

    def control(self, cmpl_id: str, action: str) -> dict:
        """`/v1/chat/completions/control` on the engine thread: `reasoning_end` makes the budget
        sampler of the live completion `cmpl_id` force the end of its reasoning now (b1's
        SERVER_TASK_TYPE_CONTROL): {"success": bool[, "message": why not]}."""
        def run() -> dict:
            s = next((s for s in self.slots if s.req is not None and cmpl_id
                      and getattr(s.req.task, "cmpl_id", "") == cmpl_id), None)
            if s is None:
                self._log("W", f"srv  process_sing: control {action} on unknown completion id={cmpl_id}, "
                               "no live slot")
                return {"success": False, "message": "no active completion for this id"}
            if action != "reasoning_end":
                return {"success": False, "message": "unknown control action"}
            if not s.req.task.params.reasoning_control:
                return {"success": False, "message": "reasoning control not enabled for this completion"}
            if s.req.sampler is not None and s.req.sampler.budget is not None:
                s.req.sampler.budget.force()  # only while counting (b1 answers success either way)
            return {"success": True}
        if self._thread is None or not self._thread.is_alive():
            return run()
        return self.run_on_loop(run, timeout=30)

    # ---- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            try:
                self._drain_inbox()
                if self.sleeping:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                self.scheduler.admit()
                self._outbox.flush()
                if not any(s.busy for s in self.slots):
                    if self.scheduler.waiting:
                        self._t_active = time.monotonic()
                    elif self._sleepy():
                        self._enter_sleep()
                        continue
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                self._step()
                self._t_active = time.monotonic()
            except Exception as e:  # never let one bad step kill the server
                traceback.print_exc()
                if self.scheduler is not None:
                    self.scheduler.fail_all(f"internal error: {e}")
            finally:
                self._outbox.flush()

    # ---- sleeping (--sleep-idle-seconds) -----------------------------------------------------
    def _sleepy(self) -> bool:
        n = self.cfg.sleep_idle_seconds
        return n > 0 and getattr(self.model, "tp", None) is None and time.monotonic() - self._t_active >= n

    def _enter_sleep(self) -> None:
        """Release the model, the KV cache and the prompt cache (on the loop thread, between steps)."""
        self._sleep_metrics = self._metric_values(reset=False)
        self._reset_window_on_wake = False
        self._log("I", "srv  handle_sleep: server is entering sleeping state")
        self.sleeping = True
        self._lora_scales = self.scheduler.lora_scales  # POST /lora-adapters outlives a sleep
        self.model = self.blocks = self.runner = self.prompt_cache = self.scheduler = self.drafter = None
        self.slots = []
        gc.collect()
        bootstrap.trim_heap()  # hand the freed heap back to the system

    def _exit_sleep(self) -> None:
        if not self.sleeping:
            return
        self._log("I", "srv  handle_sleep: server is exiting sleeping state")
        self.load()
        self.scheduler.lora_scales = self._lora_scales
        if self._reset_window_on_wake:  # a scrape while asleep already reported this window
            self._metrics.reset_window()
        self._sleep_metrics, self.sleeping = None, False
        self._t_active = time.monotonic()

    def wake(self) -> None:
        """Thread-safe: load the model again if the server sleeps (blocks until it is loaded)."""
        if self.sleeping:
            self.run_on_loop(self._exit_sleep)

    def _step(self) -> None:
        plan = self.scheduler.schedule()
        if not plan:
            return
        try:
            out = self.runner.run(plan)
        except Exception as e:  # noqa: BLE001 - the batch's sequences end; the engine serves on
            self.scheduler.fail_batch(plan, e)
            return
        self.scheduler.postprocess(plan, out)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "task":
                self._exit_sleep()  # a task never waits for a sleeping model
                self.scheduler.waiting.append(item)
                self._t_active = time.monotonic()
            elif kind == "call":
                fn, fut = item
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed back to the caller
                    fut.set_exception(e)
