"""Small helpers for running work alongside a peer that may disappear."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

T = TypeVar("T")


FrameSource = AsyncIterator[str | bytes]


async def receive_frame(ws: WebSocket) -> str | bytes:
    """The next text or binary frame; raises WebSocketDisconnect when the peer
    leaves, or has left: a session's readers take turns on one socket (while
    it queues, then while it runs), and the peer's leaving may have been read
    by an earlier one, after which Starlette refuses to receive again."""
    if ws.client_state is WebSocketState.DISCONNECTED:
        raise WebSocketDisconnect(1006)
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    return text if text is not None else message.get("bytes", b"")


async def frames_of(ws: WebSocket) -> FrameSource:
    """Every frame the peer sends, until it disconnects."""
    while True:
        try:
            yield await receive_frame(ws)
        except WebSocketDisconnect:
            return


async def _awaited(work: Awaitable[T]) -> T:
    return await work


class PeerGone(Exception):
    """The other side of a connection went away."""


async def race(work: Awaitable[T], watcher: Callable[[], Awaitable[Any]]) -> T:
    """Run ``work`` while ``watcher()`` waits for the peer to leave.

    If the watcher returns first, ``work`` is cancelled (its cleanup runs) and
    :class:`PeerGone` is raised. Both tasks are always awaited: nothing is left
    running behind the caller.
    """
    # A task the caller named already, or a coroutine made one here: either way
    # owned by this call and awaited below.
    work_task = (
        work if isinstance(work, asyncio.Task) else asyncio.create_task(_awaited(work), name="race")
    )
    watch_task = asyncio.create_task(_awaited(watcher()), name=f"{work_task.get_name()}:watcher")
    try:
        await asyncio.wait([work_task, watch_task], return_when="FIRST_COMPLETED")
    finally:
        for task in (work_task, watch_task):
            task.cancel()
        # Also reads the outcome of a task that ended as this one was cancelled.
        await asyncio.gather(work_task, watch_task, return_exceptions=True)
    if work_task.done() and not work_task.cancelled():
        return work_task.result()
    if watch_task.done() and not watch_task.cancelled() and watch_task.exception():
        raise watch_task.exception()  # type: ignore[misc]  # not None: checked above
    raise PeerGone()
