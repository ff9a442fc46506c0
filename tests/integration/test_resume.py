"""Sessions that survive the network (docs/resume.md), through real
processes: a TCP proxy in the test cuts or blackholes the client's
connection mid-answer, and the client resumes with its token."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.clients import EventSocket
from tests.servers import Server
from tests.speech import chunks_b64, silence, speak
from tests.tcp_proxy import TcpProxy

QUESTION = "What is the weather like in Paris today?"


def utterance(text: str = QUESTION) -> np.ndarray:
    return np.concatenate([silence(1.0), speak(text), silence(1.5)])


class Numbered(EventSocket):
    """A client that keeps every event with its ``seq`` and the session's token,
    across the connections it resumes on."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # opened by open()
        self.token: str | None = None
        self.resumed: list[dict[str, Any]] = []

    @property
    def last_seq(self) -> int:
        return self.events[-1]["seq"] if self.events else 0

    async def open(self, url: str) -> Numbered:
        self.ws = await connect(url, max_size=None)
        return self

    async def recv(self, timeout: float = 20) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        if event["type"] == "session.resumed":
            self.resumed.append(event)
            self.token = event["resume_token"]
            return event
        self.events.append(event)
        if "resume_token" in event and self.token is None:
            self.token = event["resume_token"]
        return event

    async def until(self, *types: str, timeout: float = 20) -> dict[str, Any]:
        return await super().until(*types, timeout=timeout)

    async def speak(self, audio: np.ndarray) -> None:
        for chunk in chunks_b64(audio):
            await self.send({"type": "audio_chunk", "audio_base64": chunk})

    def resume_url(self, base: str) -> str:
        joiner = "&" if "?" in base else "?"
        return f"{base}{joiner}resume_token={self.token}&last_seq={self.last_seq}"

    async def resume(self, base: str) -> dict[str, Any]:
        """A new connection that resumes; its ``session.resumed``."""
        await self.open(self.resume_url(base))
        resumed = await self.recv()
        assert resumed["type"] == "session.resumed", resumed
        return resumed

    def assert_contiguous(self) -> None:
        seqs = [event["seq"] for event in self.events]
        assert seqs == list(range(1, len(seqs) + 1)), seqs


async def refusal(url: str, **kwargs: Any) -> tuple[dict[str, Any], int | None]:
    async with connect(url, max_size=None, **kwargs) as ws:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        return event, ws.close_code


async def status(server: Server) -> dict[str, Any]:
    return await server.get("/status")


# The grace of the tests that wait for it to end: long enough for the status
# and the metrics to be read inside it on a loaded machine.
SHORT_GRACE_S = 4.0


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    """Poll the server's own view (``/status``) until ``predicate`` holds."""
    async with asyncio.timeout(timeout):
        for _ in range(int(timeout * 10)):
            if await predicate():
                return
            await asyncio.sleep(0.1)


@pytest.fixture
async def proxy(server: Server) -> Any:
    proxy = await TcpProxy(server.port).start()
    yield proxy
    await proxy.close()


async def half_duplex_mid_answer(server: Server, proxy: TcpProxy) -> Numbered:
    """A half-duplex session through the proxy, stopped at its first answer chunk."""
    sid = f"s_{secrets.token_hex(4)}"
    client = await Numbered().open(f"{proxy.ws}/ws/half_duplex/{sid}?seq=1")
    first = await client.until("queue_done")
    assert first["seq"] == 1 and first["resume_grace_s"] == 30 and client.token
    await client.send({"type": "prepare", "system_prompt": "slow #latency:0.3", "config": {}})
    await client.until("prepared")
    await client.speak(utterance())
    await client.until("chunk")
    return client


