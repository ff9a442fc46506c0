"""Full duplex (audio and omni) through real processes on the scripted engine."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import time

import numpy as np
import pytest
from PIL import Image
from websockets.exceptions import ConnectionClosed

from tests.clients import Client, open_client
from tests.servers import Server
from tests.speech import silence

pytestmark = pytest.mark.shared_server

SECOND = silence(1.0) + 0.01  # quiet but not digital silence


def jpeg(color: tuple[int, int, int] = (200, 30, 30)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buffer, "JPEG")
    return base64.b64encode(buffer.getvalue()).decode()


async def duplex(server: Server, query: str = "?mode=audio", session_id: str | None = None):
    return await open_client(server, session_id, path="/ws/duplex", query=query)


async def results(client: Client, n: int, timeout: float = 10) -> list[dict]:
    got = []
    while len(got) < n:
        message = await client.recv(timeout)
        assert message["type"] != "error", message
        if message["type"] == "result":
            got.append(message)
    return got


async def test_unit_loop_listen_and_speak_results(server: Server):
    client = await duplex(server)
    prepared = await client.prepare("#schedule:LLSSE")
    assert prepared["prompt_length"] > 0 and prepared["mode"] == "audio_duplex"
    assert prepared["recording_session_id"] and prepared["vision"] is True  # scripted sees
    out = []
    for _ in range(6):
        await client.chunk(SECOND)
        out.extend(await results(client, 1))
    assert [r["is_listen"] for r in out] == [True, True, False, False, False, True]
    assert [r["end_of_turn"] for r in out] == [False] * 4 + [True, False]
    speak = out[2]
    audio = np.frombuffer(base64.b64decode(speak["audio_data"]), "<f4")
    assert audio.size == 24000 and np.abs(audio).max() > 0.1
    assert "unit 2 rms 0.010" in speak["text"]
    assert out[0]["audio_data"] is None and out[0]["text"] == ""
    for field in ("current_time", "cost_llm_ms", "cost_all_ms", "wall_clock_ms", "server_send_ts",
                  "kv_cache_length", "n_tokens", "n_tts_tokens", "vision_slices", "vision_tokens",
                  "cost_tts_prep_ms", "cost_tts_ms", "cost_token2wav_ms"):  # fmt: skip
        assert field in speak, field
    kv = [r["kv_cache_length"] for r in out]
    assert kv == sorted(kv) and kv[0] > prepared["prompt_length"]
    await client.send({"type": "stop"})
    await client.until("stopped")


async def test_deferred_finalize_runs_after_the_result_and_before_the_next_prefill(
    server: Server,
):
    for deferred in (True, False):
        client = await duplex(server)
        await client.prepare("#finalize-latency:0.4 #schedule:L", deferred_finalize=deferred)
        arrivals = []
        for _ in range(3):
            await client.chunk(SECOND)
            await results(client, 1)
            arrivals.append(time.monotonic())
        await client.chunk(SECOND)
        sent = time.monotonic()
        await results(client, 1)  # the scripted engine raises if prefill beats finalize
        waited = time.monotonic() - sent
        if deferred:
            # the previous finalize overlapped our send, so part of it was hidden
            assert waited < 0.4 + 0.3
        else:
            assert waited >= 0.4  # finalize ran before this result was sent
        await client.send({"type": "stop"})
        await client.until("stopped")
        assert "error" not in client.types()


async def test_pause_and_resume(server: Server):
    client = await duplex(server)
    await client.prepare("#schedule:L")
    await client.chunk(SECOND)
    await results(client, 1)
    await client.send({"type": "pause", "timeout": 30})
    paused = await client.until("paused")
    assert paused["timeout"] == 30
    await server.wait_worker_status("duplex_paused")
    await client.chunk(SECOND)  # heard by nobody
    await client.send({"type": "resume"})
    await client.until("resumed")
    await client.chunk(SECOND)
    [after] = await results(client, 1)
    assert after["unit_index"] == 1  # the chunk sent while paused never entered the loop
    with pytest.raises(TimeoutError):
        await results(client, 1, timeout=0.5)
    assert client.types().count("result") == 2


async def test_pause_timeout_releases_the_worker_to_the_next_client(server: Server):
    first = await duplex(server)
    await first.prepare()
    second = await duplex(server)
    assert (await second.recv())["type"] == "queued"
    await first.send({"type": "pause", "timeout": 0.8})
    await first.until("paused")
    timeout = await first.until("timeout", timeout=5)
    assert timeout["reason"] == "pause"
    assert (await second.prepare())["type"] == "prepared"  # waits for its queue_done


async def test_pause_timeout_is_capped(server: Server):
    client = await duplex(server)
    await client.prepare()
    await client.send({"type": "pause", "timeout": 100000})
    assert (await client.until("paused"))["timeout"] == 300


async def test_force_listen_interrupts_speech_and_ends_the_turn(server: Server):
    client = await duplex(server)
    await client.prepare("#schedule:SSSSSSEL")
    await client.chunk(SECOND)
    [speaking] = await results(client, 1)
    assert not speaking["is_listen"]
    await client.chunk(SECOND, force_listen=True)
    [forced] = await results(client, 1)
    assert forced["is_listen"]
    await client.chunk(SECOND)
    [after] = await results(client, 1)
    assert after["is_listen"], "the turn ended: the plan moved on to its next listen"


async def test_slow_engine_drops_oldest_chunks_and_reports_them(server: Server):
    client = await duplex(server)
    await client.prepare("#latency:0.6 #schedule:L")
    for _ in range(10):  # 1 s of audio every 0.2 s: five times faster than the engine
        await client.chunk(SECOND)
        await asyncio.sleep(0.2)
    out = []
    while True:
        try:
            out.extend(await results(client, 1, timeout=1.5))
        except TimeoutError:
            break
    indices = [r["unit_index"] for r in out]
    assert indices == sorted(indices) and indices[-1] == 9, "the newest chunk is never dropped"
    assert len(out) < 10
    assert sum(r["dropped_chunks"] for r in out) == 10 - len(out)
    assert out[-1]["dropped_chunks_total"] == 10 - len(out)


async def test_omni_session_with_jpeg_frames(server: Server):
    client = await duplex(server, query="?mode=omni")
    prepared = await client.prepare("#schedule:S", max_slice_nums=2)
    assert prepared["mode"] == "omni_duplex"
    await client.chunk(SECOND, frame_base64_list=[jpeg()])
    [out] = await results(client, 1)
    assert "frames 1" in out["text"]
    assert out["vision_slices"] == 2 and out["vision_tokens"] == 128
    await client.chunk(SECOND, frame_base64_list=[jpeg()], max_slice_nums=3)
    [out] = await results(client, 1)
    assert out["vision_slices"] == 3


async def test_audio_mode_ignores_frames(server: Server):
    client = await duplex(server, query="?mode=audio")
    await client.prepare("#schedule:S")
    await client.chunk(SECOND, frame_base64_list=[jpeg()])
    [out] = await results(client, 1)
    assert "frames 0" in out["text"] and out["vision_slices"] == 0


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"audio_base64": "&&&"}, "invalid_request"),
        ({"frame_base64_list": [base64.b64encode(b"not a jpeg").decode()]}, "invalid_request"),
        ({"frame_base64_list": [jpeg()] * 9}, "payload_too_large"),
        ({"audio_base64": base64.b64encode(np.zeros(16000 * 5, "<f4").tobytes()).decode()},
         "payload_too_large"),
        ({"max_slice_nums": 10}, "invalid_request"),
    ],
)  # fmt: skip
async def test_malformed_chunks_get_errors_and_the_session_continues(
    server: Server, fields: dict, code: str
):
    client = await duplex(server, query="?mode=omni")
    await client.prepare("#schedule:L")
    good = base64.b64encode(SECOND.astype("<f4").tobytes()).decode()
    await client.send({"type": "audio_chunk", "audio_base64": good, **fields})
    error = await client.until("error")
    assert error["code"] == code
    await client.chunk(SECOND)
    assert len(await results(client, 1)) == 1


async def test_engine_failure_in_a_unit_is_recoverable(server: Server):
    client = await duplex(server)
    await client.prepare("#fail-unit:1 #schedule:L")
    await client.chunk(SECOND)
    await results(client, 1)
    await client.chunk(SECOND)
    assert (await client.until("error"))["code"] == "inference_error"
    await client.chunk(SECOND)
    assert len(await results(client, 1)) == 1


async def test_units_failing_in_a_row_end_the_session_once(server: Server):
    """An engine that fails every unit from some point on: two errors, then
    the session ends once with its error and gives its slot back, instead of
    one failure (and one logged traceback) a second until the client leaves."""
    client = await duplex(server)
    await client.prepare("#fail-from:1 #schedule:L")
    await client.chunk(SECOND)
    await results(client, 1)
    codes = []
    for _ in range(5):
        await client.chunk(SECOND)
    with pytest.raises(ConnectionClosed):
        while True:
            message = await client.recv(10)
            if message["type"] == "error":
                codes.append(message["code"])
    assert codes == ["inference_error"] * 3  # two that let it go on, one that ends it
    await server.wait_idle(timeout=5)


async def test_a_long_call_slides_its_context_and_goes_on(server: Server):
    """Past its window the context lets the oldest units go (the session's
    own window here); the system prompt stays, the results say how full the
    context is and how many units left, and the call goes on."""
    client = await duplex(server)
    window = {"high_tokens": 1000, "low_tokens": 600}
    await client.prepare("#kv-per-unit:150 #schedule:LS", context_window=window)
    out = []
    for _ in range(24):
        await client.chunk(SECOND)
        out.extend(await results(client, 1))
    lengths = [r["kv_cache_length"] for r in out]
    assert max(lengths) <= 1000 + 150 + 8 and lengths[-1] < lengths[5] + 1000
    assert out[-1]["evicted_units"] >= 10 and out[-1]["context_capacity"] == 8192
    evicted = [r["evicted_units"] for r in out]
    assert evicted == sorted(evicted) and evicted[0] == 0


async def test_the_admin_page_sees_each_sessions_context_while_it_runs(server: Server):
    """``GET /api/admin/live`` lists a running duplex session's context as its
    last result told it, and no longer once its connection ended."""

    async def shown() -> list[dict]:
        contexts = (await server.get("/api/admin/live"))["contexts"]
        return [c for c in contexts if c["session_id"] == client.session_id]

    client = await duplex(server)
    window = {"high_tokens": 1000, "low_tokens": 600}
    await client.prepare("#kv-per-unit:150 #schedule:L", context_window=window)
    for _ in range(10):
        await client.chunk(SECOND)
        [last] = await results(client, 1)
    [context] = await shown()
    assert context["kv_cache_length"] == last["kv_cache_length"] > 0
    assert context["context_capacity"] == last["context_capacity"] == 8192
    assert context["evicted_units"] == last["evicted_units"] > 0  # the window slid
    assert context["fill"] == round(last["kv_cache_length"] / 8192, 3)
    assert context["worker_id"] == (await server.get("/workers"))["workers"][0]["worker_id"]
    await client.send({"type": "stop"})
    await client.until("stopped")
    await client.ws.close()
    async with asyncio.timeout(5):  # the gateway's handler returns just after the close
        while True:
            if not await shown():
                break
            await asyncio.sleep(0.05)


async def test_a_fixed_context_ends_context_full_before_it_overflows(server: Server):
    client = await duplex(server)
    await client.prepare("#kv-per-unit:700 #schedule:L", context_window="off")
    seen = []
    for _ in range(14):
        # The server ends the session right after the unit that filled it, so
        # the next second may meet a closed socket; what it sent is still read.
        with contextlib.suppress(ConnectionClosed):
            await client.chunk(SECOND)
        message = await client.until("result", "timeout", timeout=10)
        seen.append(message)
        if message["type"] == "timeout":
            break
    assert seen[-1] == {**seen[-1], "type": "timeout", "reason": "context_full"}
    assert all(r["kv_cache_length"] <= 8192 for r in seen[:-1])
    assert max(r["evicted_units"] for r in seen[:-1]) == 0
    await server.wait_idle(timeout=5)


async def test_a_context_window_that_cannot_be_is_refused(server: Server):
    client = await duplex(server)
    await client.until("queue_done")
    bad = {"high_tokens": 500, "low_tokens": 900}
    await client.send({"type": "prepare", "system_prompt": "hi", "context_window": bad})
    error = await client.until("error")
    assert error["code"] == "invalid_request" and "low_tokens" in error["error"]
    own = {"mode": "context", "max_units": 3}
    await client.send({"type": "prepare", "system_prompt": "#schedule:L", "context_window": own})
    await client.until("prepared")


async def test_task_type_from_query_prepare_or_prefix(server: Server):
    async def running_type(client: Client) -> str:
        await client.prepare(**({"mode": "audio_duplex"} if client.session_id == "late" else {}))
        tasks = (await server.get("/status"))["running_tasks"]
        await client.send({"type": "stop"})
        await client.until("stopped")
        await client.ws.close()
        await asyncio.sleep(0.2)
        return tasks[0]["request_type"]

    assert await running_type(await duplex(server, query="?mode=audio")) == "audio_duplex"
    assert await running_type(await duplex(server, query="?mode=omni")) == "omni_duplex"
    assert (
        await running_type(await duplex(server, query="", session_id="adx_old")) == "audio_duplex"
    )
    assert await running_type(await duplex(server, query="", session_id="omni_x")) == "omni_duplex"
    assert await running_type(await duplex(server, query="", session_id="late")) == "audio_duplex"


async def test_server_paths_are_refused(server: Server):
    client = await duplex(server)
    await client.until("queue_done")
    await client.send({"type": "prepare", "system_prompt": "x", "ref_audio_path": "/etc/passwd"})
    error = await client.until("error")
    assert "ref_audio_path" in error["error"]


async def test_idle_session_times_out(tmp_path):
    srv = Server(tmp_path, env={"OMNILIVE_DUPLEX__IDLE_TIMEOUT_S": "1"}).start()
    try:
        await srv.wait_ready(workers=1)
        client = await duplex(srv)
        await client.prepare()
        assert (await client.until("timeout", timeout=5))["reason"] == "idle"
    finally:
        srv.stop()


async def test_internal_options_never_come_from_clients(server: Server):
    """The Realtime API's options travel in the gateway's own message; a
    client cannot send it, and a prepare naming them is a plain duplex one."""
    client = await duplex(server)
    await client.until("queue_done")
    options = {"type": "internal.realtime", "dialect": "realtime", "context_limit": 5}
    await client.send(options)
    assert (await client.until("error"))["code"] == "unknown_type"
    prepare = {"type": "prepare", "system_prompt": "#schedule:L", "dialect": "realtime",
               "context_limit": 5}  # fmt: skip
    await client.send(prepare)
    assert (await client.until("prepared"))["type"] == "prepared"  # not session.created
    for _ in range(3):
        await client.chunk(SECOND)
    got = await results(client, 3)
    assert [r["type"] for r in got] == ["result"] * 3  # no context_full at 5 tokens


async def test_stop_during_a_slow_prepare_is_answered_at_once(server: Server):
    """Control never waits behind a model step: a 3 s prepare does not hold a stop."""
    client = await duplex(server)
    await client.until("queue_done")
    await client.send({"type": "prepare", "system_prompt": "#latency:3 #schedule:L"})
    await asyncio.sleep(0.3)
    sent = time.monotonic()
    await client.send({"type": "stop"})
    await client.until("stopped", timeout=5)
    assert time.monotonic() - sent < 1.0
    assert "prepared" not in client.types()
    await server.wait_worker_status("idle", timeout=10)  # once the prepare is over


async def test_chunks_sent_during_a_prepare_are_heard_after_it(server: Server):
    client = await duplex(server)
    await client.until("queue_done")
    await client.send({"type": "prepare", "system_prompt": "#latency:0.5 #schedule:L"})
    await client.chunk(SECOND)  # sent before prepared arrives
    await client.until("prepared")
    [result] = await results(client, 1)
    assert result["unit_index"] == 0 and "error" not in client.types()


async def test_workers_list_the_sessions_holding_their_slots(server: Server):
    client = await duplex(server, session_id="slot_holder")
    await client.prepare("#schedule:L")
    [worker] = (await server.get("/workers"))["workers"]
    assert [(s["session_id"], s["request_type"]) for s in worker["sessions"]] == [
        ("slot_holder", "audio_duplex")
    ]
    assert worker["slots_busy"] == 1
    await client.send({"type": "stop"})
    await client.until("stopped")
    await server.wait_worker_status("idle", timeout=10)
    assert (await server.get("/workers"))["workers"][0]["sessions"] == []
