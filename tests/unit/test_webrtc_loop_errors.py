"""aiortc's ICE start failing on a closed call is one log line, not a
traceback; any other unretrieved task failure still reaches the handler."""

from __future__ import annotations

import asyncio
import logging

import pytest

from omnilive.gateway.webrtc.loop_errors import quiet_closed_ice_starts

aiortc_exceptions = pytest.importorskip("aiortc.exceptions")


class PeerConnection:
    """Stands for aiortc's: its ICE starts in ``__connect``, a task nobody awaits."""

    async def __connect(self) -> None:
        raise aiortc_exceptions.InvalidStateError("RTCIceTransport is closed")

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.__connect())


async def failed(task: asyncio.Task[None]) -> dict:
    await asyncio.wait([task])
    return {"message": "Task exception was never retrieved", "exception": task.exception(),
            "future": task}  # fmt: skip


async def test_a_closed_calls_ice_start_is_a_line_and_the_rest_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    passed_on: list[dict] = []
    loop.set_exception_handler(lambda loop, context: passed_on.append(context))
    try:
        quiet_closed_ice_starts(loop)
        quiet_closed_ice_starts(loop)  # a second call changes nothing
        caplog.set_level(logging.INFO, "omnilive.gateway.webrtc.loop_errors")
        loop.call_exception_handler(await failed(PeerConnection().start()))
        assert passed_on == []
        assert "closed while its ICE transport was starting" in caplog.text

        async def other() -> None:
            raise RuntimeError("a bug")

        context = await failed(asyncio.create_task(other()))
        loop.call_exception_handler(context)
        assert passed_on == [context]
    finally:
        loop.set_exception_handler(None)
