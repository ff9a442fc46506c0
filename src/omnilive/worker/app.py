"""The worker's internal API: health, the control channel and session sockets.

Only the gateway may talk to a worker: every route needs the internal token,
checked before a WebSocket is accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from omnilive.config import Settings
from omnilive.end_of_turn import TurnJudge
from omnilive.engines import create_engine
from omnilive.engines.base import Engine
from omnilive.logs import bind_session
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.common import (
    ErrorCode,
    ProtocolError,
    describe_validation_error,
    error_message,
    parse_json_object,
)
from omnilive.protocol.internal import (
    CLOSE_OK,
    CLOSE_SESSION_FAILED,
    CLOSE_WORKER_UNAVAILABLE,
    Envelope,
    LoadReport,
)
from omnilive.tasks import TaskSet, leaf_errors
from omnilive.worker.live.runner import LiveRunner
from omnilive.worker.openai.duplex_runner import OpenAIDuplexRunner
from omnilive.worker.openai.runner import OpenAIRealtimeRunner
from omnilive.worker.outbox import Outbox
from omnilive.worker.runners.chat import run_chat
from omnilive.worker.runners.duplex import DuplexRunner
from omnilive.worker.runners.half_duplex import HalfDuplexRunner
from omnilive.worker.runners.streaming import StreamingRunner
from omnilive.worker.runtime import SESSION_KINDS, SessionRecord, WorkerNotReady, WorkerRuntime
from omnilive.worker.transcriber import SideTranscriber
from omnilive.wsutil import PeerGone, frames_of, race

log = logging.getLogger(__name__)

DRAIN_S = 5.0
# A peer that left: not a failure of the session.
_PEER_GONE = (WebSocketDisconnect, PeerGone)
# What sending on a socket raises once the peer left or it was closed.
_SOCKET_GONE = (WebSocketDisconnect, RuntimeError, OSError)


def _authorized(headers: Any, token: str) -> bool:
    supplied = headers.get("authorization", "")
    return bool(token) and secrets.compare_digest(supplied, f"Bearer {token}")


async def _until_disconnect(ws: WebSocket) -> None:
    """Return when the peer goes away; further frames on a chat socket are ignored."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return


