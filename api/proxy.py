"""The router's loopback HTTP/1.1 client: one request to a worker, its answer relayed as it comes
(an event stream chunk by chunk), as b1-0c1e570's `server_http_proxy`.

Request headers go as the client sent them but `Accept-Encoding`, `Transfer-Encoding`,
`Content-Length` (recomputed) and `Host` (the worker's); the answer's `Server`,
`Transfer-Encoding`, `Content-Length`, `Keep-Alive` and `Access-Control-*` are dropped (the
router adds its own). h11 (uvicorn's own HTTP parser) reads the worker's bytes: no client
library. A worker that cannot be reached is b1's 500 `proxy error: ...`; one that dies
mid-answer ends the relayed body there. Cancelling the relay (the client left) closes the
connection, so the worker cancels the request in turn.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import h11
from starlette.responses import Response

__all__ = ["ProxyResponse", "open_proxy"]

_DROP_REQUEST = {b"accept-encoding", b"transfer-encoding", b"content-length", b"host", b"connection"}
_DROP_RESPONSE = {b"server", b"transfer-encoding", b"content-length", b"keep-alive", b"connection"}


class ProxyResponse(Response):
    """A worker's answer: status and headers known, body relayed from `chunks`."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], chunks: AsyncIterator[bytes],
                 on_close: Any = None):
        self.status_code = status
        self.raw_headers = headers
        self.background = None
        self._chunks, self._on_close = chunks, on_close

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self._chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self._chunks.aclose()  # type: ignore[attr-defined]
            if self._on_close is not None:
                self._on_close()


async def open_proxy(method: str, port: int, target: str, headers: list[tuple[bytes, bytes]], body: bytes,
                     timeout: float, on_close: Any = None, host: str = "127.0.0.1") -> Response:
    """Sends the request and waits for the answer's head; `on_close` runs once the exchange is
    over, whatever its end (it is how the router counts a model's requests in flight)."""
    conn = h11.Connection(h11.CLIENT)
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        out = [(k, v) for k, v in headers if k.lower() not in _DROP_REQUEST]
        out += [(b"host", f"{host}:{port}".encode()), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close")]
        writer.write(conn.send(h11.Request(method=method, target=target.encode("utf-8", "surrogateescape"),
                                           headers=out)))
        writer.write(conn.send(h11.Data(data=body)) if body else b"")
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), timeout))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                break
            raise h11.RemoteProtocolError("no response")
    except BaseException as e:
        if writer is not None:
            writer.close()
        if on_close is not None:
            on_close()
        if isinstance(e, asyncio.CancelledError):
            raise
        return Response(f"proxy error: {_reason(e)}".encode(), status_code=500, media_type="text/plain")
    head = [(k, v) for k, v in event.headers if k not in _DROP_RESPONSE and not k.startswith(b"access-control-")]

    async def chunks() -> AsyncIterator[bytes]:
        try:
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    data = await asyncio.wait_for(reader.read(65536), timeout)
                    conn.receive_data(data)
                    continue
                if isinstance(ev, h11.Data):
                    yield bytes(ev.data)
                    continue
                return  # EndOfMessage, ConnectionClosed
        except (h11.RemoteProtocolError, OSError, TimeoutError):
            return  # the worker went away mid-answer: the body ends here
        finally:
            writer.close()

    return ProxyResponse(event.status_code, head, chunks(), on_close)


def _reason(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "Read"
    if isinstance(e, ConnectionRefusedError | ConnectionResetError | OSError):
        return "Connection"
    return str(e) or type(e).__name__
