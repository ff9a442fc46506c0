"""``HalfDuplex`` against a real server: scripted engine, the server's real
Silero VAD, spoken questions made by espeak-ng."""

from __future__ import annotations

import numpy as np
import pytest

from omnilive.client import (
    Chunk,
    Generating,
    HalfDuplex,
    Prepared,
    ServerError,
    SessionState,
    SessionTimeout,
    Stopped,
    TurnDone,
    VadState,
)
from omnilive.client.errors import InvalidRequestError, SessionClosedError
from tests.servers import Server
from tests.speech import silence, speak

QUESTION = np.concatenate([silence(0.8), speak("What is the weather like in Paris?"), silence(1.2)])


async def a_turn(session: HalfDuplex) -> list:
    await session.send(QUESTION)
    events = []
    async for event in session:
        events.append(event)
        if isinstance(event, TurnDone | ServerError):
            return events
    raise AssertionError("the session ended without a turn")


async def test_a_spoken_turn_end_to_end(scripted: Server):
    voice = np.full(16000, 0.05, np.float32)
    async with HalfDuplex(scripted.http, system_prompt="Be brief.", voice=voice) as session:
        assert session.state is SessionState.ACTIVE and session.queue.done
        events = await a_turn(session)
        assert not session.answering
        assert isinstance(await session.stop(), Stopped)
    kinds = [type(e) for e in events]
    assert kinds[:2] == [type(events[0]), Prepared]  # after the queue's own events
    turn = kinds[kinds.index(Prepared) + 1 :]
    assert turn[:3] == [VadState, VadState, Generating] and turn[-1] is TurnDone
    vad = [e.speaking for e in events if isinstance(e, VadState)]
    assert vad == [True, False]
    done = events[-1]
    assert done.turn_index == 0 and done.text.startswith("Turn 0: heard")
    assert done.text.endswith("(voice: 1.00 s reference).")
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert "".join(c.text for c in chunks) == done.text
    assert all(c.audio is not None and c.audio.size for c in chunks)
    with pytest.raises(SessionClosedError):
        await session.send(QUESTION)


async def test_a_failed_turn_is_an_event_and_the_session_goes_on(scripted: Server):
    async with HalfDuplex(scripted.http, system_prompt="#fail-turn:0", tts=False) as session:
        failed = await a_turn(session)
        assert isinstance(failed[-1], ServerError) and failed[-1].code == "inference_error"
        again = await a_turn(session)
        assert isinstance(again[-1], TurnDone)  # the failed turn was rolled back:
        assert again[-1].turn_index == 0 and "earlier turns: none" in again[-1].text
        assert all(e.audio is None for e in again if isinstance(e, Chunk))


async def test_the_inactivity_timeout_ends_the_session_without_an_error(scripted: Server):
    session = HalfDuplex(scripted.http, timeout_s=0.5)
    async with session:
        events = [event async for event in session]
    assert isinstance(events[-1], SessionTimeout) and session.ending is events[-1]
    assert session.state is SessionState.CLOSED


async def test_a_bad_voice_id_is_refused_and_the_session_waits(scripted: Server):
    session = HalfDuplex(scripted.http, voice="no_such_voice")
    await session.open()
    try:
        error = await session.wait_for(ServerError, timeout=10)
        assert isinstance(error.exception(), InvalidRequestError)
        assert session.state is SessionState.CONFIGURING  # "waits for a corrected message"
    finally:
        await session.close()
    assert session.state is SessionState.CLOSED
