"""HEAD as llama-server answers it: cpp-httplib dispatches a HEAD request to the GET handlers and
sends their status and headers (Content-Length included) without the body; a path with no GET
handler is its 404. FastAPI routes answer only the methods they declare, so this ASGI wrapper runs a
HEAD exchange as GET on a copy of the scope (the server's own scope keeps HEAD) and drops the body.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class HeadAsGet:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def send_head(message: Message) -> None:
            nonlocal ended
            if message["type"] != "http.response.body":
                await send(message)
            elif not ended and not message.get("more_body", False):
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET"}, receive, send_head)
