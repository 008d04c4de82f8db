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


async def stream_events(ping_interval: float, handle: TaskHandleAPI, on_token: OnToken, on_final: OnFinal,
                        done_marker: bool, error_fmt: Callable[..., bytes] = sse_error,
                        on_progress: OnProgress | None = None) -> Response:
    """SSE response for a generating task. `on_token(ev)` and `on_final(result)` return lists of
    JSON chunks (or of events already encoded as bytes); `done_marker`: end with `data: [DONE]`
    (the OpenAI routes); `error_fmt`: how an error after the first chunk is written; `on_progress`:
    the chunks of a PromptProgress event (tasks with `return_progress`)."""
    pump = EventPump(handle)
    ping = ping_interval if ping_interval > 0 else None
    try:
        got, first = await pump.next(ping)
    except BaseException:
        pump.close()
        raise
    if got and isinstance(first, TaskError):
        pump.close()
        raise_task_error(first)

    async def gen() -> AsyncIterator[bytes]:
        try:
            ev: Any = first
            have = got
            while True:
                if not have:
                    yield PING
                else:
                    if isinstance(ev, TokenOut):
                        for chunk in on_token(ev):
                            yield chunk if isinstance(chunk, bytes) else sse(chunk)
                    elif isinstance(ev, PromptProgress):
                        for chunk in on_progress(ev) if on_progress is not None else []:
                            yield chunk if isinstance(chunk, bytes) else sse(chunk)
                    elif isinstance(ev, TaskError):
                        yield error_fmt(ev.message, ev.type, ev.code, ev.extra)
                        return
                    else:
                        for chunk in on_final(ev):
                            yield chunk if isinstance(chunk, bytes) else sse(chunk)
                        if done_marker:
                            yield DONE
                        return
                try:
                    have, ev = await pump.next(ping)
                except ApiError as e:
                    yield error_fmt(e.message, e.type, e.code, e.extra)
                    return
        except Exception as e:  # an error after the first chunk: one error event, no [DONE]
            yield error_fmt(str(e), "server_error", 500)
        finally:
            pump.close()

    return StreamingResponse(gen(), media_type="text/event-stream", headers=SSE_HEADERS)
