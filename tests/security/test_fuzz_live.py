"""A real gateway and worker under fuzzed frames of every protocol: only
documented errors come back, nothing crashes, and the server keeps serving.

Each hypothesis example is one frame, sent on a long-lived connection of its
protocol (reopened, and prepared, whenever the server ends it), so the
frames meet sessions in every state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.clients import Client
from tests.security import fuzzing
from tests.servers import Server, chat_once, user

FRAMES = max(1, int(200 * float(os.environ.get("FUZZ_SCALE", "1"))))
# Close codes the protocols document: normal, going away, not JSON (realtime),
# policy (app disabled), try again later (queue full).
CLOSE_CODES = {1000, 1001, 1003, 1008, 1013}
PREPARE = json.dumps({"type": "prepare", "system_prompt": "#schedule:LS"})
per_frame = settings(
    max_examples=FRAMES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@dataclass
class Conversation:
    """One protocol's connection to the live server, reopened as needed."""

    loop: asyncio.AbstractEventLoop
    url: str
    realtime: bool
    prepare: bool
    ws: ClientConnection | None = None
    reader: asyncio.Task[None] | None = None
    problems: list[str] = field(default_factory=list)
    connections: int = 0
    # The last frames each way, to explain a problem.
    trail: list[str] = field(default_factory=list)
    fatal: bool = False  # the server announced a fatal close (session.closed{backend_error})

    async def _read(self, ws: ClientConnection) -> None:
        self.fatal = False
        with contextlib.suppress(ConnectionClosed):
            async for raw in ws:
                self.trail = [*self.trail[-7:], f"< {str(raw)[:160]}"]
                message = json.loads(raw)
                if message.get("type") == "session.closed":
                    # The newer Realtime dialect ends every violation so (close 1011).
                    self.fatal = message.get("reason") == "backend_error"
                if message.get("type") != "error":
                    continue
                error = message["error"]
                code = error["code"] if self.realtime else message["code"]
                allowed = fuzzing.REALTIME_CODES if self.realtime else fuzzing.DOCUMENTED_CODES
                if code not in allowed:
                    self.problems.append(f"undocumented error {message}")

    async def _close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            assert self.reader is not None
            await asyncio.wait_for(self.reader, 10)
            fatal_close = self.realtime and self.fatal and self.ws.close_code == 1011
            if self.ws.close_code not in CLOSE_CODES and not fatal_close:
                self.problems.append(f"close code {self.ws.close_code} after {self.trail}")
            self.ws = None

    async def _open(self) -> ClientConnection:
        await self._close()
        self.connections += 1
        # A fresh session id each time: the last one may still be ending.
        self.ws = await connect(self.url.format(n=self.connections), max_size=None)
        self.reader = asyncio.create_task(self._read(self.ws))
        self.trail = []
        if self.prepare:
            await self.ws.send(PREPARE)
        return self.ws

    async def _send(self, raw: str | bytes) -> None:
        for _ in range(5):  # the session may end (stop, bad prepare): open another
            ws = self.ws if self.ws is not None and self.ws.close_code is None else None
            try:
                await (ws or await self._open()).send(raw)
                self.trail = [*self.trail[-7:], f"> {str(raw)[:160]}"]
                break
            except ConnectionClosed:
                await self._close()
        else:
            raise AssertionError(f"the server closed 5 fresh connections at once: {self.url}")
        await asyncio.sleep(0.005)  # let answers come back while the session is in this state

    def _check(self) -> None:
        problems, self.problems = self.problems, []  # each example answers for its own
        assert not problems, problems

    def send(self, raw: str | bytes) -> None:
        self.loop.run_until_complete(self._send(raw))
        self._check()

    def close(self) -> None:
        self.loop.run_until_complete(self._close())
        self._check()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Any]]:
    env = {"OMNILIVE_SCRIPTED__SLOTS": "8", "OMNILIVE_LIMITS__FIRST_MESSAGE_TIMEOUT_S": "5"}
    server = Server(tmp_path_factory.mktemp("fuzz-live"), env=env).start()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(server.wait_ready(workers=1))
        yield server, loop
    finally:
        server.stop()
        loop.close()


@pytest.fixture(scope="module")
def conversations(live: tuple[Server, Any]) -> Iterator[dict[str, Conversation]]:
    server, loop = live
    talks = {
        "half_duplex": Conversation(loop, f"{server.ws}/ws/half_duplex/fuzz{{n}}", False, True),
        "duplex": Conversation(loop, f"{server.ws}/ws/duplex/fuzz{{n}}?mode=omni", False, True),
        "realtime": Conversation(loop, f"{server.ws}/v1/realtime?mode=video", True, False),
    }
    yield talks
    for talk in talks.values():
        talk.close()


@per_frame
@given(raw=fuzzing.half_duplex_frames)
def test_half_duplex_frames(conversations: dict[str, Conversation], raw: str | bytes):
    conversations["half_duplex"].send(raw)


@per_frame
@given(raw=fuzzing.duplex_frames)
def test_duplex_frames(conversations: dict[str, Conversation], raw: str | bytes):
    conversations["duplex"].send(raw)


@per_frame
@given(raw=fuzzing.realtime_frames)
def test_realtime_frames(conversations: dict[str, Conversation], raw: str | bytes):
    conversations["realtime"].send(raw)


@per_frame
@given(raw=fuzzing.chat_frames)
def test_chat_frames(live: tuple[Server, Any], raw: str | bytes):
    server, loop = live

    async def one() -> list[dict]:
        seen: list[dict] = []
        async with connect(f"{server.ws}/ws/chat", max_size=None) as ws:
            await ws.send(raw)
            with contextlib.suppress(ConnectionClosed):
                async with asyncio.timeout(60):
                    async for message in ws:
                        seen.append(json.loads(message))
        assert ws.close_code in CLOSE_CODES, ws.close_code
        return seen

    seen = loop.run_until_complete(one())
    assert seen and seen[-1]["type"] in ("done", "error"), seen
    if seen[-1]["type"] == "error":
        assert seen[-1]["code"] in fuzzing.DOCUMENTED_CODES, seen[-1]


def test_the_server_still_serves_and_logged_no_failure(
    live: tuple[Server, Any], conversations: dict[str, Conversation]
):
    """After the frames above (this test runs last in the module)."""
    server, loop = live
    for talk in conversations.values():
        talk.close()

    async def serve() -> None:
        assert (await chat_once(server, user("still there?")))[-1]["type"] == "done"
        ws = await connect(f"{server.ws}/ws/duplex/after?mode=audio", max_size=None)
        client = Client(ws, "after")
        try:
            await client.prepare("#schedule:L")
            await client.chunk(np.zeros(16000, np.float32))
            assert (await client.until("result"))["is_listen"] is True
        finally:
            await ws.close()

    loop.run_until_complete(serve())
    log = Path(server.log_path).read_text(errors="replace")
    for marker in ("Traceback", "Exception in ASGI application", " ERROR "):
        at = log.find(marker)
        assert at < 0, log[max(0, at - 3000) : at + 3000]
    assert sum(talk.connections for talk in conversations.values()) >= 3
