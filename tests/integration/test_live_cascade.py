"""OpenAI's Live API on the embedded engine (the cascade's duplex loop),
with the ``openai`` SDK unchanged, and a real OpenAI-compatible language
model server (llama-cpp-python's over the packaged SmolLM2) as the
``responses`` delegation's backend: a spoken request the judge delegates,
the backend's function call sent to the app, its output taken back, and the
backend's answer said by the live model. Every event is validated as the
SDK types it, the backend's own (``response.event``) as
``openai.types.responses.ResponseStreamEvent``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.integration.test_live import DELEGATING, connect, start, stream, until
from tests.llm_server import serve_llm
from tests.servers import Server, running
from tests.speech import WEATHER_QUESTION, silence, speak

pytestmark = pytest.mark.cascade
BACKEND_EVENT = TypeAdapter(ResponseStreamEvent)
FORECAST = json.dumps({"city": "London", "forecast": "sunny", "celsius": 21})
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather forecast for a city",
    "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_llm(tmp_path_factory.mktemp("llm"))


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory, llm_server: str) -> Iterator[Server]:
    env = {
        "OMNILIVE_TRANSCRIPTION__WHISPER": "true",
        "OMNILIVE_LIVE__BACKEND__URL": llm_server,
        "OMNILIVE_LIVE__BACKEND__STREAM_AUTO_TOOLS": "false",
    }
    folder = tmp_path_factory.mktemp("live-cascade")
    with running(folder, ready_timeout=180, engine="cascade", env=env) as server:
        yield server


async def backend_events(connection: Any, until_type: str) -> list[Any]:
    """The backend's events (validated as the Responses API's) up to ``until_type``."""
    events: list[Any] = []
    async with asyncio.timeout(120):
        while not events or events[-1].type != until_type:
            wrapped, _ = await until(connection, "response.event", timeout=120)
            events.append(BACKEND_EVENT.validate_python(wrapped.event))
    return events


async def test_a_responses_delegation_with_a_function_tool(cascade: Server):
    responses = {
        "model": "smollm2",
        "instructions": "Call get_weather for the city the user names.",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    async with connect(cascade) as connection:
        await start(
            connection,
            instructions=DELEGATING,
            delegation={"type": "responses", "responses": responses},
        )
        await stream(connection, silence(1.0))
        await stream(connection, speak(WEATHER_QUESTION))
        await stream(connection, silence(2.0))
        created, _ = await until(connection, "session.delegation.created", timeout=60)
        assert created.delegation.target == "responses"
        first = await backend_events(connection, "response.completed")
        assert first[0].type == "response.created"
        [call] = [e for e in first if e.type == "response.function_call_arguments.done"]
        items = [e.item for e in first if e.type == "response.output_item.done"]
        [function_call] = [i for i in items if i.type == "function_call"]
        assert function_call.name == "get_weather" and json.loads(call.arguments) is not None
        output = {"type": "function_call_output", "call_id": function_call.call_id}
        await connection.response.item.create(item={**output, "output": FORECAST})
        await connection.session.update(
            session={"delegation": {"type": "responses", "responses": {"tool_choice": "none"}}}
        )
        await until(connection, "session.updated")
        await connection.response.create()
        second = await backend_events(connection, "response.completed")
        answer = "".join(e.delta for e in second if e.type == "response.output_text.delta")
        assert answer.strip()
        said: list[str] = []
        async with asyncio.timeout(60):
            while answer.split()[0].strip(".,!").lower() not in " ".join(said).lower():
                await stream(connection, silence(1.0))
                event, _ = await until(connection, "session.output_transcript.delta", timeout=60)
                said.append(event.delta)


async def test_a_client_delegation_on_the_cascade(cascade: Server):
    async with connect(cascade) as connection:
        await start(connection, instructions=DELEGATING)
        await stream(connection, silence(1.0))
        await stream(connection, speak(WEATHER_QUESTION))
        await stream(connection, silence(2.0))
        created, seen = await until(connection, "session.delegation.created", timeout=60)
        heard = [e for e in seen if e.type == "session.input_transcript.delta"]
        assert heard and "weather" in heard[0].delta.lower()
        await connection.session.commentary.append(
            content="It is sunny in Paris.", delegation_id=created.delegation.id
        )
        said: list[str] = []
        async with asyncio.timeout(60):
            while "sunny" not in " ".join(said).lower():
                await stream(connection, silence(1.0))
                event, _ = await until(connection, "session.output_transcript.delta", timeout=60)
                said.append(event.delta)