async def test_half_duplex_resumes_after_a_cut_mid_answer(server: Server, proxy: TcpProxy):
    client = await half_duplex_mid_answer(server, proxy)
    proxy.cut()
    await wait_for(lambda: _suspended(server, 1))
    assert (await status(server))["running_tasks"][0]["suspended"] is True
    await asyncio.sleep(1.0)  # the answer goes on meanwhile (0.3 s a chunk)
    resumed = await client.resume(f"{server.ws}/ws/half_duplex/any")
    assert resumed["events_lost"] == 0 and resumed["input_gap_ms"] > 1000
    assert resumed["replayed"] >= 2  # what was sent while the client was away
    assert resumed["resume_token"] == client.events[0]["resume_token"]
    first_turn = await client.until("turn_done")
    # the same session: a second turn refers to the first one
    await client.speak(utterance())
    second_turn = await client.until("turn_done")
    assert "earlier turns: none" in first_turn["text"]
    assert "earlier turns: none" not in second_turn["text"]
    client.assert_contiguous()
    assert [e["type"] for e in client.events].count("turn_done") == 2
    assert (await status(server))["suspended_sessions"] == 0
    # the recording marks where the client was away
    await client.send({"type": "stop"})
    await client.until("stopped")
    await client.ws.close()
    prepared = next(e for e in client.events if e["type"] == "prepared")
    marks = server.tmp / "data" / "sessions" / prepared["recording_session_id"] / "connection.json"
    await wait_for(lambda: _exists(marks))
    [gap] = json.loads(marks.read_text())["gaps"]
    assert gap["resumed_at"] > gap["dropped_at"] and gap["input_gap_ms"] == resumed["input_gap_ms"]


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def test_a_blackholed_connection_is_taken_over(server: Server, proxy: TcpProxy):
    """No close ever reaches either side: the resume takes the session over."""
    client = await half_duplex_mid_answer(server, proxy)
    old = client.ws
    proxy.blackhole()
    await asyncio.sleep(0.5)  # events the server sends now are lost in the hole
    await client.resume(f"{server.ws}/ws/half_duplex/any")
    await client.until("turn_done")
    client.assert_contiguous()
    assert old is not None and old.close_code is None  # the old socket never heard a thing
    await old.close()


async def test_a_bad_token_is_refused_and_nothing_breaks(server: Server):
    url = f"{server.ws}/ws/half_duplex/x?resume_token=nope&last_seq=3"
    event, code = await refusal(url)
    assert event["code"] == "resume_refused" and code == 1008
    event, code = await refusal(f"{server.ws}/ws/half_duplex/x?resume_token=t&last_seq=-1")
    assert event["code"] == "resume_refused" and "malformed" in event["error"]
    event, code = await refusal(f"{server.ws}/v1/realtime?mode=audio&resume_token=nope")
    assert event["error"]["code"] == "resume_refused" and code == 1008
    event, code = await refusal(f"{server.ws}/v1/realtime?model=m&resume_token=nope")
    assert event["type"] == "error" and event["error"]["code"] == "resume_refused"
    await server.wait_ready(workers=1)  # still serving


async def test_two_clients_racing_with_one_token_one_wins(server: Server, proxy: TcpProxy):
    """Both present the token at once: the session ends up on exactly one of
    them; the other is refused, or attached first and then closed (4000)."""
    client = await half_duplex_mid_answer(server, proxy)
    proxy.cut()
    await wait_for(lambda: _suspended(server, 1))
    url = client.resume_url(f"{server.ws}/ws/half_duplex/any")
    sockets = await asyncio.gather(*(connect(url, max_size=None) for _ in range(2)))

    async def fate(ws: ClientConnection) -> str:
        """``live`` if it holds the session 3 s later, else how it was let go."""
        try:
            async with asyncio.timeout(3):
                async for raw in ws:
                    event = json.loads(raw)
                    if event["type"] == "error":
                        assert event["code"] == "resume_refused"
        except TimeoutError:
            return "live"
        except ConnectionClosed:
            pass
        return f"closed {ws.close_code}"

    fates = sorted(await asyncio.gather(*(fate(ws) for ws in sockets)))
    assert fates[1] == "live" and fates[0] in ("closed 1008", "closed 4000"), fates
    assert (await status(server))["suspended_sessions"] == 0
    for ws in sockets:
        await ws.close()


