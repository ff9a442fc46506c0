"""Conformance of ``/v1/realtime`` with spec/realtime-api.md, through real
processes on the scripted engine. Each test names the statement it checks."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import signal
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from omnilive.protocol.internal import WorkerStatus
from tests.clients import EventSocket
from tests.servers import Server, free_port

pytestmark = pytest.mark.shared_server

SECOND = base64.b64encode((np.zeros(16000, "<f4") + 0.01).tobytes()).decode()


def jpeg() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 120, 0)).save(buffer, "JPEG")
    return base64.b64encode(buffer.getvalue()).decode()


def wav_b64(seconds: float) -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.zeros(round(16000 * seconds), "<i2").tobytes())
    return base64.b64encode(buffer.getvalue()).decode()


class Rt(EventSocket):
    async def start(self, instructions: str = "You are helpful.", **session: Any) -> dict:
        await self.until("session.queue_done")
        await self.send(
            {"type": "session.update", "session": {"instructions": instructions, **session}}
        )
        return await self.until("session.created")

    async def append(self, frames: bool = True, **fields: Any) -> None:
        event = {"type": "input_audio_buffer.append", "audio": SECOND, **fields}
        if frames:
            event.setdefault("video_frames", [jpeg()])
        await self.send(event)

    async def outputs(self, n: int, timeout: float = 10) -> list[dict]:
        got = []
        while len(got) < n:
            event = await self.recv(timeout)
            if event["type"] in ("response.listen", "response.output_audio.delta"):
                got.append(event)
        return got

    async def closed(self, timeout: float = 10) -> tuple[str, int | None]:
        event = await self.until("session.closed", timeout=timeout)
        await asyncio.wait_for(self.ws.wait_closed(), timeout)
        return event["reason"], self.ws.close_code


async def realtime(server: Server, mode: str = "video") -> Rt:
    return Rt(await connect(f"{server.ws}/v1/realtime?mode={mode}", max_size=None))


def samples(event: dict) -> int:
    return len(base64.b64decode(event["audio"])) // 4


async def test_lifecycle_video(server: Server):
    """Setup: queue_done is required even with no wait; update → created; stream; close."""
    rt = await realtime(server, "video")
    first = await rt.recv()
    assert first["type"] == "session.queue_done"  # no session.queued when nobody waits
    await rt.send({"type": "session.update", "session": {"instructions": "#schedule:LLSE"}})
    created = await rt.until("session.created")
    assert re.fullmatch(r"rt_\d{13}_[A-Za-z0-9_-]{12}", created["session_id"])
    assert created["prompt_length"] > 0
    out = []
    for _ in range(4):  # one output per unit with this schedule
        await rt.append()
        out.extend(await rt.outputs(1))
    listen, delta_type = "response.listen", "response.output_audio.delta"
    assert [e["type"] for e in out] == [listen, listen, delta_type, delta_type]
    assert set(out[0]) == {"type", "kv_cache_length"}
    delta = out[2]
    assert set(delta) == {"type", "text", "audio", "end_of_turn", "kv_cache_length"}
    assert delta["end_of_turn"] is False and out[3]["end_of_turn"] is True
    assert "frames 1" in delta["text"]  # the video frame reached the model
    kv = [e["kv_cache_length"] for e in out]
    assert kv == sorted(kv)
    await rt.send({"type": "session.close", "reason": "user_stop"})
    assert await rt.closed() == ("stopped", 1000)


async def test_lifecycle_audio_mode_ignores_frames(server: Server):
    rt = await realtime(server, "audio")
    await rt.start("#schedule:S")
    await rt.append()
    [delta] = await rt.outputs(1)
    assert "frames 0" in delta["text"]
    assert (await server.get("/status"))["running_tasks"][0]["request_type"] == "audio_duplex"


async def test_session_ids_are_unique(server: Server):
    ids = set()
    for _ in range(3):
        rt = await realtime(server)
        ids.add((await rt.start())["session_id"])
        await rt.send({"type": "session.close"})
        await rt.closed()
    assert len(ids) == 3


# Its queue estimates start from the defaults, not from what earlier sessions taught.
@pytest.mark.fresh_server
async def test_queue_events_not_ready_and_a_kept_update_while_queued(server: Server):
    """QUEUED: session.queued / queue_update; appends are not_ready; a
    session.update is kept and applied once the session has its worker (the
    reference's page sends it 100 ms after connecting)."""
    holder = await realtime(server)
    await holder.start()
    waiting = await realtime(server)
    queued = await waiting.recv()
    assert queued["type"] == "session.queued" and queued["position"] == 1
    assert queued["estimated_wait_s"] > 0
    await waiting.append()
    error = await waiting.until("error")
    assert error["error"] == {"code": "not_ready", "message": error["error"]["message"],
                              "type": "client_error"}  # fmt: skip
    await waiting.send({"type": "session.update", "session": {"instructions": "#schedule:S"}})
    await holder.send({"type": "session.close"})
    await holder.closed()
    await waiting.until("session.queue_done")
    await waiting.until("session.created")  # without sending the update again
    await waiting.append()
    [delta] = await waiting.outputs(1)
    assert delta["type"] == "response.output_audio.delta"  # the kept instructions apply


async def test_an_administrator_removing_a_queued_session_closes_it(server: Server):
    """The queue's DELETE ends a waiting Realtime session in its protocol
    (error, then session.closed{error}), and the server serves on."""
    holder = await realtime(server)
    await holder.start()
    waiting = await realtime(server)
    queued = await waiting.until("session.queued")
    async with httpx.AsyncClient() as client:
        removed = await client.delete(f"{server.http}/api/queue/{queued['ticket_id']}")
    assert removed.status_code == 200
    error = await waiting.until("error")
    assert error["error"]["code"] == "service_unavailable"
    assert await waiting.closed() == ("error", 1000)
    await holder.append()
    assert len(await holder.outputs(1)) == 1  # the session holding the worker goes on
    assert (await server.get("/api/queue"))["queue_length"] == 0


async def test_connected_allows_only_session_update(server: Server):
    rt = await realtime(server)
    await rt.until("session.queue_done")
    await rt.append()
    assert (await rt.until("error"))["error"]["code"] == "not_ready"
    await rt.send({"type": "session.update", "session": {"instructions": "x"}})
    await rt.until("session.created")
    await rt.append()
    assert len(await rt.outputs(1)) == 1


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ({"type": "conversation.item.create"}, "unknown_event"),
        ({"type": "input_audio_buffer.append"}, "missing_field"),
        ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_payload"),
        ({"type": "input_audio_buffer.append", "audio": "AAAA"}, "invalid_payload"),
        ({"type": "input_audio_buffer.append", "audio": SECOND,
          "video_frames": [base64.b64encode(b"not a jpeg").decode()]}, "invalid_payload"),
        ({"type": "input_audio_buffer.append", "audio": SECOND, "max_slice_nums": 12},
         "invalid_payload"),
    ],
)  # fmt: skip
async def test_client_errors_keep_the_session(server: Server, event: dict, code: str):
    rt = await realtime(server)
    await rt.start("#schedule:L")
    await rt.send(event)
    error = await rt.until("error")
    assert error["error"]["code"] == code and error["error"]["type"] == "client_error"
    await rt.append()
    assert len(await rt.outputs(1)) == 1  # still ACTIVE


