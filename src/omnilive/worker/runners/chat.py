"""Turn-based chat on the worker: prefill all messages, stream the answer."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from omnilive.audio import pcm_to_b64
from omnilive.engines.base import EngineError, TextAudioChunk, modalities_of
from omnilive.protocol.chat import ChatRequest, chunk_message, done_message, prefill_done_message
from omnilive.protocol.common import ErrorCode, error_message
from omnilive.worker.decode import DecodeError, decode_chat
from omnilive.worker.runtime import WorkerRuntime

Send = Callable[[str], Awaitable[None]]


async def run_chat(
    runtime: WorkerRuntime, session_id: str, request: ChatRequest, send: Send
) -> bool:
    """Serve one chat request; returns True when it completed with ``done``."""

    async def send_json(message: dict[str, Any]) -> None:
        await send(json.dumps(message))

    started = time.perf_counter()
    engine = runtime.engine
    try:
        messages, options = await runtime.step(decode_chat, request)
        engine.require(modalities_of(messages))
    except (DecodeError, EngineError) as exc:
        code = ErrorCode.UNSUPPORTED if isinstance(exc, EngineError) else ErrorCode.INVALID_REQUEST
        await send_json(error_message(str(exc), code))
        return False

    session = engine.open_chat()
    text_parts: list[str] = []
    audio_parts: list[np.ndarray] = []
    generated_tokens = 0
    first_chunk_ms: float | None = None
    try:
        input_tokens = await runtime.step(session.prefill, messages, options)
        prefill_ms = (time.perf_counter() - started) * 1000
        await send_json(prefill_done_message(input_tokens))
        chunks = session.generate()
        while (chunk := await runtime.step(next, chunks, None)) is not None:
            assert isinstance(chunk, TextAudioChunk)
            if first_chunk_ms is None:
                first_chunk_ms = (time.perf_counter() - started) * 1000
            generated_tokens += chunk.n_tokens
            text_parts.append(chunk.text)
            if chunk.audio is not None and chunk.audio.size:
                audio_parts.append(chunk.audio)
            if request.streaming:
                audio = pcm_to_b64(chunk.audio) if chunk.audio is not None else None
                await send_json(chunk_message(chunk.text, audio))
    except EngineError as exc:
        await send_json(error_message(f"inference failed: {exc}", ErrorCode.INFERENCE_ERROR))
        return False
    finally:
        session.close()

    total_ms = (time.perf_counter() - started) * 1000
    # Streaming clients already received every audio segment in the chunks.
    full_audio = None
    if not request.streaming and audio_parts:
        full_audio = pcm_to_b64(np.concatenate(audio_parts))
    timings = {
        "prefill_ms": round(prefill_ms, 1),
        "first_chunk_ms": round(first_chunk_ms or total_ms, 1),
        "generate_ms": round(total_ms - prefill_ms, 1),
        "total_ms": round(total_ms, 1),
    }
    await send_json(
        done_message(
            "".join(text_parts), generated_tokens, input_tokens, full_audio, session_id, timings
        )
    )
    return True
