"""The Realtime API's limits through real processes on the scripted engine:
a session's time (queueing included) and its context, which slides unless the
session asks for a fixed one (the spec's ``context_full``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.test_realtime import realtime
from tests.servers import Server


@pytest.fixture
async def short_server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = Server(
        tmp_path,
        env={
            "OMNILIVE_REALTIME__VIDEO_MAX_S": "2.5",
            "OMNILIVE_REALTIME__AUDIO_MAX_S": "4",
            "OMNILIVE_REALTIME__CONTEXT_TOKENS": "500",
        },
    ).start()
    try:
        await srv.wait_ready(workers=1)
        yield srv
    finally:
        srv.stop()


async def test_total_duration_limit_includes_queueing(short_server: Server):
    loop = asyncio.get_running_loop()
    holder = await realtime(short_server, "audio")  # 4 s limit
    await holder.start()
    started = loop.time()
    waiting = await realtime(short_server, "video")  # 2.5 s limit, all of it queued
    assert await waiting.closed(timeout=6) == ("timeout", 1000)
    assert 2.3 < loop.time() - started < 3.5
    assert await holder.closed(timeout=6) == ("timeout", 1000)
    assert 3.5 < loop.time() - started < 5


async def test_a_session_slides_past_the_context_limit(short_server: Server):
    """The context slides by default (omnilive's): the spec's 500-token limit
    here ends only a session that asks for a fixed context."""
    rt = await realtime(short_server, "audio")
    await rt.start("#kv-per-unit:200 #schedule:L")
    for _ in range(3):
        await rt.append()
    listens = [await rt.until("response.listen") for _ in range(3)]
    assert listens[-1]["kv_cache_length"] > 500
    assert await rt.closed() == ("timeout", 1000)  # its 4 s, not its context, ended it


async def test_context_full_really_ends_the_session(short_server: Server):
    rt = await realtime(short_server, "audio")
    await rt.start("#kv-per-unit:200 #schedule:L", context_window="off")
    for _ in range(4):
        await rt.append()
    assert await rt.closed() == ("context_full", 1000)
    listens = [e for e in rt.events if e["type"] == "response.listen"]
    assert listens and listens[-1]["kv_cache_length"] >= 500
    status = await short_server.get("/status")
    assert status["workers"]["slots_busy"] == 0
    nxt = await realtime(short_server, "audio")
    await nxt.start()