async def test_session_update_field_rules(server: Server):
    rt = await realtime(server)
    await rt.until("session.queue_done")
    await rt.send({"type": "session.update", "session": {"instructions": "x", "max_slice_nums": 0}})
    assert (await rt.until("error"))["error"]["code"] == "invalid_payload"
    not_wav = base64.b64encode(b"RIFFjunk").decode()
    await rt.send(
        {"type": "session.update", "session": {"instructions": "x", "ref_audio": not_wav}}
    )
    assert (await rt.until("error"))["error"]["code"] == "invalid_payload"  # decoded by the worker
    config = {"instructions": "#schedule:S", "max_slice_nums": 3}
    await rt.send({"type": "session.update", "session": config})  # a failed update may be retried
    created = await rt.until("session.created")
    assert created["prompt_length"] > 0
    await rt.append()
    [delta] = await rt.outputs(1)
    assert delta["type"] == "response.output_audio.delta"


async def test_instructions_are_optional(server: Server):
    rt = await realtime(server)
    await rt.until("session.queue_done")
    await rt.send({"type": "session.update", "session": {"max_slice_nums": 2, "voice": "x"}})
    assert (await rt.until("session.created"))["prompt_length"] > 0


async def test_a_later_update_changes_the_voice_and_the_instructions(server: Server):
    rt = await realtime(server, "audio")
    await rt.start("#schedule:S")
    await rt.append()
    assert "voice" not in (await rt.outputs(1))[0]["text"]
    update = {"instructions": "#schedule:L", "ref_audio": wav_b64(0.5)}
    await rt.send({"type": "session.update", "session": update})
    updated = await rt.until("session.updated")
    assert updated["session"] == {"instructions": True, "voice": True}
    assert updated["warnings"] == []
    await rt.append()
    assert (await rt.outputs(1))[0]["type"] == "response.listen"  # the new instructions


