"""The GA dialect's limits through a real server (scripted engine), with the
``openai`` SDK as the client: a conversation full of items, and a client
that never sends an event."""

from __future__ import annotations

import asyncio
import time

from tests.integration.test_realtime_openai import connect, say, text_session, until
from tests.servers import Server

# Each wait after the burst: the worker may still be working through 4,097
# items on a loaded 2-core machine (the whole test took 44 s on CI).
LOADED_S = 120


async def test_a_full_conversation_refuses_the_item_that_passes_it(server: Server):
    """4,097 items in one burst: the 4,097th is ``conversation_full`` (and
    nothing else fails); the session goes on, and a deleted item makes room."""
    from omnilive.worker.openai.items import MAX_ITEMS

    # The client's keepalive pings would wait behind the burst in the
    # server's socket buffer (on a loaded 2-core machine, past their 20 s).
    async with connect(server, ping_interval=None) as connection:
        await text_session(connection)
        # Read while sending, as a client does: one that reads nothing while
        # the server answers 4,097 items fills its socket, and on a loaded
        # machine the server then drops it as a client that stopped reading.
        reading = asyncio.create_task(until(connection, "error", timeout=LOADED_S))
        try:
            for n in range(MAX_ITEMS + 1):
                item = {"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": f"item {n}"}]}  # fmt: skip
                await connection.conversation.item.create(item=item, event_id=f"evt_{n}")
            error, seen = await reading
        finally:
            reading.cancel()
        assert error.error.code == "conversation_full"
        assert error.error.event_id == f"evt_{MAX_ITEMS}"
        added = [e for e in seen if e.type == "conversation.item.added"]
        assert len(added) == MAX_ITEMS
        await connection.response.create(event_id="evt_answer")
        error, _ = await until(connection, "error", timeout=LOADED_S)
        assert error.error.code == "conversation_full" and error.error.event_id == "evt_answer"
        for old in added[:2]:  # room for one more item and the answer's
            await connection.conversation.item.delete(item_id=old.item.id)
            await until(connection, "conversation.item.deleted", timeout=LOADED_S)
        await say(connection, "one more")
        await connection.response.create()
        done, _ = await until(connection, "response.done", timeout=LOADED_S)
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].text == "Answered: one more"


async def test_a_client_that_sends_nothing_is_ended(tmp_path):
    """Served and silent: the session ends after ``first_message_timeout_s``
    with ``session_expired``, as the other routes' do; it held its slot for
    the whole session's life (600 s)."""
    env = {"OMNILIVE_LIMITS__FIRST_MESSAGE_TIMEOUT_S": "1.5"}
    server = Server(tmp_path, env=env).start()
    try:
        await server.wait_ready(workers=1)
        async with connect(server) as connection:
            await until(connection, "session.created")
            started = time.monotonic()
            error, _ = await until(connection, "error", timeout=15)
            assert error.error.code == "session_expired"
            assert time.monotonic() - started < 10
        await server.wait_idle(timeout=5)
        async with connect(server) as connection:  # a client that speaks stays
            await text_session(connection)
            await asyncio.sleep(2.5)
            await say(connection, "still here")
            await until(connection, "conversation.item.done")
    finally:
        server.stop()
