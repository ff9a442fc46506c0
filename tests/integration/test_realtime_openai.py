"""OpenAI's Realtime API (GA) on ``/v1/realtime``, through a real
``omnilive serve`` on the scripted engine, with the ``openai`` SDK unchanged
as the client: conversation items, responses, tools, audio turns (manual
commit and server VAD), cancel, truncate, and bad events of every kind."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from typing import Any

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI

from omnilive.audio import INPUT_RATE, resample
from tests.clients import owned_task
from tests.servers import Server
from tests.speech import silence, speak

pytestmark = pytest.mark.shared_server

MODEL = "omnilive-realtime"


def pcm24(audio: np.ndarray) -> str:
    """16 kHz float32 as the GA API's audio/pcm: 24 kHz 16-bit, base64."""
    samples = resample(audio, INPUT_RATE, 24_000)
    return base64.b64encode((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def connect(server: Server, model: str = MODEL, **options: Any) -> Any:
    """The SDK's connection; ``options`` for its websocket (``ping_interval``...)."""
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="any-key-on-an-open-gateway")
    return client.realtime.connect(model=model, websocket_connection_options=options)


async def until(connection: Any, *types: str, timeout: float = 30) -> tuple[Any, list[Any]]:
    """Read events until one of ``types``; returns it and everything read."""
    seen: list[Any] = []
    async with asyncio.timeout(timeout):
        async for event in connection:
            seen.append(event)
            if event.type in types:
                return event, seen
    raise AssertionError(f"the connection closed before {types}: {[e.type for e in seen]}")


async def text_session(connection: Any, **session: Any) -> None:
    created, _ = await until(connection, "session.created")
    assert created.session.id.startswith("sess_")
    await connection.session.update(
        session={"type": "realtime", "output_modalities": ["text"], **session}
    )
    updated, _ = await until(connection, "session.updated")
    assert updated.session.output_modalities == ["text"]


async def say(connection: Any, text: str) -> None:
    await connection.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )


async def test_a_text_only_session(server: Server):
    async with connect(server) as connection:
        await text_session(connection, instructions="Be brief.")
        await say(connection, "hello there")
        added, _ = await until(connection, "conversation.item.added")
        assert added.item.role == "user" and added.item.content[0].text == "hello there"
        await connection.response.create()
        done, seen = await until(connection, "response.done")
        kinds = [e.type for e in seen]
        assert kinds.index("response.created") < kinds.index("response.output_item.added")
        assert "response.output_audio.delta" not in kinds
        text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
        assert text == "Answered: hello there"
        assert next(e for e in seen if e.type == "response.output_text.done").text == text
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].text == text
        assert done.response.usage.output_tokens > 0


async def test_a_tool_call_and_its_output(server: Server):
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    async with connect(server) as connection:
        await text_session(connection, tools=[weather], tool_choice="auto")
        await say(connection, "get_weather in Paris")
        await connection.response.create()
        done, seen = await until(connection, "response.done")
        call = done.response.output[0]
        assert call.type == "function_call" and call.name == "get_weather"
        deltas = [e.delta for e in seen if e.type == "response.function_call_arguments.delta"]
        finished = next(e for e in seen if e.type == "response.function_call_arguments.done")
        assert "".join(deltas) == finished.arguments == call.arguments
        assert json.loads(call.arguments) == {"text": "get_weather in Paris"}
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
        await connection.conversation.item.create(item=output)
        await connection.response.create()
        done, seen = await until(connection, "response.done")
        text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
        assert text == "Answered: sunny, 21 C"


async def test_items_retrieve_delete_and_errors_keep_the_session(server: Server):
    async with connect(server) as connection:
        await text_session(connection)
        await say(connection, "first")
        added, _ = await until(connection, "conversation.item.added")
        await connection.conversation.item.retrieve(item_id=added.item.id)
        retrieved, _ = await until(connection, "conversation.item.retrieved")
        assert retrieved.item.content[0].text == "first"
        await connection.conversation.item.delete(item_id=added.item.id)
        deleted, _ = await until(connection, "conversation.item.deleted")
        assert deleted.item_id == added.item.id
        bad: list[tuple[dict[str, Any] | str, str]] = [
            (
                {"type": "conversation.item.retrieve", "item_id": "nope", "event_id": "e1"},
                "item_not_found",
            ),
            ({"type": "no.such.event"}, "invalid_value"),
            ({"type": "conversation.item.create"}, "missing_required_parameter"),
            ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_value"),
            ({"type": "response.cancel"}, "response_cancel_not_active"),
            ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
            ({"type": "output_audio_buffer.clear"}, "unsupported"),
            (
                {"type": "session.update", "session": {"output_modalities": ["smell"]}},
                "invalid_value",
            ),
            ("[1, 2", "invalid_json"),
        ]
        for event, code in bad:
            raw = event if isinstance(event, str) else json.dumps(event)
            await connection.send_raw(raw)
            error, _ = await until(connection, "error")
            assert error.error.code == code, (event, error)
        await say(connection, "still here")
        await connection.response.create()
        done, _seen = await until(connection, "response.done")
        assert done.response.status == "completed"