async def test_response_cancel_ends_the_turn(server: Server):
    rt = await realtime(server, "audio")
    await rt.start("#schedule:SSSSSSE")
    await rt.append()
    assert (await rt.outputs(1))[0]["type"] == "response.output_audio.delta"
    await rt.send({"type": "response.cancel"})
    await rt.until("response.cancelled")
    await rt.append()
    out = await rt.outputs(1)
    assert out[-1]["type"] == "response.listen"


async def test_appends_of_any_length_are_assembled_into_seconds(server: Server):
    """An OpenAI-style client sends 20-100 ms; the model hears whole seconds."""
    rt = await realtime(server, "audio")
    await rt.start("#schedule:L")
    piece = base64.b64encode((np.zeros(800, "<f4") + 0.01).tobytes()).decode()  # 50 ms
    for _ in range(60):  # 3 s
        await rt.send({"type": "input_audio_buffer.append", "audio": piece})
        await asyncio.sleep(0.01)
    outputs = await rt.outputs(3)
    assert [o["type"] for o in outputs] == ["response.listen"] * 3
    assert "error" not in [e["type"] for e in rt.events]


async def test_raw_pcm_voices_are_accepted_like_wav(server: Server):
    """The reference's clients send ref_audio as raw float32 PCM."""
    rt = await realtime(server, "audio")
    pcm = base64.b64encode(np.zeros(8000, "<f4").tobytes()).decode()  # 0.5 s
    await rt.start("#schedule:S", ref_audio=pcm)
    await rt.append()
    assert "voice: 0.50 s reference" in (await rt.outputs(1))[0]["text"]


async def test_tts_voice_falls_back_to_ref_audio(server: Server):
    rt = await realtime(server)
    await rt.start("#schedule:S", ref_audio=wav_b64(1.0))
    await rt.append()
    assert "voice: 1.00 s reference" in (await rt.outputs(1))[0]["text"]
    other = await realtime(server)
    await rt.send({"type": "session.close"})
    await rt.closed()
    await other.start("#schedule:S", ref_audio=wav_b64(1.0), tts_ref_audio=wav_b64(0.5))
    await other.append()
    assert "voice: 0.50 s reference" in (await other.outputs(1))[0]["text"]


async def test_force_listen_interrupts_speech(server: Server):
    rt = await realtime(server)
    await rt.start("#schedule:SSSSSSE")
    await rt.append()
    [delta] = await rt.outputs(1)
    assert delta["type"] == "response.output_audio.delta"
    await rt.append(force_listen=True)
    out = await rt.outputs(1)
    assert out[-1]["type"] == "response.listen"


async def test_output_audio_lengths(server: Server):
    """Middle deltas are exactly 1 s; the first and the last may be shorter."""
    rt = await realtime(server)
    await rt.start("#schedule:SSSSSE #speak-seconds:0.7")
    for _ in range(6):
        await rt.append()
        await asyncio.sleep(0.1)  # slower than the model: nothing is dropped
    deltas = []
    while not deltas or not deltas[-1]["end_of_turn"]:
        deltas.extend(await rt.outputs(1))
    sizes = [samples(d) for d in deltas]
    assert sizes[0] == 16800 < 24000
    assert sizes[1:-1] and all(size == 24000 for size in sizes[1:-1])
    assert 0 < sizes[-1] <= 24000
    assert sum(sizes) == round(24000 * (5 * 0.7 + 0.35))


async def test_inference_error_is_recoverable(server: Server):
    rt = await realtime(server)
    await rt.start("#fail-unit:1 #schedule:L")
    await rt.append()
    await rt.outputs(1)
    await rt.append()
    error = await rt.until("error")
    assert error["error"]["code"] == "inference_error" and error["error"]["type"] == "server_error"
    await rt.append()
    assert len(await rt.outputs(1)) == 1


