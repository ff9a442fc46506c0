"""A deadline on the body of every HTTP request, as the head has one
(``header_deadline.py``): a body that stops arriving is refused.

A route waits for its body as long as the client keeps the connection open:
an offer announcing 10 GB and sending 5 bytes held its request (and a place
in whatever the route had taken for it) until the client gave up. Here every
part of a body must come within ``limits.body_timeout_s`` of the request
head or of the previous part, whichever route reads it and however (a JSON
body, a form, a stream to disk); past that the read raises an
:class:`~omnilive.gateway.http_errors.HttpRefusal` (408, ``timeout``), which
the route's own clean-up sees like any other refusal and the error handlers
answer in the documented shape. A pause measures the client, never the
route: only a wait for a part the client still owes is timed.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnilive.gateway.http_errors import HttpRefusal
from omnilive.protocol.common import ErrorCode


class BodyDeadline:
    """ASGI middleware: the deadline on every HTTP request's body."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timeout_s = self.timeout_s
        owed = True  # parts of the body still to come

        async def timed_receive() -> Message:
            nonlocal owed
            if not owed:  # after the body: only a disconnect, awaited as long as asked
                return await receive()
            try:
                async with asyncio.timeout(timeout_s):
                    message = await receive()
            except TimeoutError:
                owed = False
                why = f"the request body stopped arriving (nothing for {timeout_s:g} s)"
                raise HttpRefusal(408, ErrorCode.TIMEOUT, why) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                owed = False
            return message

        await self.app(scope, timed_receive, send)
