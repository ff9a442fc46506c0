"""One known race of aiortc, kept out of the log as a traceback.

``RTCPeerConnection`` starts its ICE transport in a task of its own that
nobody awaits. A call hung up (or refused) while that task is starting makes
it fail with ``InvalidStateError("RTCIceTransport is closed")``, and asyncio
then logs "Task exception was never retrieved" with a traceback for what is
a client's ordinary hang-up. This handler logs that one case as a line and
hands everything else to the handler it replaced.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

log = logging.getLogger(__name__)
_quieted: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _is_closed_ice_start(context: dict[str, Any]) -> bool:
    exc = context.get("exception")
    future = context.get("future")
    coro = future.get_coro() if isinstance(future, asyncio.Task) else None
    return (
        type(exc).__name__ == "InvalidStateError"
        and type(exc).__module__.startswith("aiortc")
        and "RTCIceTransport is closed" in str(exc)
        and "__connect" in getattr(coro, "__qualname__", "")
    )


def quiet_closed_ice_starts(loop: asyncio.AbstractEventLoop) -> None:
    """Install the handler on ``loop`` (once; later calls change nothing)."""
    if loop in _quieted:
        return
    _quieted.add(loop)
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if _is_closed_ice_start(context):
            log.info("webrtc: a call closed while its ICE transport was starting")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)