async def test_a_spoken_turn_with_server_vad(server: Server):
    speech = np.concatenate([silence(0.6), speak("What is the weather like today?"), silence(1.5)])
    async with connect(server) as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {
                        "transcription": {"model": "whisper-1"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    }
                },
            }
        )
        await until(connection, "session.updated")
        encoded = pcm24(speech)
        step = 24_000 * 2 // 10 * 4 // 3  # 100 ms of base64 pcm16 at 24 kHz
        for start in range(0, len(encoded), step):
            await connection.input_audio_buffer.append(audio=encoded[start : start + step])
        done, seen = await until(connection, "response.done")
        kinds = [e.type for e in seen]
        for kind in (
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.input_audio_transcription.completed",
            "response.output_audio.delta",
            "response.output_audio_transcript.done",
        ):
            assert kind in kinds, kind
        transcript = next(e for e in seen if e.type.endswith("transcription.completed")).transcript
        assert transcript.endswith("s of speech")
        audio = b"".join(
            base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta"
        )
        assert len(audio) > 24_000 * 2 * 0.2 and len(audio) % 2 == 0
        assert done.response.output[0].content[0].transcript.startswith("Turn 0")
        assert done.response.usage.input_token_details.audio_tokens > 0  # the speech it heard


async def test_cancel_mid_answer_and_truncate(server: Server):
    async with connect(server) as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": "#latency:0.2",
                "audio": {"input": {"turn_detection": None}},
            }
        )
        await until(connection, "session.updated")
        await connection.input_audio_buffer.append(audio=pcm24(speak("Tell me a long story.")))
        await connection.input_audio_buffer.commit()
        await until(connection, "conversation.item.done")  # push to talk: no answer by itself
        await connection.response.create()
        _first, _ = await until(connection, "response.output_audio.delta")
        await connection.response.cancel()
        done, _seen = await until(connection, "response.done")
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "client_cancelled"
        item = done.response.output[0]
        assert item.status == "incomplete"
        await connection.conversation.item.truncate(
            item_id=item.id, content_index=0, audio_end_ms=0
        )
        truncated, _ = await until(connection, "conversation.item.truncated")
        assert truncated.item_id == item.id and truncated.audio_end_ms == 0
        await connection.conversation.item.retrieve(item_id=item.id)
        retrieved, _ = await until(connection, "conversation.item.retrieved")
        assert retrieved.item.content[0].transcript == ""
        await connection.conversation.item.truncate(
            item_id=item.id, content_index=0, audio_end_ms=10_000_000
        )
        error, _ = await until(connection, "error")
        assert error.error.code == "invalid_value" and error.error.param == "audio_end_ms"


async def test_push_to_talk_commits_without_answering(server: Server):
    """Turn detection off: a commit makes the user's item and no response;
    the client's own response.create is the one answer (it was refused
    ``conversation_already_has_active_response`` when the commit answered)."""
    async with connect(server) as connection:
        await text_session(connection, audio={"input": {"turn_detection": None}})
        await connection.input_audio_buffer.append(audio=pcm24(speak("Hello there.")))
        await connection.input_audio_buffer.commit()
        done, seen = await until(connection, "conversation.item.done")
        assert done.item.role == "user" and "response.created" not in [e.type for e in seen]
        await connection.response.create()
        answer, seen = await until(connection, "response.done")
        assert answer.response.status == "completed"
        await connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "x"}],
            }
        )
        _, after = await until(connection, "conversation.item.done", timeout=3)
    kinds = [e.type for e in seen + after]
    assert "error" not in kinds and "response.created" not in [e.type for e in after]


