"""The worker's OpenAI Realtime runner (the OpenAI dialect's session) over an
engine whose half-duplex view has none of the optional conversation steps,
as MiniCPM-o's has not: no socket, a real runtime. Voice turns still work;
what the engine cannot do (tools, replacing its context) is an ``error``
told once, never a failed session."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from starlette.websockets import WebSocketState

from omnilive.audio import tone
from omnilive.config import load_settings
from omnilive.engines.messages import TextAudioChunk
from omnilive.engines.scripted import ScriptedEngine
from omnilive.engines.sync_views import SyncHalfDuplexSession
from omnilive.protocol.internal import Envelope
from omnilive.worker.app import _serve
from omnilive.worker.runtime import WorkerRuntime


class Minimal(SyncHalfDuplexSession):
    """Only the required steps, like an engine that keeps its own context."""

    def prepare(self, system: list, options: Any) -> int:
        return 4

    def prefill(self, speech: np.ndarray) -> int:
        return 1

    def generate(self) -> Iterator[TextAudioChunk]:
        yield TextAudioChunk(text="Heard you.", audio=tone(0.2, 24_000, 440.0), n_tokens=2)

    def snapshot(self) -> None:
        pass

    def rollback(self) -> None:
        pass


class MinimalEngine(ScriptedEngine):
    def open_half_duplex(self) -> SyncHalfDuplexSession:
        return Minimal()


class Socket:
    """The gateway's side: sends ``frames``, then stays until a response is done."""

    def __init__(self, frames: list[dict[str, Any]]) -> None:
        self.frames = [json.dumps(f) for f in frames]
        self.sent: list[dict[str, Any]] = []
        self.client_state = WebSocketState.CONNECTED
        self.done = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.frames:
            return {"type": "websocket.receive", "text": self.frames.pop(0)}
        await asyncio.wait_for(self.done.wait(), 20)
        return {"type": "websocket.disconnect", "code": 1000}

    async def send_text(self, text: str) -> None:
        _, payload = Envelope.split(text)
        self.sent.append(json.loads(payload))
        if self.sent[-1]["type"] == "response.done":
            self.done.set()


def test_an_engine_without_conversation_steps_still_talks(tmp_path: Path):
    settings = load_settings(
        environ={}, overrides={"engine": "scripted", "data_dir": tmp_path, "internal_token": "t"}
    )
    speech = (np.sin(np.arange(24_000) / 5) * 8000).astype("<i2").tobytes()
    tool = {"type": "function", "name": "get_weather"}
    session = {
        "instructions": "Be brief.",
        "tools": [tool],
        "audio": {"input": {"turn_detection": None, "transcription": {"model": "x"}}},
    }
    frames = [
        {
            "type": "internal.openai",
            "session_id": "sess_t",
            "model": "m",
            "session": session,
            "updated": True,
            "event_id": "u1",
        },
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "system",
                "content": [{"type": "input_text", "text": "Speak French."}],
            },
        },
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(speech).decode()},
        {"type": "input_audio_buffer.commit"},  # turn detection off: no answer by itself
        {"type": "response.create"},
    ]
    socket = Socket(frames)

    async def run() -> None:
        runtime = WorkerRuntime(MinimalEngine(settings.scripted), "w")
        await runtime.load()
        try:
            async with runtime.session("sess_t", "conversation") as record:
                assert await _serve(socket, runtime, record, settings)  # type: ignore[arg-type]
        finally:
            runtime.close()

    asyncio.run(run())
    kinds = [m["type"] for m in socket.sent]
    errors = [m["error"] for m in socket.sent if m["type"] == "error"]
    assert [e["code"] for e in errors] == ["unsupported", "unsupported"]
    assert errors[0]["param"] == "session.tools" and errors[0]["event_id"] == "u1"
    assert "not the model's context" in errors[1]["message"]
    updated = next(m for m in socket.sent if m["type"] == "session.updated")
    assert updated["session"]["tools"] == [] and updated["session"]["instructions"] == "Be brief."
    assert "conversation.item.input_audio_transcription.failed" in kinds
    done = socket.sent[-1]
    assert done["type"] == "response.done" and done["response"]["status"] == "completed"
    assert done["response"]["output"][0]["content"][0]["transcript"] == "Heard you."
