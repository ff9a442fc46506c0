"""Turn-based chat through real gateway and worker processes (scripted engine)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.servers import Server, chat_once, until, user

pytestmark = pytest.mark.shared_server


async def test_streaming_chat_order_and_content(server: Server):
    messages = await chat_once(server, user("Hello there, omnilive"))
    types = [m["type"] for m in messages]
    assert types[0] == "prefill_done" and types[-1] == "done"
    assert set(types[1:-1]) == {"chunk"} and len(types) > 3
    assert messages[0]["input_tokens"] > 0
    chunks = messages[1:-1]
    done = messages[-1]
    assert "".join(c["text_delta"] for c in chunks) == done["text"]
    assert "Hello there, omnilive" in done["text"]
    assert done["generated_tokens"] > 0 and done["input_tokens"] == messages[0]["input_tokens"]
    assert done["recording_session_id"].startswith("chat_")
    for chunk in chunks:
        audio = np.frombuffer(base64.b64decode(chunk["audio_data"]), "<f4")
        assert audio.size > 0 and np.abs(audio).max() > 0.05  # real 24 kHz audio, not silence


async def test_non_streaming_chat_sends_no_chunks(server: Server):
    messages = await chat_once(server, user("quiet please", streaming=False))
    assert [m["type"] for m in messages] == ["prefill_done", "done"]
    audio = np.frombuffer(base64.b64decode(messages[-1]["audio_data"]), "<f4")
    assert audio.size == pytest.approx(len(messages[-1]["text"]) * 0.05 * 24000, rel=0.01)


async def test_multimodal_content_reaches_the_engine(server: Server):
    pcm = base64.b64encode(np.zeros(8000, "<f4").tobytes()).decode()
    content = [{"type": "text", "text": "what is this"}, {"type": "audio", "data": pcm}]
    messages = await chat_once(server, {"messages": [{"role": "user", "content": content}]})
    assert "[audio 0.50 s]" in messages[-1]["text"]


async def test_post_api_chat(server: Server):
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{server.http}/api/chat", json=user("via http"), timeout=30)
    body = response.json()
    assert response.status_code == 200 and body["success"] is True
    assert "via http" in body["text"] and body["audio_data"]
    assert body["queue_wait_ms"] >= 0 and body["timings"]["total_ms"] > 0


async def test_post_api_chat_errors(server: Server):
    async with httpx.AsyncClient() as client:
        bad = await client.post(f"{server.http}/api/chat", content=b"{nope", timeout=10)
        failing = await client.post(
            f"{server.http}/api/chat", json=user("#fail:prefill"), timeout=10
        )
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_json"
    assert failing.status_code == 502 and failing.json()["code"] == "inference_error"


# Its queue estimates start from the defaults, not from what earlier sessions taught.
@pytest.mark.fresh_server
async def test_three_clients_one_worker_are_queued_and_served_in_order(server: Server):
    events: list[tuple[str, dict]] = []

    async def client(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        async with connect(f"{server.ws}/ws/chat") as ws:
            await ws.send(json.dumps(user(f"{name} #latency:0.3")))
            async for raw in ws:
                events.append((name, json.loads(raw)))

    await asyncio.gather(client("A", 0), client("B", 0.3), client("C", 0.6))
    queued = {name: m for name, m in events if m["type"] == "queued"}
    assert "A" not in queued
    assert queued["B"]["position"] == 1 and queued["C"]["position"] == 2
    assert queued["C"]["estimated_wait_s"] >= queued["B"]["estimated_wait_s"] > 0
    assert queued["B"]["ticket_id"].startswith("q_") and queued["C"]["queue_length"] == 2
    served = [name for name, m in events if m["type"] == "prefill_done"]
    assert served == ["A", "B", "C"]
    updates = [m for name, m in events if name == "C" and m["type"] == "queue_update"]
    assert any(u["position"] == 1 for u in updates), "C moves up when B is served"
    assert [name for name, m in events if m["type"] == "queue_done"] == ["B", "C"]


async def test_client_that_disconnects_while_queued_is_removed(server: Server):
    async with connect(f"{server.ws}/ws/chat") as busy:
        await busy.send(json.dumps(user("hold the worker #latency:0.5")))
        assert json.loads(await busy.recv())["type"] == "prefill_done"
        leaver = await connect(f"{server.ws}/ws/chat")
        await leaver.send(json.dumps(user("I will leave")))
        assert json.loads(await leaver.recv())["type"] == "queued"
        assert (await server.get("/api/queue"))["queue_length"] == 1
        await leaver.close()
        for _ in range(50):
            if (await server.get("/api/queue"))["queue_length"] == 0:
                break
            await asyncio.sleep(0.05)
        assert (await server.get("/api/queue"))["queue_length"] == 0
    # the worker is free again (once the gateway saw the busy client leave)
    # and serves the next client at once
    await server.wait_ready(timeout=10, workers=1)
    messages = await chat_once(server, user("next"))
    assert messages[0]["type"] == "prefill_done"


async def test_admin_cancel_of_a_queued_ticket(server: Server):
    async with connect(f"{server.ws}/ws/chat") as busy, connect(f"{server.ws}/ws/chat") as waiting:
        await busy.send(json.dumps(user("hold #latency:0.5")))
        await busy.recv()
        await waiting.send(json.dumps(user("waiting")))
        ticket = json.loads(await waiting.recv())["ticket_id"]
        item = await server.get(f"/api/queue/{ticket}")
        assert item["position"] == 1
        async with httpx.AsyncClient() as client:
            assert (await client.delete(f"{server.http}/api/queue/{ticket}")).status_code == 200
            assert (await client.delete(f"{server.http}/api/queue/{ticket}")).status_code == 404
        # A periodic queue_update may come before it.
        message = await until(waiting, "error", "prefill_done", "done")
        assert message["type"] == "error" and message["code"] == "cancelled"


async def test_malformed_requests_get_errors_and_server_keeps_serving(server: Server):
    def content(item: dict) -> str:
        return json.dumps({"messages": [{"role": "user", "content": [item]}]})

    cases = [
        ("{not json", "invalid_json"),
        (content({"type": "smell"}), "invalid_request"),
        (content({"type": "image", "data": "!!"}), "invalid_request"),
        (json.dumps({"nothing": True}), "invalid_request"),
    ]  # fmt: skip
    for raw, code in cases:
        async with connect(f"{server.ws}/ws/chat") as ws:
            await ws.send(raw)
            message = json.loads(await ws.recv())
            assert message["type"] == "error" and message["code"] == code, raw
            assert message["error"]
    # valid base64 that is not an image is refused by the worker, not a crash
    junk = base64.b64encode(b"definitely not a jpeg").decode()
    messages = await chat_once(
        server, {"messages": [{"role": "user", "content": [{"type": "image", "data": junk}]}]}
    )
    assert messages[-1]["type"] == "error" and "image" in messages[-1]["error"]
    assert (await chat_once(server, user("still here")))[-1]["type"] == "done"


async def test_engine_failure_mid_generation(server: Server):
    messages = await chat_once(server, user("#fail:generate and some more text here"))
    assert [m["type"] for m in messages][:2] == ["prefill_done", "chunk"]
    assert messages[-1]["type"] == "error" and messages[-1]["code"] == "inference_error"
    assert (await chat_once(server, user("recovered")))[-1]["type"] == "done"


@pytest.mark.fresh_server
async def test_killed_worker_gives_error_and_restarted_worker_serves(server: Server):
    pid = (await server.get("/workers"))["workers"][0]["pid"]
    async with connect(f"{server.ws}/ws/chat") as ws:
        await ws.send(json.dumps(user("a slow answer that will be cut #latency:0.5")))
        assert json.loads(await ws.recv())["type"] == "prefill_done"
        os.kill(pid, signal.SIGKILL)
        async with asyncio.timeout(2):
            rest = [json.loads(raw) async for raw in ws]
    assert rest[-1]["type"] == "error" and rest[-1]["code"] == "worker_failed"
    await server.wait_ready(workers=1, timeout=30)
    workers = (await server.get("/workers"))["workers"]
    assert workers[0]["pid"] != pid and workers[0]["restarts"] == 1
    assert (await chat_once(server, user("after restart")))[-1]["type"] == "done"


async def test_queue_full_closes_with_1013(tmp_path: Path):
    srv = Server(tmp_path, env={"OMNILIVE_MAX_QUEUE_SIZE": "1"}).start()
    try:
        await srv.wait_ready(workers=1)
        async with connect(f"{srv.ws}/ws/chat") as a, connect(f"{srv.ws}/ws/chat") as b:
            await a.send(json.dumps(user("busy #latency:0.5")))
            await a.recv()
            await b.send(json.dumps(user("waits")))
            assert json.loads(await b.recv())["type"] == "queued"
            async with connect(f"{srv.ws}/ws/chat") as c:
                await c.send(json.dumps(user("no room")))
                message = json.loads(await c.recv())
                assert message["code"] == "queue_full"
                await c.wait_closed()
                assert c.close_code == 1013
    finally:
        srv.stop()


@pytest.mark.fresh_server  # the ETA settings it changes stay changed
async def test_eta_config_put_changes_only_named_fields(server: Server):
    async with httpx.AsyncClient() as client:
        before = (await client.get(f"{server.http}/api/config/eta")).json()
        after = (await client.put(f"{server.http}/api/config/eta", json={"chat_s": 7})).json()
        bad = await client.put(f"{server.http}/api/config/eta", json={"chat_s": -1})
    assert before["chat_s"] == 15 and after["chat_s"] == 7
    assert after["omni_duplex_s"] == before["omni_duplex_s"] == 90
    assert bad.status_code == 422


async def test_status_and_workers(server: Server):
    status = await server.get("/status")
    assert status["status"] == "ready" and status["max_queue_size"] == 1000
    assert status["workers"]["by_state"] == {"idle": 1}
    health = await server.get("/health")
    assert health["status"] == "healthy"


async def test_websockets_are_not_deflated_unless_configured(server: Server, tmp_path: Path):
    """A client offering permessage-deflate (browsers and the websockets
    package do) gets plain frames: deflating base64 media costs more time
    than its bytes save on a live answer. ``ws_compression`` turns it on."""

    async def extensions(base: str) -> list[str]:
        async with connect(f"{base}/ws/chat") as ws:  # offers deflate by default
            return [extension.name for extension in ws.protocol.extensions]

    assert await extensions(server.ws) == []
    compressed = Server(tmp_path, env={"OMNILIVE_WS_COMPRESSION": "true"}).start()
    try:
        await compressed.wait_ready()
        assert await extensions(compressed.ws) == ["permessage-deflate"]
    finally:
        compressed.stop()
