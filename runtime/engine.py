"""The engine object: owns the model, the KV cache, the slots, the prompt caches and the step loop.

`api/` talks to it through `submit()` (plain dataclasses from `runtime/tasks.py`) and a few
read-only views; everything mutable lives here and is touched only by the loop thread
(slot actions from the API are queued to it and run between steps).

One step = one batched forward over every busy slot: a decode token for each generating slot plus
prompt chunks of slots still reading their prompts (bounded so that decodes are not stalled).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from runtime.cuda_graphs import DecodeGraphs
from runtime.kv_cache import KVCache, OutOfBlocks, SeqKV
from runtime.model import Model, SeqBatch
from runtime.sampler import SamplerState, sample_batch, topk_needed
from runtime.scheduler import (PromptCache, SlotFileError, TextState, cache_reuse_plan,
                               common_prefix, read_slot_file, write_slot_file)
from runtime.tasks import (CompletionResult, CompletionTask, EmbeddingTask, SamplingParams,
                           TaskError, Timings, TokenOut, TokenProb)


@dataclass
class EngineConfig:
    model_path: str | None = None
    n_ctx: int = 4096  # 0 = the model's training context
    n_parallel: int = -1  # -1 = auto: 4 slots, unified KV
    kv_unified: bool | None = None
    n_threads: int = -1
    device: str = "cpu"  # cpu | cuda | auto (cuda when available)
    cache_ram_mib: int = 8192  # -1 unlimited, 0 off
    cache_reuse: int = 0
    slot_prompt_similarity: float = 0.10
    slot_save_path: str | None = None
    embeddings: bool = False
    pooling: str = "mean"
    n_predict: int = -1
    n_batch: int = 2048
    n_prefill_chunk: int = 512  # prompt tokens per step while other slots decode
    block_size: int = 16
    kv_dtype: str = "f16"
    defaults: SamplingParams = field(default_factory=SamplingParams)
    chat_template: str | None = None
    chat_template_file: str | None = None
    verbosity: int = 3
    log: Callable[[str, str], None] | None = None  # (level letter, message)
    warmup: bool = True  # one forward at load (--no-warmup: off)
    config_overrides: dict[str, Any] = field(default_factory=dict)  # model config fields (RoPE flags)


class SlotError(Exception):
    def __init__(self, code: int, message: str, type: str):
        super().__init__(message)
        self.code, self.message, self.type = code, message, type


class TaskHandle:
    """A submitted task: events come out of `events()` (async) or `iter_sync()` (threads)."""
    _ids = itertools.count()

    def __init__(self, engine: "Engine", task):
        self.id = next(TaskHandle._ids)
        self.task = task
        self.engine = engine
        self.cancelled = False
        try:
            self._loop = asyncio.get_running_loop()
            self._q: Any = asyncio.Queue()
        except RuntimeError:
            self._loop = None
            self._q = queue.Queue()

    def _emit(self, ev) -> None:
        """Called on the engine thread: async handles are delivered in one batch per step
        (`Engine._flush`, one wake-up of the event loop instead of one per token)."""
        if self._loop is not None:
            self.engine._outbox.append((self, ev))
        else:
            self._q.put(ev)

    @staticmethod
    def _is_final(ev) -> bool:
        return not isinstance(ev, TokenOut)

    async def events(self):
        while True:
            ev = await self._q.get()
            yield ev
            if self._is_final(ev):
                return

    def iter_sync(self, timeout: float | None = None):
        while True:
            ev = self._q.get(timeout=timeout)
            yield ev
            if self._is_final(ev):
                return

    def result_sync(self, timeout: float | None = None):
        ev = None
        for ev in self.iter_sync(timeout):
            pass
        return ev

    def cancel(self) -> None:
        self.cancelled = True
        self.engine._wake.set()


@dataclass(eq=False)
class Slot:
    id: int
    n_ctx: int
    seq: SeqKV = field(default_factory=SeqKV)
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is in seq
    handle: TaskHandle | None = None
    t_last_used: float = 0.0
    last_task: Any = None  # the task the slot ran last (llama-server's /slots shows its params)
    # per task state
    prompt: list[int] = field(default_factory=list)
    n_past: int = 0  # prompt tokens already in the cache
    n_cached: int = 0  # of which reused from a cache
    state: str = "idle"  # idle | prompt | generating
    sampler: SamplerState | None = None
    pending: int | None = None  # sampled token not yet decoded
    n_decoded: int = 0
    n_predict: int = -1
    text: TextState | None = None
    generated: list[int] = field(default_factory=list)
    probs: list[TokenOut] = field(default_factory=list)
    t_start: float = 0.0
    t_prompt_done: float = 0.0
    truncated: bool = False
    stop_type: str = "none"
    id_task: int = -1
    picked_by_lru: bool = False
    lazy_grammar: Any = None  # matcher waiting for a trigger word in the output
    lazy_triggers: list[str] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        return self.handle is not None


@dataclass
class _Metrics:
    n_prompt_tokens_processed_total: int = 0
    n_prompt_tokens_cached_total: int = 0
    t_prompt_processing_total: float = 0.0  # seconds
    n_tokens_predicted_total: int = 0
    t_tokens_generation_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    # window since the last scrape
    n_prompt_tokens_processed: int = 0
    t_prompt_processing: float = 0.0
    n_tokens_predicted: int = 0
    t_tokens_generation: float = 0.0
    n_decode: int = 0
    n_busy_slots: int = 0


class Engine:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.loaded = False
        self.model: Model | None = None
        self.kv: KVCache | None = None
        self._graphs: DecodeGraphs | None = None  # CUDA: decode steps replayed from graphs
        self.tokenizer = None
        self.chat_template = None
        self.model_info: dict[str, Any] = {}
        self.slots: list[Slot] = []
        self.n_slots = 0
        self.n_ctx = 0
        self.n_ctx_slot = 0
        self.kv_unified = False
        self.prompt_cache: PromptCache | None = None
        self._inbox: queue.Queue = queue.Queue()
        self._outbox: list[tuple[TaskHandle, Any]] = []  # events for asyncio handles, sent per step
        self._waiting: list[TaskHandle] = []
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._m = _Metrics()
        self._grammar_compiler = None
        self._eog: frozenset[int] = frozenset()
        self._control: set[int] = set()

    # ---- logging --------------------------------------------------------------------------
    def _log(self, level: str, msg: str) -> None:
        if self.cfg.log is not None:
            self.cfg.log(level, msg)
        elif self.cfg.verbosity >= 3 or level in "WE":
            print(f"{level} {msg}", file=sys.stderr, flush=True)

    # ---- loading --------------------------------------------------------------------------
    def load(self) -> None:
        from runtime.chat import ChatTemplate
        from runtime.loader import load_model
        from runtime.tokenizer import load_tokenizer

        cfg = self.cfg
        if cfg.device == "auto":
            cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
        if cfg.n_threads and cfg.n_threads > 0:
            torch.set_num_threads(cfg.n_threads)
        if cfg.device == "cpu":
            _single_threaded_openblas()
        path = cfg.model_path
        if path is None:
            from runtime.tiny_model import ensure_default_model
            path = str(ensure_default_model())
            cfg.model_path = path
        self._log("I", f"srv    load_model: loading model '{path}'")
        lm = load_model(path, progress=lambda msg: self._log("I", f"srv    {msg}"))
        for key, value in cfg.config_overrides.items():
            if not hasattr(lm.config, key):
                raise ValueError(f"unknown model config field {key!r}")
            self._log("I", f"srv    load_model: {key} = {value} (command line)")
            setattr(lm.config, key, value)
        device = cfg.device
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda requested but no CUDA device is available")
        self.model = Model(lm, device)
        self._log("I", f"cmn          init: n_threads = {torch.get_num_threads()}, device = {device}")
        if self.model.unpacked_quantized:
            self._log("I", "srv    load_model: quantized weights dequantized once to float32 for the CPU path")
        elif self.model.packed_quantized:
            self._log("I", "srv    load_model: quantized weights repacked into integer tiles for the CPU kernels")
        self.tokenizer = load_tokenizer(path)
        src = None
        if cfg.chat_template_file:
            with open(cfg.chat_template_file, encoding="utf-8") as f:
                src = f.read()
        elif cfg.chat_template:
            src = _builtin_template(cfg.chat_template) or cfg.chat_template
        if src is None:
            src = self.tokenizer.chat_template
        if src is None:
            from runtime.chat import default_chatml_template
            src = default_chatml_template()
        tk = self.tokenizer
        bos = tk.piece(tk.bos_id).decode("utf-8", "replace") if tk.bos_id is not None and tk.bos_id >= 0 else ""
        eos = tk.piece(tk.eos_id).decode("utf-8", "replace") if tk.eos_id is not None and tk.eos_id >= 0 else ""
        self.chat_template = ChatTemplate(src, bos, eos)
        self._eog = frozenset(tk.eot_ids)
        self._control = set(tk.control_ids())
        for w in getattr(tk, "warnings", []):
            self._log("W", f"load: {w}")

        c = lm.config
        n_ctx = cfg.n_ctx if cfg.n_ctx > 0 else c.n_ctx_train
        if cfg.n_parallel is None or cfg.n_parallel < 0:
            n_slots, unified = 4, True
        else:
            n_slots, unified = max(1, cfg.n_parallel), bool(cfg.kv_unified)
        self.n_ctx, self.n_slots, self.kv_unified = n_ctx, n_slots, unified
        self.n_ctx_slot = n_ctx if unified else n_ctx // n_slots
        kv_dtype = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[cfg.kv_dtype]
        bs = cfg.block_size
        n_blocks = (n_ctx + bs - 1) // bs + n_slots
        self.kv = KVCache(len(self.model.layers), self.model.n_head_kv, self.model.head_dim, n_blocks, bs,
                          kv_dtype, self.model.device)
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(n_slots)]
        self._graphs = None
        graphs = os.environ.get("TRITIUM_CUDA_GRAPHS", "1")  # "0": off; "eager": static buffers, no capture
        if graphs == "eager" or (graphs != "0" and self.model.device.type == "cuda"):
            self._graphs = DecodeGraphs(self.model, self.kv, n_slots, self.kv.blocks_needed(self.n_ctx_slot) + 1,
                                        capture=graphs != "eager")
        self._warm_up()
        if cfg.cache_ram_mib != 0:
            limit = None if cfg.cache_ram_mib < 0 else cfg.cache_ram_mib * 1024 * 1024
            self.prompt_cache = PromptCache(limit, limit_tokens=n_ctx)
        self.model_info = {
            "vocab_type": tk.vocab_type,
            "n_vocab": tk.n_vocab,
            "n_ctx_train": c.n_ctx_train,
            "n_embd": c.n_embd,
            "n_params": lm.n_params,
            "size": lm.size,
            "ftype": lm.file_type,
            "arch": c.arch,
            "n_layer": c.n_layer,
            "path": path,
        }
        self.loaded = True

    def _warm_up(self) -> None:
        """One small forward at load (as llama.cpp's warm-up run), so the first request does not
        pay for first-touch page faults, thread pool start-up and kernel builds."""
        if not self.cfg.warmup:
            return
        seq = SeqKV()
        try:
            for n in (8, 1):
                self.kv.reserve(seq, seq.n_tokens + n)
                self.model.forward(self.kv, [SeqBatch(seq, [0] * n, seq.n_tokens)])
            if self._graphs is not None:  # capture every bucket now rather than on a request's time
                t0 = time.perf_counter()
                try:
                    for B in self._graphs.buckets:
                        self.kv.reserve(seq, seq.n_tokens + 1)
                        n_past = seq.n_tokens
                        self._graphs.run([SeqBatch(seq, [0], n_past) for _ in range(B)])
                        seq.n_tokens = n_past + 1
                except Exception as e:  # an untested GPU/driver combination: stay eager
                    self._log("W", f"srv    load_model: CUDA graph capture failed ({e!r}), decoding eagerly")
                    self._graphs = None
                else:
                    self._log("I", f"srv    load_model: CUDA graphs captured for decode batches of "
                                   f"{', '.join(map(str, self._graphs.buckets))} in {time.perf_counter() - t0:.1f} s")
        finally:
            self.kv.clear(seq)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tritium-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- API-facing -----------------------------------------------------------------------
    def submit(self, task: CompletionTask | EmbeddingTask) -> TaskHandle:
        h = TaskHandle(self, task)
        self._inbox.put(("task", h))
        self._wake.set()
        return h

    def run_on_loop(self, fn: Callable[[], Any], timeout: float = 600) -> Any:
        """Run fn on the engine thread between steps and return its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", (fn, fut)))
        self._wake.set()
        return fut.result(timeout=timeout)

    def idle_slot_available(self) -> bool:
        return any(not s.busy for s in self.slots)

    def slots_info(self) -> list[dict]:
        """/slots as llama-server b1-0c1e570 prints it: a slot that never ran a task shows id,
        n_ctx, speculative and is_processing only; the others add their last task's id and counts,
        `task` (that task: the API prints its params) and next_token (reset while idle)."""
        out = []
        for s in self.slots:
            d: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": False, "is_processing": s.busy}
            if s.last_task is not None:
                n_remain = -1
                if s.busy and s.n_predict >= 0:
                    n_remain = max(s.n_predict - s.n_decoded, 0)
                d.update({
                    "id_task": s.id_task,
                    "n_prompt_tokens": len(s.tokens) + (1 if s.pending is not None and s.busy else 0),
                    "n_prompt_tokens_processed": max(len(s.prompt) - s.n_cached, 0) if s.busy else 0,
                    "n_prompt_tokens_cache": s.n_cached if s.busy else 0,
                    "task": s.last_task,
                    "next_token": [{
                        "has_next_token": s.busy,
                        "has_new_line": bool(s.busy and s.text and s.text.has_new_line),
                        "n_remain": n_remain,
                        "n_decoded": s.n_decoded if s.busy else 0,
                    }],
                })
            out.append(d)
        return out

    def metrics(self) -> dict[str, float]:
        """Counters (cumulative) and gauges (averaged over the window since the last call)."""
        def compute():
            m = self._m
            d = {
                "prompt_tokens_total": m.n_prompt_tokens_processed_total,
                "prompt_tokens_cached_total": m.n_prompt_tokens_cached_total,
                "prompt_seconds_total": m.t_prompt_processing_total,
                "tokens_predicted_total": m.n_tokens_predicted_total,
                "tokens_predicted_seconds_total": m.t_tokens_generation_total,
                "n_decode_total": m.n_decode_total,
                "n_tokens_max": m.n_tokens_max,
                "spec_decode_num_draft_tokens_total": 0,
                "spec_decode_num_accepted_tokens_total": 0,
                "spec_decode_num_drafts_total": 0,
                "prompt_tokens_seconds": m.n_prompt_tokens_processed / m.t_prompt_processing if m.t_prompt_processing else 0.0,
                "predicted_tokens_seconds": m.n_tokens_predicted / m.t_tokens_generation if m.t_tokens_generation else 0.0,
                "requests_processing": sum(1 for s in self.slots if s.busy),
                "requests_deferred": len(self._waiting),
                "n_busy_slots_per_decode": m.n_busy_slots / m.n_decode if m.n_decode else 0.0,
            }
            m.n_prompt_tokens_processed = 0
            m.t_prompt_processing = 0.0
            m.n_tokens_predicted = 0
            m.t_tokens_generation = 0.0
            m.n_decode = 0
            m.n_busy_slots = 0
            return d
        if self._thread is None or not self._thread.is_alive():
            return compute()
        return self.run_on_loop(compute, timeout=30)

    def slot_action(self, id_slot: int, action: str, filename: str | None = None) -> dict:
        if action not in ("save", "restore", "erase"):
            raise SlotError(400, "Invalid action", "invalid_request_error")
        if id_slot < 0 or id_slot >= len(self.slots):
            raise SlotError(400, "Invalid slot ID", "invalid_request_error")
        if action in ("save", "restore"):
            if not self.cfg.slot_save_path:
                raise SlotError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                                "not_supported_error")
            if not filename or not valid_slot_filename(filename):
                raise SlotError(400, "Invalid filename", "invalid_request_error")
        fn = {"save": self._slot_save, "restore": self._slot_restore, "erase": self._slot_erase}[action]
        return self.run_on_loop(lambda: fn(id_slot, filename))

    def _slot_save(self, id_slot: int, filename: str) -> dict:
        s = self.slots[id_slot]
        if s.busy:
            raise SlotError(400, "Slot is busy", "invalid_request_error")
        t0 = time.perf_counter()
        path = os.path.join(self.cfg.slot_save_path, filename)
        state = self.kv.export(s.seq, len(s.tokens))
        n_written = write_slot_file(path, s.tokens, state, id_slot, self._kv_streams())
        return {"id_slot": id_slot, "filename": filename, "n_saved": len(s.tokens), "n_written": n_written,
                "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}

    def _kv_streams(self) -> int:
        """llama.cpp's KV streams: one per slot unless the cache is unified."""
        return 1 if self.kv_unified else self.n_slots

    def _slot_restore(self, id_slot: int, filename: str) -> dict:
        s = self.slots[id_slot]
        if s.busy:
            raise SlotError(400, "Slot is busy", "invalid_request_error")
        t0 = time.perf_counter()
        path = os.path.join(self.cfg.slot_save_path, filename)
        if not os.path.isfile(path):
            raise SlotError(400, "failed to restore slot", "invalid_request_error")
        try:
            tokens, state, n_read = read_slot_file(path, self.kv, self._kv_streams())
        except SlotFileError as e:
            raise SlotError(400, f"Unable to restore slot, no available space in KV cache or invalid slot save file: {e}",
                            "invalid_request_error")
        if len(tokens) > s.n_ctx:
            raise SlotError(400, "Unable to restore slot, no available space in KV cache or invalid slot save file",
                            "invalid_request_error")
        try:
            self.kv.import_(s.seq, state)
        except OutOfBlocks:
            s.tokens = []
            raise SlotError(400, "Unable to restore slot, no available space in KV cache or invalid slot save file",
                            "invalid_request_error")
        s.tokens = list(tokens)
        return {"id_slot": id_slot, "filename": filename, "n_restored": len(tokens), "n_read": n_read,
                "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}

    def _slot_erase(self, id_slot: int, filename=None) -> dict:
        s = self.slots[id_slot]
        if s.busy:
            raise SlotError(400, "Slot is busy", "invalid_request_error")
        n = len(s.tokens)
        self.kv.clear(s.seq)
        s.tokens = []
        return {"id_slot": id_slot, "n_erased": n}

    # ---- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            try:
                self._drain_inbox()
                self._assign()
                self._flush()
                if not any(s.busy for s in self.slots):
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                self._step()
            except Exception as e:  # never let one bad step kill the server
                import traceback
                traceback.print_exc()
                for s in self.slots:
                    if s.busy:
                        self._fail(s, 500, f"internal error: {e}", "server_error")
            finally:
                self._flush()

    def _flush(self) -> None:
        """Hand this step's events to their event loops: one thread-safe call per loop."""
        if not self._outbox:
            return
        by_loop: dict[Any, list] = {}
        for h, ev in self._outbox:
            by_loop.setdefault(h._loop, []).append((h, ev))
        self._outbox = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # loop closed: its clients are gone
                for h, _ in items:
                    h.cancelled = True

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "task":
                self._waiting.append(item)
            elif kind == "call":
                fn, fut = item
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed back to the caller
                    fut.set_exception(e)

    def _assign(self) -> None:
        still = []
        for h in self._waiting:
            if h.cancelled:
                continue
            slot = self._pick_slot(h)
            if slot is None:
                still.append(h)
                continue
            self._launch(slot, h)
        self._waiting = still

    def _pick_slot(self, h: TaskHandle) -> Slot | None:
        task = h.task
        id_slot = getattr(task, "id_slot", -1)
        if id_slot is not None and id_slot >= 0:
            s = self.slots[id_slot % len(self.slots)]
            return None if s.busy else s
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        prompt = task.prompt_tokens
        best, sim_best = None, 0.0
        if self.cfg.slot_prompt_similarity != 0.0 and prompt:
            for s in idle:
                if not s.tokens:
                    continue
                sim = common_prefix(s.tokens, prompt) / len(prompt)
                if sim > sim_best and sim > self.cfg.slot_prompt_similarity:
                    best, sim_best = s, sim
        if best is not None:
            best.picked_by_lru = False
            return best
        s = min(idle, key=lambda s: s.t_last_used)
        s.picked_by_lru = True
        return s

    def _launch(self, s: Slot, h: TaskHandle) -> None:
        task = h.task
        s.handle, s.id_task, s.last_task = h, h.id, h.task
        s.prompt = list(task.prompt_tokens)
        s.n_decoded, s.generated, s.probs, s.pending = 0, [], [], None
        s.truncated, s.stop_type = False, "none"
        s.text, s.sampler, s.n_past, s.n_cached = None, None, 0, 0  # nothing of the previous task
        s.lazy_grammar, s.lazy_triggers = None, []
        s.t_start = time.perf_counter()
        s.t_prompt_done = 0.0
        lru, s.picked_by_lru = s.picked_by_lru, False
        if isinstance(task, EmbeddingTask):
            self.kv.clear(s.seq)
            s.tokens = []
            s.state = "prompt"
            return

        prompt = s.prompt
        if not prompt:
            s.state = "generating"
            self._finish(s)
            return
        if len(prompt) >= s.n_ctx:
            self._fail(s, 400, f"request ({len(prompt)} tokens) exceeds the available context size ({s.n_ctx} tokens), try increasing it",
                       "exceed_context_size_error", {"n_prompt_tokens": len(prompt), "n_ctx": s.n_ctx})
            return

        # RAM prompt cache: save a state about to be mostly lost, load a better match
        if self.prompt_cache is not None:
            lcp = common_prefix(s.tokens, prompt)
            f_keep = lcp / len(s.tokens) if s.tokens else 0.0
            if lru or f_keep < 0.5:
                if s.tokens:
                    self.prompt_cache.save(s.tokens, lambda: self.kv.export(s.seq, len(s.tokens)))
                entry = self.prompt_cache.take_best(s.tokens, prompt)
                if entry is not None:
                    self.kv.clear(s.seq)  # its content is in the RAM cache now
                    s.tokens = []
                    try:
                        self._reserve(s, len(entry.tokens))  # purges idle slots if the pool is full
                        self.kv.import_(s.seq, entry.state)
                        s.tokens = list(entry.tokens)
                    except OutOfBlocks:  # no room even then: the prompt is recomputed
                        self.kv.clear(s.seq)
                self.prompt_cache.update()

        n_past = 0
        if task.cache_prompt:
            n_past = common_prefix(s.tokens, prompt)
            n_reuse = self.cfg.cache_reuse if task.n_cache_reuse is None else task.n_cache_reuse
            if n_reuse and n_reuse > 0:
                moves, n_past = cache_reuse_plan(s.tokens, prompt, n_past, n_reuse)
                for src, dst, n in moves:
                    self.kv.move(s.seq, src, dst, n, self.model.inv_freq, self.model.neox)
                    s.tokens[dst:dst + n] = s.tokens[src:src + n]
        if n_past >= len(prompt):
            n_past = len(prompt) - 1  # the last prompt token is always evaluated (its logits are needed)
        self.kv.truncate(s.seq, n_past)
        s.tokens = s.tokens[:n_past]
        s.n_past = n_past
        s.n_cached = n_past
        s.state = "prompt"
        p = task.params
        s.sampler = SamplerState(p, self._eog)
        if p.dry_multiplier > 0:
            s.sampler.dry_breakers = frozenset(self._dry_breaker_ids(p.dry_sequence_breakers))
        s.sampler.history.extend(prompt)
        if p.grammar:
            try:
                matcher = self._compile_grammar(p.grammar)
            except Exception as e:  # noqa: BLE001
                self._fail(s, 400, f"Failed to parse grammar: {e}", "invalid_request_error")
                return
            if p.grammar_lazy and p.grammar_triggers:
                # unconstrained until a trigger word appears in the output (tool_choice auto)
                s.lazy_grammar, s.lazy_triggers = matcher, list(p.grammar_triggers)
            else:
                s.sampler.grammar = matcher
                if task.grammar_prefix:
                    self._advance_grammar_over(matcher, task.grammar_prefix)
        n_predict = task.n_predict
        if self.cfg.n_predict > 0 and (n_predict < 0 or n_predict > self.cfg.n_predict):
            n_predict = self.cfg.n_predict
        s.n_predict = n_predict
        s.text = TextState(task.stop, self.tokenizer)

    def _advance_grammar_over(self, matcher, text: str) -> None:
        """Feed text already in the prompt (a prefilled assistant turn) through the grammar."""
        for t in self.tokenizer.encode(text, add_special=False, parse_special=True):
            try:
                matcher.advance(t)
            except Exception:  # noqa: BLE001 - text outside the grammar: leave it unconstrained there
                return

    def _dry_breaker_ids(self, breakers: list[str]) -> set[int]:
        ids: set[int] = set()
        for b in breakers:
            toks = self.tokenizer.encode(b, add_special=False, parse_special=False)
            if len(toks) == 1:
                ids.add(toks[0])
        return ids

    def _compile_grammar(self, gbnf: str):
        if self._grammar_compiler is None:
            from grammar import GrammarCompiler, Vocab
            vocab = Vocab(self.tokenizer.token_pieces(), set(self._eog))
            self._grammar_compiler = GrammarCompiler(vocab)
        return self._grammar_compiler.matcher(gbnf)

    def _step(self) -> None:
        cfg = self.cfg
        batch: list[SeqBatch] = []
        owners: list[Slot] = []
        # cancellations first
        for s in self.slots:
            if s.busy and s.handle.cancelled:
                self._release(s)
        decoding = [s for s in self.slots if s.busy and s.state == "generating" and s.pending is not None]
        prefilling = [s for s in self.slots if s.busy and s.state == "prompt"]
        budget = cfg.n_batch
        for s in decoding:
            k, banned = topk_needed(s.sampler)
            batch.append(SeqBatch(s.seq, [s.pending], len(s.tokens), logits=True, topk=k, banned=banned))
            owners.append(s)
            budget -= 1
        chunk_cap = cfg.n_prefill_chunk if decoding else cfg.n_batch
        for s in prefilling:
            if budget <= 0:
                break
            remaining = len(s.prompt) - s.n_past
            n = min(remaining, budget, chunk_cap)
            toks = s.prompt[s.n_past:s.n_past + n]
            last = s.n_past + n == len(s.prompt)
            emb = isinstance(s.handle.task, EmbeddingTask)
            k, banned = topk_needed(s.sampler) if last and not emb else (0, ())
            batch.append(SeqBatch(s.seq, toks, s.n_past, logits=last and not emb, hidden=emb, topk=k, banned=banned))
            owners.append(s)
            budget -= n
        if not batch:
            return
        ok_batch, ok_owners = [], []
        for b, s in zip(batch, owners):
            try:
                self._reserve(s, b.n_past + len(b.tokens))
                ok_batch.append(b)
                ok_owners.append(s)
            except OutOfBlocks:
                if s.state == "generating":
                    s.truncated = True
                    s.stop_type = "limit"
                    self._finish(s)
                else:
                    self._fail(s, 500, "failed to find free space in the KV cache", "server_error")
        if not ok_batch:
            return
        if self._graphs is not None and self._graphs.supports(ok_batch):
            logits, hidden = self._graphs.run(ok_batch), [None] * len(ok_batch)
        else:
            logits, hidden = self.model.forward(self.kv, ok_batch)
        m = self._m
        m.n_decode_total += 1
        m.n_decode += 1
        m.n_busy_slots_total += len(ok_owners)
        m.n_busy_slots += len(ok_owners)

        # bookkeeping of what was fed
        need_sample: list[Slot] = []
        for b, s, hid in zip(ok_batch, ok_owners, hidden):
            s.tokens.extend(b.tokens)
            if s.state == "generating":
                s.pending = None
            else:
                s.n_past += len(b.tokens)
                if s.n_past == len(s.prompt):
                    if isinstance(s.handle.task, EmbeddingTask):
                        self._finish_embedding(s, hid)
                        continue
                    s.t_prompt_done = time.perf_counter()
                    n_proc = len(s.prompt) - s.n_cached
                    t_prompt = s.t_prompt_done - s.t_start
                    m.n_prompt_tokens_processed_total += n_proc
                    m.n_prompt_tokens_processed += n_proc
                    m.n_prompt_tokens_cached_total += s.n_cached
                    m.t_prompt_processing_total += t_prompt
                    m.t_prompt_processing += t_prompt
                    s.state = "generating"
                    if s.n_predict == 0:
                        s.stop_type = "limit"
                        self._finish(s)
                        continue
            if b.logits:
                need_sample.append(s)
        if logits is None or not need_sample:
            return
        logit_owners = [s for b, s in zip(ok_batch, ok_owners) if b.logits]  # one per logits row
        wanted = {id(s) for s in need_sample}
        keep = [i for i, s in enumerate(logit_owners) if id(s) in wanted]
        sel = logits if len(keep) == logits.shape[0] else logits[torch.tensor(keep, device=logits.device)]
        results = sample_batch(sel, [logit_owners[i].sampler for i in keep])
        for i, r in zip(keep, results):
            self._on_token(logit_owners[i], r)

    def _reserve(self, s: Slot, n_total: int) -> None:
        """Blocks for n_total tokens of slot s; when the (unified) pool is full, idle slots' cached
        prompts are purged, least recently used first, as llama.cpp's try_clear_idle_slots."""
        while True:
            try:
                self.kv.reserve(s.seq, n_total)
                return
            except OutOfBlocks:
                idle = [x for x in self.slots if not x.busy and x.tokens and x is not s]
                if not idle:
                    raise
                victim = min(idle, key=lambda x: x.t_last_used)
                self._log("W", f"srv  update_slots: purging slot {victim.id} with {len(victim.tokens)} tokens")
                self.kv.clear(victim.seq)
                victim.tokens = []

    def _on_token(self, s: Slot, r) -> None:
        tok = r.token
        s.sampler.accept(tok)
        s.n_decoded += 1
        s.generated.append(tok)
        piece = b"" if tok in self._control else self.tokenizer.piece(tok)
        is_eog = tok in self._eog
        stop_word, delta = s.text.push(piece, is_eog)
        if s.lazy_grammar is not None:
            self._maybe_trigger_grammar(s)
        out = TokenOut(tok, delta)
        if s.handle.task.params.n_probs > 0:
            out.probs = [self._token_prob(t, lp) for t, lp in r.top]
            out.logprob = r.logprob
            s.probs.append(out)
        stop = False
        if stop_word is not None:
            s.stop_type = "word"
            stop = True
        if len(s.tokens) + 1 >= s.n_ctx:
            s.truncated = True
            s.stop_type = "limit"
            stop = True
        if not stop and s.n_predict >= 0 and s.n_decoded >= s.n_predict:
            s.stop_type = "limit"
            stop = True
        if not stop and s.text.indent_stop(s.handle.task.n_indent):
            s.stop_type = "limit"
            stop = True
        t_max = s.handle.task.t_max_predict_ms
        if not stop and t_max > 0 and s.text.has_new_line and \
                (time.perf_counter() - s.t_prompt_done) * 1e3 > t_max:
            s.stop_type = "limit"  # llama.cpp's time limit: applies once a new line was generated
            stop = True
        if is_eog:
            s.stop_type = "eos"
            stop = True
        if s.handle.task.stream and (out.text or out.probs or not stop):
            s.handle._emit(out)
        if stop:
            self._finish(s)
        else:
            s.pending = tok

    def _maybe_trigger_grammar(self, s: Slot) -> None:
        """Activate a lazy grammar at the first trigger word, feeding it the text from there."""
        text = s.text.text
        hits = [(i, w) for w in s.lazy_triggers if (i := text.find(w)) >= 0]
        if not hits:
            return
        start = min(hits)[0]
        matcher, s.lazy_grammar = s.lazy_grammar, None
        try:
            matcher.advance_bytes(text[start:].encode("utf-8"))
        except Exception:  # noqa: BLE001 - the output already left the grammar: stay unconstrained
            return
        s.sampler.grammar = matcher

    def _token_prob(self, tok: int, logprob: float) -> TokenProb:
        b = self.tokenizer.piece(tok)
        return TokenProb(tok, b.decode("utf-8", "replace"), list(b), logprob)

    def _timings(self, s: Slot) -> Timings:
        now = time.perf_counter()
        done = s.t_prompt_done or now
        return Timings(cache_n=s.n_cached, prompt_n=len(s.prompt) - s.n_cached,
                       prompt_ms=(done - s.t_start) * 1e3, predicted_n=s.n_decoded,
                       predicted_ms=(now - done) * 1e3 if s.t_prompt_done else 0.0)

    def _finish(self, s: Slot) -> None:
        tim = self._timings(s)
        m = self._m
        m.n_tokens_predicted_total += s.n_decoded
        m.n_tokens_predicted += s.n_decoded
        m.t_tokens_generation_total += tim.predicted_ms / 1e3
        m.t_tokens_generation += tim.predicted_ms / 1e3
        m.n_tokens_max = max(m.n_tokens_max, len(s.prompt) + s.n_decoded)
        text = s.text.final() if s.text is not None else ""
        res = CompletionResult(
            content=text, tokens=list(s.generated), id_slot=s.id, stop_type=s.stop_type,
            stopping_word=s.text.stopping_word if s.text is not None else "",
            truncated=s.truncated, n_prompt_tokens=len(s.prompt), n_decoded=s.n_decoded,
            tokens_cached=len(s.tokens), has_new_line=bool(s.text and s.text.has_new_line),
            timings=tim, probs=list(s.probs))
        h = s.handle
        self._release(s)
        h._emit(res)

    def _finish_embedding(self, s: Slot, hid: torch.Tensor) -> None:
        task: EmbeddingTask = s.handle.task
        h = s.handle
        vecs = pool_embeddings(hid, task.pooling, task.normalize)
        self.kv.clear(s.seq)
        s.tokens = []
        self._release(s)
        h._emit(vecs)

    def _fail(self, s: Slot, code: int, message: str, type: str, extra: dict | None = None) -> None:
        h = s.handle
        self._release(s)
        if h is not None:
            h._emit(TaskError(code, message, type, extra or {}))

    def _release(self, s: Slot) -> None:
        s.handle = None
        s.state = "idle"
        s.pending = None
        s.t_last_used = time.perf_counter()
        s.sampler = None


def _deliver(items: list) -> None:
    """On the event loop: put each event in its handle's queue."""
    for h, ev in items:
        h._q.put_nowait(ev)


def _single_threaded_openblas() -> None:
    """The CPU path runs small matmuls through numpy's OpenBLAS between torch ops (OpenMP pool) and
    the batched-GEMV kernel (OpenMP too). A second pool of BLAS threads spinning on the same cores
    makes every step slower (measured: 4 sequences 19.8 ms -> 12.4 ms per step with one BLAS thread),
    so OpenBLAS runs single-threaded; torch and the GEMV kernel keep all threads."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # optional: without it, OpenBLAS keeps its default thread count
        return
    ThreadpoolController().select(internal_api="openblas").limit(limits=1)


def pool_embeddings(hid: torch.Tensor, pooling: str, normalize: int) -> list[list[float]]:
    """hid: [n_tokens, C] -> list of vectors (one per token for pooling 'none')."""
    if pooling == "none":
        vecs = hid
    elif pooling == "cls":
        vecs = hid[:1]
    elif pooling == "last":
        vecs = hid[-1:]
    else:
        vecs = hid.mean(0, keepdim=True)
    vecs = vecs.double()
    if normalize == 0:
        vecs = vecs / vecs.abs().amax(1, keepdim=True).clamp_min(1e-30) * 32760.0
    elif normalize == 1:
        vecs = vecs / vecs.abs().sum(1, keepdim=True).clamp_min(1e-30)
    elif normalize == 2:
        vecs = vecs / vecs.norm(dim=1, keepdim=True).clamp_min(1e-30)
    elif normalize > 2:
        vecs = vecs / vecs.abs().pow(normalize).sum(1, keepdim=True).pow(1.0 / normalize).clamp_min(1e-30)
    return vecs.tolist()


# code points llama.cpp's fs_validate_filename refuses besides controls: the illegal path
# characters, their Unicode look-alikes (fullwidth full stop, division slash, set minus), the
# replacement character and the byte order mark
_BAD_FILENAME_CHARS = frozenset('/\\:*?"<>|\uff0e\u2215\u2216\ufffd\ufeff')


def valid_slot_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename (common/common.cpp, no subdirectories), which llama-server
    applies to a slot file name: 1 to 255 UTF-8 bytes, no control character (C0, DEL, C1), none of
    `/ \\ : * ? " < > |` or their look-alikes, no surrogate, no leading or trailing space (0x20
    only), no trailing '.', no "..", not "."."""
    try:
        n_bytes = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate (JSON "\\ud800"): not UTF-8
        return False
    if not name or n_bytes > 255:
        return False
    if any(c <= "\x1f" or "\x7f" <= c <= "\x9f" or c in _BAD_FILENAME_CHARS for c in name):
        return False
    if name[0] == " " or name[-1] in " .":
        return False
    return ".." not in name and name != "."


def _builtin_template(name: str) -> str | None:
    if name in ("chatml",):
        from runtime.chat import default_chatml_template
        return default_chatml_template()
    return None
