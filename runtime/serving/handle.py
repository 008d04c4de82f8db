"""The bridge between the engine thread and the callers: `TaskHandle` and the `Outbox`.

A handle is created by `Engine.submit` on the caller's thread. Events for it are produced on the
engine thread: a handle created inside a running asyncio loop gets them through the engine's
`Outbox`, flushed once per step (one `call_soon_threadsafe` per event loop instead of one wake-up
per token); a handle created in a plain thread gets them straight into a `queue.Queue`.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

from runtime.tasks import PromptProgress, TokenOut


class Outbox:
    """Events for asyncio handles produced during one step, delivered together by `flush`."""

    def __init__(self) -> None:
        self._items: list[tuple[TaskHandle, Any]] = []

    def put(self, handle: "TaskHandle", ev: Any) -> None:
        self._items.append((handle, ev))

    def flush(self) -> None:
        """Hand this step's events to their event loops: one thread-safe call per loop."""
        if not self._items:
            return
        by_loop: dict[Any, list] = {}
        for h, ev in self._items:
            by_loop.setdefault(h._loop, []).append((h, ev))
        self._items = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # loop closed: its clients are gone
                for h, _ in items:
                    h.cancelled = True


def _deliver(items: list) -> None:
    """On the event loop: put each event in its handle's queue."""
    for h, ev in items:
        h._q.put_nowait(ev)


class TaskHandle:
    """A submitted task: events come out of `events()` (async) or `iter_sync()` (threads):
    TokenOut* (streaming) then exactly one final event (CompletionResult, embeddings or TaskError).
    `id` is the engine's task number (`id_task` in /slots)."""

    def __init__(self, task, id: int, outbox: Outbox, wake: threading.Event):
        self.id = id
        self.task = task
        self.cancelled = False
        self._outbox = outbox
        self._wake = wake
        try:
            self._loop = asyncio.get_running_loop()
            self._q: Any = asyncio.Queue()
        except RuntimeError:
            self._loop = None
            self._q = queue.Queue()

    def emit(self, ev) -> None:
        """Called on the engine thread."""
        if self._loop is not None:
            self._outbox.put(self, ev)
        else:
            self._q.put(ev)

    @staticmethod
    def _is_final(ev) -> bool:
        return not isinstance(ev, (TokenOut, PromptProgress))

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
        """The client went away: the slot is freed at the next step."""
        self.cancelled = True
        self._wake.set()
