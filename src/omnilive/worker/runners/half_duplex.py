"""Half-duplex voice on the worker: server-side VAD, one answer per utterance.

Three things run at once and none waits for another: the reader (client
messages, so ``stop`` is acted on mid-turn), the turn (prefill + streamed
answer, at most one model step in flight), and the inactivity watchdog.
The VAD belongs to this runner, not to the engine, so every engine gets it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from omnilive.audio import INPUT_RATE, AudioDecodeError, pcm_from_b64, pcm_to_b64, voice_from_b64
from omnilive.engines.base import EngineError, HalfDuplexSession
from omnilive.engines.messages import (
    AudioPart,
    GenerationOptions,
    HalfDuplexOptions,
    Part,
    TextPart,
    Voice,
)
from omnilive.protocol.chat import chunk_message
from omnilive.protocol.common import ErrorCode, ProtocolError, error_message
from omnilive.protocol.half_duplex import (
    CLIENT_TYPES,
    STOPPED,
    AudioChunk,
    ChunkFields,
    Playback,
    Prepare,
    Stop,
    client_message,
    generating_message,
    interrupted_message,
    playback_applied_message,
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
    TurnCheck,
    VadConfig,
)
from omnilive.worker.chunk_media import DecodedChunk, chunk_audio, read_frame
from omnilive.worker.decode import DecodeError, load_stored_voice
from omnilive.worker.heard import SpokenAnswer, heard_text
from omnilive.worker.machines.half_duplex import HalfDuplexMachine, HalfDuplexPhase
from omnilive.worker.machines.session import Ended
from omnilive.worker.runners.hearing import EarlyHearing, judged_end, with_turn_checks
from omnilive.worker.runners.streaming import StreamingRunner, Work

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Reply briefly and naturally."
COLD_START_MS = 500
# Speech this long over an answer interrupts it (barge_in): long enough that a
# cough or a burst of echo does not, short enough to feel immediate.
BARGE_IN_MS = 300
# A turn whose words sound unfinished may wait past the session's silence
# rule (end_of_turn.unfinished_wait_ms). Once that rule's silence is heard,
# a client that sends nothing for its last chunk's length and this margin has
# stopped sending (a microphone turned off, a clip sent whole): the turn ends
# then, as the rule alone would have ended it, instead of never.
STALL_MARGIN_S = 0.3


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

    machine: HalfDuplexMachine

    def _init_state(self) -> None:
        first_message_s = self.settings.limits.first_message_timeout_s
        self.machine = HalfDuplexMachine(first_message_s, time.monotonic())
        self.session: HalfDuplexSession = self.runtime.open_half_duplex(self.record)
        self.hearing = EarlyHearing(self.runtime, self.record, self.session, self.spawn)
        self.record.closer = self.session.close  # the lane's last step
        self.vad: StreamingVad | None = None
        self.turns = 0
        self.ignored_chunks = 0  # audio that arrived while answering (echo risk)
        self._turn: asyncio.Task[None] | None = None
        self.recorder: TurnRecorder | None = None
        self.last_answer: SpokenAnswer | None = None  # for a playback report
        self._stalled: asyncio.Task[None] | None = None  # see STALL_MARGIN_S

    # --- the session's tasks ----------------------------------------------------

    def _main_tasks(self) -> dict[str, Work]:
        return {"reader": self._read, "watchdog": self._watchdog}

    async def _wind_down(self) -> None:
        try:
            await self._end_turn()
            await self.hearing.stop()
        finally:
            if self.recorder is not None:  # after the last turn was recorded
                await self.recorder.close()

    async def _goodbye(self, ended: Ended) -> None:
        if ended.reason == "stopped":
            await self.send(STOPPED)
        elif ended.reason in ("timeout", "idle"):
            await self.send(timeout_message(time.monotonic() - self.machine.last_activity))

    # --- reading -------------------------------------------------------------

    async def _read(self) -> None:
        max_bytes = self.settings.limits.max_message_bytes
        async for raw in self.frames:
            try:
                message = read_frame(raw, client_message, CLIENT_TYPES, max_bytes, ChunkFields)
            except ProtocolError as exc:
                await self.send(error_message(exc.message, exc.code))
                continue
            if isinstance(message, Stop):  # in every phase, a prepare in flight included
                self.machine.stop()
                return
            if not self.machine.hold(message):
                await self._handle(message)
        self.machine.disconnected()

    async def _handle(self, message: Prepare | AudioChunk | DecodedChunk | Playback) -> None:
        try:
            if isinstance(message, Prepare):
                self.machine.prepare()
                self._preparing = self.spawn("prepare", self._prepare(message))
            elif isinstance(message, Playback):
                await self._playback(message)
            else:
                await self._audio(message)
        except ProtocolError as exc:
            await self.send(error_message(exc.message, exc.code))

    async def _prepare(self, message: Prepare) -> None:
        """The prepare, as a task of its own: the reader goes on meanwhile
        (a stop ends the session at once), holding audio until it is done."""
        try:
            timeout_s = await self._prepare_session(message)
        except ProtocolError as exc:
            await self.send(error_message(exc.message, exc.code))
            timeout_s = None
        now = time.monotonic()
        if timeout_s is None:
            held = self.machine.prepare_failed()
        else:
            held = self.machine.prepared_with(timeout_s, now, message.config.barge_in)
        for later in held:
            await self._handle(later)

    async def _prepare_session(self, message: Prepare) -> float | None:
        """The session's inactivity timeout once it is prepared (``prepared``
        is sent), or None if the engine failed to prepare it."""
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
                do_sample=g.do_sample,
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
        # A client that sets no silence rule leaves it to the server (the end-of-turn settings).
        rule_is_servers = "min_silence_duration_ms" not in config.vad.model_fields_set
        words = self.session.judges_words
        vad_config = await with_turn_checks(self.runtime, vad_config, rule_is_servers, words)
        self.vad = StreamingVad(await asyncio.to_thread(SileroModel), vad_config)
        try:
            await self.runtime.step(self.session.prepare, parts, options)
        except EngineError as exc:
            await self.send(error_message(f"prepare failed: {exc}", ErrorCode.INFERENCE_ERROR))
            return None
        timeout_s = min(config.session.timeout_s, self.settings.limits.max_session_timeout_s)
        self.recorder = self._open_recorder(message)
        recording_id = self.recorder.recording_id if self.recorder is not None else None
        warnings = list(self.session.warnings)  # e.g. a voice it cannot clone
        await self.send(prepared_message(self.record.session_id, timeout_s, recording_id, warnings))
        return timeout_s

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

    async def _audio(self, message: AudioChunk | DecodedChunk[ChunkFields]) -> None:
        """A chunk, as text or as a media frame: the same checks, the same errors."""
        self.machine.require_prepared("audio_chunk")  # else refused, unread
        samples = chunk_audio(message)
        if not self.machine.audio(time.monotonic()):
            # The client should be silent while the answer plays (echo); such
            # audio never reaches the VAD.
            self.ignored_chunks += 1
            return
        vad = self.vad
        assert vad is not None  # made by the prepare
        if self._stalled is not None:
            self._stalled.cancel()  # audio came after all
            self._stalled = None
        if self.machine.phase is HalfDuplexPhase.ANSWERING:
            await self._hear_over_answer(vad, samples)
            return
        for event in vad.feed(samples):  # ~3 ms per 0.5 s of audio: fine on the loop
            if isinstance(event, SpeechStarted):
                await self.send(vad_state_message(True))
            elif isinstance(event, SpeechDiscarded):
                await self.send(vad_state_message(False))
            elif isinstance(event, TurnCheck):
                self.spawn("end-of-turn", self._judge_turn(event))
            elif isinstance(event, SpeechEnded):
                await self._speech_ended(event)
                return  # audio after the end of speech belongs to no turn
        if vad.speaking:
            self.hearing.want(vad.speech_so_far, vad.paused)
        rule_ms = vad.config.rule_silence_ms
        if rule_ms is not None and vad.paused and vad.silence_ms >= rule_ms:
            wait_s = samples.size / INPUT_RATE + STALL_MARGIN_S
            self._stalled = self.spawn("stalled", self._end_if_no_audio(wait_s))

    async def _end_if_no_audio(self, wait_s: float) -> None:
        """End a turn held past the session's silence rule if no audio comes
        for ``wait_s`` (the next chunk cancels this)."""
        await asyncio.sleep(wait_s)
        self._stalled = None
        ended = self.vad.end_pause() if self.vad is not None else None
        if isinstance(ended, SpeechEnded):
            await self._speech_ended(ended)
        elif isinstance(ended, SpeechDiscarded):
            await self.send(vad_state_message(False))

    async def _playback(self, message: Playback) -> None:
        """The client played only ``played_ms`` of the last answer: the
        context keeps the part that was heard (where the engine can cut it)."""
        self.machine.require_prepared("playback")
        answer = self.last_answer
        if answer is None or answer.turn_index != message.turn_index:
            last = "none" if answer is None else str(answer.turn_index)
            message_text = f"playback reports the last answered turn (now {last})"
            raise ProtocolError(ErrorCode.INVALID_REQUEST, message_text)
        if self._turn is not None and not self._turn.done():
            raise ProtocolError(ErrorCode.NOT_READY, "a turn is being answered")
        heard = heard_text(answer.chunks, message.played_ms)
        cut = False
        if message.played_ms < answer.audio_ms:
            cut = await self.runtime.step(self.session.keep_heard, heard)
            self.last_answer = None  # cut once
        else:
            heard = answer.text
        await self.send(playback_applied_message(answer.turn_index, message.played_ms, heard, cut))

    async def _speech_ended(self, event: SpeechEnded) -> None:
        await self.send(vad_state_message(False))
        await self.send(generating_message(event.speech_ms))
        self.machine.speech_ended()
        if self.vad is not None:
            # Now, not when the answer ends: with barge-in, what the VAD hears
            # during the answer is the next turn's start.
            self.vad.reset()
        self._turn = self.spawn("turn", self._answer(event, time.time()))

    # --- turn-taking by meaning ------------------------------------------------------

    async def _judge_turn(self, check: TurnCheck) -> None:
        """A finished turn is answered now; an unfinished one waits for the
        silence rule."""
        ended = await judged_end(self.runtime, self.record, self.session, self.vad, check)
        if isinstance(ended, SpeechEnded):
            await self._speech_ended(ended)
        elif isinstance(ended, SpeechDiscarded):
            await self.send(vad_state_message(False))

    # --- the answer ----------------------------------------------------------------

    async def _answer(self, ended: SpeechEnded, ended_ts: float) -> None:
        await self.hearing.stop()  # one model step per session at a time
        speech = ended.segment
        started = time.perf_counter()
        output = TurnOutput()
        spoken = SpokenAnswer(self.turns)
        self.last_answer = None
        timing: dict[str, float] = {}
        status: TurnStatus = "interrupted"  # until it completes or fails
        failure: str | None = None
        try:
            await self.runtime.step(self.session.snapshot)
            await self.runtime.step(self.session.prefill, speech)
            timing["prefill_ms"] = round((time.perf_counter() - started) * 1000, 1)
            async for chunk in self.runtime.stream(self.session.generate):
                timing.setdefault("first_chunk_ms", (time.perf_counter() - started) * 1000)
                audio = pcm_to_b64(chunk.audio) if chunk.audio is not None else None
                await self.send(chunk_message(chunk.text, audio))
                output.add(chunk.text, chunk.audio, time.time())
                spoken.add(chunk.text, chunk.audio.size if chunk.audio is not None else 0)
            timing["first_chunk_ms"] = round(timing.get("first_chunk_ms", 0.0), 1)
            timing["total_ms"] = round((time.perf_counter() - started) * 1000, 1)
            timing.update(self.session.turn_timings)
            done = turn_done_message(self.turns, "".join(output.text))
            await self.send({**done, "timings": timing})
            self.last_answer = spoken
            self.turns += 1
            status = "done"
        except EngineError as exc:
            status, failure = "failed", str(exc)
            log.warning("turn %d of %s failed: %s", self.turns, self.record.session_id, exc)
            await self.runtime.step(self.session.rollback)
            await self.send(error_message(f"turn failed: {exc}", ErrorCode.INFERENCE_ERROR))
        except asyncio.CancelledError:
            self.last_answer = spoken  # what was sent of it, for a playback report
            self.turns += 1
            raise
        finally:
            self.machine.answered(time.monotonic())
            if self.recorder is not None:
                timing.setdefault("total_ms", round((time.perf_counter() - started) * 1000, 1))
                await self._record_turn(ended, ended_ts, output, timing, status, failure)

    async def _record_turn(
        self,
        ended: SpeechEnded,
        ended_ts: float,
        output: TurnOutput,
        timing: dict[str, float],
        status: TurnStatus,
        failure: str | None,
    ) -> None:
        assert self.recorder is not None and self.vad is not None
        # The turn ended after ``silence_ms`` of quiet (the silence rule's, or
        # less when the end-of-turn model judged it finished); the segment
        # (speech plus pad) ended that long ago, give or take one VAD window.
        speech = ended.segment
        trailing_s = (ended.silence_ms - self.vad.config.speech_pad_ms) / 1000
        speech_ts = ended_ts - trailing_s - speech.size / INPUT_RATE
        if "first_chunk_ms" in timing:
            timing["first_chunk_ms"] = round(timing["first_chunk_ms"], 1)
        source = TurnInput(speech=speech, speech_ts=speech_ts)
        await self.recorder.turn(ended_ts, source, output, timing, status, failure)

    # --- barge-in ------------------------------------------------------------------

    async def _hear_over_answer(self, vad: StreamingVad, samples: np.ndarray) -> None:
        """Speech that goes on for :data:`BARGE_IN_MS` while the model answers
        (the client asked for ``barge_in``) interrupts the answer and is the
        next turn's start; shorter sounds (a cough, echo the client's
        canceller let through) are forgotten."""
        vad.feed(samples)  # ends of short sounds, pauses: nothing to answer yet
        if vad.speaking and vad.speech_ms >= BARGE_IN_MS:
            turn, self._turn = self._turn, None
            index = self.turns
            if turn is not None and not turn.done():
                self.outbox.drop(lambda m: m.get("type") == "chunk")  # unsent answer audio
                turn.cancel()
                await asyncio.wait([turn])
                await self.send(interrupted_message(index))
            await self.send(vad_state_message(True))

    async def _end_turn(self) -> None:
        """Interrupt the answer: queued chunks are dropped, the step in flight
        finishes, and the context goes back to before the turn."""
        turn, self._turn = self._turn, None
        if turn is None or turn.done():
            return
        self.outbox.flush()
        turn.cancel()
        await asyncio.wait([turn])  # how it ended is the group's to read
        await self.runtime.step(self.session.rollback)
