"""One worker, one slot: every mode hears its place in the queue and its wait,
is served in turn, and hears a full queue or a cancel as typed exceptions."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from omnilive.client import (
    Chat,
    ChatDone,
    Duplex,
    HalfDuplex,
    Queued,
    QueueUpdate,
    Realtime,
    SessionClosed,
    Stopped,
)
from omnilive.client.errors import QueueFullError, RequestCancelledError
from omnilive.client.session import Session
from tests.servers import Server, running


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"OMNILIVE_MAX_QUEUE_SIZE": "3"}
    with running(tmp_path_factory.mktemp("single"), env=env) as server:
        yield server


async def test_every_mode_is_queued_then_served_in_turn(single: Server):
    answer = Chat(single.http).request("Hi from the queue")
    duplex = Duplex(single.http)
    realtime = Realtime(single.http, mode="audio", dialect="v2")
    waiting: list[Session] = [answer, duplex, realtime]
    try:
        async with HalfDuplex(single.http):  # holds the only slot
            for position, session in enumerate(waiting, 1):
                await session.open()
                queued = await session.wait_for(Queued, timeout=10)
                assert queued.position == position and queued.ticket_id
                assert queued.estimated_wait_s and queued.estimated_wait_s > 0
                assert session.queue.position == position and not session.queue.done
            with pytest.raises(QueueFullError) as full:
                async with HalfDuplex(single.http):
                    pass
            assert full.value.details["close_code"] == 1013
        reply = await answer.reply()  # the holder stopped: the chat goes first
        assert isinstance(reply, ChatDone) and reply.text == "You said: Hi from the queue"
        await duplex.ready(timeout=10)
        assert isinstance(await duplex.stop(), Stopped)
        await realtime.ready(timeout=10)
        assert realtime.queue.done
        moves = [e async for e in _until_created(realtime) if isinstance(e, QueueUpdate)]
        assert [m.position for m in moves][-1:] == [1]  # it moved up as the others left
        assert isinstance(await realtime.stop(), SessionClosed)
    finally:
        for session in waiting:
            await session.close()
    await single.wait_worker_status("idle", timeout=10)  # nothing is left holding the slot


async def _until_created(session: Realtime):
    async for event in session:
        yield event
        if type(event).__name__ == "SessionCreated":
            return


async def test_an_administrator_s_cancel_is_raised_as_cancelled(single: Server):
    async with HalfDuplex(single.http):
        waiting = Duplex(single.http)
        await waiting.open()
        try:
            queued = await waiting.wait_for(Queued, timeout=10)
            async with httpx.AsyncClient() as http:
                url = f"{single.http}/api/queue/{queued.ticket_id}"
                assert (await http.delete(url)).status_code == 200
            with pytest.raises(RequestCancelledError):
                await waiting.ready(timeout=10)
        finally:
            await waiting.close()