async def test_truncating_the_answer_in_progress_stops_it(server: Server):
    """The Agents SDKs' ``interrupt()`` truncates the item it is playing,
    which omnilive announced moments before (``conversation.item.added``):
    that answer stops, and its transcript is cut to what was heard."""
    async with connect(server) as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={"type": "realtime", "instructions": "#latency:0.3"}
        )
        await until(connection, "session.updated")
        await say(connection, "tell me about the sea")
        await connection.response.create()
        added, _ = await until(connection, "response.output_item.added")
        assert added.item.status == "in_progress"
        await until(connection, "response.output_audio.delta")
        await connection.conversation.item.truncate(
            item_id=added.item.id, content_index=0, audio_end_ms=0
        )
        truncated, seen = await until(connection, "conversation.item.truncated")
        done = next(e for e in seen if e.type == "response.done")
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "client_cancelled"
        assert truncated.item_id == added.item.id and "error" not in [e.type for e in seen]
        await connection.conversation.item.retrieve(item_id=added.item.id)
        retrieved, _ = await until(connection, "conversation.item.retrieved")
        assert retrieved.item.status == "incomplete" and retrieved.item.content[0].transcript == ""


@pytest.mark.parametrize("dialect_url", ["?mode=audio&model=x", "?mode=chat"])
async def test_minicpmo_clients_keep_their_dialect(server: Server, dialect_url: str):
    from websockets.asyncio.client import connect as ws_connect

    async with ws_connect(f"{server.ws}/v1/realtime{dialect_url}") as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert first["type"].startswith("session.queue")


async def test_an_ephemeral_key_in_openais_shape(tmp_path):
    key = "openai-dialect-key-0123456789"
    keys = json.dumps([{"key": key, "role": "user", "name": "t"}])
    server = Server(tmp_path, env={"OMNILIVE_AUTH__KEYS": keys}, api_key=key).start()
    try:
        await server.wait_ready(workers=1)
        async with httpx.AsyncClient() as http:
            url = f"{server.http}/v1/realtime/client_secrets"
            body = {
                "expires_after": {"anchor": "created_at", "seconds": 120},
                "session": {"type": "realtime", "instructions": "hi"},
            }
            answer = await http.post(url, json=body, headers=server.headers)
            refused = await http.post(url, json=body)
        assert answer.status_code == 200 and refused.status_code == 401
        secret = answer.json()
        assert secret["value"].startswith("ek_")  # what OpenAI's browser SDKs take
        assert secret["session"]["instructions"] == "hi"
        assert 0 < secret["expires_at"] - time.time() <= 121
        client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key=secret["value"])
        async with client.realtime.connect(model=MODEL) as connection:
            created, _ = await until(connection, "session.created")
            assert created.session.model == MODEL
        bad = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="not-a-key-of-this-gateway")
        with pytest.raises(Exception, match="401"):
            async with bad.realtime.connect(model=MODEL) as connection:
                await connection.recv()
    finally:
        server.stop()


async def test_out_of_band_responses_and_audio_items(server: Server):
    async with connect(server) as connection:
        await text_session(connection)
        await say(connection, "keep me")
        kept, _ = await until(connection, "conversation.item.done")
        question = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "classify this"}],
        }
        await connection.response.create(
            response={
                "conversation": "none",
                "metadata": {"topic": "triage"},
                "input": [{"type": "item_reference", "id": kept.item.id}, question],
            }
        )
        done, seen = await until(connection, "response.done")
        assert done.response.conversation_id is None
        assert done.response.metadata == {"topic": "triage"}
        assert done.response.output[0].content[0].text == "Answered: classify this"
        assert "conversation.item.added" not in [e.type for e in seen]
        audio = pcm24(speak("Hello there, how are you?"))
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_audio", "audio": audio}],
        }
        await connection.conversation.item.create(item=item)
        heard, _ = await until(connection, "conversation.item.done")
        assert heard.item.content[0].transcript.endswith("s of speech")
        await connection.response.create()
        done, _ = await until(connection, "response.done")
        assert done.response.output[0].content[0].text.startswith("Turn 0: heard")
        await connection.conversation.item.retrieve(item_id=kept.item.id)
        retrieved, _ = await until(connection, "conversation.item.retrieved")
        assert retrieved.item.content[0].text == "keep me"  # the conversation is untouched
        bad = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "input_audio", "audio": audio}],
        }
        await connection.conversation.item.create(item=bad)
        error, _ = await until(connection, "error")
        assert error.error.code == "invalid_value" and error.error.param == "item.content"


