"""The auxiliary REST routes answer in the reference's shapes (names and
types its pages and scripts read, per reference/api-shapes.md), through a
real server; and every protocol that takes a voice takes raw float32 PCM as
well as a WAV file."""

from __future__ import annotations

import base64
import io
import wave
from datetime import datetime
from typing import Any

import httpx
import numpy as np
import pytest

from tests.clients import open_client
from tests.servers import Server, chat_once, user

pytestmark = pytest.mark.shared_server

SECOND = base64.b64encode((np.zeros(16000, "<f4") + 0.01).tobytes()).decode()


def iso(value: Any) -> datetime:
    assert isinstance(value, str), value
    return datetime.fromisoformat(value)


def wav_b64(seconds: float, rate: int = 16000) -> str:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.zeros(round(rate * seconds), "<i2").tobytes())
    return base64.b64encode(buffer.getvalue()).decode()


def pcm_b64(seconds: float) -> str:
    return base64.b64encode(np.zeros(round(16000 * seconds), "<f4").tobytes()).decode()


async def test_status_workers_queue_and_running_tasks(server: Server):
    holder = await open_client(server)  # a half-duplex session holds the only worker
    await holder.prepare()
    waiting = await open_client(server)
    assert (await waiting.recv())["type"] == "queued"
    await server.wait_worker_status("busy_half_duplex")
    status = await server.get("/status")
    assert status["gateway_healthy"] is True and status["total_workers"] == 1
    for name in ("idle", "busy", "duplex", "loading", "error", "offline"):
        assert isinstance(status[f"{name}_workers"], int)
    assert status["busy_workers"] == 1 and status["queue_length"] == 1
    assert isinstance(status["max_queue_size"], int)
    [task] = status["running_tasks"]
    assert task["request_type"] == "half_duplex_audio" and task["worker_id"] == "w0"
    assert iso(task["started_at"]) and isinstance(task["elapsed_s"], float)
    assert isinstance(task["estimated_remaining_s"], float)
    workers = await server.get("/workers")
    assert workers["total"] == 1
    [worker] = workers["workers"]
    assert worker["host"] == "127.0.0.1" and worker["port"] == server.worker_base
    assert worker["gpu_id"] is None  # a CPU engine
    assert worker["status"] == "busy_half_duplex"
    assert worker["current_request_type"] == "half_duplex_audio"
    assert worker["current_session_id"] and iso(worker["task_started_at"])
    assert isinstance(worker["total_requests"], int)
    assert isinstance(worker["avg_inference_time_ms"], float)
    queue = await server.get("/api/queue")
    [item] = queue["items"]
    assert item["request_type"] == "half_duplex_audio" and item["position"] == 1
    assert iso(item["enqueued_at"]) and isinstance(item["wait_elapsed_s"], float)
    ticket = await server.get(f"/api/queue/{item['ticket_id']}")
    assert ticket["found"] is True and ticket["ticket"]["ticket_id"] == item["ticket_id"]
    async with httpx.AsyncClient() as client:
        gone = await client.delete(f"{server.http}/api/queue/{item['ticket_id']}")
        assert gone.json()["success"] is True
        missing = await client.get(f"{server.http}/api/queue/{item['ticket_id']}")
        assert missing.status_code == 404 and missing.json()["found"] is False


@pytest.mark.fresh_server  # the ETA settings it changes stay changed
async def test_eta_config_in_the_reference_names(server: Server):
    eta = await server.get("/api/config/eta")
    assert eta["config"] == {"eta_chat_s": 15.0, "eta_half_duplex_s": 180.0,
                             "eta_audio_duplex_s": 120.0, "eta_omni_duplex_s": 90.0,
                             "ema_alpha": 0.3}  # fmt: skip
    assert eta["ema_alpha"] == 0.3 and eta["ema_chat_s"] is None and eta["ema_chat_samples"] == 0
    async with httpx.AsyncClient() as client:
        body = {
            "eta_chat_s": 20,
            "eta_half_duplex_s": 100,
            "eta_audio_duplex_s": 60,
            "eta_omni_duplex_s": 50,
            "ema_alpha": None,
        }  # the reference page's PUT
        changed = (await client.put(f"{server.http}/api/config/eta", json=body)).json()
    assert changed["config"]["eta_chat_s"] == 20 and changed["config"]["eta_omni_duplex_s"] == 50
    assert changed["ema_alpha"] == 0.3  # None: unchanged
    await chat_once(server, user("hi"))
    observed = await server.get("/api/config/eta")
    assert observed["ema_chat_samples"] == 1 and isinstance(observed["ema_chat_s"], float)


