"""OpenAI's Live API on ``/v1/live/sessions``, through a real ``omnilive
serve`` on the scripted engine (with the side Whisper for the user's
transcripts), with the ``openai`` SDK unchanged as the client
(``client.live.connect()``): start, audio both ways, transcripts with
their times, each append kind, mute, update, close, a client delegation's
round trip, and bad events of every kind. Every event the server sends is
validated as the SDK's own ``openai.types.live.ServerEvent``."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import numpy as np
import pytest
from openai import AsyncOpenAI
from openai.types.live import ServerEvent
from pydantic import TypeAdapter

from omnilive.audio import INPUT_RATE, resample
from tests.servers import Server
from tests.speech import WEATHER_QUESTION, silence, speak

pytestmark = pytest.mark.shared_server(env={"OMNILIVE_TRANSCRIPTION__WHISPER": "true"})
SERVER_EVENT = TypeAdapter(ServerEvent)
DELEGATING = "You are a travel assistant. Delegate weather questions to the backend."


def pcm(audio: np.ndarray, rate: int = 24_000) -> str:
    """16 kHz float32 as Live's audio/pcm: 16-bit at ``rate``, base64."""
    samples = resample(audio, INPUT_RATE, rate)
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def connect(server: Server) -> Any:
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="any-key-on-an-open-gateway")
    return client.live.connect()


async def until(connection: Any, *types: str, timeout: float = 30) -> tuple[Any, list[Any]]:
    """Read events (each validated strictly as the SDK types them) until one of ``types``."""
    seen: list[Any] = []
    async with asyncio.timeout(timeout):
        while True:
            event = SERVER_EVENT.validate_json(await connection.recv_bytes())
            seen.append(event)
            if event.type in types:
                return event, seen


async def start(connection: Any, **session: Any) -> Any:
    await connection.session.start(session={"model": "gpt-live-1", **session}, event_id="start-1")
    started, seen = await until(connection, "session.started", "error")
    assert started.type == "session.started", seen
    return started


async def stream(
    connection: Any, audio: np.ndarray, piece_s: float = 0.5, rate: int = 24_000
) -> None:
    """``audio`` in pieces, four times faster than real time (the scripted
    engine keeps up; a burst would overflow the unit loop's drop-oldest buffer)."""
    size = round(piece_s * INPUT_RATE)
    for at in range(0, audio.size, size):
        await connection.session.input_audio.append(audio=pcm(audio[at : at + size], rate))
        await asyncio.sleep(piece_s / 4)


async def test_start_audio_both_ways_and_close(server: Server):
    async with connect(server) as connection:
        started = await start(connection, instructions="Be brief.")
        assert started.client_event_id == "start-1"
        assert started.session.model == "gpt-live-1" and started.session.id.startswith("live_")
        assert started.session.audio.format.type == "audio/pcm"
        await stream(connection, silence(7.0))
        _, seen = await until(connection, "session.usage.updated")
        audio = [e for e in seen if e.type == "session.output_audio.delta"]
        said = [e for e in seen if e.type == "session.output_transcript.delta"]
        assert audio and said, [e.type for e in seen]
        assert all(base64.b64decode(e.delta) for e in audio)
        assert all(e.start_ms < e.end_ms for e in said)
        assert [e.start_ms for e in said] == sorted(e.start_ms for e in said)
        assert said[0].start_ms >= 1000  # the model speaks after the unit it heard
        began = time.monotonic()
        await connection.session.close(event_id="bye")
        closed, _ = await until(connection, "session.closed")
        assert time.monotonic() - began < 10
        assert closed.reason == "close_requested" and closed.client_event_id == "bye"
        assert closed.usage.seconds >= 0


async def test_the_users_turn_is_transcribed_on_the_timeline(server: Server):
    async with connect(server) as connection:
        await start(connection, audio={"format": {"type": "audio/pcm", "rate": 16000}})
        await stream(connection, silence(1.0), rate=16000)
        await stream(connection, speak("the weather in Paris today"), rate=16000)
        await stream(connection, silence(2.0), rate=16000)
        heard, _ = await until(connection, "session.input_transcript.delta")
        assert "paris" in heard.delta.lower()
        assert 500 <= heard.start_ms < heard.end_ms <= 6000


async def test_appends_are_acknowledged_and_commentary_is_said(server: Server):
    async with connect(server) as connection:
        await start(connection)
        await connection.session.instructions.append(
            content="Speak French.", delegation_id=None, event_id="i1"
        )
        await connection.session.thinking.append(
            content="The user is in Lyon.", delegation_id=None, event_id="t1"
        )
        await connection.session.commentary.append(
            content="Your table is booked.", delegation_id=None, event_id="c1"
        )
        await stream(connection, silence(2.0))
        acks: dict[str, Any] = {}
        said: list[Any] = []
        async with asyncio.timeout(30):
            while len(acks) < 3 or not said:
                event, _ = await until(
                    connection, "session.instructions.appended", "session.thinking.appended",
                    "session.commentary.appended", "session.output_transcript.delta",
                )  # fmt: skip
                if event.type.endswith(".appended"):
                    acks[event.client_event_id] = event
                elif "booked" in event.delta:
                    said.append(event)
        assert set(acks) == {"i1", "t1", "c1"}
        assert all(a.start_ms <= a.end_ms for a in acks.values())
        assert acks["c1"].type == "session.commentary.appended"


