"""``Chat`` against a real server (scripted engine): every kind of content,
voices by audio and by id, streaming or not, errors as typed exceptions."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from omnilive.client import Chat, ChatDone, Chunk, PrefillDone, ServerError, image, user, video
from omnilive.client.audio import OUTPUT_RATE
from omnilive.client.errors import InferenceError, InvalidRequestError
from tests.audio_files import wav_file
from tests.servers import Server

SECOND = np.full(16000, 0.1, np.float32)


async def test_ask_returns_the_text_and_the_streamed_speech_joined(scripted: Server):
    reply = await Chat(scripted.http).ask("Hello there", system_prompt="Be brief.")
    assert reply.text == "You said: Hello there"
    assert reply.audio is not None and reply.audio.dtype == np.float32
    # the scripted engine speaks 50 ms per character, in pieces of 12 characters
    assert reply.audio.size / OUTPUT_RATE == pytest.approx(0.05 * len(reply.text), abs=0.15)
    assert reply.input_tokens > 0 and reply.recording_session_id


async def test_streaming_events_arrive_in_order(scripted: Server):
    chat = Chat(scripted.http)
    async with chat.request("Tell me a long story about rivers") as answer:
        kinds = [type(event) async for event in answer]
    assert kinds[0] is PrefillDone and kinds[-1] is ChatDone
    assert set(kinds[1:-1]) == {Chunk} and len(kinds) > 4


async def test_not_streaming_and_without_speech(scripted: Server):
    chat = Chat(scripted.http)
    whole = await chat.ask("Hello there", streaming=False)
    assert whole.audio is not None and whole.audio.size > OUTPUT_RATE // 2
    silent = await chat.ask("Hello there", tts=False)
    assert silent.text == "You said: Hello there" and silent.audio is None


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buffer, "JPEG")
    return buffer.getvalue()


async def test_text_image_audio_and_video_content(scripted: Server):
    picture = jpeg()
    question = user("Look:", image(picture), SECOND, video(b"\x00\x00mp4"))
    reply = await Chat(scripted.http).ask([question])
    heard = f"Look: [image {len(picture)} bytes] [audio 1.00 s] [video 5 bytes]"
    assert reply.text == f"You said: {heard}"


async def test_voices_by_audio_and_by_id(scripted: Server):
    chat = Chat(scripted.http)
    by_audio = await chat.ask("Hi", voice=np.concatenate([SECOND, SECOND]))
    assert by_audio.text.endswith("(voice: 2.00 s reference)")
    by_wav = await chat.ask("Hi", voice=wav_file(SECOND))
    assert by_wav.text.endswith("(voice: 1.00 s reference)")
    upload = {"name": "mine", "audio_base64": base64.b64encode(wav_file(SECOND)).decode()}
    async with httpx.AsyncClient() as http:
        stored = await http.post(f"{scripted.http}/api/assets/ref_audio", json=upload)
    by_id = await chat.ask("Hi", voice=stored.json()["id"])
    assert by_id.text.endswith("(voice: 1.00 s reference)")


async def test_server_errors_are_raised_as_their_codes(scripted: Server):
    chat = Chat(scripted.http)
    with pytest.raises(InferenceError, match="scripted failure in prefill"):
        await chat.ask("#fail:prefill")
    with pytest.raises(InvalidRequestError) as caught:
        await chat.ask("Hi", voice="no_such_voice")
    assert caught.value.details["close_code"] == 1000
    # the same model as the server's refuses a bad request before it is sent
    with pytest.raises(ValidationError):
        await chat.ask("Hi", generation={"temperature": 9.0})


async def test_a_failed_stream_yields_its_events_then_raises(scripted: Server):
    seen = []
    with pytest.raises(InferenceError):
        async with Chat(scripted.http).request("#fail:generate and more words") as answer:
            async for event in answer:
                seen.append(type(event))
    assert seen[0] is PrefillDone and Chunk in seen and seen[-1] is ServerError