async def test_a_resume_for_another_route_is_refused(server: Server, proxy: TcpProxy):
    client = await half_duplex_mid_answer(server, proxy)
    proxy.cut()
    await wait_for(lambda: _suspended(server, 1))
    event, _ = await refusal(client.resume_url(f"{server.ws}/ws/duplex/any"))
    assert event["code"] == "resume_refused" and "half_duplex" in event["error"]
    # the refusal did not use up the token
    await client.resume(f"{server.ws}/ws/half_duplex/any")
    await client.until("turn_done")
    client.assert_contiguous()


async def _suspended(server: Server, n: int) -> bool:
    return (await status(server))["suspended_sessions"] == n


async def test_the_slot_is_held_then_freed_when_no_resume_comes(tmp_path: Path):
    server = Server(tmp_path, env={"OMNILIVE_LIMITS__RESUME_GRACE_S": str(SHORT_GRACE_S)}).start()
    proxy = await TcpProxy(server.port).start()
    try:
        await server.wait_ready(workers=1)
        client = await half_duplex_mid_answer_grace(server, proxy)
        proxy.cut()
        await wait_for(lambda: _suspended(server, 1))
        metrics = await _metrics(server)
        body = await status(server)
        assert body["workers"]["slots_busy"] == 1
        assert "omnilive_sessions_suspended 1" in metrics
        await wait_for(lambda: _suspended(server, 0))
        body = await status(server)
        assert body["suspended_sessions"] == 0 and body["running_tasks"] == []
        await server.wait_ready(workers=1)  # the slot is idle again
        event, _ = await refusal(client.resume_url(f"{server.ws}/ws/half_duplex/any"))
        assert event["code"] == "resume_refused"
    finally:
        await proxy.close()
        server.stop()


async def test_any_close_frame_ends_the_session_at_once(tmp_path: Path):
    """Only a connection lost without a Close frame is held for a resume: an
    empty Close (1005, OpenAI's JS SDK), a protocol error, an application's
    own code, and the server's own 1009 for an oversized frame all end the
    session, and the slot is free long before the 30 s grace."""
    env = {"OMNILIVE_LIMITS__MAX_MESSAGE_BYTES": "200000"}
    server = Server(tmp_path, env=env).start()
    try:
        await server.wait_ready(workers=1)
        for code in (None, 1002, 3000, 4001, "oversized"):
            sid = f"s_{secrets.token_hex(4)}"
            client = await Numbered().open(f"{server.ws}/ws/half_duplex/{sid}")
            assert (await client.until("queue_done"))["resume_grace_s"] == 30
            await client.send({"type": "prepare", "system_prompt": "hi", "config": {}})
            await client.until("prepared")
            if code == "oversized":
                with contextlib.suppress(ConnectionClosed):
                    await client.ws.send("x" * 2_000_000)
                    await client.ws.wait_closed()
                assert client.ws.close_code == 1009
            else:
                await client.ws.close(code)  # type: ignore[arg-type]  # None: an empty Close
            status = await server.wait_idle(timeout=8)
            assert status["suspended_sessions"] == 0, (code, status)
    finally:
        server.stop()


async def half_duplex_mid_answer_grace(server: Server, proxy: TcpProxy) -> Numbered:
    sid = f"s_{secrets.token_hex(4)}"
    client = await Numbered().open(f"{proxy.ws}/ws/half_duplex/{sid}?seq=1")
    first = await client.until("queue_done")
    assert first["resume_grace_s"] == SHORT_GRACE_S
    await client.send({"type": "prepare", "system_prompt": "slow #latency:0.3", "config": {}})
    await client.until("prepared")
    await client.speak(utterance())
    await client.until("chunk")
    return client


async def _metrics(server: Server) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{server.http}/metrics", headers=server.headers)).text


async def test_grace_zero_turns_resume_off(tmp_path: Path):
    server = Server(tmp_path, env={"OMNILIVE_LIMITS__RESUME_GRACE_S": "0"}).start()
    try:
        await server.wait_ready(workers=1)
        async with connect(f"{server.ws}/ws/half_duplex/s_off") as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert first["type"] == "queue_done" and "resume_token" not in first and "seq" not in first
    finally:
        server.stop()


