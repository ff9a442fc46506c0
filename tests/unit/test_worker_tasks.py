"""The worker's session tasks: named, owned by the session, and never failing
unseen. A bug in any of them (a model step that raises something other than
an ``EngineError``, a writer that cannot send) ends that session at once with
an ``inference_error``, logged once with the session id; it never leaves the
session hanging, and nothing of the session is left running."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect, WebSocketState

from omnilive.config import Settings, load_settings
from omnilive.engines.base import DuplexSession
from omnilive.engines.messages import DuplexOptions, DuplexUnit, PrefillStats, UnitInput
from omnilive.engines.scripted import ScriptedEngine
from omnilive.engines.sync_views import SyncDuplexSession
from omnilive.protocol.internal import CLOSE_SESSION_FAILED, Envelope
from omnilive.tasks import leaf_errors
from omnilive.worker.app import _serve, create_worker_app
from omnilive.worker.runtime import WorkerRuntime
from tests.speech import chunks_b64, silence, speak

SESSION = "sess-tasks"
PATIENCE_S = 10  # far more than any of these sessions needs; reaching it is a hang


class Bug(Exception):
    """What a bug in a model step raises (not an EngineError: nothing expects it)."""


class FaultyEngine(ScriptedEngine):
    """The scripted engine with one step of its sessions broken."""

    def __init__(self, settings: Settings, fault: str | None) -> None:
        super().__init__(settings.scripted)
        self.fault = fault

    def open_duplex(self) -> Any:
        return self._break(super().open_duplex())

    def open_half_duplex(self) -> Any:
        return self._break(super().open_half_duplex())

    def _break(self, session: Any) -> Any:
        fault = self.fault
        if fault is None:
            return session

        def broken(*args: Any) -> Any:
            raise Bug(f"bug in {fault}")

        def broken_stream(*args: Any) -> Iterator[Any]:
            yield from ()
            raise Bug(f"bug in {fault}")

        streamed = inspect.isgeneratorfunction(getattr(session, fault))
        setattr(session, fault, broken_stream if streamed else broken)
        return session


class Peer:
    """The gateway's end of a worker session socket, driven by the test."""

    def __init__(self, send_fails: bool = False) -> None:
        self.client_state = WebSocketState.CONNECTED
        self.send_fails = send_fails
        self.sent: list[dict[str, Any]] = []
        self._incoming: asyncio.Queue[str | None] = asyncio.Queue()
        self._outgoing: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def send(self, message: dict[str, Any]) -> None:
        self._incoming.put_nowait(json.dumps(message))

    async def until(self, kind: str) -> dict[str, Any]:
        while (message := await self._outgoing.get())["type"] != kind:
            pass
        return message

    # --- what the worker uses of a WebSocket ---------------------------------------

    async def receive(self) -> dict[str, Any]:
        raw = await self._incoming.get()
        if raw is None:
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "websocket.receive", "text": raw}

    async def send_text(self, text: str) -> None:
        if self.send_fails:  # as a send on a socket closed by mistake does
            raise RuntimeError("bug in send")
        envelope, payload = Envelope.split(text)
        message = json.loads(payload)
        assert envelope.type == message["type"]
        self.sent.append(message)
        self._outgoing.put_nowait(message)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A session left waiting for a prepare would outlast PATIENCE_S: a hang, not a timeout.
    waiting = {"limits.first_message_timeout_s": 60}
    overrides = {"data_dir": tmp_path, "internal_token": "t", "recording.enabled": False}
    return load_settings(environ={}, overrides={**overrides, **waiting})


@pytest.fixture
def fault() -> str | None:
    return None


@pytest.fixture
async def runtime(settings: Settings, fault: str | None) -> AsyncIterator[WorkerRuntime]:
    runtime = WorkerRuntime(FaultyEngine(settings, fault), "w")
    await runtime.load()
    try:
        yield runtime
    finally:
        runtime.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What was logged as an error (asyncio's "exception never retrieved" too)."""
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def session_tasks() -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(SESSION))


async def start(
    runtime: WorkerRuntime, settings: Settings, kind: str, peer: Peer
) -> asyncio.Task[bool]:
    async def serve() -> bool:
        async with runtime.session(SESSION, kind) as record:
            return await _serve(peer, runtime, record, settings)  # type: ignore[arg-type]

    return asyncio.create_task(serve())


