"""``Duplex`` against a real server (scripted engine): pieces of any size make
1 s units, frames and interruptions ride with them, control works."""

from __future__ import annotations

import asyncio
import io

import numpy as np
from PIL import Image

from omnilive.client import (
    Duplex,
    Paused,
    Prepared,
    Result,
    Resumed,
    ServerError,
    Stopped,
    Updated,
)
from omnilive.client.audio import OUTPUT_RATE
from tests.client.helpers import collect
from tests.servers import Server

PIECE = np.full(320, 0.05, np.float32)  # 20 ms, as a microphone delivers


async def speak_for(session: Duplex, seconds: float, frames: list[bytes] | None = None) -> None:
    """``seconds`` of 20 ms pieces, at twice real time."""
    for _ in range(round(seconds * 50)):
        await session.send(PIECE, frames or [])
        await asyncio.sleep(0.01)


async def results(session: Duplex, n: int) -> list[Result]:
    return await collect(session, n, Result)


async def test_pieces_become_units_and_results_follow_the_schedule(scripted: Server):
    async with Duplex(scripted.http, system_prompt="#schedule:LSE") as session:
        prepared = await session.ready()
        assert isinstance(prepared, Prepared) and prepared.mode == "audio_duplex"
        await speak_for(session, 3.1)
        assert session.units_sent == 3 and session.units.pending_samples == 1600
        assert await session.flush() and session.units_sent == 4
        got = await results(session, 4)
        assert [r.unit_index for r in got] == [0, 1, 2, 3]
        assert [r.is_listen for r in got] == [True, False, False, True]
        assert got[2].end_of_turn and "rms 0.050" in got[1].text
        assert got[1].audio is not None and got[1].audio.size == OUTPUT_RATE
        assert isinstance(await session.stop(), Stopped)


async def test_omni_frames_go_with_their_unit(scripted: Server):
    async with Duplex(scripted.http, mode="omni", system_prompt="#schedule:S") as session:
        await speak_for(session, 1.0, frames=[jpeg()])
        await session.send(np.zeros(16000, np.float32), [jpeg()])
        first, second = await results(session, 2)
        assert "frames 8" in first.text  # a frame with each of 50 pieces: the newest 8
        assert "frames 1" in second.text


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (20, 120, 200)).save(buffer, "JPEG")
    return buffer.getvalue()


async def test_force_listen_interrupts_the_model(scripted: Server):
    async with Duplex(scripted.http, system_prompt="#schedule:S") as session:
        await speak_for(session, 1.0)
        session.force_listen()
        await speak_for(session, 1.0)
        speaking, interrupted = await results(session, 2)
        assert not speaking.is_listen and interrupted.is_listen


async def test_pause_resume_and_update(scripted: Server):
    async with Duplex(scripted.http, system_prompt="#schedule:L") as session:
        await session.pause(timeout=30)
        assert (await session.wait_for(Paused, timeout=5)).timeout == 30
        await session.resume()
        await session.wait_for(Resumed, timeout=5)
        await session.update(system_prompt="#schedule:S", voice=np.full(8000, 0.1, np.float32))
        updated = await session.wait_for(Updated, timeout=5)
        assert updated.warnings == []
        await speak_for(session, 1.0)
        (result,) = await results(session, 1)
        assert not result.is_listen and "(voice: 0.50 s reference)" in result.text


async def test_a_failed_unit_is_an_event_and_the_units_go_on(scripted: Server):
    async with Duplex(scripted.http, system_prompt="#fail-unit:0 #schedule:L") as session:
        await speak_for(session, 2.0)
        error = await session.wait_for(ServerError, timeout=10)
        assert error.code == "inference_error"
        (after,) = await results(session, 1)
        assert after.is_listen
