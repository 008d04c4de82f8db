"""The router's models: one worker process per loaded model, their states, `--models-max` with
least-recently-used unloading and a FIFO queue of requests waiting for a free place, as
llama-server b1-0c1e570's `server_models` / `server_lru_sched` / `server_monitor`
(tools/server/server-models.cpp).

A worker is `python -m api.cli` with the model's options on 127.0.0.1 and a free port
(runtime/launch/router_worker.py: its process, its `loading`/`ready` state lines, the exit command;
runtime/launch/router_child.py: the worker's side). A worker that dies leaves its model `unloaded`
with its exit code (`failed` in `GET /models`); the router goes on and the next request for that
model starts it again.

Everything here runs on the router's event loop: `ModelRouter` is the one owner of the model
table, the queue and the SSE subscribers; a waiter is woken by `_changed`, re-armed per change.
A request cancelled while it waits (its client left) leaves the queue and hands its place on.
"""
from __future__ import annotations

import asyncio
import sys
import time
from typing import Callable

from runtime.launch import router_worker
from runtime.launch.model_sources import (HF_FILE, HF_REPO, LOAD_ON_STARTUP, MMPROJ, MMPROJ_AUTO, MODEL, PRESET_ONLY,
                                          STOP_TIMEOUT, ModelPreset, ModelSource, cached_mmproj, mmproj_inputs,
                                          remove_cached, resolve_cached)
from runtime.launch.router_state import (CHILD_ADDR, DEFAULT_STOP_TIMEOUT, ModelEntry,
                                         ModelStatus, RouterError, RouterSettings, WaitQueue, Worker, free_port)

__all__ = ["ModelStatus", "ModelEntry", "ModelRouter", "RouterSettings", "RouterError"]

SSE_BACKLOG = 4096  # events kept for one slow /models/sse client before it is dropped


def _csv(v: str | None) -> list[str]:
    return sorted({x.strip() for x in (v or "").split(",") if x.strip()})