async def failed(
    session: asyncio.Task[bool], peer: Peer, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """The session ended at once with an inference_error, the bug logged once."""
    error = await asyncio.wait_for(peer.until("error"), PATIENCE_S)
    assert error["code"] == "inference_error"
    assert error["error"] == f"internal error: bug in {where}"
    assert await asyncio.wait_for(session, PATIENCE_S) is False  # closed as failed
    assert peer.sent[-1] == error  # the last word
    [record] = errors(caplog)
    assert SESSION in record.getMessage() and record.exc_info is not None
    assert [type(e) for e in leaf_errors(record.exc_info[1])] == [Bug]  # type: ignore[arg-type]
    assert session_tasks() == []


def pcm(seconds: float) -> str:
    return chunks_b64(silence(seconds) + 0.01, seconds)[0]


# --- duplex --------------------------------------------------------------------------------


async def test_a_duplex_session_names_its_tasks_and_leaves_none(runtime, settings, caplog):
    peer = Peer()
    session = await start(runtime, settings, "audio_duplex", peer)
    peer.send({"type": "prepare", "system_prompt": "#schedule:L"})
    await asyncio.wait_for(peer.until("prepared"), PATIENCE_S)
    peer.send({"type": "audio_chunk", "audio_base64": pcm(1.0)})
    await asyncio.wait_for(peer.until("result"), PATIENCE_S)
    names = session_tasks()
    for name in ("compute", "reader", "watchdog"):
        assert f"{SESSION}:{name}" in names
    assert f"{SESSION}:writer" in names
    peer.send({"type": "stop"})
    await asyncio.wait_for(peer.until("stopped"), PATIENCE_S)
    assert await asyncio.wait_for(session, PATIENCE_S) is True
    assert session_tasks() == [] and errors(caplog) == []


class WholeUnitDuplex(DuplexSession):
    """The scripted duplex view as an async one that runs a unit as one step
    (as the GPU engine does): the runner must call :meth:`unit`, nothing else."""

    def __init__(self, inner: SyncDuplexSession, units: list[bool]) -> None:
        self.inner, self.units = inner, units

    async def prepare(self, system_prompt: str, options: DuplexOptions) -> int:
        return self.inner.prepare(system_prompt, options)

    async def unit(self, given: UnitInput) -> tuple[PrefillStats, DuplexUnit]:
        self.units.append(given.force_listen)
        stats = self.inner.prefill(given.audio, given.frames, given.max_slice_nums)
        stats.cost_ms = 250.0
        return stats, self.inner.generate(given.force_listen)

    async def prefill(self, *args: Any) -> PrefillStats:
        raise Bug("a whole unit's parts were called apart")

    async def generate(self, force_listen: bool = False) -> DuplexUnit:
        raise Bug("a whole unit's parts were called apart")

    async def finalize(self) -> None:
        self.inner.finalize()

    def close(self) -> None:
        self.inner.close()


class WholeUnits(FaultyEngine):
    """The scripted engine with an async duplex view that runs whole units."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, None)
        self.units: list[bool] = []

    def open_duplex(self) -> Any:
        return WholeUnitDuplex(super().open_duplex(), self.units)


async def test_an_engine_that_runs_whole_units_is_given_each_unit_as_one_step(settings, caplog):
    engine = WholeUnits(settings)
    runtime = WorkerRuntime(engine, "w")
    await runtime.load()
    try:
        peer = Peer()
        session = await start(runtime, settings, "audio_duplex", peer)
        peer.send({"type": "prepare", "system_prompt": "#schedule:S"})
        await asyncio.wait_for(peer.until("prepared"), PATIENCE_S)
        peer.send({"type": "audio_chunk", "audio_base64": pcm(1.0), "force_listen": True})
        peer.send({"type": "audio_chunk", "audio_base64": pcm(1.0)})
        first = await asyncio.wait_for(peer.until("result"), PATIENCE_S)
        second = await asyncio.wait_for(peer.until("result"), PATIENCE_S)
        assert first["is_listen"] and not second["is_listen"]
        assert second["cost_prefill_ms"] == 250.0  # the engine's own share of the unit
        assert engine.units == [True, False]
        peer.send({"type": "stop"})
        assert await asyncio.wait_for(session, PATIENCE_S) is True
        assert errors(caplog) == []
    finally:
        runtime.close()


@pytest.mark.parametrize("fault", ["prepare", "generate", "finalize"])
async def test_a_bug_in_a_duplex_step_ends_the_session(runtime, settings, caplog, fault):
    peer = Peer()
    session = await start(runtime, settings, "audio_duplex", peer)
    peer.send({"type": "prepare", "system_prompt": "#schedule:L"})
    if fault != "prepare":
        await asyncio.wait_for(peer.until("prepared"), PATIENCE_S)
        peer.send({"type": "audio_chunk", "audio_base64": pcm(1.0)})
    await failed(session, peer, caplog, fault)


async def test_a_writer_that_fails_ends_the_session(runtime, settings, caplog):
    peer = Peer(send_fails=True)
    session = await start(runtime, settings, "audio_duplex", peer)
    peer.send({"type": "prepare", "system_prompt": "#schedule:L"})  # answered: send fails
    assert await asyncio.wait_for(session, PATIENCE_S) is False
    [record] = errors(caplog)
    assert SESSION in record.getMessage()
    assert [str(e) for e in leaf_errors(record.exc_info[1])] == ["bug in send"]  # type: ignore[index,arg-type]
    assert session_tasks() == []


@pytest.mark.parametrize("fault", ["prepare"])
def test_the_socket_of_a_failed_session_closes_as_failed(settings, fault):
    app = create_worker_app(settings, "w", engine=FaultyEngine(settings, fault))
    auth = {"authorization": "Bearer t"}
    with TestClient(app) as client:
        while not client.get("/health", headers=auth).json()["model_loaded"]:
            time.sleep(0.05)
        path = f"/internal/session/audio_duplex/{SESSION}"
        with client.websocket_connect(path, headers=auth) as ws:
            ws.send_text(json.dumps({"type": "prepare"}))
            _, payload = Envelope.split(ws.receive_text())
            assert json.loads(payload)["code"] == "inference_error"
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_text()
            assert closed.value.code == CLOSE_SESSION_FAILED


# --- half-duplex ---------------------------------------------------------------------------


async def start_half_duplex(
    runtime: WorkerRuntime, settings: Settings, peer: Peer
) -> asyncio.Task[bool]:
    session = await start(runtime, settings, "half_duplex", peer)
    peer.send({"type": "prepare"})
    return session


async def speak_slowly(peer: Peer, audio: np.ndarray) -> None:
    for chunk in chunks_b64(audio):
        peer.send({"type": "audio_chunk", "audio_base64": chunk})
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("fault", ["prepare"])
async def test_a_bug_in_a_half_duplex_prepare_ends_the_session(runtime, settings, caplog, fault):
    peer = Peer()
    session = await start_half_duplex(runtime, settings, peer)
    await failed(session, peer, caplog, "prepare")


@pytest.mark.parametrize("fault", ["hear"])
async def test_a_bug_in_early_hearing_ends_the_session(runtime, settings, caplog, fault):
    peer = Peer()
    session = await start_half_duplex(runtime, settings, peer)
    await asyncio.wait_for(peer.until("prepared"), PATIENCE_S)
    # Speech that does not end: no turn starts, so only the early hearing can fail.
    speech = np.concatenate([silence(1.0), speak("Hello there, how are you doing today?")])
    speaking = asyncio.create_task(speak_slowly(peer, speech))
    try:
        await failed(session, peer, caplog, "hear")
    finally:
        speaking.cancel()
        await asyncio.wait([speaking])


@pytest.mark.parametrize("fault", ["generate"])
async def test_a_bug_in_a_turn_ends_the_session(runtime, settings, caplog, fault):
    peer = Peer()
    session = await start_half_duplex(runtime, settings, peer)
    await asyncio.wait_for(peer.until("prepared"), PATIENCE_S)
    utterance = np.concatenate([silence(1.0), speak("What time is it?"), silence(1.5)])
    await speak_slowly(peer, utterance)
    await failed(session, peer, caplog, "generate")
