"""Server-sent events as llama-server writes them.

Each chunk is `data: <compact JSON>\\n\\n`; the OpenAI routes end with `data: [DONE]\\n\\n`; an error
after the stream has started is one `data: {"error": {...}}\\n\\n` event and the end of the stream
(no [DONE]). While a task produces nothing for `--sse-ping-interval` seconds (e.g. it waits for a
free slot) the stream sends the comment `:\\n\\n`; a ping interval <= 0 sends none.

The first event is awaited before the response starts, so an error before the first token is an
ordinary HTTP error response, not a stream.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi.responses import Response, StreamingResponse

from api.engine_api import TaskHandleAPI
from api.errors import ApiError, dumps, error_object
from api.results import raise_task_error
from runtime.tasks import CompletionResult, PromptProgress, TaskError, TokenOut

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PING = b":\n\n"
DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode("utf-8", "replace")


def sse_error(message: str, type: str, code: int | None = None, extra: dict[str, Any] | None = None) -> bytes:
    return sse({"error": error_object(message, type, code, extra)})


def sse_event(name: str, data: Any) -> bytes:
    """A named event (`event: NAME\\ndata: JSON`), as the Responses and Anthropic streams write them."""
    return f"event: {name}\ndata: {dumps(data)}\n\n".encode("utf-8", "replace")


def sse_error_event(message: str, type: str, code: int | None = None, extra: dict[str, Any] | None = None) -> bytes:
    """An error inside an Anthropic stream: `event: error` with the bare error object."""
    return sse_event("error", error_object(message, type, code, extra))


class EventPump:
    """Reads a task's events with a deadline, so that a stream can send pings while it waits."""

    def __init__(self, handle: TaskHandleAPI):
        self.handle = handle
        self.it = handle.events().__aiter__()
        self.pending: asyncio.Future | None = None
        self.finished = False

    async def next(self, timeout: float | None) -> tuple[bool, Any]:
        """(True, event) or (False, None) when `timeout` seconds passed without one."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.it.__anext__())
        done, _ = await asyncio.wait({self.pending}, timeout=timeout)
        if not done:
            return False, None
        fut, self.pending = self.pending, None
        try:
            ev = fut.result()
        except StopAsyncIteration:
            self.finished = True
            raise ApiError("task ended without a result", "server_error", 500)
        if not isinstance(ev, (TokenOut, PromptProgress)):
            self.finished = True
        return True, ev

    def close(self) -> None:
        if not self.finished:
            self.handle.cancel()
        if self.pending is not None:
            self.pending.cancel()


OnToken = Callable[[TokenOut], list[Any]]
OnFinal = Callable[[CompletionResult], list[Any]]
OnProgress = Callable[[PromptProgress], list[Any]]


@dataclass
class Stream:
    """One task of a streamed response and how its events become chunks: `on_token(ev)` and
    `on_final(result)` return lists of JSON chunks (or of events already encoded as bytes);
    `on_progress`: the chunks of a PromptProgress event (tasks with `return_progress`); `lead`:
    bytes written once before the task's first chunk."""
    handle: TaskHandleAPI
    on_token: OnToken
    on_final: OnFinal
    on_progress: OnProgress | None = None
    lead: bytes = b""


async def stream_events(ping_interval: float, handle: TaskHandleAPI, on_token: OnToken, on_final: OnFinal,
                        done_marker: bool, error_fmt: Callable[..., bytes] = sse_error,
                        on_progress: OnProgress | None = None) -> Response:
    """SSE response for one generating task (`stream_many` with one Stream)."""
    return await stream_many(ping_interval, [Stream(handle, on_token, on_final, on_progress)], done_marker, error_fmt)


async def stream_many(ping_interval: float, streams: list[Stream], done_marker: bool,
                      error_fmt: Callable[..., bytes] = sse_error) -> Response:
    """SSE response for tasks generating side by side (several prompts, `n` choices): each task's
    chunks in the order its events arrive, interleaved as llama-server interleaves its tasks'
    results; `done_marker`: end with `data: [DONE]` once all are done (the OpenAI routes);
    `error_fmt`: how an error after the first chunk is written (it ends the whole stream, and the
    other tasks are cancelled). An error as the first event overall is a plain HTTP error."""
    pumps = [EventPump(st.handle) for st in streams]
    ping = ping_interval if ping_interval > 0 else None

    def close_all() -> None:
        for p in pumps:
            p.close()

    async def next_event(timeout: float | None) -> tuple[int, Any] | None:
        """(stream index, event) of the first event to arrive, or None after `timeout` seconds."""
        for i, p in enumerate(pumps):  # one already arrived
            if p.pending is not None and p.pending.done():
                return i, (await p.next(0))[1]
        live = [p for p in pumps if not p.finished]
        for p in live:
            if p.pending is None:
                p.pending = asyncio.ensure_future(p.it.__anext__())
        done, _ = await asyncio.wait({p.pending for p in live}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            return None
        i = next(i for i, p in enumerate(pumps) if p.pending in done)
        return i, (await pumps[i].next(0))[1]

    try:
        first = await next_event(ping)
    except BaseException:
        close_all()
        raise
    if first is not None and isinstance(first[1], TaskError):
        close_all()
        raise_task_error(first[1])

    async def gen() -> AsyncIterator[bytes]:
        started = [False] * len(streams)
        try:
            item = first
            while True:
                if item is None:
                    yield PING
                else:
                    i, ev = item
                    st = streams[i]
                    if isinstance(ev, TaskError):
                        yield error_fmt(ev.message, ev.type, ev.code, ev.extra)
                        return
                    if isinstance(ev, TokenOut):
                        chunks = st.on_token(ev)
                    elif isinstance(ev, PromptProgress):
                        chunks = st.on_progress(ev) if st.on_progress is not None else []
                    else:
                        chunks = st.on_final(ev)
                    if chunks and not started[i]:
                        started[i] = True
                        if st.lead:
                            yield st.lead
                    for chunk in chunks:
                        yield chunk if isinstance(chunk, bytes) else sse(chunk)
                    if all(p.finished for p in pumps):
                        if done_marker:
                            yield DONE
                        return
                try:
                    item = await next_event(ping)
                except ApiError as e:
                    yield error_fmt(e.message, e.type, e.code, e.extra)
                    return
        except Exception as e:  # an error after the first chunk: one error event, no [DONE]
            yield error_fmt(str(e), "server_error", 500)
        finally:
            close_all()

    return StreamingResponse(gen(), media_type="text/event-stream", headers=SSE_HEADERS)