class ModelRouter:
    """The model table. `presets()` lists what the sources hold (with the cache entries hidden by
    a dedup preset); `render(options)` turns a preset into a worker's arguments; `log(level, msg)`
    writes the router's lines, `forward(line)` a worker's."""

    def __init__(self, settings: RouterSettings,
                 presets: Callable[[], tuple[dict[str, ModelPreset], set[str]]],
                 render: Callable[[dict[str, str]], list[str]],
                 log: Callable[[str, str], None], forward: Callable[[str], None]):
        self.settings = settings
        self._presets, self._render, self.log, self.forward = presets, render, log, forward
        self.models: dict[str, ModelEntry] = {}
        self.stopping: set[str] = set()
        self.queue = WaitQueue(lambda m: self.log("I", m))
        self.startup: list[str] | None = None
        self.reloading = False
        self.subscribers: set[asyncio.Queue] = set()
        self._downloads: set[asyncio.Task] = set()
        self._changed = asyncio.Event()

    # ---- the table -----------------------------------------------------------------------------

    def load_models(self) -> None:
        """First listing (synchronous, before the server answers)."""
        final, hidden = self._presets()
        for name, p in final.items():
            self._add(p)
        self._apply(final, hidden)
        self._log_available()
        wanted = [n for n, e in self.models.items() if _on(e.options.get(LOAD_ON_STARTUP))]
        mm = self.settings.models_max
        if mm > 0 and len(wanted) > mm:
            raise RouterError(f"number of models to load on startup ({len(wanted)}) exceeds models_max ({mm})")
        self.startup = wanted

    async def reload(self) -> None:
        """`GET /models?reload=1`: re-read the sources; running models whose preset changed or
        went away are unloaded first."""
        final, hidden = self._presets()
        self.reloading = True
        try:
            strip = lambda o: {k: v for k, v in o.items() if k not in ("host", "port", "alias")}  # noqa: E731
            gone = [n for n, e in self.models.items() if e.running and (
                n not in final or strip(e.options) != strip(final[n].options))]
            for n in gone:
                self.log("I", f"(reload) unloading model name={n} (source updated or removed)")
                self.unload(n)
            await self._wait_until(lambda: all(not self.models[n].running for n in gone if n in self.models))
            for n in [n for n in self.models if n not in final and self.models[n].status is not ModelStatus.DOWNLOADING]:
                self.log("I", f"(reload) removing model name={n} (no longer in source)")
                del self.models[n]
            for n, e in self.models.items():
                if e.running or n not in final:
                    continue
                e.options = dict(final[n].options)
                e.source = final[n].source
                e.aliases = [a for a in _csv(e.options.get("alias")) if not any(
                    a == o or a in m.aliases for o, m in self.models.items() if o != n)]
                e.tags = _csv(e.options.get("tags"))
                e.exit_code = 0
                e.args = self._args(e)
            for n, p in final.items():
                if n not in self.models:
                    self._add(p)
            self._apply(final, hidden)
        finally:
            self.reloading = False
            self._notify()
        self._log_available()
        self._sse("models_reload", "*")

    def _add(self, p: ModelPreset) -> None:
        for key, other in self.models.items():
            if p.name in other.aliases:
                raise RouterError(f"model name '{p.name}' conflicts with alias of model '{key}'")
        e = ModelEntry(p.name, p.source, dict(p.options), _csv(p.options.get("alias")), _csv(p.options.get("tags")))
        for a in e.aliases:
            if a in self.models:
                raise RouterError(f"alias '{a}' for model '{p.name}' conflicts with existing model name")
            for key, other in self.models.items():
                if a in other.aliases:
                    raise RouterError(f"alias '{a}' for model '{p.name}' conflicts with alias of model '{key}'")
        e.args = self._args(e)
        self.models[p.name] = e

    def _apply(self, final: dict[str, ModelPreset], hidden: set[str]) -> None:
        for n, e in self.models.items():
            e.hidden = n in hidden
            v = e.options.get(STOP_TIMEOUT)
            if v is not None:
                try:
                    e.stop_timeout = int(v)
                except ValueError:
                    self.log("W", f"invalid stop-timeout value '{v}' for model '{n}', using default "
                                  f"{DEFAULT_STOP_TIMEOUT} seconds")
                    e.stop_timeout = DEFAULT_STOP_TIMEOUT

    def _log_available(self) -> None:
        self.log("I", f"Available models ({len(self.models)}):")
        if not self.models:
            self.log("I", "  no models found on the system (visit https://llama.app/models for suggestions)")
        for n, e in self.models.items():
            info = (f" (aliases: {', '.join(e.aliases)})" if e.aliases else "") + \
                   (f" [tags: {', '.join(e.tags)}]" if e.tags else "")
            self.log("I", f"  [{e.source.value:>10}] {n}{info}")

    def _args(self, e: ModelEntry) -> list[str]:
        """The worker's command line (and, as b1's update_caps, what its projector takes in)."""
        opts = {k: v for k, v in e.options.items() if k not in PRESET_ONLY}
        if opts.get(HF_REPO) and not opts.get(MODEL):  # a cached model: its files, read offline
            path = resolve_cached(opts[HF_REPO], opts.get(HF_FILE, ""))
            if path is not None:
                auto = opts.get(MMPROJ_AUTO, "true") == "true" and not opts.get(MMPROJ) and not opts.get("mmproj-url")
                mmproj = cached_mmproj(opts[HF_REPO], opts.get(HF_FILE, "")) if auto else None
                opts.pop(HF_REPO)
                opts.pop(HF_FILE, None)
                opts[MODEL] = str(path)
                if mmproj is not None:
                    opts[MMPROJ] = str(mmproj)
        e.inputs = mmproj_inputs(opts[MMPROJ]) if opts.get(MMPROJ) else ["text"]
        opts.update(host=CHILD_ADDR, port=str(e.port), alias=e.name)
        return [sys.executable, "-m", "api.cli", *self._render(opts)]

    def get(self, name: str) -> ModelEntry | None:
        """A model by name or alias."""
        if name in self.models:
            return self.models[name]
        return next((e for e in self.models.values() if name in e.aliases), None)

    # ---- state changes -------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, timeout: float | None = None) -> None:
        ev = self._changed
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            pass

    async def _wait_until(self, pred: Callable[[], bool]) -> None:
        while not pred():
            await self._wait_change(0.2)

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(SSE_BACKLOG)
        self.subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self.subscribers.discard(q)

    def _sse(self, event: str, model: str, data: dict | None = None) -> None:
        msg = {"model": model, "event": event}
        if data is not None:
            msg["data"] = data
        for q in list(self.subscribers):
            try:
                q.put_nowait(msg)
            except asyncio.QueueFull:  # a client that reads nothing is dropped, not buffered forever
                self.subscribers.discard(q)
                q.get_nowait()
                q.put_nowait(None)  # its stream ends

    def _update_status(self, name: str, status: ModelStatus, exit_code: int = 0, info: dict | None = None,
                       progress: dict | None = None) -> None:
        e = self.models.get(name)
        if e is not None:
            e.status, e.exit_code = status, exit_code
            if status is ModelStatus.UNLOADED:
                self.stopping.discard(name)
                e.worker = None
            if info is not None:
                e.loaded_info = info
            if progress is not None:
                e.progress = progress
            self._tick()
        data: dict = {"status": status.value}
        if status is ModelStatus.UNLOADED:
            data["exit_code"] = exit_code
        if info is not None:
            data["info"] = info
        if progress is not None:
            data["progress"] = progress
        self._sse("status_change", name, data)
        self._notify()

    # ---- the queue (server_lru_sched) ----------------------------------------------------------

    def _n_running(self) -> int:
        return sum(1 for e in self.models.values() if e.running)

    def has_capacity(self) -> bool:
        return self.settings.models_max <= 0 or self._n_running() < self.settings.models_max

    def pick_victim(self) -> str:
        victim, oldest = "", 0.0
        for n, e in self.models.items():
            if e.req_count or not e.ready_or_sleeping or n in self.stopping or self.queue.find(n):
                continue
            if not victim or e.last_used < oldest:
                victim, oldest = n, e.last_used
        return victim

    def _tick(self) -> None:
        """Evict idle models while queued requests outnumber the places free or being freed."""
        mm = self.settings.models_max
        if mm <= 0 or not self.queue:
            return
        running = [n for n, e in self.models.items() if e.running]
        n_stopping = sum(1 for n in running if n in self.stopping)
        needed = sum(1 for w in self.queue if not w.loading)
        claimed = sum(1 for w in self.queue if w.loading and w.model in self.models and not self.models[w.model].running)
        n_free = mm - len(running) + n_stopping - claimed
        while n_free < needed:
            victim = self.pick_victim()
            if not victim:
                return
            self.log("I", f"evicting idle LRU name={victim} for a queued request")
            self._request_stop(victim)
            n_free += 1

    # ---- workers -------------------------------------------------------------------------------

    async def _unload_lru(self) -> None:
        if self.settings.models_max <= 0 or self.has_capacity():
            return
        victim = self.pick_victim()
        if victim:
            self.log("I", f"models_max limit reached, removing LRU name={victim}")
            self.unload(victim)
            await self._wait_until(lambda: self.models[victim].status is ModelStatus.UNLOADED
                                   if victim in self.models else True)

    async def load(self, name: str) -> None:
        """Starts `name`'s worker (returns once it is spawned, not loaded)."""
        if self.settings.fake_timing:
            await asyncio.sleep(2)
        if self.get(name) is None:
            raise RouterError(f"model name={name} is not found")
        await self._unload_lru()
        await self._wait_until(lambda: not self.reloading)
        e = self.models.get(name)
        if e is None:
            raise RouterError(f"model name={name} is not found")
        if e.status is not ModelStatus.UNLOADED:
            self.log("I", f"model {name} is not ready")
            return
        if self.settings.models_max > 0 and self._n_running() >= self.settings.models_max:
            raise RouterError("model limit reached, try again later")
        e.port = free_port()
        e.status, e.loaded_info, e.last_used, e.exit_code = ModelStatus.LOADING, {}, time.monotonic(), 0
        e.args = self._args(e)
        self.log("I", f"spawning server instance with name={name} on port {e.port}")
        self.log("I", "spawning server instance with args:")
        for a in e.args:
            self.log("I", f"  {a}")
        try:
            w = await router_worker.spawn(e.args, e.port, self.settings.port)
        except OSError as ex:
            e.status = ModelStatus.UNLOADED
            self._notify()
            raise RouterError(f"failed to spawn server instance: {ex}") from None
        e.worker = w
        self._sse("model_status", name, {"status": ModelStatus.LOADING.value})
        w.reader = asyncio.ensure_future(self._watch(name, w))
        self._notify()

    async def _watch(self, name: str, w: Worker) -> None:
        """Reads a worker's output until it closes, then reaps it."""
        code = await router_worker.read_lines(w, lambda line: self._on_line(name, w, line))
        e = self.models.get(name)
        if e is None or e.worker is not w:
            self.stopping.discard(name)
        else:
            self._update_status(name, ModelStatus.UNLOADED, code)
        self.log("I", f"instance name={name} exited with status {code}")

    def _on_line(self, name: str, w: Worker, line: str) -> None:
        try:
            got = router_worker.state_line(line)
        except ValueError as ex:
            self.log("E", f"failed to parse child state update for name={name}: {ex}")
            return
        if got is None:
            if line:
                self.forward(f"[{w.port:5d}] {line}")
            return
        e = self.models.get(name)
        if e is None or e.worker is not w:
            return
        state, payload = got
        if state == "loading":
            self._update_status(name, ModelStatus.LOADING, progress=payload)
        elif state == "ready":
            self._update_status(name, ModelStatus.LOADED, info=payload or None)
        elif state == "sleeping":
            self._update_status(name, ModelStatus.SLEEPING)

    def _request_stop(self, name: str, send_exit: bool = True) -> None:
        e = self.models.get(name)
        if e is None or name in self.stopping or e.worker is None:
            return
        self.stopping.add(name)
        w = e.worker
        if send_exit:
            router_worker.send_exit(w)

        def force() -> None:
            if w.proc.returncode is None:
                self.log("W", f"force-killing model instance name={name} after timeout")
                w.proc.kill()
        w.kill = asyncio.get_running_loop().call_later(max(0, e.stop_timeout), force)

    def unload(self, name: str) -> None:
        e = self.models.get(name)
        if e is None:
            return
        if e.running:
            self.log("I", f"stopping model instance name={name}")
            loading = e.status is ModelStatus.LOADING
            if loading and e.worker is not None:
                self.log("W", f"model name={name} is still loading, force-killing")
                if e.worker.proc.returncode is None:
                    e.worker.proc.kill()
            self._request_stop(name, not loading)
        else:
            self.log("W", f"model instance name={name} is not running")

    async def unload_all(self) -> None:
        for n in list(self.models):
            if self.models[n].running:
                self.unload(n)
        await self._wait_until(lambda: not any(e.running for e in self.models.values()))

    async def load_startup(self) -> None:
        wanted, self.startup = self.startup or [], None
        for n in wanted:
            self.log("I", f"(startup) loading model {n}")
            await self.load(n)

    async def download(self, name: str, fetch: Callable[[], object]) -> None:
        """`POST /models`: `fetch()` (a blocking download into the cache) runs in a thread while
        `name` is listed `downloading`; then the cache is listed again (`download_finished`), or
        the entry goes (`download_failed`)."""
        if self.get(name) is not None:
            raise RouterError(f"model '{name}' already exists", invalid=True)
        self.log("I", f"starting download for model '{name}'")
        e = ModelEntry(name, ModelSource.CACHE, {HF_REPO: name}, status=ModelStatus.DOWNLOADING)
        e.args = self._args(e)
        self.models[name] = e
        self._sse("model_status", name, {"status": ModelStatus.DOWNLOADING.value})

        async def run() -> None:
            try:
                await asyncio.to_thread(fetch)
                ok = True
            except Exception as ex:  # noqa: BLE001 - reported as b1 reports a failed download
                self.log("E", f"download failed for model name={name}: {ex}")
                ok = False
            if self.models.get(name) is e:
                del self.models[name]
            self._sse("download_finished" if ok else "download_failed", name, {})
            if ok:
                await self.reload()
        self._downloads.add(t := asyncio.ensure_future(run()))
        t.add_done_callback(self._downloads.discard)

    async def remove(self, name: str) -> None:
        """`DELETE /models?model=`: a cached model's worker stopped, its files deleted (b1's remove)."""
        e = self.models.get(name)
        if e is None:
            raise RouterError(f"model name={name} is not found")
        if e.source is not ModelSource.CACHE:
            raise RouterError(f"model name={name} is not removable (not from cache)")
        if e.running:
            self.unload(name)
            await self._wait_until(lambda: name not in self.models or not self.models[name].running)
        ok = await asyncio.to_thread(remove_cached, name)
        self.log("I", f"removing model name={name} from cache ({'succeeded' if ok else 'partial'})")
        self.models.pop(name, None)
        self._sse("model_remove", name, {})

    # ---- requests ------------------------------------------------------------------------------

    async def ensure_ready(self, name: str) -> bool:
        """Loads `name` if needed and waits until it serves (False: it already did). Waits in the
        queue while `--models-max` models are busy; cancel the call to give up."""
        e = self.get(name)
        if e is None:
            raise RouterError(f"model name={name} is not found")
        name = e.name
        if name not in self.stopping and e.ready_or_sleeping:
            return False
        queued = did_load = saw_loading = False
        if e.status is ModelStatus.UNLOADED:
            self.queue.join(name)
            self._tick()
            queued = True
        self.log("I", f"waiting until model name={name} is fully loaded...")
        try:
            while True:
                e = self.models.get(name)
                if e is None:
                    break
                if name in self.stopping:
                    if not queued:
                        self.queue.join(name)
                        self._tick()
                        queued = True
                    await self._wait_change(0.2)
                    continue
                if e.ready_or_sleeping or e.status in (ModelStatus.DOWNLOADING, ModelStatus.DOWNLOADED):
                    break
                if e.status is ModelStatus.LOADING:
                    saw_loading = True
                elif e.status is ModelStatus.UNLOADED:
                    if did_load or saw_loading:
                        if e.failed:
                            raise RouterError(f"model name={name} failed to load")
                        break
                    if not queued:
                        break
                if e.status is ModelStatus.UNLOADED and self.queue.try_claim(name, self.has_capacity()):
                    ok = True
                    try:
                        self.log("I", f"slot available, loading queued model name={name}")
                        await self.load(name)
                        did_load = True
                    except RouterError as ex:
                        self.log("W", f"queued load of name={name} did not go through: {ex}")
                        ok = False
                    self.queue.claim_done(name, ok)
                    self._tick()
                    continue
                await self._wait_change(0.2)
        except BaseException:
            if queued:
                self.queue.leave(name)
            self._tick()
            raise
        if queued:
            self.queue.leave(name)
        return True

    def begin_request(self, name: str, update_last_used: bool) -> ModelEntry:
        e = self.get(name)
        if e is None:
            raise RouterError(f"model name={name} is not found")
        if not e.running:
            raise RouterError(f"model name={e.name} is not running", invalid=True)
        if update_last_used:
            e.last_used = time.monotonic()
        e.req_count += 1
        return e

    def end_request(self, name: str) -> None:
        e = self.models.get(name)
        if e is not None and e.req_count > 0:
            e.req_count -= 1
            if e.req_count == 0:
                self._tick()
                self._notify()


def _on(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "on", "yes", "enabled")