async def test_invalid_json_closes_with_1003(server: Server):
    rt = await realtime(server)
    await rt.start()
    await rt.ws.send("this is not json")
    await asyncio.wait_for(rt.ws.wait_closed(), 5)
    assert rt.ws.close_code == 1003
    # and the worker was released
    rt2 = await realtime(server)
    await rt2.start()


async def test_silent_drop_when_the_client_is_faster_than_the_model(server: Server):
    rt = await realtime(server)
    await rt.start("#latency:0.5 #schedule:L")
    for _ in range(8):
        await rt.append()
        await asyncio.sleep(0.1)
    got = []
    with pytest.raises(TimeoutError):
        while True:
            got.extend(await rt.outputs(1, timeout=1.5))
    assert 0 < len(got) < 8
    assert "error" not in [e["type"] for e in rt.events]


async def test_server_shutdown(tmp_path: Path):
    srv = Server(tmp_path).start()
    try:
        await srv.wait_ready(workers=1)
        rt = await realtime(srv)
        await rt.start()
        srv.process.send_signal(signal.SIGTERM)
        assert (await rt.closed())[0] == "server_shutdown"
    finally:
        srv.stop()


@pytest.mark.fresh_server
async def test_worker_death_is_an_unrecoverable_error(server: Server):
    rt = await realtime(server)
    await rt.start("#schedule:L")
    pid = (await server.get("/workers"))["workers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    error = await rt.until("error", timeout=5)
    assert error["error"]["type"] == "server_error"
    assert await rt.closed() == ("error", 1000)


async def test_queue_full_and_service_unavailable_close_with_1013(tmp_path: Path):
    full = Server(tmp_path, env={"OMNILIVE_MAX_QUEUE_SIZE": "0"}).start()
    empty = Server(tmp_path, workers=0).start()
    try:
        await full.wait_ready(workers=1)
        holder = await realtime(full)
        await holder.start()
        refused = await realtime(full)
        assert (await refused.recv())["error"]["code"] == "queue_full"
        await asyncio.wait_for(refused.ws.wait_closed(), 5)
        assert refused.ws.close_code == 1013
        await asyncio.sleep(1)
        rt = await realtime(empty)
        error = await rt.recv()
        assert error["error"] == {"code": "service_unavailable", "type": "server_error",
                                  "message": error["error"]["message"]}  # fmt: skip
        await asyncio.wait_for(rt.ws.wait_closed(), 5)
        assert rt.ws.close_code == 1013
    finally:
        full.stop()
        empty.stop()


class FakeWorker:
    """A worker that reports itself idle and then refuses (4503) or cannot
    take (HTTP 404) sessions: the gateway's worker-side failure paths."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.port = free_port()

    async def handler(self, ws: Any) -> None:
        if ws.request.path == "/internal/control":
            capabilities = {"input_modalities": ["audio", "text"], "audio_output": True,
                            "voice_cloning": False, "context_length": 8192, "slots": 1}  # fmt: skip
            status = WorkerStatus(
                worker_id="w0", worker_status="idle", engine="fake", capabilities=capabilities
            )
            await ws.send(status.model_dump_json())
            await ws.wait_closed()
        else:
            await ws.close(4503, "busy")

    def process_request(self, connection: Any, request: Any) -> Any:
        if self.behaviour == "unreachable" and request.path.startswith("/internal/session"):
            return connection.respond(404, "no such session route\n")
        return None

    def serve(self) -> Any:
        return serve(self.handler, "127.0.0.1", self.port, process_request=self.process_request)


@pytest.mark.parametrize(
    ("behaviour", "code"), [("busy", "worker_busy"), ("unreachable", "worker_connect_failed")]
)
async def test_worker_side_refusals_close_with_1013(tmp_path: Path, behaviour: str, code: str):
    fake = FakeWorker(behaviour)
    async with fake.serve():
        gateway = Server(
            tmp_path,
            command="gateway",
            env={"OMNILIVE_INTERNAL_TOKEN": "t"},
            args=["--worker", f"http://127.0.0.1:{fake.port}"],
        ).start()
        try:
            await gateway.wait_ready(workers=1)
            rt = await realtime(gateway)
            await rt.until("session.queue_done")
            error = await rt.until("error")
            assert error["error"]["code"] == code and error["error"]["type"] == "server_error"
            with pytest.raises(ConnectionClosed):
                await rt.recv()
            assert rt.ws.close_code == 1013
        finally:
            gateway.stop()
