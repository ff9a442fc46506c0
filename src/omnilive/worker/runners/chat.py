"""Turn-based chat on the worker: prefill all messages, stream the answer."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from omnilive.audio import pcm_to_b64
from omnilive.config import Settings
from omnilive.engines.base import ChatMessage, EngineError, modalities_of
from omnilive.protocol.chat import ChatRequest, chunk_message, done_message, prefill_done_message
from omnilive.protocol.common import ErrorCode, error_message
from omnilive.protocol.internal import Envelope
from omnilive.recording.turns import (
    TurnInput,
    TurnOutput,
    TurnRecorder,
    TurnStatus,
)
from omnilive.worker.decode import DecodeError, decode_chat
from omnilive.worker.runtime import SessionRecord, WorkerRuntime

Send = Callable[[str], Awaitable[None]]
TITLE_CHARS = 80


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

    async def send_json(message: dict[str, Any]) -> None:
        await send(Envelope.frame(message))

    started = time.perf_counter()
    request_ts = time.time()
    engine = runtime.engine
    try:
        data_dir = settings.data_dir if settings is not None else None
        messages, options = await runtime.step(record, decode_chat, request, data_dir)
        engine.require(modalities_of(messages))
    except (DecodeError, EngineError) as exc:
        code = ErrorCode.UNSUPPORTED if isinstance(exc, EngineError) else ErrorCode.INVALID_REQUEST
        await send_json(error_message(str(exc), code))
        return False

    recorder = _open_recorder(settings, runtime, record.session_id, request, messages)
    output = TurnOutput()
    timings: dict[str, float] = {}
    status: TurnStatus = "interrupted"  # until it completes or fails
    failure: str | None = None
    session = engine.open_chat()
    record.closer = session.close  # the lane's last step
    audio_parts: list[np.ndarray] = []
    generated_tokens = 0
    warnings: list[str] = []
    try:
        try:
            input_tokens = await runtime.step(record, session.prefill, messages, options)
            timings["prefill_ms"] = round((time.perf_counter() - started) * 1000, 1)
            await send_json(prefill_done_message(input_tokens))
            async for chunk in runtime.stream(record, session.generate):
                timings.setdefault("first_chunk_ms", (time.perf_counter() - started) * 1000)
                generated_tokens += chunk.n_tokens
                if chunk.audio is not None and chunk.audio.size:
                    audio_parts.append(chunk.audio)
                if request.streaming:
                    audio = pcm_to_b64(chunk.audio) if chunk.audio is not None else None
                    await send_json(chunk_message(chunk.text, audio))
                # Non-streaming audio reaches the client with ``done``, below.
                output.add(chunk.text, chunk.audio if request.streaming else None, time.time())
        except EngineError as exc:
            status, failure = "failed", str(exc)
            await send_json(error_message(f"inference failed: {exc}", ErrorCode.INFERENCE_ERROR))
            return False
        finally:
            warnings = list(session.warnings)  # e.g. a voice it could not clone

        total_ms = (time.perf_counter() - started) * 1000
        prefill_ms = timings["prefill_ms"]
        timings.update(
            first_chunk_ms=round(timings.get("first_chunk_ms", total_ms), 1),
            generate_ms=round(total_ms - prefill_ms, 1),
            total_ms=round(total_ms, 1),
        )
        # Streaming clients already received every audio segment in the chunks.
        full_audio = None
        if not request.streaming and audio_parts:
            joined = np.concatenate(audio_parts)
            full_audio = pcm_to_b64(joined)
            output.audio.append((time.time(), joined))
        text = "".join(output.text)
        recording_id = recorder.recording_id if recorder is not None else None
        await send_json(
            done_message(
                text, generated_tokens, input_tokens, full_audio, recording_id, timings, warnings
            )
        )
        status = "done"
        return True
    finally:
        if recorder is not None:
            # Also on cancellation (client gone): what was produced is kept.
            source = TurnInput(messages=messages)
            await recorder.turn(request_ts, source, output, timings, status, failure)
            await recorder.close()
