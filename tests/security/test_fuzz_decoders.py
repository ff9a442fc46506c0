"""Every client decoder of every protocol, gateway and worker side, under
hypothesis: each frame is accepted or refused with a documented code, never
anything else. About 11,000 generated frames in all: gateway chat 1,500, half-duplex
and duplex 1,500 each, realtime 1,500; worker chat parsing 1,000 and sessions 100;
worker session runners 3 x 250 sessions of 1-9 frames (~3,700), and 2 x 150 of
the gateway's media frames among them (~1,500). ``FUZZ_SCALE`` in
the environment multiplies the counts; ``benchmarks/fuzz_nightly.py`` runs it big.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.websockets import WebSocketState

from omnilive.config import Settings, load_settings
from omnilive.engines.scripted import ScriptedEngine
from omnilive.gateway.limits import check_message
from omnilive.gateway.pool import Pool
from omnilive.gateway.realtime.machine import Close, RealtimeMachine, ToClient, ToWorker
from omnilive.gateway.routes.chat import validate_chat
from omnilive.gateway.state import Gateway
from omnilive.protocol import duplex, half_duplex
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.common import ProtocolError, decode_client_message
from omnilive.protocol.internal import Envelope
from omnilive.protocol.realtime import CLIENT_ERRORS, CLOSE_UNSUPPORTED_DATA
from omnilive.worker.app import _serve
from omnilive.worker.decode import DecodeError, decode_chat
from omnilive.worker.runtime import WorkerRuntime
from tests.security import fuzzing

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
MAX_BYTES = 1 << 20


def examples(n: int) -> Any:
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )


def _settings(tmp: Path) -> Settings:
    return load_settings(
        environ={},
        overrides={
            "engine": "scripted",
            "data_dir": tmp,
            "internal_token": "t",
            "recording.enabled": False,
            "limits.first_message_timeout_s": 5,
        },
    )


# --- the gateway's validators -----------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Gateway:
    settings = _settings(tmp_path_factory.mktemp("fuzz-gateway"))
    return Gateway(settings=settings, pool=Pool(settings))


def _refused_properly(exc: ProtocolError) -> None:
    assert exc.code.value in fuzzing.DOCUMENTED_CODES and exc.message


@examples(1500)
@given(raw=fuzzing.chat_frames)
def test_gateway_chat_validator(gateway: Gateway, raw: str | bytes):
    try:
        request = validate_chat(gateway, raw)
    except ProtocolError as exc:
        _refused_properly(exc)
        return
    assert isinstance(request, ChatRequest)
    ChatRequest.model_validate_json(request.model_dump_json())  # what the worker receives


@pytest.mark.parametrize("protocol", [half_duplex, duplex], ids=["half_duplex", "duplex"])
@examples(1500)
@given(data=st.data())
def test_gateway_session_validators(gateway: Gateway, protocol: Any, data: st.DataObject):
    frames = fuzzing.half_duplex_frames if protocol is half_duplex else fuzzing.duplex_frames
    raw = data.draw(frames)
    try:
        message = decode_client_message(
            raw, protocol.client_message, protocol.CLIENT_TYPES, MAX_BYTES
        )
        check_message(message, gateway.settings.limits)
    except ProtocolError as exc:
        _refused_properly(exc)
        return
    assert message.type in protocol.CLIENT_TYPES


@examples(1500)
@given(state=st.sampled_from(["queued", "connected", "active"]), raw=fuzzing.realtime_frames)
def test_realtime_machine(state: str, raw: str | bytes):
    machine = RealtimeMachine("video", "rt_fuzz", 8192)
    if state != "queued":
        machine.queue_event({"type": "queue_done"})
    if state == "active":
        machine.worker_event(Envelope("session.created"))
    actions = machine.client_frame(raw)
    for action in actions:
        if isinstance(action, ToClient):
            event = action.event
            if event["type"] == "error":
                assert event["error"]["code"] in {c.value for c in CLIENT_ERRORS}
                assert event["error"]["type"] == "client_error"
            else:
                assert event in ({"type": "session.closed", "reason": "stopped"},
                                 {"type": "response.cancelled"})  # fmt: skip
        elif isinstance(action, ToWorker):
            # the translation always yields a valid duplex message
            message = decode_client_message(
                json.dumps(action.message), duplex.worker_message, duplex.WORKER_TYPES, MAX_BYTES
            )
            assert message.type in ("internal.realtime", "prepare", "audio_chunk", "update", "stop")
        else:
            assert isinstance(action, Close)
            assert action.code in (1000, CLOSE_UNSUPPORTED_DATA)


# --- the worker's parsing ----------------------------------------------------------------


@examples(1000)
@given(raw=fuzzing.chat_frames)
def test_worker_chat_parsing(raw: str | bytes):
    try:
        request = ChatRequest.model_validate_json(raw)
    except ValidationError:
        return  # the worker answers invalid_request
    try:
        decode_chat(request)
    except DecodeError:
        return  # an error naming the content; never an exception of another kind


class FakeSocket:
    """Just what the worker's session handler uses of a WebSocket."""

    def __init__(self, frames: list[str | bytes]) -> None:
        self.frames = list(frames)
        self.sent: list[dict[str, Any]] = []
        self.client_state = WebSocketState.CONNECTED

    async def receive(self) -> dict[str, Any]:
        if not self.frames:
            return {"type": "websocket.disconnect", "code": 1000}
        raw = self.frames.pop(0)
        key = "bytes" if isinstance(raw, bytes) else "text"
        return {"type": "websocket.receive", key: raw}

    async def receive_text(self) -> str:
        message = await self.receive()
        if message["type"] == "websocket.disconnect":
            raise RuntimeError("disconnected")
        return message["text"]

    async def send_text(self, text: str) -> None:
        envelope, payload = Envelope.split(text)  # what the worker sends is enveloped
        message = json.loads(payload)
        assert envelope.type == message["type"]
        self.sent.append(message)


