"""The tool flow of OpenAI's own clients on the embedded engine with a real
language model server: llama-cpp-python's own OpenAI-compatible server over
the packaged SmolLM2 (``chatml-function-calling``), as ``cascade.llm.url``,
with ``tool_choice: auto``, every client's default.

That server answers a *streamed* request with tool choice ``auto`` with a
200 and then fails: omnilive reported it as a completed, empty answer. The
stream is now a failed answer (``inference_error`` naming the setting), and
the docs' recipe asks such a server for those answers whole
(``cascade.llm.stream_auto_tools = false``); greedy sampling
(``cascade.llm.temperature = 0``) makes the small model's calls repeatable.
SmolLM2-135M calls the tool again on its output, so the Agents SDKs' flows
are followed through the second call; the ``openai`` package's app answers
with ``tool_choice: none``, as the cascade's other test does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent

from omnilive.engines.base import EngineError
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.remote_llm import RemoteChat, RemotePrompt
from omnilive.engines.messages import GenerationOptions, Tools
from tests.llm_server import serve_llm
from tests.openai_clients.harness import conforming, node_scenario, session_of, tls_serving
from tests.servers import Server

pytestmark = pytest.mark.cascade
FORECAST = json.dumps({"city": "Paris", "forecast": "sunny", "celsius": 21})
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_llm(tmp_path_factory.mktemp("llm"))


@pytest.fixture(scope="module")
def cascade(tmp_path_factory: pytest.TempPathFactory, llm_server: str) -> Iterator[Server]:
    env = {
        "OMNILIVE_CASCADE__LLM__URL": llm_server,
        "OMNILIVE_CASCADE__LLM__STREAM_AUTO_TOOLS": "false",
        "OMNILIVE_CASCADE__LLM__TEMPERATURE": "0",
    }
    folder = tmp_path_factory.mktemp("cascade-tools")
    with tls_serving(folder, ready_timeout=180, engine="cascade", env=env) as server:
        yield server


def test_the_server_cannot_stream_auto_tools_and_says_so(llm_server: str):
    """Against the real server: a streamed answer with tool choice auto is a
    failure naming the setting, not an empty answer; asked for whole, it is
    the call."""
    weather = ({"name": "get_weather", "parameters": CITY},)
    prompt = RemotePrompt([Message("user", "What is the weather in Paris?")], Tools(weather))
    greedy = GenerationOptions(do_sample=False)
    streaming = RemoteChat(llm_server, "", None, 2048, 60.0, stream_auto_tools=True)
    with pytest.raises(EngineError, match="stream_auto_tools"):
        list(streaming.stream(prompt, greedy, 64))
    whole = RemoteChat(llm_server, "", None, 2048, 60.0, stream_auto_tools=False)
    (call,) = list(whole.stream(prompt, greedy, 64))
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    streaming.close()
    whole.close()


async def test_the_python_agents_sdk(cascade: Server, tmp_path: Path):
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return FORECAST

    agent = RealtimeAgent(name="assistant", instructions="You are a helpful voice assistant.",
                          tools=[get_weather])  # fmt: skip
    async with session_of(cascade, agent, {"output_modalities": ["text"]}) as recorded:
        await recorded.session.send_message("What is the weather in Paris?")
        await recorded.until("tool_end", timeout=120)
        await recorded.until_server("response.done", 2, timeout=120)
    assert calls[0] == "Paris"
    outputs = [e for e in recorded.server_events if e["type"] == "conversation.item.added"
               and e["item"]["type"] == "function_call_output"]  # fmt: skip
    assert outputs and outputs[0]["item"]["output"] == FORECAST
    conforming(recorded, tmp_path)


def test_the_openai_package(cascade: Server, tmp_path: Path):
    results = node_scenario(cascade, "openai", "weather", tmp_path, timeout_s=120)
    assert results["call"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert results["status"] == "completed" and results["answer_type"] == "message"


def test_the_js_agents_sdk(cascade: Server, tmp_path: Path):
    results = node_scenario(cascade, "agents", "weather", tmp_path, timeout_s=120)
    assert results["calls"][0] == "Paris" and results["outputs"] >= 1
    assert results["statuses"] == ["completed", "completed"]
