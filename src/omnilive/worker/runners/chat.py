"""Turn-based chat on the worker: prefill all messages, stream the answer.

The rules are :class:`~omnilive.worker.machines.chat.ChatMachine`'s; this
runner does the I/O: the decode and the engine's steps (their results, and
their failures, become the machine's events), the sends and the recording.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from omnilive.config import Settings
from omnilive.engines.base import EngineError
from omnilive.engines.messages import ChatMessage, modalities_of
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.internal import Envelope
from omnilive.recording.turns import TurnInput, TurnRecorder
from omnilive.worker.decode import DecodeError, decode_chat
from omnilive.worker.machines import chat as rules
from omnilive.worker.runtime import SessionRecord, WorkerRuntime

Send = Callable[[str], Awaitable[None]]
TITLE_CHARS = 80

log = logging.getLogger(__name__)


def _title(messages: list[ChatMessage]) -> str:
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    return last_user.text[:TITLE_CHARS] if last_user else ""


def _open_recorder(
    settings: Settings | None,
    runtime: WorkerRuntime,
    session_id: str,
    request: ChatRequest,
    messages: list[ChatMessage],
) -> TurnRecorder | None:
    """The chat id the gateway minted doubles as the recording id (it is the
    ``recording_session_id`` of ``done``)."""
    if settings is None:
        return None
    config = request.model_dump(exclude={"messages": True, "tts": {"ref_audio_data"}})
    return TurnRecorder.open(
        settings,
        "chat",
        session_id,
        worker_id=runtime.worker_id,
        config=config,
        opted_in=request.recording,
        title=_title(messages),
    )


async def run_chat(
    runtime: WorkerRuntime,
    record: SessionRecord,
    request: ChatRequest,
    send: Send,
    settings: Settings | None = None,
) -> bool:
    """Serve one chat request; returns True when it completed with ``done``.
    With ``settings`` the request is recorded (unless recording is off or the
    request opted out)."""
    run = _ChatRun(runtime, record, request, send, settings)
    try:
        await run.serve()
    finally:
        if run.recorder is not None:
            await run.recorder.close()
    return run.machine.state is rules.ChatState.DONE


@dataclass
class _ChatRun:
    """One request's I/O around its machine."""

    runtime: WorkerRuntime
    record: SessionRecord
    request: ChatRequest
    send: Send
    settings: Settings | None
    machine: rules.ChatMachine = field(init=False)
    messages: list[ChatMessage] = field(default_factory=list)
    recorder: TurnRecorder | None = None

    def __post_init__(self) -> None:
        started, request_ts = time.perf_counter(), time.time()
        self.machine = rules.ChatMachine(self.request.streaming, started, request_ts)

    async def serve(self) -> None:
        machine = self.machine
        try:
            async with aclosing(self._events()) as events:
                async for event in events:
                    await self._do(machine.handle(event))
            if machine.state is rules.ChatState.FINISHING:
                await self._do(machine.handle(rules.DoneSent()))
        except BaseException:
            # Cancelled (the client left) or a send failed: what was produced
            # is recorded as interrupted. (So is a bug outside the engine's
            # steps, which the worker's session handler reports.)
            if not machine.ended:
                await self._do(machine.handle(rules.ClientGone()))
            raise

    async def _events(self) -> AsyncGenerator[rules.Event, None]:
        """What the decode and the engine's steps produce, as the machine's
        events. Their failures are events too, so what raises out of here is
        cancellation alone."""
        runtime, record, request = self.runtime, self.record, self.request
        try:
            data_dir = self.settings.data_dir if self.settings is not None else None
            # Off the session's lane: a GPU worker keeps one lane thread for all
            # its slots, and requests decode side by side.
            decoding = runtime.step(asyncio.to_thread, decode_chat, request, data_dir)
            messages, options = await decoding
            runtime.engine.require(modalities_of(messages))
        except DecodeError as exc:
            yield rules.DecodeFailed(str(exc))
            return
        except EngineError as exc:
            yield rules.Unsupported(str(exc))
            return
        except Exception as exc:
            yield self._unexpected(exc)
            return
        self.messages = messages
        yield rules.Decoded()
        recorder = _open_recorder(self.settings, runtime, record.session_id, request, messages)
        self.recorder = recorder
        yield rules.PrefillStarted(recorder.recording_id if recorder is not None else None)
        try:
            session = runtime.open_chat(record)
            record.closer = session.close  # the lane's last step
            input_tokens = await runtime.step(session.prefill, messages, options)
            yield rules.Prefilled(input_tokens, time.perf_counter())
            # Closed when the run leaves early, so the engine stops producing.
            async with aclosing(runtime.stream(session.generate)) as chunks:
                async for chunk in chunks:
                    now, wall = time.perf_counter(), time.time()
                    yield rules.Chunk(chunk.text, chunk.audio, chunk.n_tokens, now, wall)
            yield rules.Generated(session.warnings, time.perf_counter(), time.time())
        except EngineError as exc:
            yield rules.GenerationFailed(str(exc))
        except Exception as exc:
            yield self._unexpected(exc)

    def _unexpected(self, exc: Exception) -> rules.UnexpectedError:
        # Logged here, once: the client gets an ``error`` and the worker goes on.
        log.exception("chat %s failed", self.record.session_id)
        return rules.UnexpectedError(str(exc))

    async def _do(self, actions: list[rules.Action]) -> None:
        """Send what goes to the client, in order. The recording gets its turn
        even when a send fails (the client is gone): what it saw is kept."""
        try:
            for action in actions:
                if isinstance(action, rules.ToClient):
                    await self.send(Envelope.frame(action.message))
        finally:
            for action in actions:
                if isinstance(action, rules.Record) and self.recorder is not None:
                    source = TurnInput(messages=self.messages)
                    await self.recorder.turn(
                        action.request_ts,
                        source,
                        action.output,
                        action.timings,
                        action.status,
                        action.error,
                    )
