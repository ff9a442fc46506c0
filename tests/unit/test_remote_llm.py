"""The cascade's language model on an OpenAI-compatible server
(``engines/cascade/remote_llm.py``), against a real HTTP server in the test
that answers as such servers do when they work and when they break: a
stream is an answer only when it says it is finished."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.remote_llm import RemoteChat, RemotePrompt
from omnilive.engines.messages import GenerationOptions, ToolCall, Tools


def chunk(content: str | None = None, finish: str | None = None, **delta: Any) -> str:
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return "data: " + json.dumps({"choices": [choice]}) + "\n\n"


class ScriptedServer(ThreadingHTTPServer):
    """Answers each POST with the next of ``bodies`` (a list: streamed as it
    is; a dict: one JSON answer) and keeps the requests."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Answers)
        self.bodies: list[list[str] | dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []


class Answers(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server = cast(ScriptedServer, self.server)
        length = int(self.headers.get("Content-Length", 0))
        server.requests.append(json.loads(self.rfile.read(length)))
        body = server.bodies.pop(0)
        self.send_response(200)
        streamed = isinstance(body, list)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        self.end_headers()
        for piece in body if streamed else [json.dumps(body)]:
            self.wfile.write(piece.encode())
            self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    http = ScriptedServer()
    thread = threading.Thread(target=http.serve_forever, name="llm-server", daemon=True)
    thread.start()
    yield http
    http.shutdown()
    http.server_close()


def answer(server: ScriptedServer, tools: Tools | None = None, **options: Any) -> list:
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    chat = RemoteChat(url, "m", None, 2048, 10.0, **options)
    prompt = RemotePrompt([Message("user", "What is the weather in Paris?")], tools or Tools())
    try:
        return list(chat.stream(prompt, GenerationOptions(), 64))
    finally:
        chat.close()


WEATHER = Tools(functions=({"name": "get_weather", "parameters": {"type": "object"}},))


def test_a_finished_stream_is_the_answer(server):
    server.bodies.append(
        [chunk("Sunny "), chunk("today."), chunk(finish="stop"), "data: [DONE]\n\n"]
    )
    assert answer(server) == ["Sunny ", "today."]


@pytest.mark.parametrize("last", ["", chunk("")])
def test_a_stream_that_never_finishes_is_a_failed_answer(server, last):
    """llama-cpp-python's server answers 200 and then fails, when asked to
    stream with tool_choice auto: that was taken for an empty answer."""
    server.bodies.append([chunk("Sun"), last] if last else [])
    with pytest.raises(EngineError, match="without finishing it"):
        answer(server)


def test_the_failure_names_the_setting_for_auto_tools(server):
    server.bodies.append([])
    with pytest.raises(EngineError, match="stream_auto_tools"):
        answer(server, WEATHER)


def test_an_error_in_the_stream_is_the_servers_message(server):
    server.bodies.append([chunk("Sun"), 'data: {"error": {"message": "out of memory"}}\n\n'])
    with pytest.raises(EngineError, match="out of memory"):
        answer(server)


def test_auto_tools_asked_for_whole_where_the_server_cannot_stream_them(server):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    server.bodies.append(
        {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    )
    got = answer(server, WEATHER, stream_auto_tools=False)
    assert got == [ToolCall("call_1", "get_weather", '{"city": "Paris"}')]
    sent = server.requests[0]
    assert sent["stream"] is False and sent["tool_choice"] == "auto"


def test_a_forced_tool_choice_still_streams(server):
    forced = Tools(functions=WEATHER.functions, choice="function:get_weather")
    piece = {"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": "{}"}}
    server.bodies.append([chunk(tool_calls=[piece]), chunk(finish="tool_calls")])
    assert answer(server, forced, stream_auto_tools=False) == [ToolCall("c1", "get_weather", "{}")]
    assert server.requests[0]["stream"] is True


def test_the_servers_temperature_is_the_operators_when_set(server):
    for _ in range(2):
        server.bodies.append([chunk("Hi"), chunk(finish="stop")])
    answer(server)
    answer(server, temperature=0.0)
    assert [r["temperature"] for r in server.requests] == [GenerationOptions().temperature, 0.0]
