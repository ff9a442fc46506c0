"""OpenAI's Realtime API (GA) over the full-duplex unit loop: the session of
a client that asked for a ``*-duplex`` model.

The duplex runner's loop is unchanged (1 s units, drop-oldest, deferred
finalize); this runner reads GA events instead of duplex messages and its
presenter (``duplex_presenter.py``) writes the model's listen/speak
decisions as responses. A server VAD beside the loop (when turn detection
is on) marks the user's turns: ``speech_started`` / ``speech_stopped``, a
committed user item with its transcript (the side Whisper's, where the
worker has one), and barge-in: speech heard during a response cancels it
(``interrupt_response``) and the next unit is a forced listen, as
``response.cancel`` does. What the model cannot take in this mode (text
items, responses asked for, a buffer to commit) is an ``unsupported`` error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from omnilive.audio import INPUT_RATE, AudioDecodeError
from omnilive.audio_codecs import decode_input
from omnilive.protocol.common import ProtocolError, parse_json_object
from omnilive.protocol.duplex import Prepare, Update
from omnilive.protocol.openai_realtime import (
    AudioAppend,
    AudioClear,
    ItemTruncate,
    ResponseCancel,
    SessionConfig,
    SessionUpdate,
    parse_client_event,
    refusal_event,
    server_event,
    session_object,
)
from omnilive.vad import SileroModel, SpeechEnded, SpeechStarted, StreamingVad
from omnilive.worker.openai import machine as rules
from omnilive.worker.openai.duplex_presenter import OpenAIDuplexPresenter
from omnilive.worker.openai.items import Conversation
from omnilive.worker.openai.presenter import (
    committed,
    edit,
    item_id,
    set_transcript,
    speech_item,
    speech_started,
    transcription,
)
from omnilive.worker.runners.duplex import DuplexRunner
from omnilive.worker.unit_assembler import UnitAssembler

log = logging.getLogger(__name__)
_AUDIO_DELTA = "response.output_audio.delta"
_NOT_IN_DUPLEX = {
    "input_audio_buffer.commit": "the model hears continuously: there is no buffer to commit",
    "conversation.item.create": "the full-duplex model takes only audio",
    "response.create": "the full-duplex model decides itself when to speak",
    "output_audio_buffer.clear": "output_audio_buffer.clear is for WebRTC connections",
}


class OpenAIDuplexRunner(DuplexRunner):
    """One GA-dialect session on the duplex unit loop."""

    presenter: OpenAIDuplexPresenter  # the base's, in this dialect (see _init_state)
    assembler: UnitAssembler

    def _init_state(self) -> None:
        super()._init_state()
        self.mode = "audio_duplex"
        self.dialect = "openai"
        self.config = SessionConfig()
        self.model = "omnilive-realtime"
        self.session_id = self.record.session_id
        self.conversation = Conversation()
        self.presenter = OpenAIDuplexPresenter(
            lambda: self.config,
            lambda: session_object(self.session_id, self.config, self.model),
            self.conversation,
        )
        self.assembler = UnitAssembler(self.settings.limits.max_frames_per_chunk)
        self.machine.context_limit = self.settings.realtime.context_tokens
        self.vad: StreamingVad | None = None
        self.heard_ms = 0.0
        self._speech_item: str | None = None

    async def _error(self, exc: ProtocolError) -> None:
        await self.send(refusal_event(exc))

    # --- reading ------------------------------------------------------------------------

    async def _read(self) -> None:
        max_bytes = self.settings.limits.max_message_bytes
        async for raw in self.frames:
            data = parse_json_object(raw, max_bytes)  # the gateway checked it
            if data.get("type") == "internal.openai":  # the gateway's, not the client's to refuse
                await self._start(data)
                continue
            try:
                await self._event(parse_client_event(data))
            except ProtocolError as exc:
                await self._error(exc)
        self.machine.disconnected()

    async def _start(self, data: dict[str, Any]) -> None:
        self.session_id = data.get("session_id") or self.session_id
        self.model = data.get("model") or self.model
        self.config = SessionConfig.model_validate(data.get("session") or {})
        self.presenter.extensions = bool(data.get("extensions"))
        prepare = Prepare(
            type="prepare",
            system_prompt=rules.instructions(self.config),
            mode="audio_duplex",
            recording=True,
        )
        self.machine.prepare()
        ready = await self._prepare_session(prepare)
        if not ready:
            self.machine.prepare_failed()
            return
        self.machine.prepared(time.monotonic())
        await self._new_vad()
        if data.get("updated"):
            await self.send(self.presenter.updated([], []))

    async def _event(self, event: Any) -> None:
        if isinstance(event, AudioAppend):
            await self._append(event)
        elif isinstance(event, SessionUpdate):
            await self._session_update(event)
        elif isinstance(event, ResponseCancel):
            running = self.presenter.response
            if running is None or (event.response_id and event.response_id != running.id):
                message = "no active response to cancel"
                raise ProtocolError("response_cancel_not_active", message, None, event.event_id)
            await self._interrupt("client_cancelled")
        elif isinstance(event, AudioClear):
            await self.send(server_event("input_audio_buffer.cleared"))
        elif (answer := await self._edit(event)) is not None:
            await self.send(answer)
        else:
            raise ProtocolError("unsupported", _NOT_IN_DUPLEX[event.type], "type", event.event_id)

    async def _edit(self, event: Any) -> dict[str, Any] | None:
        """A retrieve, delete or truncate done, as its answer (None for other
        events); a truncate of the response the client is hearing ends that
        response first, as ``response.cancel`` does."""
        running = self.presenter.response
        if isinstance(event, ItemTruncate) and running and running.is_output(event.item_id):
            await self._interrupt("client_cancelled")
        return edit(event, self.conversation, self.presenter.spoken_ms)

    async def _session_update(self, event: SessionUpdate) -> None:
        before, self.config = self.config, event.session
        if self.config.audio.input.turn_detection != before.audio.input.turn_detection:
            await self._new_vad()
        if self.config.instructions != before.instructions:
            # The engine's own update answers session.updated (what it could change).
            update = Update(type="update", system_prompt=rules.instructions(self.config))
            await self._update(update)
        else:
            await self.send(self.presenter.updated([], []))

    async def _new_vad(self) -> None:
        config = rules.vad_config(self.config)
        self.vad = None
        if config is not None:
            self.vad = StreamingVad(await asyncio.to_thread(SileroModel), config)

    # --- input audio ------------------------------------------------------------------

    async def _append(self, event: AudioAppend) -> None:
        try:
            samples = decode_input(event.audio, self.config.audio.input.format.type)
        except AudioDecodeError as exc:
            raise ProtocolError("invalid_value", f"audio: {exc}", "audio", event.event_id) from None
        start_ms = self.heard_ms
        self.heard_ms += samples.size / INPUT_RATE * 1000
        for vad_event in self.vad.feed(samples) if self.vad is not None else []:
            if isinstance(vad_event, SpeechStarted):
                await self._speech_started(start_ms)
            elif isinstance(vad_event, SpeechEnded):
                await self._speech_ended(vad_event.segment)
        self._push(samples, [], False)

    async def _speech_started(self, at_ms: float) -> None:
        self._speech_item = item_id()
        await self.send(speech_started(at_ms, self._speech_item))
        detection = self.config.audio.input.turn_detection
        if self.presenter.response is not None and detection and detection.interrupt_response:
            await self._interrupt("turn_detected")

    async def _speech_ended(self, speech: np.ndarray) -> None:
        """The user's turn as an item (the model heard it already, unit by unit)."""
        new_id, self._speech_item = self._speech_item or item_id(), None
        await self.send(
            server_event(
                "input_audio_buffer.speech_stopped",
                audio_end_ms=round(self.heard_ms),
                item_id=new_id,
            )
        )
        item = speech_item(new_id)
        for event in committed(item, self.conversation.add(item)):
            await self.send(event)
        self.spawn(f"transcribe-{new_id}", self._transcribe(item, speech))

    async def _transcribe(self, item: dict[str, Any], speech: np.ndarray) -> None:
        """The item's transcript, off the reader: the side Whisper's, if any."""
        transcriber = self.runtime.transcriber
        text = await transcriber.transcribe(speech) if transcriber is not None else None
        set_transcript(item, text)
        await self.send(server_event("conversation.item.done", item=item))
        if self.config.audio.input.transcription is not None:
            for event in transcription(
                item["id"], text, "no transcriber: set transcription.whisper"
            ):
                await self.send(event)

    async def _interrupt(self, reason: str) -> None:
        """The open response ends ``cancelled`` now; its queued audio is
        dropped and the model listens from the next unit on."""
        self.outbox.drop(lambda m: m.get("type") == _AUDIO_DELTA)
        self.assembler.force_listen()
        for message in self.presenter.close("cancelled", reason):
            await self.send(message)
