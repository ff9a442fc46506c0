"""Half-duplex voice through real processes: scripted engine, real Silero VAD,
spoken input made by espeak-ng."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.clients import open_client
from tests.servers import Server
from tests.speech import chunks_b64, silence, speak

pytestmark = pytest.mark.shared_server

QUESTION = "What is the weather like in Paris today?"


def utterance(text: str = QUESTION) -> np.ndarray:
    """Silence, a spoken sentence, then enough silence to end the turn."""
    return np.concatenate([silence(1.0), speak(text), silence(1.5)])


async def test_two_full_turns_in_order_with_context(server: Server):
    client = await open_client(server)
    prepared = await client.prepare()
    assert prepared["session_id"] == client.session_id
    assert prepared["timeout_s"] == 180 and prepared["recording_session_id"]
    first_turn = utterance()
    texts = []
    for index in range(2):
        await client.speak(first_turn)
        done = await client.until("turn_done")
        assert done["turn_index"] == index
        texts.append(done["text"])
    await client.send({"type": "stop"})
    await client.until("stopped")
    types = client.types()
    assert types[:2] == ["queue_done", "prepared"]
    turn = types[2 : types.index("turn_done") + 1]
    assert turn[:3] == ["vad_state", "vad_state", "generating"]
    assert set(turn[3:-1]) == {"chunk"} and len(turn) > 4
    vad = [m for m in client.received if m["type"] == "vad_state"][:2]
    assert [v["speaking"] for v in vad] == [True, False]
    generating = next(m for m in client.received if m["type"] == "generating")
    spoken_ms = 1000 * speak(QUESTION).size / 16000
    assert abs(generating["speech_duration_ms"] - spoken_ms) < 500
    # the second answer shows the engine kept the first turn in its context
    assert "earlier turns: none" in texts[0]
    heard = float(texts[0].split("heard ")[1].split(" s")[0])
    assert f"earlier turns: {heard:.2f}" in texts[1]
    chunks = [m for m in client.received if m["type"] == "chunk"]
    assert all(np.frombuffer(base64.b64decode(c["audio_data"]), "<f4").size for c in chunks)
    await client.ws.close()


async def test_stop_mid_generation_ends_within_one_chunk(server: Server):
    client = await open_client(server)
    await client.prepare("slow #latency:0.4")
    await client.speak(utterance())
    await client.until("chunk")
    await client.send({"type": "stop"})
    loop = asyncio.get_running_loop()
    sent = loop.time()
    after = []
    while (message := await client.recv())["type"] != "stopped":
        after.append(message["type"])
    assert loop.time() - sent < 0.9  # one 0.4 s step at most, plus transport
    assert after.count("chunk") <= 1 and "turn_done" not in after


async def test_rest_stop_stops_only_that_session(tmp_path: Path):
    srv = Server(tmp_path, env={"OMNILIVE_SCRIPTED__SLOTS": "2"}).start()
    try:
        await srv.wait_ready(workers=1)
        a, b = await open_client(srv), await open_client(srv)
        await a.prepare("#latency:0.3")
        await b.prepare("#latency:0.3")
        await a.speak(utterance())
        await a.until("chunk")
        async with httpx.AsyncClient() as http:
            response = await http.post(
                f"{srv.http}/api/half_duplex/stop", json={"session_id": a.session_id}
            )
            missing = await http.post(
                f"{srv.http}/api/half_duplex/stop", json={"session_id": "hdx_nobody"}
            )
        assert response.status_code == 200 and missing.status_code == 404
        await a.until("stopped", timeout=2)
        # b is untouched and still converses
        await b.speak(utterance())
        assert (await b.until("turn_done"))["turn_index"] == 0
    finally:
        srv.stop()


async def test_inactivity_timeout_and_cap(server: Server):
    client = await open_client(server)
    prepared = await client.prepare(config={"session": {"timeout_s": 1}})
    assert prepared["timeout_s"] == 1
    timeout = await client.until("timeout", timeout=5)
    assert 0.9 <= timeout["elapsed_s"] < 2.5
    capped = await open_client(server)
    assert (await capped.prepare(config={"session": {"timeout_s": 99999}}))["timeout_s"] == 900


async def test_timeout_resets_on_each_audio_chunk(server: Server):
    client = await open_client(server)
    await client.prepare(config={"session": {"timeout_s": 1.5}})
    await client.speak(silence(3.0), pace_s=0.5)  # 3 s of activity > 1.5 s timeout
    assert "timeout" not in client.types()
    await client.until("timeout", timeout=5)


async def test_failed_turn_is_rolled_back_and_session_goes_on(server: Server):
    client = await open_client(server)
    await client.prepare("#fail-turn:0")
    await client.speak(utterance())
    error = await client.until("error")
    assert error["code"] == "inference_error"
    await client.speak(utterance())
    done = await client.until("turn_done")
    assert done["turn_index"] == 0 and "earlier turns: none" in done["text"]


async def test_malformed_messages_do_not_kill_the_session(server: Server):
    client = await open_client(server)
    await client.until("queue_done")
    await client.send({"type": "audio_chunk", "audio_base64": chunks_b64(silence(0.5))[0]})
    assert (await client.until("error"))["code"] == "not_ready"
    await client.send({"type": "prepare", "system_prompt": "hi"})
    await client.until("prepared")
    for bad, code in [
        ({"type": "dance"}, "unknown_type"),
        ({"type": "audio_chunk", "audio_base64": "***"}, "invalid_request"),
        ({"type": "audio_chunk"}, "invalid_request"),
        ({"type": "prepare"}, "invalid_request"),
    ]:
        await client.send(bad)
        assert (await client.until("error"))["code"] == code, bad
    await client.ws.send("not json")
    assert (await client.until("error"))["code"] == "invalid_json"
    await client.speak(utterance())
    assert (await client.until("turn_done"))["turn_index"] == 0


async def test_prepare_sent_while_queued_is_kept(server: Server):
    holder = await open_client(server)
    await holder.prepare()
    early = await open_client(server)
    assert (await early.recv())["type"] == "queued"
    await early.send({"type": "prepare", "system_prompt": "eager"})
    await early.send({"type": "audio_chunk", "audio_base64": chunks_b64(silence(0.5))[0]})
    assert (await early.until("error"))["code"] == "not_ready"
    await holder.send({"type": "stop"})
    await early.until("queue_done")
    assert (await early.until("prepared"))["session_id"] == early.session_id


async def test_audio_while_answering_is_not_heard(server: Server):
    client = await open_client(server)
    await client.prepare("#latency:0.2")
    await client.speak(utterance())
    await client.until("generating")
    await client.speak(utterance())  # echo of the answer: must not start a turn
    await client.until("turn_done")
    await asyncio.sleep(0.5)
    await client.send({"type": "stop"})
    await client.until("stopped")
    assert client.types().count("generating") == 1


@pytest.mark.parametrize("session_id", ["bad id", "x" * 200])
async def test_unsafe_session_ids_are_refused(server: Server, session_id: str):
    async with connect(f"{server.ws}/ws/half_duplex/{session_id.replace(' ', '%20')}") as ws:
        message = json.loads(await ws.recv())
    assert message["type"] == "error" and message["code"] == "invalid_request"


async def test_disconnect_releases_the_worker(server: Server):
    client = await open_client(server)
    await client.prepare("#latency:0.3")
    await client.speak(utterance())
    await client.until("chunk")
    await client.ws.close()
    for _ in range(60):
        status = await server.get("/status")
        if status["workers"]["slots_busy"] == 0 and status["workers"]["by_state"] == {"idle": 1}:
            break
        await asyncio.sleep(0.1)
    assert status["workers"]["slots_busy"] == 0
    again = await open_client(server)
    assert (await again.prepare())["type"] == "prepared"


async def test_stop_during_a_slow_prepare_is_answered_at_once(server: Server):
    """Control never waits behind a model step: a 3 s prepare does not hold a stop."""
    client = await open_client(server)
    await client.until("queue_done")
    await client.send({"type": "prepare", "system_prompt": "#latency:3"})
    await asyncio.sleep(0.3)
    sent = time.monotonic()
    await client.send({"type": "stop"})
    await client.until("stopped", timeout=5)
    assert time.monotonic() - sent < 1.0
    assert "prepared" not in client.types()


async def answer_then_speech_over_it(server: Server, barge_in: bool) -> list[dict]:
    """A question, then, once the (slow) answer has begun, another question
    spoken over it at microphone pace; the messages until the second
    question's turn is over (or 4 s of quiet)."""
    client = await open_client(server)
    await client.prepare("#latency:0.4 Answer slowly.", {"barge_in": barge_in})
    await client.speak(utterance())
    await client.until("chunk")
    await client.speak(utterance("Wait, tell me about Rome instead."), pace_s=0.5)
    with contextlib.suppress(TimeoutError):
        await client.until("turn_done", timeout=20)  # the first answer's, or the second's
        await client.until("turn_done", timeout=20)
    await client.ws.close()
    return client.received