async def test_a_realtime_session_resumes_with_its_events_in_order(server: Server, proxy: TcpProxy):
    """The MiniCPM-o Realtime dialect: one unit's output per second of audio."""
    client = await Numbered().open(f"{proxy.ws}/v1/realtime?mode=audio&seq=1")
    await client.until("session.queue_done")
    await client.send({"type": "session.update", "session": {"instructions": "#schedule:LLSE"}})
    await client.until("session.created")
    second = chunks_b64(np.zeros(16000, "<f4") + 0.01, 16000)[0]
    for _ in range(3):
        await client.send({"type": "input_audio_buffer.append", "audio": second})
    await client.until("response.output_audio.delta")
    proxy.cut()
    await client.resume(f"{server.ws}/v1/realtime")
    await client.send({"type": "input_audio_buffer.append", "audio": second})
    last = await client.until("response.output_audio.delta")
    assert last["end_of_turn"] is True  # the fourth unit: the session went on
    client.assert_contiguous()


async def test_a_foreign_key_cannot_resume(tmp_path: Path):
    keys = [
        {"key": "resume-owner-key-0123456789", "role": "user", "name": "owner", "max_sessions": 1},
        {"key": "resume-other-key-0123456789", "role": "user", "name": "other"},
    ]
    env = {"OMNILIVE_AUTH__KEYS": json.dumps(keys)}
    server = Server(tmp_path, env=env, api_key=keys[0]["key"]).start()
    proxy = await TcpProxy(server.port).start()
    try:
        await server.wait_ready(workers=1)
        owner = {"Authorization": f"Bearer {keys[0]['key']}"}
        other = {"Authorization": f"Bearer {keys[1]['key']}"}
        client = Numbered()
        client.ws = await connect(
            f"{proxy.ws}/ws/half_duplex/s_key?seq=1", additional_headers=owner
        )
        await client.until("queue_done")
        await client.send({"type": "prepare", "system_prompt": "hi", "config": {}})
        await client.until("prepared")
        proxy.cut()
        await wait_for(lambda: _suspended(server, 1))
        # the suspended session holds the key's one place; its resume takes none
        with pytest.raises(InvalidStatus) as refused:
            await connect(f"{server.ws}/ws/half_duplex/s_more", additional_headers=owner)
        assert refused.value.response.status_code == 429
        url = client.resume_url(f"{server.ws}/ws/half_duplex/any")
        event, _ = await refusal(url, additional_headers=other)
        assert event["code"] == "resume_refused" and "another API key" in event["error"]
        client.ws = await connect(url, additional_headers=owner)
        assert (await client.recv())["type"] == "session.resumed"
        await client.ws.close()
    finally:
        await proxy.close()
        server.stop()


@pytest.mark.cascade
async def test_the_cascade_keeps_the_conversation_across_a_cut(tmp_path: Path):
    """The real embedded engine: the answer after the resume uses what was
    said before the cut (the model's context was held while suspended)."""
    server = Server(tmp_path, engine="cascade").start()
    proxy = await TcpProxy(server.port).start()
    try:
        await server.wait_ready(timeout=180, workers=1)
        client = await Numbered().open(f"{proxy.ws}/ws/half_duplex/s_cascade?seq=1")
        await client.until("queue_done")
        prompt = "You are a helpful assistant. Answer in one short sentence."
        # Greedy: a sampled first answer (which depends on how many answers
        # begun at pauses drew from the sampler before) sometimes had SmolLM2
        # call itself Peter, and then forget who the user was.
        config = {"generation": {"do_sample": False}}
        await client.send({"type": "prepare", "system_prompt": prompt, "config": config})
        await client.until("prepared", timeout=60)
        await client.speak(utterance("My name is Peter. Please remember my name."))
        await client.until("chunk", timeout=60)
        proxy.cut()
        await client.resume(f"{server.ws}/ws/half_duplex/any")
        await client.until("turn_done", timeout=60)
        await client.speak(utterance("What is my name?"))
        answer = await client.until("turn_done", timeout=60)
        client.assert_contiguous()
        assert "peter" in answer["text"].lower(), answer
    finally:
        await proxy.close()
        server.stop()


