"""OpenAI's JavaScript clients, unmodified, in Node (``node/clients.mjs``):
the ``openai`` package's ``OpenAIRealtimeWS`` and ``@openai/agents-realtime``'s
``RealtimeSession``, each in text, speech, tool, interrupt and close flows,
against a real ``omnilive serve`` (scripted engine) over TLS with its
self-signed certificate trusted through ``NODE_EXTRA_CA_CERTS``: the
``openai`` package speaks only ``wss://``, so this is the recipe the docs
give (docs/modes/openai-realtime.md). Every server event a client received
must pass the agents SDK's own zod schema (it drops those that do not) and
OpenAI's TypeScript types; no client may report an error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.openai_clients.harness import node_scenario, pcm24, question, tls_serving
from tests.servers import Server

SCENARIOS = ["text", "speech", "tool", "interrupt", "close"]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with tls_serving(tmp_path_factory.mktemp("openai-node")) as server:
        yield server


@pytest.fixture(scope="module")
def speech_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("speech") / "question.pcm"
    path.write_bytes(pcm24(question()))
    return path


def scenario(tls_server: Server, client: str, name: str, speech: Path, folder: Path) -> Any:
    return node_scenario(tls_server, client, name, folder, speech)


@pytest.mark.parametrize("name", SCENARIOS)
async def test_the_openai_package(tls_server: Server, speech_file: Path, tmp_path: Path, name):
    results = scenario(tls_server, "openai", name, speech_file, tmp_path)
    call = {"name": "get_weather", "arguments": {"text": "get_weather for Paris"}}
    cancelled = {"status": "cancelled", "reason": "client_cancelled"}
    expected: dict[str, Any] = {
        "text": {"status": "completed", "text": "Answered: hello there"},
        "tool": {"call": call, "answer": "Answered: sunny"},
        "interrupt": {**cancelled, "truncated": "conversation.item.truncated"},
        "close": {},
    }
    if name == "speech":
        assert results["transcript"].endswith("s of speech")
        assert results["answer"].startswith("Turn 0") and results["audio_bytes"] > 9600
    else:
        assert results == expected[name]
    await tls_server.wait_idle(timeout=5)  # the session ended with the client


@pytest.mark.parametrize("name", SCENARIOS)
async def test_the_agents_sdk(tls_server: Server, speech_file: Path, tmp_path: Path, name):
    results = scenario(tls_server, "agents", name, speech_file, tmp_path)
    if name == "text":
        assert results == {"status": "completed", "answer": "Answered: hello there"}
    elif name == "speech":
        assert results["answer"].startswith("Turn 0") and results["audio_events"] > 0
    elif name == "tool":
        # The tool runs once: an .added function_call that said "completed" ran it twice.
        assert results == {"calls": ["get_weather for Paris"], "answer": "Answered: sunny",
                           "outputs": 1}  # fmt: skip
    elif name == "interrupt":
        assert results == {"status": "cancelled", "truncated": True, "next": "completed"}
    # close: session.close() sends a Close frame without a status code, which
    # held the slot for the 30 s resume grace; any Close frame ends the session.
    await tls_server.wait_idle(timeout=5)
