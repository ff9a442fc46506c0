"""Audio chunks reach the worker as binary media frames (protocol/media_frame.py)
or, with ``binary_media`` off, as the client's text: through real processes on
the scripted engine, both give the same results, the same recordings and the
same refusals, and a worker's session socket takes both forms."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from omnilive.protocol.internal import Envelope, bearer, ws_url
from omnilive.protocol.media_frame import MediaMessage, encode_media
from tests.clients import Client, open_client
from tests.recordings import jpeg, load, meta_when, recording_dir
from tests.servers import Server, running
from tests.speech import silence, speak

TOKEN = "media-frames-" + "t" * 20
FORMS = ("binary", "text")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """One server of each form, two slots each (a test may open a session on
    a worker's own socket beside the gateway's)."""
    env = {"OMNILIVE_INTERNAL_TOKEN": TOKEN, "OMNILIVE_SCRIPTED__SLOTS": "2",
           "OMNILIVE_LIMITS__RESUME_GRACE_S": "1"}  # fmt: skip
    with (
        running(tmp_path_factory.mktemp("binary"), env=env) as binary,
        running(tmp_path_factory.mktemp("text"), env={**env, "OMNILIVE_BINARY_MEDIA": "0"}) as text,
    ):
        yield {"binary": binary, "text": text}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def pcm(samples: np.ndarray) -> str:
    return b64(samples.astype("<f4").tobytes())


async def omni(server: Server, system_prompt: str) -> Client:
    client = await open_client(server, path="/ws/duplex", query="?mode=omni")
    await client.prepare(system_prompt)
    return client


def frames_of(chunk: dict[str, Any]) -> list[str]:
    """The frames a recorded unit holds (several are listed, one is named)."""
    return chunk.get("user_frames") or [chunk["user_frame"]]


async def stop(client: Client) -> None:
    await client.send({"type": "stop"})
    await client.until("stopped")


async def test_omni_units_are_answered_and_recorded_the_same_either_way(
    servers: dict[str, Server],
):
    seen: dict[str, Any] = {}
    for form, server in servers.items():
        client = await omni(server, "#schedule:LSSE")
        recording_id = client.received[-1]["recording_session_id"]
        results = []
        for index in range(4):
            frames = [b64(jpeg((60 * index, 20, 200)))] * (1 + index % 2)
            audio = np.full(16_000, 0.01 * (index + 1), np.float32)
            await client.chunk(audio, frame_base64_list=frames, force_listen=index == 3)
            results.append(await client.until("result"))
        await stop(client)
        await meta_when(server, recording_id, "ended")
        directory = recording_dir(server, recording_id)
        chunks = load(directory / "recording.json")["chunks"]
        seen[form] = {
            "answers": [
                (r["is_listen"], r["text"], r["end_of_turn"], r["vision_slices"]) for r in results
            ],
            "audio": [(directory / c["user_audio"]).read_bytes() for c in chunks],
            "frames": [[(directory / f).read_bytes() for f in frames_of(c)] for c in chunks],
        }
    assert seen["binary"] == seen["text"]
    assert [len(frames) for frames in seen["binary"]["frames"]] == [1, 2, 1, 2]
    assert "frames 2" in seen["binary"]["answers"][1][1]


# The refusals of chunks the gateway lets through (they have the shape of
# base64 and of float32 PCM): the worker makes them, in the same words
# whichever form the chunk came in.
BAD_CHUNKS = {
    "audio-base64": ({"audio_base64": "&" * 16}, "audio_base64: invalid base64: "),
    "frame-base64": ({"frame_base64_list": [b64(jpeg((1, 2, 3))), "!!!!"]},
                     "frame 1: invalid base64: "),
    "not-a-jpeg": ({"frame_base64_list": [b64(b"not a jpeg")]}, "frame is not a decodable image"),
    "nan": ({"audio_base64": pcm(np.array([0.0, np.nan]))},
            "audio_base64: PCM contains NaN or infinite samples"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_CHUNKS))
async def test_a_bad_chunk_gets_the_same_error_either_way(servers: dict[str, Server], case: str):
    fields, words = BAD_CHUNKS[case]
    errors = {}
    for form, server in servers.items():
        client = await omni(server, "#schedule:L")
        await client.send({"type": "audio_chunk", "audio_base64": pcm(silence(1.0)), **fields})
        error = await client.until("error")
        # PIL's words name the buffer it read, at its address in that process.
        errors[form] = {**error, "error": re.sub(r" at 0x[0-9a-f]+", "", error["error"])}
        await client.chunk(silence(1.0))  # the session goes on
        assert (await client.until("result"))["is_listen"] is True
        await stop(client)
    assert errors["binary"] == errors["text"]
    assert errors["binary"]["code"] == "invalid_request"
    assert errors["binary"]["error"].startswith(words), errors


async def test_a_bad_chunk_before_prepare_is_refused_for_that_first(servers: dict[str, Server]):
    """Refused unread, before its base64 is looked at, as it always was."""
    errors = {}
    for form, server in servers.items():
        client = await open_client(server, path="/ws/duplex", query="?mode=omni")
        await client.until("queue_done")
        await client.send({"type": "audio_chunk", "audio_base64": "&" * 16})
        errors[form] = await client.until("error")
    assert errors["binary"] == errors["text"]
    assert errors["binary"] == {
        "type": "error",
        "error": "send prepare before audio_chunk",
        "code": "not_ready",
    }


async def test_a_half_duplex_turn_is_heard_and_recorded_the_same_either_way(
    servers: dict[str, Server],
):
    speech = np.concatenate([silence(1.0), speak("What time is it?"), silence(1.5)])
    seen = {}
    for form, server in servers.items():
        client = await open_client(server)
        prepared = await client.prepare("Answer in one short sentence.")
        await client.speak(speech)
        done = await client.until("turn_done")
        await client.send({"type": "audio_chunk", "audio_base64": "&" * 16})
        refused = await client.until("error")
        await client.send({"type": "stop"})
        await client.until("stopped")
        recording_id = prepared["recording_session_id"]
        await meta_when(server, recording_id, "ended")
        directory = recording_dir(server, recording_id)
        turn = load(directory / "recording.json")["turns"][0]
        heard = (directory / turn["input"]["user_audio"]).read_bytes()
        vad = [m["speaking"] for m in client.received if m["type"] == "vad_state"]
        seen[form] = (done["text"], vad, heard, refused)
    assert seen["binary"] == seen["text"]
    assert seen["binary"][3]["error"].startswith("audio_base64: invalid base64: ")


# --- a worker's own session socket ----------------------------------------------------


async def worker_session(server: Server, session_id: str) -> ClientConnection:
    url = ws_url(server.ports()["workers"]["w0"], f"/internal/session/omni_duplex/{session_id}")
    return await connect(url, additional_headers=bearer(TOKEN), max_size=None)


async def next_of(ws: ClientConnection, *types: str) -> dict[str, Any]:
    while True:
        envelope, payload = Envelope.split(await ws.recv())  # type: ignore[arg-type]
        if envelope.type in types:
            return json.loads(payload)


async def test_the_worker_takes_either_form_and_refuses_a_broken_frame(
    servers: dict[str, Server],
):
    audio = np.full(16_000, 0.02, "<f4")
    frame = jpeg((10, 200, 10))
    binary = encode_media(MediaMessage({"type": "audio_chunk"}, audio.tobytes(), (frame,)))
    text = json.dumps({"type": "audio_chunk", "audio_base64": pcm(audio),
                       "frame_base64_list": [b64(frame)]})  # fmt: skip
    async with await worker_session(servers["text"], "ws_either_form") as ws:
        await ws.send(json.dumps({"type": "prepare", "system_prompt": "#schedule:S"}))
        await next_of(ws, "prepared")
        answers = []
        for raw in (binary, text, binary[:-1], b"\x00OM\x01" + b"\xff" * 8, binary):
            await ws.send(raw)
            answers.append(await next_of(ws, "result", "error"))
        await ws.send(json.dumps({"type": "stop"}))
        await next_of(ws, "stopped")
    first, second, cut, garbled, last = answers
    assert first["type"] == second["type"] == last["type"] == "result"
    assert first["text"] == second["text"].replace("unit 1", "unit 0")
    assert "frames 1" in first["text"]
    assert cut["code"] == "invalid_request"
    assert cut["error"].startswith("media frame: the header counts")
    assert garbled["code"] == "invalid_request"
    assert garbled["error"].startswith("media frame: header of ")
