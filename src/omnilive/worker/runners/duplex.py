"""Full duplex on the worker: the per-second prefill → generate → finalize loop.

The reader never waits for the model, so ``pause``, ``resume``, ``stop`` and
``force_listen`` take effect while a unit is being computed. Chunks wait in a
small drop-oldest buffer. The loop's rules (the steps of a unit, the order of
its finalize and the next prefill, what is recorded, when the session ends)
are :class:`~omnilive.worker.machines.duplex.DuplexMachine`'s; this runner
does the I/O: it runs the steps the machine answers and tells it how they
went, sends, records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

import numpy as np
from pydantic import ValidationError

from omnilive.audio import AudioDecodeError, voice_from_b64
from omnilive.engines.base import DuplexSession, EngineError
from omnilive.engines.messages import DuplexOptions, Voice
from omnilive.protocol.common import ContextWindowOption, ErrorCode, ProtocolError
from omnilive.protocol.duplex import (
    WORKER_TYPES,
    AudioChunk,
    ChunkFields,
    DuplexMode,
    Pause,
    Prepare,
    RealtimeOptions,
    Resume,
    Stop,
    Update,
    parse_mode,
    worker_message,
)
from omnilive.recording.duplex import DuplexRecorder
from omnilive.recording.files import new_recording_id
from omnilive.worker.chunk_buffer import ChunkBuffer, PendingChunk
from omnilive.worker.chunk_media import DecodedChunk, chunk_audio, chunk_frames, read_frame
from omnilive.worker.decode import DecodeError, check_image, load_stored_voice
from omnilive.worker.machines import duplex as rules
from omnilive.worker.machines.duplex import DuplexMachine, Limits, window_for
from omnilive.worker.machines.session import Ended
from omnilive.worker.presenter_v2 import RealtimeV2Presenter
from omnilive.worker.presenters import (
    DuplexPresenter,
    Presenter,
    RealtimePresenter,
)
from omnilive.worker.runners.streaming import StreamingRunner, Work
from omnilive.worker.runtime import WorkerState
from omnilive.worker.unit_assembler import Unit, UnitAssembler

log = logging.getLogger(__name__)


def decode_reference(data: str | None) -> np.ndarray | None:
    """A reference voice as 16 kHz float32 (raw PCM or a WAV file), if given."""
    return voice_from_b64(data) if data else None


class DuplexRunner(StreamingRunner):
    """One audio or omni duplex session; :meth:`run` returns when it ends."""

    machine: DuplexMachine

    def _init_state(self) -> None:
        kind = self.record.kind
        self.mode: DuplexMode = "audio_duplex" if kind == "audio_duplex" else "omni_duplex"
        settings = self.settings
        limits = Limits(
            first_message_s=settings.limits.first_message_timeout_s,
            idle_s=settings.duplex.idle_timeout_s,
            pause_s=settings.duplex.pause_timeout_s,
            max_pause_s=settings.duplex.max_pause_s,
        )
        self.session: DuplexSession = self.runtime.open_duplex(self.record)
        self.record.closer = self.session.close  # the lane's last step
        self.machine = DuplexMachine(limits, time.monotonic())
        self.buffer = ChunkBuffer(self.settings.duplex.max_pending_chunks)
        self.presenter: Presenter = DuplexPresenter()
        self.dialect = "duplex"
        self.assembler: UnitAssembler | None = None  # Realtime sessions only
        self.recorder: DuplexRecorder | None = None
        self._received = 0
        self._presented: list[dict[str, Any]] = []  # the unit's messages, until sent
        self._finalize_task: asyncio.Task[None] | None = None

    async def send_error(self, code: ErrorCode, message: str) -> None:
        await self.send(self.presenter.error(code, message))

    # --- the session's tasks ----------------------------------------------------

    def _main_tasks(self) -> dict[str, Work]:
        return {"reader": self._read, "compute": self._compute, "watchdog": self._watchdog}

    async def _wind_down(self) -> None:
        try:
            if self._finalize_task is not None:  # the last unit's finalize runs to its end
                await asyncio.wait([self._finalize_task])
        finally:
            if self.recorder is not None:
                await self.recorder.close()

    async def _goodbye(self, ended: Ended) -> None:
        if ended.tell_client:
            self.outbox.flush()  # results not yet sent are stale now
            elapsed = time.monotonic() - self.machine.started
            goodbye = self.presenter.ended(ended.reason, elapsed, ended.detail)
            if goodbye is not None:
                await self.send(goodbye)

    # --- reading -------------------------------------------------------------

    async def _read(self) -> None:
        max_bytes = self.settings.limits.max_message_bytes
        async for raw in self.frames:
            try:
                message = read_frame(raw, worker_message, WORKER_TYPES, max_bytes, ChunkFields)
            except ProtocolError as exc:
                await self.send_error(exc.code, exc.message)
                continue
            if isinstance(message, Stop):  # in every phase, a prepare in flight included
                self.machine.stop(message.reason)
                return
            if not self.machine.hold(message):
                await self._handle(message)
        self.machine.disconnected()

    async def _handle(self, message: Any) -> None:
        try:
            if isinstance(message, Prepare):
                self.machine.prepare()
                self._preparing = self.spawn("prepare", self._prepare(message))
            elif isinstance(message, AudioChunk | DecodedChunk):
                await self._audio(message)
            elif isinstance(message, Update):
                await self._update(message)
            elif isinstance(message, RealtimeOptions):
                self._realtime(message)
            elif isinstance(message, Pause):
                await self._pause(message)
            elif isinstance(message, Resume):
                self.machine.resume(time.monotonic())
                self.runtime.set_session_state(self.record, WorkerState.DUPLEX_ACTIVE)
                await self.send(self.presenter.resumed())
        except ProtocolError as exc:
            await self.send_error(exc.code, exc.message)

    async def _prepare(self, message: Prepare) -> None:
        """The prepare, as a task of its own: the reader goes on meanwhile
        (a stop ends the session at once), holding other messages until it is
        done; then they are handled in order."""
        try:
            ready = await self._prepare_session(message)
        except ProtocolError as exc:
            await self.send_error(exc.code, exc.message)
            ready = False
        now = time.monotonic()
        held = self.machine.prepared(now) if ready else self.machine.prepare_failed()
        for later in held:
            await self._handle(later)

    async def _prepare_session(self, message: Prepare) -> bool:
        """Whether the session is prepared (``prepared`` is sent)."""
        self.mode = parse_mode(message.mode) or self.mode
        self.record.kind = self.mode
        llm_ref, tts_ref = await self._voices(message)
        tts_ref = tts_ref if tts_ref is not None else llm_ref
        given = message.context_window or _config_window(message.config)
        options = DuplexOptions(
            llm_voice=Voice(reference=llm_ref) if llm_ref is not None else None,
            tts_voice=Voice(reference=tts_ref) if tts_ref is not None else None,
            max_slice_nums=message.max_slice_nums,
            vision=self.mode == "omni_duplex",
            window=window_for(self.runtime.engine.capabilities.context_window, given),
        )
        self.machine.configure_units(
            message.deferred_finalize, message.max_slice_nums, options.window
        )
        try:
            prompt_length = await self.runtime.step(
                self.session.prepare, message.system_prompt, options
            )
        except EngineError as exc:
            await self.send_error(ErrorCode.INFERENCE_ERROR, f"prepare failed: {exc}")
            return False
        kind = "realtime" if self.dialect != "duplex" else self.mode
        self.recorder = DuplexRecorder.open(
            self.settings,
            kind,
            new_recording_id(kind),
            worker_id=self.runtime.worker_id,
            config={
                **message.model_dump(
                    include={"system_prompt", "max_slice_nums", "deferred_finalize", "mode"}
                ),
                "dialect": self.dialect,
            },
            opted_in=message.recording,
        )
        extra = {
            "mode": self.mode,
            "capabilities": self.runtime.engine.capabilities.to_dict(),
            "warnings": list(self.session.warnings),
        }
        recording_id = self.recorder.recording_id if self.recorder else None
        session_id = self.record.session_id
        ready = self.presenter.prepared(session_id, prompt_length, recording_id, extra)
        if ready is not None:
            await self.send(ready)
        return True

    def _realtime(self, options: RealtimeOptions) -> None:
        """The gateway serves the Realtime API over this session."""
        self.machine.options()
        self.dialect = options.dialect
        if options.dialect == "realtime":
            self.presenter = RealtimePresenter()
        else:
            self.presenter = RealtimeV2Presenter(self.record.session_id)
        # Realtime clients send audio in pieces of any length: joined into 1 s units.
        self.assembler = UnitAssembler(self.settings.limits.max_frames_per_chunk)
        self.machine.context_limit = options.context_limit

    async def _voices(self, message: Prepare | Update) -> tuple[np.ndarray | None, ...]:
        """The LLM and TTS reference voices a message gives: its audio, else
        the stored voice it names, else None."""
        try:
            llm_ref = decode_reference(message.ref_audio_base64)
            tts_ref = decode_reference(message.tts_ref_audio_base64)
        except AudioDecodeError as exc:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, f"reference audio: {exc}") from None
        if llm_ref is None and message.ref_audio_id:
            llm_ref = await self._stored_voice(message.ref_audio_id)
        if tts_ref is None and message.tts_ref_audio_id:
            tts_ref = await self._stored_voice(message.tts_ref_audio_id)
        return llm_ref, tts_ref

    async def _update(self, message: Update) -> None:
        self.machine.update()
        llm_ref, tts_ref = await self._voices(message)
        voice = tts_ref if tts_ref is not None else llm_ref
        tts_voice = Voice(reference=voice) if voice is not None else None
        try:
            unchanged = await self.runtime.step(
                self.session.update, message.system_prompt, tts_voice
            )
        except EngineError as exc:
            await self.send_error(ErrorCode.INFERENCE_ERROR, f"update failed: {exc}")
            return
        applied = [name for name, value in (("instructions", message.system_prompt),
                                            ("voice", tts_voice)) if value is not None]  # fmt: skip
        await self.send(self.presenter.updated(applied, unchanged))

    async def _stored_voice(self, voice_id: str) -> np.ndarray:
        try:
            return await asyncio.to_thread(load_stored_voice, self.settings.data_dir, voice_id)
        except DecodeError as exc:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, str(exc)) from None

    async def _audio(self, message: AudioChunk | DecodedChunk[ChunkFields]) -> None:
        """A chunk, as text or as a media frame: the same checks, the same errors."""
        self.machine.require_prepared("audio_chunk")  # else refused, unread
        limits = self.settings.limits
        audio = chunk_audio(message)
        if audio.size > limits.max_chunk_audio_s * 16_000:
            raise ProtocolError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"chunk of {audio.size / 16_000:.2f} s exceeds {limits.max_chunk_audio_s} s",
            )
        frames = chunk_frames(message, limits)
        try:
            await asyncio.to_thread(lambda: [check_image(f, "frame") for f in frames])
        except DecodeError as exc:
            raise ProtocolError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        fields = message.fields if isinstance(message, DecodedChunk) else message
        self._push(audio, frames, fields.force_listen, fields.max_slice_nums, fields.input_id)

    def _push(
        self,
        audio: np.ndarray,
        frames: list[bytes],
        force_listen: bool,
        max_slice_nums: int | None = None,
        input_id: str | None = None,
    ) -> None:
        """Decoded input, for the unit loop (joined into 1 s units where
        an assembler does that)."""
        if not self.machine.audio(time.monotonic()):
            return  # a paused session hears nothing
        frames = frames if self.mode == "omni_duplex" else []
        if self.assembler is None:
            units = [Unit(audio, frames, force_listen, max_slice_nums)]
        else:
            units = self.assembler.add(audio, frames, force_listen, max_slice_nums, input_id)
        for unit in units:
            self.buffer.push(
                PendingChunk(
                    index=self._received,
                    received_at=time.monotonic(),
                    received_wall=time.time(),
                    audio=unit.audio,
                    frames=unit.frames,
                    force_listen=unit.force_listen,
                    max_slice_nums=unit.max_slice_nums,
                    input_id=unit.input_id,
                )
            )
            self._received += 1

    async def _pause(self, message: Pause) -> None:
        seconds = self.machine.pause(message.timeout, time.monotonic())
        self.buffer.clear()
        self.runtime.set_session_state(self.record, WorkerState.DUPLEX_PAUSED)
        await self.send(self.presenter.paused(seconds))

    # --- the unit loop ---------------------------------------------------------------

    async def _compute(self) -> None:
        while True:
            chunk = await self.buffer.pop()
            if await self._do(self.machine.handle(rules.ChunkReady(chunk))):
                return

    async def _do(self, actions: list[rules.UnitAction]) -> bool:
        """Do what the machine answered, in order; what a step reports goes
        back to it, and what it answers to that is done next. Returns True
        when the session ended."""
        todo = deque(actions)
        while todo:
            action = todo.popleft()
            if isinstance(action, rules.End):
                return True
            event = await self._act(action)
            if event is not None:
                todo.extendleft(reversed(self.machine.handle(event)))
        return False

    async def _act(self, action: rules.UnitAction) -> rules.UnitEvent | None:
        """One action; a step's outcome is returned as the machine's event."""
        record, session = self.record, self.session
        match action:
            case rules.AwaitFinalize():
                if self._finalize_task is not None and not self._finalize_task.done():
                    await asyncio.wait([self._finalize_task])
            case rules.BetweenUnits():
                await self._between_units()
            case rules.RunUnit(given):
                started = time.perf_counter()
                try:
                    stats, unit = await self.runtime.step(session.unit, given)
                except EngineError as exc:
                    return rules.UnitFailed(exc)
                return rules.UnitRan(
                    stats, unit, started, time.perf_counter(), self.buffer.dropped_total
                )
            case rules.Present(unit, chunk, timing):
                record.kv_cache_length = unit.kv_cache_length
                self._presented = self.presenter.unit(unit, chunk, timing)
            case rules.RecordUnit(chunk, unit, mode, timing):
                if self.recorder is not None:
                    await self.recorder.unit(
                        chunk.index,
                        chunk.received_wall,
                        chunk.audio,
                        chunk.frames,
                        mode=mode,
                        text=unit.text,
                        ai_audio=unit.audio,
                        end_of_turn=unit.end_of_turn,
                        timing=timing,
                        dropped_before=chunk.dropped_before,
                    )
            case rules.Finalize(deferred):
                if deferred:
                    self._finalize_task = self.spawn("finalize", self._finalize())
                else:
                    await self._finalize()
            case rules.SendPresented():
                messages, self._presented = self._presented, []
                for message in messages:
                    await self.send(message)
            case rules.ReportError(code, message):
                await self.send_error(code, message)
            case rules.SkipUnit(index, error):
                log.warning("unit %d of %s failed: %s", index, record.session_id, error)
                await self.send_error(ErrorCode.INFERENCE_ERROR, action.message)
            case rules.GiveUp(error):
                raise error  # the session ends with its error, logged once
            case _:
                raise TypeError(f"not a unit loop action: {action!r}")
        return None

    async def _between_units(self) -> None:
        """What a dialect writes into the context between two units (the
        Live API's appends): after one unit's finalize, before the next's prefill."""
        return None

    async def _finalize(self) -> None:
        """The unit's finalize; the machine hears how it went (beside the
        loop, where it is deferred)."""
        try:
            await self.runtime.step(self.session.finalize)
        except EngineError as exc:
            await self._do(self.machine.handle(rules.Finalized(str(exc))))
        else:
            await self._do(self.machine.handle(rules.Finalized()))


def _config_window(config: dict[str, Any]) -> ContextWindowOption | None:
    """``config.context_window`` (the Realtime API's clients pass their
    config through), typed; a bad one is the client's error."""
    given = config.get("context_window")
    if given is None:
        return None
    try:
        return ContextWindowOption.model_validate(given)
    except ValidationError as exc:
        message = f"config.context_window: {exc.errors()[0]['msg']}"
        raise ProtocolError(ErrorCode.INVALID_REQUEST, message) from None
