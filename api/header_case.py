"""Response header names spelled as llama-server (cpp-httplib) sends them: `Content-Type`,
`Access-Control-Allow-Origin`, `Process-Start-Time-Unix`...

Starlette lower-cases every header name it stores. HTTP names are case-insensitive, but clients that
copy the headers into a plain dict (llama.cpp's own test suite does: `"Process-Start-Time-Unix" in
res.headers`) see the difference, so this ASGI wrapper writes each name in its canonical form.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


def canonical(name: bytes) -> bytes:
    return b"-".join(p[:1].upper() + p[1:].lower() for p in name.split(b"-"))


class CanonicalHeaderCase:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_canonical(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [(canonical(k), v) for k, v in message.get("headers", [])]
            await send(message)

        await self.app(scope, receive, send_canonical)
