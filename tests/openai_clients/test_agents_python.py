"""OpenAI's Agents SDK for Python (``openai-agents``), unmodified, as a voice
app uses it, against a real ``omnilive serve`` on the scripted engine: a
``RealtimeAgent`` with a function tool run by ``RealtimeRunner``, text in,
speech in, a tool round trip and ``interrupt()``. The SDK validates every
server event against the ``openai`` package's union and turns any it cannot
into an ``error`` event: none may come. Every event it received also
type-checks against the ``openai`` npm package's TypeScript types."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeSessionModelSettings

from tests.openai_clients.harness import conforming, pcm24, question, session_of
from tests.servers import Server, running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(tmp_path_factory.mktemp("agents-python")) as server:
        yield server


async def test_text_in_and_the_answer_out(server: Server, tmp_path: Path):
    agent = RealtimeAgent(name="assistant", instructions="Be brief.")
    async with session_of(server, agent) as recorded:
        await recorded.session.send_message("hello there")
        await recorded.until("agent_end")
    done = next(e for e in recorded.server_events if e["type"] == "response.done")
    assert done["response"]["output"][0]["content"][0]["transcript"] == "Answered: hello there"
    assert "audio" in recorded.kinds
    conforming(recorded, tmp_path)


async def test_speech_in_and_speech_out(server: Server, tmp_path: Path):
    agent = RealtimeAgent(name="assistant", instructions="Be brief.")
    transcription: RealtimeSessionModelSettings = {"input_audio_transcription": {"model": "x"}}
    async with session_of(server, agent, transcription) as recorded:
        speech = pcm24(question())
        for start in range(0, len(speech), 4800):  # 100 ms pieces, as from a microphone
            await recorded.session.send_audio(speech[start : start + 4800])
        await recorded.until("agent_end")
    kinds = [e["type"] for e in recorded.server_events]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.committed",
                 "conversation.item.input_audio_transcription.completed",
                 "response.output_audio.delta"):  # fmt: skip
        assert kind in kinds, kind
    conforming(recorded, tmp_path)


async def test_a_tool_round_trip(server: Server, tmp_path: Path):
    """The scripted engine calls a tool its user's text names; the SDK runs
    the function once, sends its output and asks for the answer."""
    calls: list[str] = []

    @function_tool
    def get_weather(text: str) -> str:
        """The weather in a place."""
        calls.append(text)
        return "sunny"

    agent = RealtimeAgent(name="assistant", instructions="Be brief.", tools=[get_weather])
    async with session_of(server, agent, {"output_modalities": ["text"]}) as recorded:
        await recorded.session.send_message("get_weather for Paris")
        await recorded.until("tool_end")
        await recorded.until_server("response.done", 2)  # the call, then the answer
    assert calls == ["get_weather for Paris"]
    done = [e for e in recorded.server_events if e["type"] == "response.done"]
    assert done[-1]["response"]["output"][0]["content"][0]["text"] == "Answered: sunny"
    conforming(recorded, tmp_path)


async def test_interrupt_stops_the_answer_and_the_talk_goes_on(server: Server, tmp_path: Path):
    """``interrupt()`` sends ``conversation.item.truncate`` for the item that
    plays (and, with the server's VAD interrupting, no cancel): omnilive
    announced that item moments before, so it must find it and stop the
    answer, not say ``item_not_found``."""
    agent = RealtimeAgent(name="assistant", instructions="#latency:0.3")
    async with session_of(server, agent) as recorded:
        await recorded.session.send_message("tell me about the sea")
        await recorded.until("audio")
        await asyncio.sleep(0.3)
        await recorded.session.interrupt()
        await recorded.until("audio_interrupted")
        await recorded.until("agent_end")
        await recorded.session.send_message("and the mountains")
        await recorded.until("agent_end")
    done = [e["response"]["status"] for e in recorded.server_events if e["type"] == "response.done"]
    assert done == ["cancelled", "completed"]
    kinds = [e["type"] for e in recorded.server_events]
    assert "conversation.item.truncated" in kinds
    conforming(recorded, tmp_path)
