"""A deadline on the head of every HTTP request: a connection that has not
sent its whole request head (headers, or a WebSocket upgrade) in time is
closed.

uvicorn times out idle keep-alive connections but not a request head that
is never finished: a client that sends half an upgrade request holds its
connection (and a file descriptor) for ever, and thousands of them exhaust
the process. The deadline is armed when a connection is made and again when
a response completes (the next request's head is then awaited), and checked
when it fires: a connection still waiting for a head is closed; one serving
a request, or upgraded to a WebSocket, is left alone.
"""

from __future__ import annotations

import asyncio
from typing import Any


def with_header_deadline(base: type[Any], timeout_s: float) -> type[Any]:
    """uvicorn's HTTP protocol class ``base`` (h11 or httptools: both keep
    their request/response cycle in ``cycle``) with the deadline."""

    class HeaderDeadline(base):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self:
                return  # closed already, or upgraded: the WebSocket has its own rules
            if self.cycle is None or self.cycle.response_complete:
                transport.close()  # still no whole request head

    HeaderDeadline.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline


def http_protocol(timeout_s: float) -> type[Any]:
    """The HTTP protocol class uvicorn would choose, with the deadline."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return with_header_deadline(AutoHTTPProtocol, timeout_s)