async def test_a_playback_report_cuts_the_answer_to_what_was_heard(server: Server):
    """History = what was heard: the client played only part of turn 0; the
    context keeps that part, and the next answer is made from it."""
    client = await Numbered().open(f"{server.ws}/ws/half_duplex/s_heard")
    await client.until("queue_done")
    await client.send({"type": "prepare", "system_prompt": "hi", "config": {}})
    await client.until("prepared")
    await client.speak(utterance())
    done = await client.until("turn_done")
    await client.send({"type": "playback", "turn_index": 1, "played_ms": 10})
    assert (await client.until("error"))["code"] == "invalid_request"  # not the last turn
    await client.send({"type": "playback", "turn_index": 0, "played_ms": 1500})
    applied = await client.until("playback_applied")
    assert applied["context"] == "cut" and applied["heard_text"]
    assert done["text"].startswith(applied["heard_text"]) and applied["heard_text"] != done["text"]
    await client.speak(utterance())
    second = await client.until("turn_done")
    assert f"last answer heard: {applied['heard_text']!r}" in second["text"]
    # all of it heard: nothing to cut
    await client.send({"type": "playback", "turn_index": 1, "played_ms": 999_999})
    whole = await client.until("playback_applied")
    assert whole["context"] == "unchanged" and whole["heard_text"] == second["text"]


async def test_a_duplex_session_pauses_while_suspended_and_goes_on(server: Server, proxy: TcpProxy):
    """Units are driven by the client's audio: none runs while it is away."""
    client = await Numbered().open(f"{proxy.ws}/ws/duplex/s_dx?mode=audio_duplex&seq=1")
    await client.until("queue_done")
    await client.send({"type": "prepare", "system_prompt": "#schedule:LLSSE", "config": {}})
    await client.until("prepared")
    second = chunks_b64(np.zeros(16000, "<f4") + 0.01, 16000)[0]
    for _ in range(2):
        await client.send({"type": "audio_chunk", "audio_base64": second})
    await client.until("result")
    await client.until("result")
    proxy.cut()
    await wait_for(lambda: _suspended(server, 1))
    await asyncio.sleep(1.5)  # no unit runs meanwhile: nothing new to replay
    resumed = await client.resume(f"{server.ws}/ws/duplex/any")
    assert resumed["replayed"] == 0 and resumed["input_gap_ms"] >= 1500
    for _ in range(3):
        await client.send({"type": "audio_chunk", "audio_base64": second})
    results = [await client.until("result") for _ in range(3)]
    assert results[-1]["end_of_turn"] is True  # the fifth unit of the schedule
    client.assert_contiguous()


async def test_an_openai_dialect_session_resumes(server: Server, proxy: TcpProxy):
    """With omnilive's extensions asked for: OpenAI's clients know no resume token."""
    url = f"{proxy.ws}/v1/realtime?model=gpt-realtime&seq=1&omnilive_extensions=true"
    client = await Numbered().open(url)
    created = await client.until("session.created")
    assert created["seq"] == 1 and client.token
    await wait_for(lambda: _running(server, 1))
    proxy.cut()
    await wait_for(lambda: _suspended(server, 1))
    await client.resume(f"{server.ws}/v1/realtime?model=gpt-realtime")
    await client.send({"type": "session.update", "session": {"type": "realtime"}})
    await client.until("session.updated")
    client.assert_contiguous()


async def test_an_openai_client_that_drops_is_not_held(server: Server, proxy: TcpProxy):
    """A plain OpenAI client gets no token, and its lost connection ends the
    session at once: its slot is not held for a resume it cannot ask for."""
    client = await Numbered().open(f"{proxy.ws}/v1/realtime?model=gpt-realtime")
    created = await client.until("session.created")
    assert "resume_token" not in created and "resume_grace_s" not in created
    await wait_for(lambda: _running(server, 1))
    proxy.cut()
    status = await server.wait_idle(timeout=8)
    assert status["suspended_sessions"] == 0


async def _running(server: Server, n: int) -> bool:
    return len((await status(server))["running_tasks"]) == n
