"""OpenAI's Live API over the full-duplex unit loop (``kind = live``).

The duplex runner's loop is unchanged (1 s units, drop-oldest, deferred
finalize); this runner reads Live events instead of duplex messages, and its
presenter (``presenter.py``) writes the model's units as speech and
transcript deltas on the session's timeline. Beside the loop:

- a server VAD marks the user's turns; each is transcribed (the side Whisper,
  ``transcription.whisper``) into ``session.input_transcript.delta`` with its
  times, and read by the delegation judge (``worker/delegation/``);
- appends (``instructions``, ``thinking``, ``commentary``) wait, bounded,
  for the loop's next gap between two units, where the engine writes them
  into the model's context (:meth:`DuplexSession.append`); each is
  acknowledged (``session.*.appended``) once written;
- ``mute`` feeds the model silence in place of the user's audio until ``unmute``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnilive.audio import INPUT_RATE, AudioDecodeError
from omnilive.audio_codecs import decode_input
from omnilive.engines.appends import ContextNote, NoteKind
from omnilive.engines.base import EngineError
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.remote_llm import RemoteChat
from omnilive.protocol.common import ProtocolError, parse_json_object
from omnilive.protocol.duplex import Prepare
from omnilive.protocol.openai_live import (
    Append,
    AudioAppend,
    AudioMute,
    AudioUnmute,
    CustomVoice,
    InstructionsAppend,
    PcmFormat,
    ResponseCreate,
    ResponseItemCreate,
    SessionClose,
    SessionConfig,
    parse_client_event,
)
from omnilive.protocol.openai_live_events import (
    AppendKind,
    appended,
    muted,
    refusal_event,
    session_closed,
    session_resource,
    session_updated,
    transcript,
)
from omnilive.vad import SileroModel, SpeechEnded, SpeechStarted, StreamingVad, VadConfig
from omnilive.worker.delegation.backend import ResponsesBackend
from omnilive.worker.delegation.flow import DelegationFlow
from omnilive.worker.delegation.judge import judge_of
from omnilive.worker.live.presenter import LivePresenter
from omnilive.worker.machines.session import Ended
from omnilive.worker.runners.duplex import DuplexRunner
from omnilive.worker.unit_assembler import UnitAssembler

log = logging.getLogger(__name__)
_KINDS = {
    "session.instructions.append": NoteKind.INSTRUCTIONS,
    "session.thinking.append": NoteKind.THINKING,
    "session.commentary.append": NoteKind.COMMENTARY,
}
# The user's turns, for transcripts and the judge: the GA dialect's server
# VAD defaults, but a turn ends after 0.6 s of silence (clients group
# transcript fragments into turns at a 0.8 s gap).
TURN_VAD = VadConfig(threshold=0.5, min_silence_duration_ms=600, speech_pad_ms=200)


@dataclass(frozen=True)
class _Note:
    note: ContextNote
    event_id: str | None  # None: the session's own (an acknowledgement, a backend's answer)
    at_ms: int


class LiveRunner(DuplexRunner):
    """One Live session on the duplex unit loop."""

    presenter: LivePresenter
    assembler: UnitAssembler

    def _init_state(self) -> None:
        super()._init_state()
        self.mode = "audio_duplex"
        self.dialect = "live"
        self.config = SessionConfig(model="gpt-live-1")
        self.session_id = self.record.session_id
        self.expires_at = 0
        self.presenter = LivePresenter(
            lambda: self.config,
            lambda: session_resource(self.session_id, self.config, self.expires_at),
            lambda: self.machine.context_limit,
        )
        self.presenter.elapsed_s = lambda: time.monotonic() - self.machine.started
        self.assembler = UnitAssembler(self.settings.limits.max_frames_per_chunk)
        self.machine.context_limit = self.settings.realtime.context_tokens
        self.vad: StreamingVad | None = None
        self.heard_ms = 0.0  # the session's timeline: input audio heard since the start
        self.muted = False
        self._turn_start_ms = 0.0
        self.notes: deque[_Note] = deque()  # bounded by _queue (live.max_pending_appends)
        self._turns: set[asyncio.Task[None]] = set()
        live = self.settings.live
        backend = None
        if live.backend.url is not None:
            backend = ResponsesBackend(RemoteChat.from_settings(live.backend), live.backend.model)
        self.flow = DelegationFlow(
            judge_of(live.judge), backend, live.acknowledgement, self.send, self._say, self.spawn
        )
        self.presenter.on_said = self.flow.said

    @property
    def now_ms(self) -> int:
        return round(self.heard_ms)

    async def _error(self, exc: ProtocolError, kind: str = "invalid_request_error") -> None:
        await self.send(refusal_event(exc, kind))

    # --- reading ------------------------------------------------------------------------

    async def _read(self) -> None:
        max_bytes = self.settings.limits.max_message_bytes
        async for raw in self.frames:
            data = parse_json_object(raw, max_bytes)  # the gateway checked it
            if data.get("type") == "internal.live":  # the gateway's, not the client's to refuse
                await self._start(data)
                continue
            try:
                if data.get("type") == "session.update":  # the whole session, merged
                    await self._session_update(data)
                else:
                    event = parse_client_event(data)
                    if isinstance(event, SessionClose):
                        await self.send(self._closed("close_requested", event.event_id))
                        self.machine.stop("close_requested")
                        return
                    await self._event(event)
            except ProtocolError as exc:
                await self._error(exc)
        self.machine.disconnected()

    async def _start(self, data: dict[str, Any]) -> None:
        self.session_id = data.get("session_id") or self.session_id
        self.config = SessionConfig.model_validate(data["session"])
        self.flow.config = self.config
        self.expires_at = int(data.get("expires_at") or 0)
        self.presenter.start_event_id = data.get("event_id")
        voice = self.config.audio.output.voice
        prepare = Prepare(
            type="prepare",
            system_prompt=system_prompt(self.config),
            mode="audio_duplex",
            recording=True,
            ref_audio_id=voice.id if isinstance(voice, CustomVoice) else None,
        )
        for item in self.config.input or []:
            (self.flow.heard if item.role == "user" else self.flow.said)(item.text)
        self.machine.prepare()
        if not await self._prepare_session(prepare):
            self.machine.prepare_failed()
            return
        self.machine.prepared(time.monotonic())
        if self.runtime.transcriber is not None:  # no transcript: no turn to judge
            self.vad = StreamingVad(await asyncio.to_thread(SileroModel), TURN_VAD)

    async def _session_update(self, data: dict[str, Any]) -> None:
        self.config = SessionConfig.model_validate(data["session"])
        self.flow.config = self.config
        await self.send(session_updated(self.presenter_resource(), data.get("event_id")))

    def presenter_resource(self) -> dict[str, Any]:
        return session_resource(self.session_id, self.config, self.expires_at)

    async def _event(self, event: Any) -> None:
        if isinstance(event, AudioAppend):
            await self._append_audio(event)
        elif isinstance(event, AudioMute | AudioUnmute):
            self.muted = isinstance(event, AudioMute)
            await self.send(muted(event.event_id, self.muted))
        elif isinstance(event, Append):
            await self._append(event)
        elif isinstance(event, ResponseItemCreate):
            self.flow.item(event.item, event.event_id)
        elif isinstance(event, ResponseCreate):
            self.flow.create(event.event_id)

    # --- appends ------------------------------------------------------------------------

    async def _append(self, event: Append) -> None:
        kind = _KINDS[event.type]
        self.flow.appended(kind.value, event.delegation_id, event.event_id)
        if isinstance(event, InstructionsAppend):
            self.flow.history.append(Message("system", event.content))
        self._queue(_Note(ContextNote(kind, event.content), event.event_id, self.now_ms))

    async def _say(self, note: ContextNote) -> None:
        """The session's own commentary (an acknowledgement, the backend's answer)."""
        try:
            self._queue(_Note(note, None, self.now_ms))
        except ProtocolError as exc:  # the client's appends filled the queue: said, not hidden
            log.warning("session %s: not said (%s): %s", self.session_id, exc.message, note.text)
            await self._error(exc, "server_error")

    def _queue(self, note: _Note) -> None:
        if len(self.notes) >= self.settings.live.max_pending_appends:
            message = "too many appends wait for the model's next unit"
            raise ProtocolError("too_many_events", message, None, note.event_id)
        self.notes.append(note)

    async def _between_units(self) -> None:
        """The appends waiting, into the model's context, each acknowledged."""
        while self.notes:
            pending = self.notes.popleft()
            try:
                await self.runtime.step(self.session.append, pending.note)
            except EngineError as exc:  # CapabilityError included: the engine cannot
                if pending.event_id is not None:
                    error = ProtocolError("unsupported", str(exc), None, pending.event_id)
                    await self._error(error, "server_error")
                continue
            if pending.event_id is not None:
                kind: AppendKind = pending.note.kind.value
                await self.send(appended(kind, pending.at_ms, self.now_ms, pending.event_id))

    # --- input audio ------------------------------------------------------------------

    async def _append_audio(self, event: AudioAppend) -> None:
        fmt = self.config.audio.format
        rate = fmt.rate if isinstance(fmt, PcmFormat) else None
        try:
            samples = decode_input(event.audio, fmt.type, rate)
        except AudioDecodeError as exc:
            raise ProtocolError("invalid_value", f"audio: {exc}", "audio", event.event_id) from None
        start_ms = self.heard_ms
        self.heard_ms += samples.size / INPUT_RATE * 1000
        if self.muted:  # the model hears silence, and no turn is transcribed
            self._push(np.zeros_like(samples), [], False)
            return
        # The model first: the turn VAD (Silero over the chunk: ~10 ms a
        # second of audio on 2 cores) is for transcripts, which may wait, so
        # it runs off the event loop while the unit goes to the engine.
        self._push(samples, [], False)
        if self.vad is not None:
            for vad_event in await asyncio.to_thread(self.vad.feed, samples):
                if isinstance(vad_event, SpeechStarted):
                    self._turn_start_ms = start_ms
                elif isinstance(vad_event, SpeechEnded):
                    turn = (self._turn_start_ms, self.heard_ms)
                    task = self.spawn("turn", self._turn(vad_event.segment, *turn))
                    self._turns.add(task)
                    task.add_done_callback(self._turns.discard)

    async def _turn(self, speech: np.ndarray, start_ms: float, end_ms: float) -> None:
        """A user turn: its transcript, then the judge (off the reader)."""
        transcriber = self.runtime.transcriber
        if transcriber is None:
            return  # no transcript, nothing to judge: docs/modes/live.md
        text = (await transcriber.transcribe(speech)).strip()
        if not text:
            return
        await self.send(transcript("input", text, round(start_ms), round(end_ms)))
        await self.flow.turn(text, round(end_ms))

    # --- the session's end ------------------------------------------------------------

    def _closed(self, reason: Any, client_event_id: str | None) -> dict[str, Any]:
        elapsed = time.monotonic() - self.machine.started
        return session_closed(self.presenter_resource(), reason, elapsed, client_event_id)

    async def _wind_down(self) -> None:
        turns = list(self._turns)
        for task in turns:
            task.cancel()
        if turns:
            await asyncio.wait(turns)
        await self.flow.close()
        await super()._wind_down()

    async def _goodbye(self, ended: Ended) -> None:
        if ended.reason == "stopped" or not ended.tell_client:
            return  # session.close answered already; a client gone hears nothing
        self.outbox.flush()
        elapsed = time.monotonic() - self.machine.started
        why = self.presenter.end_error(ended.reason, elapsed)
        if why is not None:
            await self.send(why)
        closed = self.presenter.ended(ended.reason, elapsed, ended.detail)
        if closed is not None:
            await self.send(closed)


def system_prompt(config: SessionConfig) -> str:
    """The session's instructions, then the text history it starts with."""
    lines = [config.instructions or ""]
    for item in config.input or []:
        lines.append(f"{item.role}: {item.text}")
    return "\n".join(line for line in lines if line).strip()
