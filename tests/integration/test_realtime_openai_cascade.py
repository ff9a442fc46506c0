"""OpenAI's Realtime API (GA) on the real embedded engine, with the ``openai``
SDK unchanged: a spoken question (espeak-ng) heard by server VAD gets the
user's transcript and a spoken answer with its transcript; and a voice
session with a ``get_weather`` tool whose language model is a real
OpenAI-compatible server the test starts (llama-cpp-python's own server over
the packaged SmolLM2, with its ``chatml-function-calling`` format) makes the
call, takes its output and answers."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect as ws_connect

from tests.integration.test_realtime_openai import connect, pcm24, until
from tests.llm_server import serve_llm
from tests.servers import Server
from tests.speech import WEATHER_QUESTION, silence, speak

pytestmark = pytest.mark.cascade
QUESTION = "What is the capital of France?"
VOICE_SESSION = {
    "type": "realtime",
    "instructions": "You are a helpful voice assistant.",
    "audio": {
        "input": {
            "transcription": {"model": "whisper-base"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 600},
        }
    },
}


def stream_speech(
    connection, speech: np.ndarray, pause_s: float = 0.02, stop: asyncio.Event | None = None
):
    """The speech as 100 ms pieces of audio/pcm, ``pause_s`` apart (0.1: as a
    microphone sends them), stopping early once ``stop`` is set."""
    encoded = pcm24(speech)
    step = 6400  # 100 ms of 24 kHz 16-bit audio, base64

    async def send() -> None:
        for start in range(0, len(encoded), step):
            if stop is not None and stop.is_set():
                return
            await connection.input_audio_buffer.append(audio=encoded[start : start + step])
            await asyncio.sleep(pause_s)

    return send()


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-cpp-python's OpenAI-compatible server over the packaged GGUF."""
    yield from serve_llm(tmp_path_factory.mktemp("llm"))


