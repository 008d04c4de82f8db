"""uvicorn, hardened: graceful drain on SIGTERM and a deadline for request headers.

`DrainingServer` replaces uvicorn's exit on the first SIGTERM/SIGINT: the app's `Drain`
(api/guard.py) refuses new requests with 503, running streams get up to `--shutdown-timeout`
seconds to finish, those still running are ended with a final error event, then the server exits
with status 0 (a second signal exits at once). uvicorn's own handler would wait for every stream
however long, and re-raise the signal so that the process dies by it.

`header_timeout_protocol(seconds)` is uvicorn's h11 protocol with one more timer: a connection
that has not finished sending a request's headers within `--header-timeout` seconds of its first
byte (or of being opened) is closed, so half-open connections cannot pile up. Idle keep-alive
connections keep uvicorn's own `--timeout`.
"""
from __future__ import annotations

import asyncio
import signal
from types import FrameType
from typing import Any, Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Any, shutdown_timeout: float,
                 log: Callable[[str], None] | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self.shutdown_timeout = shutdown_timeout
        self._log = log or (lambda msg: None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self._loop is None or not self.started:
            self.should_exit = True
            if self._draining:
                self.force_exit = True
            return
        self._draining = True
        self._log(f"received signal {signal.Signals(sig).name}: draining, "
                  f"in-flight requests have {self.shutdown_timeout:g} s (--shutdown-timeout)")
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain_then_exit()))

    async def _drain_then_exit(self) -> None:
        try:
            ended = await self.drain.run(self.shutdown_timeout)
            if ended:
                self._log(f"shutdown timeout: ended {ended} request(s) still running")
        finally:
            self.should_exit = True


def header_timeout_protocol(seconds: float) -> type:
    class HeaderTimeoutH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._header_timer: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            self._arm()

        def _between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if seconds > 0 and self._header_timer is None:
                self._header_timer = self.loop.call_later(seconds, self._on_header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if self._between_requests() and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._between_requests():
                self._arm()
            super().data_received(data)
            if not self._between_requests():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutH11Protocol