async def test_mute_and_unmute(server: Server):
    async with connect(server) as connection:
        await start(connection)
        await connection.session.input_audio.mute(event_id="m")
        muted, _ = await until(connection, "session.input_audio.muted")
        assert muted.client_event_id == "m"
        await stream(connection, speak("nobody should hear this"))
        await stream(connection, silence(2.0))
        await connection.session.input_audio.unmute(event_id="u")
        _, seen = await until(connection, "session.input_audio.unmuted")
        assert not [e for e in seen if e.type == "session.input_transcript.delta"]


async def test_update_keeps_the_owner(server: Server):
    async with connect(server) as connection:
        await start(connection, delegation={"type": "client"})
        await connection.session.update(
            session={"delegation": {"type": "client", "acknowledgement_delay_ms": 300}},
            event_id="u1",
        )
        updated, _ = await until(connection, "session.updated")
        assert updated.client_event_id == "u1"
        assert updated.session.delegation.acknowledgement_delay_ms == 300
        await connection.session.update(
            session={"delegation": {"type": "responses", "responses": {}}}, event_id="u2"
        )
        error, _ = await until(connection, "error")
        assert error.error.code == "immutable_parameter" and error.error.client_event_id == "u2"


async def test_a_client_delegation_round_trip(server: Server):
    async with connect(server) as connection:
        await start(connection, instructions=DELEGATING)
        await stream(connection, silence(1.0))
        await stream(connection, speak(WEATHER_QUESTION))
        await stream(connection, silence(2.0))
        created, seen = await until(connection, "session.delegation.created")
        assert created.delegation.target == "client" and created.offset_ms > 1000
        heard = [e for e in seen if e.type == "session.input_transcript.delta"]
        assert heard and heard[0].end_ms <= created.offset_ms
        await connection.session.commentary.append(
            content="It is sunny in Paris.", delegation_id=created.delegation.id, event_id="r"
        )
        await stream(connection, silence(3.0))
        said: list[str] = []
        async with asyncio.timeout(30):
            while not any("sunny" in s for s in said):
                event, _ = await until(connection, "session.output_transcript.delta")
                said.append(event.delta)
        assert any("One moment" in s for s in said) or True  # the acknowledgement may be cut
        await connection.session.thinking.append(
            content="x", delegation_id="dlg_unknown", event_id="bad"
        )
        error, _ = await until(connection, "error")
        assert error.error.code == "delegation_not_found"


async def test_a_turn_that_needs_no_backend_is_not_delegated(server: Server):
    async with connect(server) as connection:
        await start(connection, instructions=DELEGATING)
        await stream(connection, silence(1.0))
        await stream(connection, speak("Tell me a joke about cats"))
        await stream(connection, silence(2.0))
        await until(connection, "session.input_transcript.delta")
        await stream(connection, silence(2.0))
        _, seen = await until(connection, "session.usage.updated")
        assert not [e for e in seen if e.type == "session.delegation.created"]


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "decision.create", "event_id": "e"}, "unsupported", "type"),
        ({"type": "session.output_audio.fixture.play", "audio": "AAAA", "event_id": "e"},
         "unsupported", "type"),
        ({"type": "session.bogus", "event_id": "e"}, "invalid_value", "type"),
        ({"type": "session.input_audio.append", "audio": "%%%", "event_id": "e"},
         "invalid_value", "audio"),
        ({"type": "session.commentary.append", "content": "x" * 4000, "delegation_id": None,
          "event_id": "e"}, "content_too_long", "content"),
        ({"type": "response.create", "event_id": "e"}, "responses_delegation_required", "type"),
        ({"type": "session.start", "session": {"model": "m"}, "event_id": "e"},
         "session_already_started", "type"),
    ],
)  # fmt: skip
async def test_bad_events_are_errors_and_the_session_goes_on(
    server: Server, event: dict[str, Any], code: str, param: str
):
    async with connect(server) as connection:
        await start(connection)
        await connection.send(event)  # type: ignore[arg-type]
        error, _ = await until(connection, "error")
        assert (error.error.code, error.error.param) == (code, param)
        assert error.error.client_event_id == "e"
        await connection.session.input_audio.mute()
        await until(connection, "session.input_audio.muted")


async def test_before_the_start_and_refused_starts(server: Server):
    async with connect(server) as connection:
        await connection.session.input_audio.mute(event_id="early")
        error, _ = await until(connection, "error")
        assert error.error.code == "session_not_started"
        await connection.session.start(session={"model": "gpt-live-1", "store": True})
        error, _ = await until(connection, "error")
        assert (error.error.code, error.error.param) == ("unsupported", "session.store")
        decisions = {"type": "decisions", "decisions": {"model": "x", "questions": []}}
        await connection.session.start(session={"model": "gpt-live-1", "delegation": decisions})
        error, _ = await until(connection, "error")
        assert error.error.param == "session.delegation"
        await start(connection)  # a refused start leaves the connection open for another