# --- the full-duplex loop (a model named *-duplex) -------------------------------------------


async def duplex_session(connection: Any, schedule: str, **audio_input: Any) -> None:
    await until(connection, "session.created")
    await connection.session.update(
        session={
            "type": "realtime",
            "instructions": f"#schedule:{schedule}",
            "audio": {"input": {"turn_detection": None, **audio_input}},
        }
    )
    await until(connection, "session.updated")


async def stream_audio(connection: Any, audio: np.ndarray, pace: float = 0.5) -> None:
    """100 ms pieces at ``pace`` times real time."""
    encoded = pcm24(audio)
    step = 6400
    for start in range(0, len(encoded), step):
        await connection.input_audio_buffer.append(audio=encoded[start : start + step])
        await asyncio.sleep(0.1 * pace)


async def test_full_duplex_units_as_responses(server: Server):
    async with connect(server, model="minicpm-o-4.5-duplex") as connection:
        await duplex_session(connection, "LLSSE")
        async with owned_task(stream_audio(connection, silence(8.0) + 0.01), "sender"):
            done, seen = await until(connection, "response.done")
            kinds = [e.type for e in seen]
            assert kinds.index("response.created") < kinds.index("response.output_audio.delta")
            assert done.response.status == "completed"
            transcript = done.response.output[0].content[0].transcript
            assert transcript.startswith("unit 2")  # the first speaking unit (0-based)
            await connection.response.create()
            error, _ = await until(connection, "error")
            assert error.error.code == "unsupported"
            await connection.conversation.item.retrieve(item_id=done.response.output[0].id)
            retrieved, _ = await until(connection, "conversation.item.retrieved")
            assert retrieved.item.content[0].transcript == transcript


async def test_full_duplex_cancel_and_barge_in(server: Server):
    async with connect(server, model="x-duplex") as connection:
        await duplex_session(connection, "LSSSSSSSSE")
        async with owned_task(stream_audio(connection, silence(12.0) + 0.01), "sender"):
            await until(connection, "response.output_audio.delta")
            await connection.response.cancel()
            done, _ = await until(connection, "response.done")
            assert done.response.status == "cancelled"
            assert done.response.status_details.reason == "client_cancelled"
    speech = np.concatenate([silence(2.5), speak("Wait, stop talking please."), silence(1.0)])
    async with connect(server, model="x-duplex") as connection:
        await until(connection, "session.created")
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": "#schedule:LSSSSSSSSSSE",
                "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
            }
        )
        await until(connection, "session.updated")
        async with owned_task(stream_audio(connection, speech, pace=1.0), "sender") as sender:
            done, seen = await until(connection, "response.done")
            assert done.response.status == "cancelled"
            assert done.response.status_details.reason == "turn_detected"
            assert "input_audio_buffer.speech_started" in [e.type for e in seen]
            stopped, _ = await until(connection, "conversation.item.done")
            assert stopped.item.role == "user"
            await sender


@pytest.mark.fresh_server
async def test_a_worker_lost_mid_session_is_an_openai_error(server: Server):
    async with connect(server) as connection:
        await text_session(connection)
        workers = await server.get("/workers")
        os.kill(workers["workers"][0]["pid"], signal.SIGKILL)
        error, _ = await until(connection, "error")
        assert error.error.type == "server_error" and error.error.message


async def test_control_never_waits_behind_the_engine(server: Server):
    """An update whose engine step waits behind a running answer does not
    hold up the cancel sent after it: the reader never waits for the engine."""
    tool = {"type": "function", "name": "get_weather"}
    async with connect(server) as connection:
        await text_session(connection, instructions="#latency:0.4")
        await say(connection, "tell me a long long story please")
        await connection.response.create()
        await until(connection, "response.output_text.delta")
        await connection.session.update(session={"type": "realtime", "tools": [tool]})
        await connection.response.cancel()
        done, seen = await until(connection, "response.done", timeout=10)
        assert done.response.status == "cancelled"
        text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
        assert len(text) < len("Answered: tell me a long long story please") - 12
        updated, _ = await until(connection, "session.updated")
        assert updated.session.tools[0].name == "get_weather"