class _Failures(logging.Handler):
    """Collects error records (the worker logs a traceback for a crash)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ...]]:
    """One scripted engine on one event loop, shared by every example."""
    settings = _settings(tmp_path_factory.mktemp("fuzz-worker"))
    loop = asyncio.new_event_loop()

    async def start() -> WorkerRuntime:
        runtime = WorkerRuntime(ScriptedEngine(settings.scripted), "fuzz")
        await runtime.load()
        return runtime

    runtime = loop.run_until_complete(start())
    failures = _Failures()
    logging.getLogger("omnilive").addHandler(failures)
    try:
        yield loop, runtime, settings, failures
    finally:
        logging.getLogger("omnilive").removeHandler(failures)
        runtime.close()
        loop.close()


def _run_worker_session(
    worker: tuple[Any, ...], kind: str, frames: list[str | bytes], check: Any = None
) -> None:
    loop, runtime, settings, failures = worker
    socket = FakeSocket(frames)

    async def session() -> None:
        async with runtime.session("fuzz", kind) as record:
            await _serve(socket, runtime, record, settings)  # type: ignore[arg-type]

    loop.run_until_complete(asyncio.wait_for(session(), 30))
    assert not failures.records, [r.getMessage() for r in failures.records]
    for message in socket.sent:
        if message["type"] == "error" and check is not None:
            check(message)
        elif message["type"] == "error":
            error = message["error"]
            code = error["code"] if isinstance(error, dict) else message["code"]
            assert code in fuzzing.DOCUMENTED_CODES | fuzzing.REALTIME_CODES, message
            # a protocol error, never the worker's own failure
            assert "internal error" not in json.dumps(message), message


@pytest.mark.parametrize("kind", ["half_duplex", "audio_duplex", "omni_duplex"])
@examples(250)
@given(data=st.data())
def test_worker_session_runners(worker: tuple[Any, ...], kind: str, data: st.DataObject):
    strategy = fuzzing.half_duplex_frames if kind == "half_duplex" else fuzzing.duplex_frames
    valid_prepare = json.dumps({"type": "prepare", "system_prompt": "#schedule:LS"})
    frames = data.draw(st.lists(strategy, min_size=1, max_size=8))
    if data.draw(st.booleans()):
        frames.insert(0, valid_prepare)  # so that the frames after it reach an active session
    _run_worker_session(worker, kind, frames)


@pytest.mark.parametrize("kind", ["half_duplex", "omni_duplex"])
@examples(150)
@given(data=st.data())
def test_worker_session_runners_take_media_frames(
    worker: tuple[Any, ...], kind: str, data: st.DataObject
):
    """The binary form the gateway sends a chunk in, valid, cut or any bytes
    after its magic, among the protocol's text frames."""
    text = fuzzing.half_duplex_frames if kind == "half_duplex" else fuzzing.duplex_frames
    strategy = st.one_of(fuzzing.media_frames, fuzzing.media_frames, text)
    frames = data.draw(st.lists(strategy, min_size=1, max_size=8))
    if data.draw(st.booleans()):
        frames.insert(0, json.dumps({"type": "prepare", "system_prompt": "#schedule:LS"}))
    _run_worker_session(worker, kind, frames)


@examples(100)
@given(raw=fuzzing.chat_frames)
def test_worker_chat_session(worker: tuple[Any, ...], raw: str | bytes):
    # The gateway sends the worker text frames only.
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    _run_worker_session(worker, "chat", [text])