def cascade_server(tmp: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    server = Server(tmp, engine="cascade", env=env).start()
    try:
        asyncio.run(server.wait_ready(timeout=180, workers=1))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from cascade_server(tmp_path_factory.mktemp("cascade-openai"))


@pytest.fixture(scope="module")
def cascade_with_tools(
    tmp_path_factory: pytest.TempPathFactory, llm_server: str
) -> Iterator[Server]:
    env = {"OMNILIVE_CASCADE__LLM__URL": llm_server}
    yield from cascade_server(tmp_path_factory.mktemp("cascade-tools"), env)


async def test_a_spoken_question_gets_a_spoken_answer_and_transcripts(cascade: Server):
    speech = np.concatenate([silence(0.6), speak(QUESTION), silence(1.5)])
    async with connect(cascade) as connection:
        await until(connection, "session.created")
        await connection.session.update(session=VOICE_SESSION)
        await until(connection, "session.updated")
        sender = asyncio.create_task(stream_speech(connection, speech))
        done, seen = await until(connection, "response.done", timeout=120)
        await sender
    kinds = [e.type for e in seen]
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index(
        "input_audio_buffer.speech_stopped"
    )
    heard = next(e for e in seen if e.type.endswith("input_audio_transcription.completed"))
    assert "capital" in heard.transcript.lower()  # Whisper base hears espeak-ng's "France" poorly
    audio = b"".join(
        base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta"
    )
    assert len(audio) >= 24_000 * 2 * 0.5  # at least half a second of speech
    spoken = np.frombuffer(audio, "<i2").astype(np.float32) / 32768
    assert float(np.sqrt(np.mean(spoken**2))) > 0.01
    transcript = next(e for e in seen if e.type == "response.output_audio_transcript.done")
    assert transcript.transcript.strip()
    assert done.response.status == "completed"
    assert done.response.output[0].content[0].transcript == transcript.transcript


async def test_tools_need_a_model_that_takes_them(cascade: Server):
    async with connect(cascade) as connection:
        await until(connection, "session.created")
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
        await connection.session.update(session={"type": "realtime", "tools": [tool]})
        error, _ = await until(connection, "error", timeout=30)
        assert error.error.code == "unsupported" and "cascade.llm.url" in error.error.message
        updated, _ = await until(connection, "session.updated", timeout=30)
        assert updated.session.tools == []  # the rest of the update stands


async def test_a_spoken_conversation_with_a_tool_call(cascade_with_tools: Server):
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
    session = {
        **VOICE_SESSION,
        "tools": [weather],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    speech = np.concatenate([silence(0.6), speak(WEATHER_QUESTION), silence(1.5)])
    async with connect(cascade_with_tools) as connection:
        await until(connection, "session.created")
        await connection.session.update(session=session)
        await until(connection, "session.updated")
        sender = asyncio.create_task(stream_speech(connection, speech))
        done, seen = await until(connection, "response.done", timeout=120)
        await sender
        call = next(item for item in done.response.output if item.type == "function_call")
        assert call.name == "get_weather"
        arguments = json.loads(call.arguments)
        assert isinstance(arguments, dict) and "city" in arguments
        deltas = [e for e in seen if e.type == "response.function_call_arguments.delta"]
        assert "".join(e.delta for e in deltas) == call.arguments
        output = {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": json.dumps({"city": "London", "forecast": "sunny", "celsius": 21}),
        }
        await connection.conversation.item.create(item=output)
        await until(connection, "conversation.item.done")
        await connection.response.create(response={"tool_choice": "none"})
        done, seen = await until(connection, "response.done", timeout=120)
    assert done.response.status == "completed"
    answer = done.response.output[0]
    assert answer.type == "message" and answer.content[0].transcript.strip()
    assert any(e.type == "response.output_audio.delta" for e in seen)


async def test_a_side_whisper_transcribes_for_an_engine_that_does_not(tmp_path: Path):
    """MiniCPM-o hears speech as audio; a Whisper beside it (here beside the
    scripted engine, told not to transcribe) gives the user's transcript."""
    env = {"OMNILIVE_SCRIPTED__TRANSCRIBES": "false", "OMNILIVE_TRANSCRIPTION__WHISPER": "true"}
    server = Server(tmp_path, env=env).start()
    speech = np.concatenate([silence(0.6), speak(QUESTION), silence(1.5)])
    try:
        await server.wait_ready(workers=1)
        async with connect(server) as connection:
            await until(connection, "session.created")
            await connection.session.update(session=VOICE_SESSION)
            await until(connection, "session.updated")
            sender = asyncio.create_task(stream_speech(connection, speech))
            heard, _ = await until(
                connection, "conversation.item.input_audio_transcription.completed", timeout=120
            )
            await sender
        assert "capital" in heard.transcript.lower()
    finally:
        server.stop()


async def test_semantic_vad_judges_the_turn_by_meaning(cascade: Server):
    """``semantic_vad`` with low eagerness waits 1.2 s of silence, unless the
    worker's end-of-turn model finds the question finished sooner."""
    session = {
        "type": "realtime",
        "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}},
    }
    # Whisper hears it whole however it is padded (12 of 12 paddings; "the
    # weather in Paris" became "the winner" in 2, CPU by CPU, and the words'
    # judge then rightly waits), and the language model finds it finished (p 0.68).
    question = "What is your name?"
    speech = np.concatenate([silence(0.6), speak(question)])

    turn_ended = asyncio.Event()

    async def microphone(connection) -> None:
        await stream_speech(connection, speech, pause_s=0.1)
        # The silence at a tenth of real time until the turn ends: the
        # judgement takes wall-clock time (Whisper, then the language model),
        # which a loaded 2-core machine stretched past the rule's 1.2 s of
        # audio even at a third of real time (CI, 1.4 s); the turn's end is
        # measured in audio time either way.
        await stream_speech(connection, silence(2.0), pause_s=1.0, stop=turn_ended)

    async with connect(cascade) as connection:
        await until(connection, "session.created")
        await connection.session.update(session=session)
        updated, _ = await until(connection, "session.updated")
        assert updated.session.audio.input.turn_detection.type == "semantic_vad"
        sender = asyncio.create_task(microphone(connection))
        stopped, _ = await until(connection, "input_audio_buffer.speech_stopped", timeout=60)
        turn_ended.set()
        done, _ = await until(connection, "response.done", timeout=120)
        await sender
    spoken_ms = (0.6 + speak(question).size / 16_000) * 1000
    assert stopped.audio_end_ms - spoken_ms < 1200  # judged before the silence rule
    assert done.response.status == "completed"


async def test_truncation_disabled_refuses_an_answer_past_the_context(cascade: Server):
    """``truncation: "disabled"``: a conversation past the cascade's context
    (2048 tokens) is not cut; the answer fails with context_length_exceeded
    and the session goes on; with "auto" the oldest items leave and it answers."""
    words = " ".join(["tea"] * 400)  # a few hundred tokens an item
    session = {"type": "realtime", "output_modalities": ["text"], "truncation": "disabled"}
    async with connect(cascade) as connection:
        await until(connection, "session.created")
        await connection.session.update(session=session)
        updated, _ = await until(connection, "session.updated")
        assert updated.session.truncation == "disabled"
        for index in range(8):
            text = {"type": "input_text", "text": f"Note {index}: {words}."}
            item = {"type": "message", "role": "user", "content": [text]}
            await connection.conversation.item.create(item=item)
            await until(connection, "conversation.item.done")
        await connection.response.create()
        done, seen = await until(connection, "response.done", timeout=120)
        assert done.response.status == "failed"
        assert done.response.status_details.error.code == "context_length_exceeded"
        assert any(e.type == "error" and e.error.code == "context_length_exceeded" for e in seen)
        await connection.session.update(session={"type": "realtime", "truncation": "auto"})
        await until(connection, "session.updated")
        await connection.response.create()
        done, _ = await until(connection, "response.done", timeout=120)
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].text.strip()


async def test_the_items_the_model_no_longer_sees_are_named(cascade: Server):
    """With omnilive's extensions, each time the truncation lets the oldest
    items go (a retention ratio under a 120-token limit), the client is told
    which, oldest first, and which is now the oldest the model sees; the
    answers go on. A plain OpenAI client hears none of it (its SDK's union
    has no such event)."""
    session = {
        "type": "realtime",
        "output_modalities": ["text"],
        "max_output_tokens": 12,
        "truncation": {
            "type": "retention_ratio",
            "retention_ratio": 0.5,
            "token_limits": {"post_instructions": 120},
        },
    }
    url = f"{cascade.ws}/v1/realtime?model=gpt-realtime&omnilive_extensions=true"
    async with ws_connect(url) as ws:

        async def read_until(kind: str) -> list[dict]:
            seen: list[dict] = []
            async with asyncio.timeout(120):
                while not seen or seen[-1]["type"] != kind:
                    seen.append(json.loads(await ws.recv()))
            return seen

        async def send(event: dict) -> list[dict]:
            await ws.send(json.dumps(event))
            return await read_until(DONE[event["type"]])

        await read_until("session.created")
        await send({"type": "session.update", "session": session})
        items: list[str] = []
        told: list[dict] = []
        for index in range(8):
            text = f"Note {index}: the tea shop on street {index} opens at nine every day."
            content = [{"type": "input_text", "text": text}]
            item = {"type": "message", "role": "user", "content": content}
            seen = await send({"type": "conversation.item.create", "item": item})
            added = next(e for e in seen if e["type"] == "conversation.item.added")
            items.append(added["item"]["id"])
            seen += await send({"type": "response.create"})
            done = seen[-1]["response"]
            assert done["status"] == "completed"
            items += [output["id"] for output in done["output"]]
            told += [e for e in seen if e["type"] == "omnilive.conversation.context"]
    assert told, "the conversation passed its limit, and no item was said to be let go"
    dropped = [i for event in told for i in event["dropped_item_ids"]]
    assert dropped == items[: len(dropped)]  # the oldest, in order, each once
    last = told[-1]
    assert last["dropped_items"] == len(dropped) < len(items)
    assert last["oldest_item_id"] == items[len(dropped)]


DONE = {
    "session.update": "session.updated",
    "conversation.item.create": "conversation.item.done",
    "response.create": "response.done",
}
