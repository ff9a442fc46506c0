"""``Realtime`` against a real server (scripted engine), in both dialects and
in chat mode."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from omnilive.client import (
    AudioDelta,
    Listen,
    Realtime,
    ResponseCancelled,
    ServerError,
    SessionClosed,
    SessionCreated,
    SessionUpdated,
    Speech,
    TextDelta,
)
from omnilive.client.audio import OUTPUT_RATE
from omnilive.client.errors import BackendError
from tests.client.helpers import collect
from tests.servers import Server

QUARTER = np.full(4000, 0.05, np.float32)


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (90, 20, 200)).save(buffer, "JPEG")
    return buffer.getvalue()


async def send_seconds(session: Realtime, seconds: float, **fields) -> None:
    for _ in range(round(seconds * 4)):  # quarter seconds, at twice real time
        await session.send(QUARTER, **fields)
        await asyncio.sleep(0.125)


async def test_older_dialect_listen_speak_cancel_update_close(scripted: Server):
    session = Realtime(scripted.http, mode="audio", instructions="#schedule:LSSSE")
    async with session:
        created = await session.ready()
        assert isinstance(created, SessionCreated) and created.prompt_length
        await send_seconds(session, 2.0)
        listen, speech = await collect(session, 2, Listen, Speech)
        assert isinstance(listen, Listen) and listen.kv_cache_length
        assert isinstance(speech, Speech) and speech.text.startswith("unit 1")
        assert speech.audio is not None and speech.audio.size <= OUTPUT_RATE
        await session.cancel()
        await session.wait_for(ResponseCancelled, timeout=5)
        await session.update(instructions="#schedule:L")
        assert (await session.wait_for(SessionUpdated, timeout=5)).session["instructions"]
        closed = await session.stop()
    assert isinstance(closed, SessionClosed) and closed.reason == "stopped"


async def test_older_dialect_video_and_a_recoverable_engine_error(scripted: Server):
    instructions = "#fail-unit:0 #schedule:S"
    async with Realtime(scripted.http, mode="video", instructions=instructions) as session:
        await send_seconds(session, 2.0, frames=[jpeg()])
        error, speech = await collect(session, 2, ServerError, Speech)
        assert isinstance(error, ServerError) and error.code == "inference_error"
        assert error.kind == "server_error" and "frames" in speech.text


async def test_newer_dialect_deltas_carry_ids_and_usage(scripted: Server):
    session = Realtime(scripted.http, mode="audio", dialect="v2", instructions="#schedule:LE")
    async with session:
        created = await session.ready()
        assert isinstance(created, SessionCreated) and created.mode == "full_duplex"
        for index in range(8):
            await session.send(QUARTER, input_id=f"in_{index}")
            await asyncio.sleep(0.125)
        events = await collect(session, 4, Listen, TextDelta, AudioDelta)
        kinds = [type(e) for e in events]
        assert kinds == [Listen, TextDelta, AudioDelta, Listen]
        spoken = events[1:]
        assert len({e.response_id for e in spoken}) == 1 and spoken[0].response_id
        assert spoken[0].input_id == "in_7" and spoken[0].usage["total_tokens"] > 0
        closed = await session.stop()
    assert isinstance(closed, SessionClosed) and closed.reason == "user_stop"
    assert closed.usage and closed.usage["output_tokens"] > 0


async def test_newer_dialect_failures_are_raised(scripted: Server):
    session = Realtime(scripted.http, mode="audio", dialect="v2", instructions="#fail-unit:0")
    with pytest.raises(BackendError, match="scripted failure in unit 0"):
        async with session:
            await send_seconds(session, 1.5)
            async for _ in session:
                pass
    assert isinstance(session.ending, SessionClosed)


async def test_chat_mode_questions_and_answers(scripted: Server):
    async with Realtime(scripted.http, mode="chat") as session:
        spoken = await session.ask("Hello there", tts=True)
        assert spoken.text == "You said: Hello there" and spoken.reason == "turn_end"
        assert spoken.audio is not None and spoken.audio.size > OUTPUT_RATE // 2
        quiet = await session.ask("Again", streaming=False)
        assert quiet.text == "You said: Again" and quiet.audio is None
        assert quiet.usage and quiet.chunk_index == 1
    with pytest.raises(ValueError, match="chat"):
        Realtime(scripted.http, mode="chat", dialect="v1")