async def test_frontend_defaults_apps_and_chat(server: Server):
    assert await server.get("/api/frontend_defaults") == {"playback_delay_ms": 200}
    apps = await server.get("/api/apps")
    routes = {app["app_id"]: app["route"] for app in apps["apps"]}
    assert routes["turnbased"] == "/turnbased" and routes["half_duplex_audio"] == "/half_duplex"
    assert routes["omni"] == "/omni" and routes["audio_duplex"] == "/audio_duplex"
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{server.http}/api/chat", json=user("hello"), timeout=30)
    answer = response.json()
    assert answer["success"] is True and answer["error"] is None
    assert answer["text"] == "You said: hello" and answer["audio_sample_rate"] == 24000
    assert answer["tokens_generated"] == answer["generated_tokens"] > 0
    stats = answer["token_stats"]
    assert stats["total_tokens"] == stats["input_tokens"] + stats["generated_tokens"]
    assert isinstance(answer["duration_ms"], float) and isinstance(answer["queue_wait_ms"], float)
    assert answer["estimated_queue_wait_s"] == 0


async def test_voices_and_default_voice_in_the_reference_shapes(server: Server):
    default = await server.get("/api/default_ref_audio")
    audio = np.frombuffer(base64.b64decode(default["base64"]), "<f4")
    assert default["sample_rate"] == 16000 and default["samples"] == audio.size
    assert default["duration"] == round(audio.size / 16000, 1) and default["name"]
    async with httpx.AsyncClient() as client:
        upload = {"name": "mine", "audio_base64": wav_b64(1.0, 44100)}
        stored = (await client.post(f"{server.http}/api/assets/ref_audio", json=upload)).json()
        assert stored["success"] is True and stored["name"] == "mine" and stored["message"]
        listing = (await client.get(f"{server.http}/api/assets/ref_audio")).json()
        assert listing["total"] == 1 and listing["ref_audios"][0]["duration_ms"] == 1000
        deleted = await client.delete(f"{server.http}/api/assets/ref_audio/{stored['id']}")
        assert deleted.json() == {**deleted.json(), "success": True, "id": stored["id"]}


async def test_presets_keyed_by_the_reference_folders(server: Server):
    presets = await server.get("/api/presets")
    assert set(presets) == {"turnbased", "half_duplex_audio", "audio_duplex", "omni"}
    english = presets["half_duplex_audio"][0]
    audio_items = [i for i in english["system_content"] if i["type"] == "audio"]
    assert audio_items and all(i["data"] is None and i["path"] for i in audio_items)
    clips = await server.get(f"/api/presets/half_duplex_audio/{english['id']}/audio")
    assert len(clips["system_content_audio"]) == len(audio_items)
    assert clips["ref_audio"]["data"] and clips["ref_audio"]["duration"] > 0


async def test_every_protocol_takes_raw_pcm_and_wav_voices(server: Server):
    for voice, seconds in ((pcm_b64(0.5), "0.50"), (wav_b64(0.75, 24000), "0.75")):
        described = f"voice: {seconds} s reference"
        duplex = await open_client(server, path="/ws/duplex", query="?mode=audio")
        await duplex.prepare("#schedule:S", ref_audio_base64=voice)
        await duplex.chunk(np.zeros(16000, np.float32))
        assert described in (await duplex.until("result"))["text"]
        await duplex.ws.close()
        half = await open_client(server)
        prepared = await half.prepare(ref_audio_base64=voice)
        assert prepared["type"] == "prepared"
        await half.ws.close()
        request = user("hi", tts={"enabled": True, "ref_audio_data": voice})
        [*_, done] = await chat_once(server, request)
        assert done["type"] == "done" and described in done["text"]