async def test_barge_in_speech_over_an_answer_interrupts_it_and_is_the_next_turn(server: Server):
    received = await answer_then_speech_over_it(server, barge_in=True)
    types = [m["type"] for m in received]
    assert "interrupted" in types, types
    at = types.index("interrupted")
    assert received[at]["turn_index"] == 0
    assert "turn_done" not in types[:at]  # the first answer never finished
    after = types[at + 1 :]
    # The speech that interrupted is heard to its end and answered as turn 1.
    assert after[0] == "vad_state" and received[at + 1]["speaking"] is True
    assert "generating" in after
    done = [m for m in received[at:] if m["type"] == "turn_done"]
    assert done and done[0]["turn_index"] == 1
    assert "earlier turns: none" not in done[0]["text"]  # the first turn is in the context


async def test_without_barge_in_speech_over_an_answer_is_not_heard(server: Server):
    received = await answer_then_speech_over_it(server, barge_in=False)
    types = [m["type"] for m in received]
    assert "interrupted" not in types
    # The first answer runs to its end: what was said over it was not heard
    # (its tail, spoken after the answer ended, may be a turn of its own).
    first_done = types.index("turn_done")
    assert received[first_done]["turn_index"] == 0
    assert types[: first_done + 1].count("vad_state") == 2  # the first question's only
