"""Half-duplex voice on the worker: server-side VAD, one answer per utterance.

Three things run at once and none waits for another: the reader (client
messages, so ``stop`` is acted on mid-turn), the turn (prefill + streamed
answer, at most one model step in flight), and the inactivity watchdog.
The VAD belongs to this runner, not to the engine, so every engine gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from enum import StrEnum

import numpy as np

from omnilive.audio import INPUT_RATE, AudioDecodeError, pcm_from_b64, pcm_to_b64, voice_from_b64
from omnilive.engines.base import (
    AudioPart,
    EngineError,
    GenerationOptions,
    HalfDuplexOptions,
    HalfDuplexSession,
    Part,
    TextPart,
    Voice,
)
from omnilive.protocol.chat import chunk_message
from omnilive.protocol.common import (
    ErrorCode,
    ProtocolError,
    decode_client_message,
    error_message,
)
from omnilive.protocol.half_duplex import (
    CLIENT_TYPES,
    STOPPED,
    AudioChunk,
    Prepare,
    Stop,
    client_message,
    generating_message,
    prepared_message,
    timeout_message,
    turn_done_message,
    vad_state_message,
)
from omnilive.recording.files import new_recording_id
from omnilive.recording.turns import (
    TurnInput,
    TurnOutput,
    TurnRecorder,
    TurnStatus,
)
from omnilive.vad import (
    SileroModel,
    SpeechDiscarded,
    SpeechEnded,
    SpeechStarted,
    StreamingVad,
    VadConfig,
)
from omnilive.worker.decode import DecodeError, load_stored_voice
from omnilive.worker.runners.streaming import StreamingRunner

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Reply briefly and naturally."
COLD_START_MS = 500


class Phase(StrEnum):
    WAITING_PREPARE = "waiting_prepare"
    LISTENING = "listening"
    GENERATING = "generating"


def system_parts(
    prepare: Prepare, stored_voice: np.ndarray | None = None
) -> tuple[list[Part], Voice | None]:
    """System content and the TTS voice: ``ref_audio_base64`` if given, else
    the stored voice ``ref_audio_id`` named (``stored_voice``), else the first
    audio item of ``system_content``, else a named voice."""
    parts: list[Part] = []
    voice: Voice | None = None
    for item in prepare.system_content or []:
        if item.type == "text":
            parts.append(TextPart(item.text))
        else:
            audio = pcm_from_b64(item.data)
            parts.append(AudioPart(audio))
            voice = voice or Voice(reference=audio)
    if not parts:
        parts.append(TextPart(prepare.system_prompt or DEFAULT_SYSTEM_PROMPT))
    if prepare.ref_audio_base64:
        voice = Voice(reference=voice_from_b64(prepare.ref_audio_base64))
    elif stored_voice is not None:
        voice = Voice(reference=stored_voice)
    tts = prepare.config.tts
    if voice is None and (tts.voice or tts.language):
        voice = Voice(name=tts.voice, language=tts.language)
    return parts, voice


class HalfDuplexRunner(StreamingRunner):
    """One half-duplex session; :meth:`run` returns when it has ended."""

    def _init_state(self) -> None:
        self.phase = Phase.WAITING_PREPARE
        self.session: HalfDuplexSession = self.runtime.engine.open_half_duplex()
        self.record.closer = self.session.close  # the lane's last step
        self.vad: StreamingVad | None = None
        self.timeout_s = 0.0
        self.last_activity = time.monotonic()
        self.turns = 0
        self.ignored_chunks = 0  # audio that arrived while answering (echo risk)
        self._turn: asyncio.Task[None] | None = None
        self._hear: asyncio.Task[None] | None = None
        self._hear_wanted: tuple[np.ndarray, bool] | None = None  # newest (speech, paused)
        self.recorder: TurnRecorder | None = None

    async def run(self) -> str:
        """Serve until stop, timeout or disconnect; returns which."""
        reader = asyncio.ensure_future(self._read())
        watchdog = asyncio.ensure_future(self._watchdog())
        try:
            done, _ = await asyncio.wait([reader, watchdog], return_when="FIRST_COMPLETED")
            first = done.pop()
            reason = first.result()
        finally:
            for task in (reader, watchdog):
                task.cancel()
            await asyncio.gather(reader, watchdog, return_exceptions=True)
            try:
                await self._end_turn()
                await self._stop_hear()
            finally:
                if self.recorder is not None:  # after the last turn was recorded
                    await self.recorder.close()
        if reason == "stopped":
            await self.send(STOPPED)
        elif reason == "timeout":
            await self.send(timeout_message(time.monotonic() - self.last_activity))
        return reason

    # --- reading -------------------------------------------------------------

    async def _read(self) -> str:
        max_bytes = self.settings.limits.max_message_bytes
        async for raw in self.frames:
            try:
                message = decode_client_message(raw, client_message, CLIENT_TYPES, max_bytes)
                if isinstance(message, Stop):
                    return "stopped"
                if isinstance(message, Prepare):
                    await self._prepare(message)
                elif isinstance(message, AudioChunk):
                    await self._audio(message)
            except ProtocolError as exc:
                await self.send(error_message(exc.message, exc.code))
        return "disconnected"

    async def _prepare(self, message: Prepare) -> None:
        if self.phase is not Phase.WAITING_PREPARE:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, "session is already prepared")
        stored_voice = None
        if message.ref_audio_id and not message.ref_audio_base64:
            data_dir, voice_id = self.settings.data_dir, message.ref_audio_id
            try:
                stored_voice = await asyncio.to_thread(load_stored_voice, data_dir, voice_id)
            except DecodeError as exc:
                raise ProtocolError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        try:
            parts, voice = system_parts(message, stored_voice)
        except AudioDecodeError as exc:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, f"system audio: {exc}") from None
        config = message.config
        g = config.generation
        options = HalfDuplexOptions(
            generation=GenerationOptions(
                max_new_tokens=g.max_new_tokens,
                temperature=g.temperature,
                top_p=g.top_p,
                length_penalty=g.length_penalty,
            ),
            tts_enabled=config.tts.enabled,
            voice=voice,
        )
        vad_config = VadConfig(
            threshold=config.vad.threshold,
            min_speech_duration_ms=config.vad.min_speech_duration_ms,
            min_silence_duration_ms=config.vad.min_silence_duration_ms,
            speech_pad_ms=config.vad.speech_pad_ms,
            ignore_initial_ms=COLD_START_MS,
        )
        self.vad = StreamingVad(await asyncio.to_thread(SileroModel), vad_config)
        try:
            await self.runtime.step(self.record, self.session.prepare, parts, options)
        except EngineError as exc:
            await self.send(error_message(f"prepare failed: {exc}", ErrorCode.INFERENCE_ERROR))
            return
        self.timeout_s = min(config.session.timeout_s, self.settings.limits.max_session_timeout_s)
        self.phase = Phase.LISTENING
        self.last_activity = time.monotonic()
        self.recorder = self._open_recorder(message)
        recording_id = self.recorder.recording_id if self.recorder is not None else None
        warnings = list(self.session.warnings)  # e.g. a voice it cannot clone
        await self.send(
            prepared_message(self.record.session_id, self.timeout_s, recording_id, warnings)
        )

    def _open_recorder(self, message: Prepare) -> TurnRecorder | None:
        """The session id is the client's choice (guessable), so the recording
        gets its own server-minted id, announced in ``prepared``."""
        config = {
            "system_prompt": message.system_prompt,
            "system_content": [
                item.model_dump() if item.type == "text" else {"type": "audio"}
                for item in message.system_content or []
            ],
            "voice_reference": bool(message.ref_audio_base64 or message.ref_audio_id),
            **message.config.model_dump(),
        }
        return TurnRecorder.open(
            self.settings,
            "half_duplex",
            new_recording_id("half_duplex"),
            worker_id=self.runtime.worker_id,
            config=config,
            opted_in=message.recording,
            title=(message.system_prompt or "")[:80],
            extra_meta={"client_session_id": self.record.session_id},
        )

    async def _audio(self, message: AudioChunk) -> None:
        if self.phase is Phase.WAITING_PREPARE or self.vad is None:
            raise ProtocolError(ErrorCode.NOT_READY, "send prepare before audio_chunk")
        try:
            samples = pcm_from_b64(message.audio_base64)
        except AudioDecodeError as exc:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, f"audio_base64: {exc}") from None
        self.last_activity = time.monotonic()
        if self.phase is Phase.GENERATING:
            # The client should be silent while the answer plays (echo); such
            # audio never reaches the VAD.
            self.ignored_chunks += 1
            return
        vad = self.vad
        for event in vad.feed(samples):  # ~3 ms per 0.5 s of audio: fine on the loop
            if isinstance(event, SpeechStarted):
                await self.send(vad_state_message(True))
            elif isinstance(event, SpeechDiscarded):
                await self.send(vad_state_message(False))
            elif isinstance(event, SpeechEnded):
                await self.send(vad_state_message(False))
                await self.send(generating_message(event.speech_ms))
                self.phase = Phase.GENERATING
                self._turn = asyncio.ensure_future(self._answer(event.segment, time.time()))
                return  # audio after the end of speech belongs to no turn
        if vad.speaking:
            self._want_hear(vad.speech_so_far, vad.paused)

    # --- early work while the user speaks ----------------------------------------

    def _want_hear(self, speech: np.ndarray, paused: bool) -> None:
        self._hear_wanted = (speech, paused)
        if self._hear is None or self._hear.done():
            self._hear = asyncio.ensure_future(self._hear_loop())

    async def _hear_loop(self) -> None:
        """At most one ``hear`` step in flight; the newest request wins."""
        while self._hear_wanted is not None:
            (speech, paused), self._hear_wanted = self._hear_wanted, None
            await self.runtime.step(self.record, self.session.hear, speech, paused)

    async def _stop_hear(self) -> None:
        self._hear_wanted = None
        if self._hear is not None:
            with contextlib.suppress(Exception):
                await self._hear
            self._hear = None

    # --- the answer ----------------------------------------------------------------

    async def _answer(self, speech: np.ndarray, ended_ts: float) -> None:
        await self._stop_hear()  # one model step per session at a time
        record = self.record
        started = time.perf_counter()
        output = TurnOutput()
        timing: dict[str, float] = {}
        status: TurnStatus = "interrupted"  # until it completes or fails
        failure: str | None = None
        try:
            await self.runtime.step(record, self.session.snapshot)
            await self.runtime.step(record, self.session.prefill, speech)
            timing["prefill_ms"] = round((time.perf_counter() - started) * 1000, 1)
            async for chunk in self.runtime.stream(record, self.session.generate):
                timing.setdefault("first_chunk_ms", (time.perf_counter() - started) * 1000)
                audio = pcm_to_b64(chunk.audio) if chunk.audio is not None else None
                await self.send(chunk_message(chunk.text, audio))
                output.add(chunk.text, chunk.audio, time.time())
            timing["first_chunk_ms"] = round(timing.get("first_chunk_ms", 0.0), 1)
            timing["total_ms"] = round((time.perf_counter() - started) * 1000, 1)
            timing.update(self.session.turn_timings)
            done = turn_done_message(self.turns, "".join(output.text))
            await self.send({**done, "timings": timing})
            self.turns += 1
            status = "done"
        except EngineError as exc:
            status, failure = "failed", str(exc)
            log.warning("turn %d of %s failed: %s", self.turns, self.record.session_id, exc)
            await self.runtime.step(record, self.session.rollback)
            await self.send(error_message(f"turn failed: {exc}", ErrorCode.INFERENCE_ERROR))
        finally:
            if self.vad is not None:
                self.vad.reset()  # cheap; must happen before audio is fed again
            self.phase = Phase.LISTENING
            self.last_activity = time.monotonic()
            if self.recorder is not None:
                timing.setdefault("total_ms", round((time.perf_counter() - started) * 1000, 1))
                await self._record_turn(speech, ended_ts, output, timing, status, failure)

    async def _record_turn(
        self,
        speech: np.ndarray,
        ended_ts: float,
        output: TurnOutput,
        timing: dict[str, float],
        status: TurnStatus,
        failure: str | None,
    ) -> None:
        assert self.recorder is not None and self.vad is not None
        # SpeechEnded fires after min_silence of quiet; the segment (speech
        # plus pad) ended that long ago, give or take one VAD window.
        vad = self.vad.config
        trailing_s = (vad.min_silence_duration_ms - vad.speech_pad_ms) / 1000
        speech_ts = ended_ts - trailing_s - speech.size / INPUT_RATE
        if "first_chunk_ms" in timing:
            timing["first_chunk_ms"] = round(timing["first_chunk_ms"], 1)
        source = TurnInput(speech=speech, speech_ts=speech_ts)
        await self.recorder.turn(ended_ts, source, output, timing, status, failure)

    async def _end_turn(self) -> None:
        """Interrupt the answer: queued chunks are dropped, the step in flight
        finishes, and the context goes back to before the turn."""
        turn, self._turn = self._turn, None
        if turn is None or turn.done():
            return
        self.outbox.flush()
        turn.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await turn
        await self.runtime.step(self.record, self.session.rollback)

    # --- inactivity ------------------------------------------------------------------

    async def _watchdog(self) -> str:
        """Ends the session after ``timeout_s`` without audio; answering counts
        as activity (the client is told to be silent meanwhile)."""
        first_message_timeout = self.settings.limits.first_message_timeout_s
        while True:
            limit = (
                self.timeout_s if self.phase is not Phase.WAITING_PREPARE else first_message_timeout
            )
            if self.phase is Phase.GENERATING:
                self.last_activity = time.monotonic()
            left = self.last_activity + limit - time.monotonic()
            if left <= 0:
                return "timeout"
            await asyncio.sleep(min(left, 0.5))