def create_worker_app(
    settings: Settings,
    worker_id: str,
    engine: Engine | None = None,
    on_load: Callable[[LoadReport], None] | None = None,
) -> FastAPI:
    """The worker's ASGI app. ``engine`` defaults to the one the settings name;
    ``on_load`` hears whether it loaded (``omnilive worker`` exits if not)."""
    token = settings.internal_token
    if not token:
        raise ValueError("a worker needs an internal token (OMNILIVE_INTERNAL_TOKEN)")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = WorkerRuntime(engine or create_engine(settings), worker_id)
        runtime.transcriber = SideTranscriber.from_settings(settings)
        runtime.turn_judge = TurnJudge(settings.end_of_turn)
        tasks = TaskSet(f"worker-{worker_id}")
        app.state.runtime = runtime

        async def load() -> None:
            report = await runtime.load()
            if on_load is not None:
                on_load(report)

        tasks.spawn("load", load())
        try:
            yield
        finally:
            await tasks.close()
            runtime.close()

    app = FastAPI(title=f"omnilive worker {worker_id}", lifespan=lifespan, openapi_url=None)

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Any:
        if not _authorized(request.headers, token):
            return JSONResponse({"detail": "internal token required"}, status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        runtime: WorkerRuntime = request.app.state.runtime
        return runtime.status().model_dump()

    @app.websocket("/internal/control")
    async def control(ws: WebSocket) -> None:
        if not _authorized(ws.headers, token):
            await ws.close(code=1008)
            return
        await ws.accept()
        runtime: WorkerRuntime = ws.app.state.runtime

        async def push() -> bool:
            while True:
                changed = runtime.next_change()
                await ws.send_text(runtime.status().model_dump_json())
                await changed.wait()

        with contextlib.suppress(WebSocketDisconnect, PeerGone):
            await race(push(), lambda: _until_disconnect(ws))

    @app.websocket("/internal/session/{kind}/{session_id}")
    async def session(ws: WebSocket, kind: str, session_id: str) -> None:
        if not _authorized(ws.headers, token):
            await ws.close(code=1008)
            return
        if kind not in SESSION_KINDS:
            await ws.close(code=1008, reason=f"unknown session kind {kind!r}")
            return
        await ws.accept()
        bind_session(session_id)  # every log line of this session names it
        runtime: WorkerRuntime = ws.app.state.runtime
        try:
            async with runtime.session(session_id, kind) as record:
                ok = await _serve(ws, runtime, record, settings)
        except WorkerNotReady as exc:
            await ws.send_text(Envelope.frame(error_message(str(exc), ErrorCode.NO_WORKERS)))
            await ws.close(code=CLOSE_WORKER_UNAVAILABLE)
            return
        if ws.client_state is WebSocketState.CONNECTED:
            # The gateway may have closed first (its client left): nothing to tell.
            with contextlib.suppress(*_SOCKET_GONE):
                await ws.close(code=CLOSE_OK if ok else CLOSE_SESSION_FAILED)

    return app


async def _serve(
    ws: WebSocket, runtime: WorkerRuntime, record: SessionRecord, settings: Settings
) -> bool:
    """Run the session; whether it ended normally. An unexpected failure in
    any of its tasks ends it: the traceback is logged once, here, and the
    client gets an ``error`` (``inference_error``) before the socket closes."""
    try:
        if record.kind == "chat":
            return await _serve_chat(ws, runtime, record, settings)
        return await _serve_streaming(ws, runtime, record, settings)
    except Exception as exc:  # the session's boundary: every task's error ends up here
        failures = [e for e in leaf_errors(exc) if not isinstance(e, _PEER_GONE)]
        if not failures:
            return False
        log.exception("session %s failed", record.session_id)
        if ws.client_state is WebSocketState.CONNECTED:
            failure = error_message(f"internal error: {failures[0]}", ErrorCode.INFERENCE_ERROR)
            with contextlib.suppress(*_SOCKET_GONE):
                await ws.send_text(Envelope.frame(failure))
        return False


async def _serve_chat(
    ws: WebSocket, runtime: WorkerRuntime, record: SessionRecord, settings: Settings
) -> bool:
    raw = await ws.receive_text()
    try:
        request = ChatRequest.model_validate(parse_json_object(raw, None))
    except ProtocolError as exc:
        await ws.send_text(Envelope.frame(error_message(exc.message, exc.code)))
        return False
    except ValidationError as exc:
        message = describe_validation_error(exc)
        await ws.send_text(Envelope.frame(error_message(message, ErrorCode.INVALID_REQUEST)))
        return False
    work = run_chat(runtime, record, request, ws.send_text, settings)
    return await race(work, lambda: _until_disconnect(ws))


async def _serve_streaming(
    ws: WebSocket, runtime: WorkerRuntime, record: SessionRecord, settings: Settings
) -> bool:
    """A long-lived session: its runner reads frames, one writer sends. The
    two share a TaskGroup, so that a writer that fails ends the session; the
    writer outlives the runner to send what it queued last."""
    outbox = Outbox(ws.send_text)
    runner_class = _RUNNERS.get(record.kind, DuplexRunner)
    runner = runner_class(runtime, record, settings, frames_of(ws), outbox)
    async with asyncio.TaskGroup() as group:
        writer = group.create_task(outbox.run(), name=f"{record.session_id}:writer")
        try:
            await runner.run()
        finally:
            await _drain(outbox, writer)
    return True  # however it ended (stop, timeout, disconnect), the session ended normally


_RUNNERS: dict[str, type[StreamingRunner]] = {
    "half_duplex": HalfDuplexRunner,
    "conversation": OpenAIRealtimeRunner,  # the OpenAI Realtime dialect's sessions
    "openai_duplex": OpenAIDuplexRunner,  # ...on the full-duplex unit loop
    "live": LiveRunner,  # OpenAI's Live API, on the full-duplex unit loop
}


async def _drain(outbox: Outbox, writer: asyncio.Task[None]) -> None:
    """Let the writer send what is queued, then end it; a peer that does not
    take it within ``DRAIN_S`` loses the rest."""
    if writer.done():  # failed: the group raises its error
        return
    try:
        async with asyncio.timeout(DRAIN_S):
            await outbox.close()
            await asyncio.wait([writer])
    except TimeoutError:
        writer.cancel()
