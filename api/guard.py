"""The outermost ASGI layer: what one request may cost, and what happens when its client leaves or
the server drains.

`RequestGuard` (installed by `create_app`) wraps every HTTP exchange:
  * the body is read here, before any route runs: at most `--max-body-size` bytes (a
    `Content-Length` above it, or a chunked body growing past it, is a 413 in llama-server's
    envelope without reading the rest), each chunk within `--timeout` seconds (else 408);
  * the route then runs as its own task while a watcher waits for the client to go away: a
    disconnect cancels the route, so a non-streamed generation frees its slot at once just like a
    streamed one (`results.collect` / `sse.stream_events` cancel their task when cancelled);
    an ordinary disconnect is one log line, never a traceback;
  * while the server drains (`Drain`, started by SIGTERM in api/shutdown.py) a new request is a 503;
    an exchange still running at the drain deadline is ended: a started event stream gets a final
    `data: {"error": ...}` event, a response not yet started a 503.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import ClientDisconnect

from api.errors import ApiError, dumps, error_object

SHUTTING_DOWN = "Server is shutting down"


@dataclass(eq=False)
class Exchange:
    """One request in flight."""
    task: asyncio.Task | None = None
    started: bool = False  # the response head has been sent
    complete: bool = False  # the last body chunk has been sent
    event_stream: bool = False
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: str = ""  # why the guard ended the route ("disconnect" | "drain")


class Drain:
    """Per-app drain state: the exchanges in flight and whether new ones are refused."""

    def __init__(self) -> None:
        self.draining = False
        self.active: set[Exchange] = set()
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, ex: Exchange) -> None:
        self.active.add(ex)
        self.idle.clear()

    def remove(self, ex: Exchange) -> None:
        self.active.discard(ex)
        if not self.active:
            self.idle.set()

    async def run(self, timeout: float) -> int:
        """Refuse new requests, wait up to `timeout` s for those in flight, then end the rest.
        Returns how many were ended."""
        self.draining = True
        if self.active:
            try:
                await asyncio.wait_for(self.idle.wait(), timeout=max(timeout, 0.0))
            except TimeoutError:
                pass
        left = [ex for ex in self.active if ex.task is not None and not ex.task.done()]
        for ex in left:
            ex.aborted = "drain"
            ex.task.cancel()
        if left:
            try:
                await asyncio.wait_for(self.idle.wait(), timeout=2.0)
            except TimeoutError:
                pass
        return len(left)


def _error_response(message: str, type: str, code: int) -> tuple[dict, dict]:
    body = dumps({"error": error_object(message, type, code)}).encode()
    head = {"type": "http.response.start", "status": code,
            "headers": [(b"content-type", b"application/json; charset=utf-8"), (b"server", b"llama.cpp"),
                        (b"content-length", str(len(body)).encode())]}
    return head, {"type": "http.response.body", "body": body, "more_body": False}


class RequestGuard:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        ctx, drain = state.server, state.drain
        cfg = ctx.cfg
        if drain.draining:
            await self._send_error(send, ApiError(SHUTTING_DOWN, "unavailable_error", 503))
            return
        ex = Exchange()
        drain.add(ex)
        try:
            body = await self._read_body(scope, receive, send, cfg)
            if body is None:
                return
            await self._run(scope, receive, send, ex, body, ctx)
        finally:
            drain.remove(ex)

    async def _send_error(self, send: Any, e: ApiError) -> None:
        head, body = _error_response(e.message, e.type, e.code)
        await send(head)
        await send(body)

    async def _read_body(self, scope: dict, receive: Any, send: Any, cfg: Any) -> bytes | None:
        """The whole body, or None when an error was answered (413, 408) or the client left."""
        limit = getattr(cfg, "max_body_size", 0)
        timeout = getattr(cfg, "read_timeout", 600.0)
        length = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if limit > 0 and length is not None and length.isdigit() and int(length) > limit:
            await self._send_error(send, _too_large(int(length), limit))
            return None
        chunks: list[bytes] = []
        n = 0
        while True:
            try:
                msg = await asyncio.wait_for(receive(), timeout=timeout if timeout > 0 else None)
            except TimeoutError:
                await self._send_error(send, ApiError(f"request body not received within {timeout:g} s (--timeout)",
                                                      "invalid_request_error", 408))
                return None
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            n += len(chunk)
            if limit > 0 and n > limit:
                await self._send_error(send, _too_large(n, limit, more=msg.get("more_body", False)))
                return None
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    async def _run(self, scope: dict, receive: Any, send: Any, ex: Exchange, body: bytes, ctx: Any) -> None:
        delivered = False

        async def app_receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await ex.disconnected.wait()
            return {"type": "http.disconnect"}

        async def app_send(msg: dict) -> None:
            if ex.aborted:
                return
            if msg["type"] == "http.response.start":
                ex.started = True
                ctype = next((v for k, v in msg.get("headers", []) if k.lower() == b"content-type"), b"")
                ex.event_stream = ctype.startswith(b"text/event-stream")
            elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                ex.complete = True
            await send(msg)

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    ex.disconnected.set()
                    if not ex.complete and ex.task is not None and not ex.task.done():
                        ex.aborted = "disconnect"
                        ex.task.cancel()
                    return

        ex.task = asyncio.ensure_future(self.app(scope, app_receive, app_send))
        watcher = asyncio.ensure_future(watch())
        t0 = time.monotonic()
        try:
            await asyncio.wait({ex.task})
        finally:
            watcher.cancel()
        if ex.task.cancelled() or ex.aborted:
            if ex.aborted == "disconnect":
                ctx.log.srv("I", "log_server_r", f"client disconnected: {scope.get('method')} {scope.get('path')}, "
                                                 f"request cancelled after {time.monotonic() - t0:.2f} s")
            elif ex.aborted == "drain":
                await self._end_on_drain(send, ex)
            return
        e = ex.task.exception()
        if e is None:
            return
        if ex.disconnected.is_set() or isinstance(e, ClientDisconnect):
            ctx.log.srv("I", "log_server_r", f"client disconnected: {scope.get('method')} {scope.get('path')}")
            return
        raise e

    async def _end_on_drain(self, send: Any, ex: Exchange) -> None:
        try:
            if not ex.started:
                await self._send_error(send, ApiError(SHUTTING_DOWN, "unavailable_error", 503))
            elif ex.event_stream and not ex.complete:
                event = f"data: {dumps({'error': error_object(SHUTTING_DOWN, 'unavailable_error', 503)})}\n\n"
                await send({"type": "http.response.body", "body": event.encode(), "more_body": False})
            elif not ex.complete:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass


def _too_large(n: int, limit: int, more: bool = False) -> ApiError:
    size = f"more than {n}" if more else str(n)
    return ApiError(f"request body too large: {size} bytes, the limit is {limit} bytes (--max-body-size)",
                    "invalid_request_error", 413)
