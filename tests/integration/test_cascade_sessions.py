"""Every session mode end to end on the real embedded engine (cascade), with
spoken questions made by espeak-ng: the model hears, answers and speaks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator

import numpy as np
import pytest
from openbmb_realtime import AudioDelta, RealtimeClient, TextDelta
from websockets.asyncio.client import connect

from tests.clients import open_client, spoken_turn
from tests.servers import Server, chat_once, user
from tests.speech import chunks_b64, silence, speak

pytestmark = pytest.mark.cascade
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("cascade"), engine="cascade").start()
    try:
        asyncio.run(server.wait_ready(timeout=180, workers=1))
        yield server
    finally:
        server.stop()


def audio_of(b64: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), "<f4")


async def test_chat_text_question_gets_a_spoken_answer(cascade: Server):
    messages = await chat_once(cascade, user("Say hello in one short sentence."), timeout=60)
    done = messages[-1]
    assert done["type"] == "done" and done["text"].strip()
    audio = [audio_of(m["audio_data"]) for m in messages if m.get("audio_data")]
    assert audio and sum(a.size for a in audio) > 24000 * 0.3
    assert max(np.abs(a).max() for a in audio) > 0.05


async def test_chat_image_is_refused_naming_the_capability(cascade: Server):
    image = {"type": "image", "data": base64.b64encode(b"\xff\xd8\xff").decode()}
    messages = await chat_once(cascade, {"messages": [{"role": "user", "content": [image]}]})
    assert messages[-1]["code"] == "unsupported_capability"
    assert "vision" in messages[-1]["error"]


async def test_half_duplex_spoken_question(cascade: Server):
    client = await open_client(cascade)
    done, chunks = await spoken_turn(client, QUESTION, timeout=60)
    assert done["turn_index"] == 0 and done["text"].strip()
    assert chunks and max(np.abs(audio_of(c["audio_data"])).max() for c in chunks) > 0.05
    generating = next(m for m in client.received if m["type"] == "generating")
    assert 1000 < generating["speech_duration_ms"] < 4000
    await client.send({"type": "stop"})
    await client.until("stopped")


async def stream_question(send_chunk, answered, seconds_before: float = 2.0) -> None:
    """The question, then silence as a live microphone sends it, until
    ``answered()``: the answer is spoken a unit at a time, so it needs units
    to come, and on a busy CPU it starts later (the Piper voice takes
    ~0.2-0.7 s a sentence)."""
    audio = np.concatenate([silence(seconds_before), speak(QUESTION)])
    deadline = asyncio.get_running_loop().time() + 120
    chunks = iter(chunks_b64(audio, seconds=1.0))
    while not answered():
        assert asyncio.get_running_loop().time() < deadline, "no whole answer in 120 s"
        await send_chunk(next(chunks, None) or chunks_b64(silence(1.0), seconds=1.0)[0])
        await asyncio.sleep(0.4)  # faster than real time, slower than the unit loop


async def test_duplex_spoken_question_gets_a_spoken_answer_while_chunks_flow(cascade: Server):
    client = await open_client(cascade, path="/ws/duplex", query="?mode=omni")
    prepared = await client.prepare("Answer in one short sentence.")
    assert prepared["vision"] is False  # this engine cannot see, and says so

    async def send(chunk: str) -> None:
        await client.send({"type": "audio_chunk", "audio_base64": chunk})

    async def read() -> None:
        while True:
            await client.recv(timeout=120)

    def results() -> list[dict]:
        return [m for m in client.received if m["type"] == "result"]

    reader = asyncio.create_task(read())
    await stream_question(send, lambda: any(r["end_of_turn"] for r in results()))
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    listens = [r["is_listen"] for r in results()]
    assert listens[0] is True, "it listens while the user speaks"
    spoken = [r for r in results() if not r["is_listen"]]
    assert spoken, "it answered"
    assert "".join(r["text"] for r in spoken).strip()
    assert max(np.abs(audio_of(r["audio_data"])).max() for r in spoken if r["audio_data"]) > 0.05
    first_speak = results().index(spoken[0])
    assert all(r["is_listen"] for r in results()[:first_speak])


async def test_realtime_spoken_question(cascade: Server):
    async with connect(f"{cascade.ws}/v1/realtime?mode=audio", max_size=None) as ws:
        events: list[dict] = []

        async def until(kind: str) -> dict:
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                events.append(event)
                if event["type"] == kind:
                    return event

        await until("session.queue_done")
        session = {"instructions": "Answer in one short sentence."}
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await until("session.created")

        async def send(chunk: str) -> None:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))

        def deltas() -> list[dict]:
            return [e for e in events if e["type"] == "response.output_audio.delta"]

        reader = asyncio.create_task(until("never"))
        await stream_question(send, lambda: any(d["end_of_turn"] for d in deltas()))
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        sizes = [audio_of(d["audio"]).size for d in deltas()]
        assert deltas()[-1]["end_of_turn"] is True  # the turn's last delta says so
        assert all(size == 24000 for size in sizes[1:-1])
        assert "".join(d["text"] for d in deltas()).strip()
        await ws.send(json.dumps({"type": "session.close"}))
        assert (await until("session.closed"))["reason"] == "stopped"


async def test_realtime_newer_dialect_spoken_question_through_the_sdk(cascade: Server):
    """The public SDK, as a microphone app uses it: 100 ms pieces of speech."""
    client = RealtimeClient(api_key="open-gateway", base_url=cascade.http)
    session = await client.audio.connect(model="m", system_prompt="Answer in one short sentence.")
    audio = np.concatenate([silence(1.0), speak(QUESTION), silence(8.0)]).astype("<f4")
    events: list = []

    async def microphone() -> None:
        for start in range(0, audio.size, 1600):
            await session.send_audio(audio[start : start + 1600].tobytes())
            await asyncio.sleep(0.05)  # twice real time

    async def listen() -> None:
        async for event in session:
            events.append(event)

    sender = asyncio.create_task(microphone())
    reader = asyncio.create_task(listen())
    await asyncio.wait_for(sender, 60)
    await asyncio.sleep(2.0)
    await session.close()
    await asyncio.wait_for(reader, 15)
    answer = "".join(e.text for e in events if isinstance(e, TextDelta)).strip()
    spoken = [np.frombuffer(e.audio, "<f4") for e in events if isinstance(e, AudioDelta)]
    assert answer and spoken and max(np.abs(s).max() for s in spoken) > 0.05
    usage = session.usage
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0
