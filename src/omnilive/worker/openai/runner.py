"""A Realtime conversation on the worker: the session behind OpenAI's
Realtime API (GA) dialect, on the engine's half-duplex view.

The session is the half-duplex one (the same engine steps, the same
server-side VAD, the same early work while the user speaks) plus what a
client of that API edits: a conversation of items, an input buffer it
commits itself when turn detection is off, responses it asks for, cancels
or makes with per-response options, and tools. The reader acts on every
event at once (a cancel never waits behind an answer); at most one response
runs; audio heard while it runs interrupts it when ``interrupt_response``.
Events leave in the dialect's shapes (``presenter.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from omnilive.audio import INPUT_RATE, AudioDecodeError
from omnilive.audio_codecs import decode_input
from omnilive.engines.base import CapabilityError, EngineError
from omnilive.engines.messages import Part, TextPart
from omnilive.protocol.common import ProtocolError, parse_json_object
from omnilive.protocol.openai_realtime import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    ItemCreate,
    ItemTruncate,
    OutputAudioClear,
    ResponseCancel,
    ResponseCreate,
    ResponseParams,
    SemanticVad,
    SessionConfig,
    SessionUpdate,
    error_event,
    parse_client_event,
    refusal_event,
    server_event,
    session_object,
)
from omnilive.vad import SileroModel, SpeechEnded, SpeechStarted, StreamingVad, TurnCheck
from omnilive.worker.machines.session import Ended
from omnilive.worker.openai import machine as rules
from omnilive.worker.openai.context import ContextMirror
from omnilive.worker.openai.items import Conversation, client_item
from omnilive.worker.openai.machine import ConversationMachine
from omnilive.worker.openai.presenter import (
    committed,
    edit,
    item_id,
    set_transcript,
    speech_item,
    speech_started,
    transcript_of,
    transcription,
)
from omnilive.worker.openai.responses import Responses
from omnilive.worker.runners.hearing import EarlyHearing, judged_end, with_turn_checks
from omnilive.worker.runners.streaming import StreamingRunner, Work

log = logging.getLogger(__name__)

MAX_BUFFER_S = 120  # a manually committed input buffer keeps at most this much
MAX_PENDING_OPS = 256  # engine work the reader queued; beyond it the reader waits
Op = Callable[[], Awaitable[None]]


class OpenAIRealtimeRunner(Responses, StreamingRunner):
    """One GA-dialect session; :meth:`run` returns when it has ended."""

    machine: ConversationMachine

    def _init_state(self) -> None:
        self.machine = ConversationMachine(
            self.settings.limits.first_message_timeout_s, time.monotonic()
        )
        self.session = self.runtime.open_half_duplex(self.record)
        self.hearing = EarlyHearing(self.runtime, self.record, self.session, self.spawn)
        self.record.closer = self.session.close
        self.config = SessionConfig()
        self.session_id = self.record.session_id
        self.model = "omnilive-realtime"
        self.conversation = Conversation()
        self.vad: StreamingVad | None = None
        self.buffer: list[np.ndarray] = []
        self.buffer_ms = 0.0
        self.heard_ms = 0.0  # input audio so far (the VAD's and the buffer's clock)
        self._speech_item: str | None = None  # the item the VAD's current speech will be
        self._prefilled = False  # the last speech is in the engine, unanswered
        self._input_tokens = 0  # what the engine heard since the last response (usage)
        self._spoken_ms: dict[str, float] = {}  # assistant item → its audio's length
        self._history_refused = False  # the engine keeps its own context (told once)
        self._settle_queued = False  # a _settle_history waits in the engine's queue
        self.extensions = False  # omnilive's own events too (the client asked)
        self.context = ContextMirror()
        # What client events ask of the engine, in their order, off the reader:
        # a step may wait behind an answer (one lane), the reader never does.
        self._ops: asyncio.Queue[tuple[Op, str | None]] = asyncio.Queue(MAX_PENDING_OPS)
        self._init_responses()

    # --- the session's tasks --------------------------------------------------------

    def _main_tasks(self) -> dict[str, Work]:
        return {"reader": self._read, "engine": self._run_ops, "watchdog": self._watchdog}

    async def _wind_down(self) -> None:
        await self._cancel_response("client_cancelled")
        await self.hearing.stop()

    async def _goodbye(self, ended: Ended) -> None:
        """The GA dialect has no goodbye event: the socket closes, after an
        ``error`` that says why when the server ended it."""
        if ended.reason == "idle":
            wait = self.settings.limits.first_message_timeout_s
            message = f"the client sent no event within {wait:g} s"
            await self.send(error_event("session_expired", message))

    async def _error(self, exc: ProtocolError) -> None:
        await self.send(refusal_event(exc))

    # --- reading ------------------------------------------------------------------------

    async def _read(self) -> None:
        max_bytes = self.settings.limits.max_message_bytes
        async for raw in self.frames:
            data = parse_json_object(raw, max_bytes)  # the gateway checked it
            if data.get("type") == "internal.openai":
                await self._start(data)
                continue
            self.machine.client_event()
            try:
                event = parse_client_event(data)
                await self._handle(event)
                if not isinstance(event, AudioAppend):
                    await self._settle_later(event.event_id)
            except ProtocolError as exc:
                await self._error(exc)
        self.machine.disconnected()

    async def _later(self, op: Op, client_event_id: str | None = None) -> None:
        """Queue engine work for the engine task (in the order it was asked for)."""
        await self._ops.put((op, client_event_id))

    async def _run_ops(self) -> None:
        """The engine task: each queued piece of work in turn; a refusal or a
        failed step is the client's error, and the session goes on."""
        while True:
            op, client_event_id = await self._ops.get()
            try:
                await op()
            except ProtocolError as exc:
                await self._error(exc)
            except EngineError as exc:  # a capability the engine lacks, a failed step
                code = rules.engine_error_code(exc)
                await self._error(ProtocolError(code, str(exc), None, client_event_id))

    async def _start(self, data: dict[str, Any]) -> None:
        """The session as the gateway has it so far: prepared with its
        instructions and options; what the engine cannot take is refused as
        in any update, and the rest stands."""
        self.session_id = data.get("session_id") or self.session_id
        self.model = data.get("model") or self.model
        self.extensions = bool(data.get("extensions"))
        if data.get("updated"):  # the client's session.update, sent while it queued
            self.machine.client_event()
        wanted = SessionConfig.model_validate(data.get("session") or {})
        self.machine.prepare()
        system: list[Part] = [TextPart(rules.instructions(wanted))]
        await self.runtime.step(self.session.prepare, system, rules.options(wanted))
        self.machine.prepared(time.monotonic())
        update = SessionUpdate(type="session.update", session=wanted, event_id=data.get("event_id"))
        await self._update(update, tell=bool(data.get("updated")), prepared=True)

    async def _handle(self, event: Any) -> None:
        if isinstance(event, AudioAppend):
            await self._append(event)
        elif isinstance(event, SessionUpdate):
            await self._update(event)
        elif isinstance(event, AudioCommit):
            await self._commit(event.event_id)
        elif isinstance(event, AudioClear):
            self.buffer, self.buffer_ms = [], 0.0
            await self.send(server_event("input_audio_buffer.cleared"))
        elif isinstance(event, ItemCreate):
            await self._create_item(event)
        elif (answer := await self._edit(event)) is not None:
            await self.send(answer)
        elif isinstance(event, ResponseCreate):
            params, event_id = event.response, event.event_id
            await self._later(lambda: self._create_response(params, event_id), event_id)
        elif isinstance(event, ResponseCancel):
            await self._cancel(event)
        elif isinstance(event, OutputAudioClear):
            message = "output_audio_buffer.clear is for WebRTC connections; this one is a WebSocket"
            raise ProtocolError("unsupported", message, "type", event.event_id)

    async def _edit(self, event: Any) -> dict[str, Any] | None:
        """A retrieve, delete or truncate done, as its answer (None for other
        events). A truncate of the answer the client is hearing stops that
        answer first, as ``response.cancel`` would (the Agents SDKs'
        ``interrupt()`` may send only the truncate)."""
        if isinstance(event, ItemTruncate) and self._answering_into(event.item_id):
            await self._cancel_response("client_cancelled")
        return edit(event, self.conversation, self._spoken_ms)

    # --- the session's configuration ----------------------------------------------------

    async def _apply_tools(self, params: ResponseParams | None = None) -> None:
        """Offer the session's functions (or one response's) to the model."""
        offered = rules.tools(self.config, params)
        await self.runtime.step(self.session.set_tools, offered)

    async def _update(
        self, event: SessionUpdate, tell: bool = True, prepared: bool = False
    ) -> None:
        """Apply the session as the gateway has it now: what the reader
        needs (formats, turn detection) at once, what the engine needs in
        turn. ``prepared``: instructions and options went into the engine's
        ``prepare`` already."""
        before = self.config if not prepared else event.session
        self.config = event.session  # the gateway sends the whole session
        if self.config.instructions != before.instructions:
            self.conversation.dirty = True
        if prepared or self.config.audio.input.turn_detection != before.audio.input.turn_detection:
            await self._new_vad()
        await self._later(
            lambda: self._update_engine(event, before, tell, prepared), event.event_id
        )

    async def _update_engine(
        self, event: SessionUpdate, before: SessionConfig, tell: bool, prepared: bool
    ) -> None:
        """An update's engine part; what the engine refuses (tools, options)
        is an error and keeps its former value, the rest stands."""
        option_fields = ("output_modalities", "max_output_tokens", "temperature", "truncation")
        kept = {name: getattr(before, name) for name in option_fields}
        if any(getattr(self.config, name) != kept[name] for name in option_fields):
            options = rules.options(self.config)
            await self._applied(self.session.set_options, options, kept, event.event_id)
        tools = self.config.tools, self.config.tool_choice
        if prepared or tools != (before.tools, before.tool_choice):
            kept = {
                "tools": [] if prepared else before.tools,
                "tool_choice": "auto" if prepared else before.tool_choice,
            }
            offered = rules.tools(self.config)
            await self._applied(self.session.set_tools, offered, kept, event.event_id)
        if tell:
            session = session_object(self.session_id, self.config, self.model)
            await self.send(server_event("session.updated", session=session))

    async def _applied(
        self, step: Any, argument: Any, kept: dict[str, Any], client_event_id: str | None
    ) -> None:
        """One engine step of an update; refused, the fields it served keep
        their former values (``kept``) and the client is told."""
        try:
            await self.runtime.step(step, argument)
        except EngineError as exc:
            self.config = self.config.model_copy(update=kept)
            param = "session." + next(iter(kept))
            await self._error(ProtocolError("unsupported", str(exc), param, client_event_id))

    async def _new_vad(self) -> None:
        """The server VAD turn detection asks for; ``semantic_vad`` also has
        the worker's end-of-turn model judge each short silence, where it has
        one (else silence alone decides, by eagerness)."""
        config = rules.vad_config(self.config)
        if config is None:
            self.vad = None
            return
        if isinstance(self.config.audio.input.turn_detection, SemanticVad):
            config = await with_turn_checks(
                self.runtime, config, judges_words=self.session.judges_words
            )
        self.vad = StreamingVad(await asyncio.to_thread(SileroModel), config)

    # --- input audio -----------------------------------------------------------------------

    async def _append(self, event: AudioAppend) -> None:
        try:
            samples = decode_input(event.audio, self.config.audio.input.format.type)
        except AudioDecodeError as exc:
            raise ProtocolError("invalid_value", f"audio: {exc}", "audio", event.event_id) from None
        start_ms = self.heard_ms
        self.heard_ms += samples.size / INPUT_RATE * 1000
        if self.vad is None:
            self.buffer.append(samples)
            self.buffer_ms += samples.size / INPUT_RATE * 1000
            while self.buffer_ms > MAX_BUFFER_S * 1000 and len(self.buffer) > 1:
                self.buffer_ms -= self.buffer.pop(0).size / INPUT_RATE * 1000
            return
        for vad_event in self.vad.feed(samples):
            if isinstance(vad_event, SpeechStarted):
                await self._speech_started(start_ms)
            elif isinstance(vad_event, TurnCheck):
                self.spawn("end-of-turn", self._judge_turn(vad_event))
            elif isinstance(vad_event, SpeechEnded):
                await self._speech_ended(vad_event.segment)
                return
        if self.vad.speaking and not self._answering:
            self.hearing.want(self.vad.speech_so_far, self.vad.paused)

    async def _judge_turn(self, check: TurnCheck) -> None:
        """``semantic_vad``: a turn the model finds finished ends now."""
        ended = await judged_end(self.runtime, self.record, self.session, self.vad, check)
        if isinstance(ended, SpeechEnded):
            await self._speech_ended(ended.segment)

    async def _speech_ended(self, speech: np.ndarray) -> None:
        new_id, self._speech_item = self._speech_item or item_id(), None
        stopped = server_event(
            "input_audio_buffer.speech_stopped", audio_end_ms=round(self.heard_ms), item_id=new_id
        )
        await self.send(stopped)
        await self._commit_speech(speech, new_id)

    async def _speech_started(self, at_ms: float) -> None:
        detection = self.config.audio.input.turn_detection
        self._speech_item = item_id()
        await self.send(speech_started(at_ms, self._speech_item))
        if detection is not None and detection.interrupt_response:
            await self._cancel_response("turn_detected")
        await self._settle_later()

    async def _commit(self, client_event_id: str | None) -> None:
        """Commit the buffer; with turn detection on, end the speech it hears now."""
        if self.vad is not None and self.vad.speaking:
            speech, item = self.vad.speech_so_far, self._speech_item or item_id()
            self.vad.reset()
            self._speech_item = None
            await self._commit_speech(speech, item)
            return
        if self.buffer_ms < 100:
            message = (
                f"the buffer holds {self.buffer_ms:.0f} ms of audio; at least 100 ms is needed"
            )
            raise ProtocolError("input_audio_buffer_commit_empty", message, None, client_event_id)
        speech = np.concatenate(self.buffer)
        self.buffer, self.buffer_ms = [], 0.0
        await self._commit_speech(speech, item_id())

    async def _commit_speech(self, speech: np.ndarray, new_id: str) -> None:
        """The user's turn: an item now; then, in turn, the engine hears it,
        its transcript, and (as turn detection says) a response."""
        await self._cancel_response("turn_detected")
        await self.hearing.stop()
        item = speech_item(new_id)
        for event in committed(item, self.conversation.add(item)):
            await self.send(event)
        detection = self.config.audio.input.turn_detection
        # Turn detection off: the client commits and then asks for the answer itself.
        answer = detection is not None and detection.create_response
        await self._later(lambda: self._heard(item, speech, answer))

    async def _heard(self, item: dict[str, Any], speech: np.ndarray, answer: bool) -> None:
        await self._hear_item(item, speech)
        await self.send(server_event("conversation.item.done", item=item))
        await self._send_transcript(item["id"], transcript_of(item))
        if answer:
            await self._create_response(ResponseParams(), None)

    async def _send_transcript(self, item: str, transcript: str | None) -> None:
        if self.config.audio.input.transcription is not None:
            for event in transcription(item, transcript, "this engine does not transcribe"):
                await self.send(event)

    # --- items --------------------------------------------------------------------------------

    async def _hear_item(self, item: dict[str, Any], speech: np.ndarray) -> None:
        """The engine hears a user's speech item; its transcript goes into
        the item. Speech not yet transcribed is no part of a replaced
        history, so the history is brought up to date first."""
        if self.conversation.dirty:
            await self._sync_history()
        self._input_tokens += await self.runtime.step(self.session.prefill, speech)
        self._prefilled = True
        self.context.turn((item["id"],))
        await self._tell_context()
        set_transcript(item, await self._transcript(speech))

    async def _transcript(self, speech: np.ndarray) -> str | None:
        """What the engine heard, or the side Whisper's transcript when the
        engine does not transcribe (and the worker has one)."""
        heard = self.session.transcript
        if heard is None and self.runtime.transcriber is not None:
            heard = await self.runtime.transcriber.transcribe(speech)
        return heard

    async def _create_item(self, event: ItemCreate) -> None:
        raw = event.item.model_dump(mode="json")
        item = client_item(raw, item_id())
        speech = self._item_speech(raw, event.event_id)
        previous = self.conversation.add(item, event.previous_item_id, event.event_id)
        await self.send(
            server_event("conversation.item.added", previous_item_id=previous, item=item)
        )
        if speech is None:
            self.conversation.dirty = True
            done = server_event("conversation.item.done", previous_item_id=previous, item=item)
            await self.send(done)
            return
        await self._cancel_response("client_cancelled")

        async def hear() -> None:
            await self._heard(item, speech, answer=False)
            if self.conversation.last_id != item["id"]:
                self.conversation.dirty = True  # heard last, but it belongs earlier

        await self._later(hear, event.event_id)

    def _item_speech(self, raw: dict[str, Any], client_event_id: str | None) -> np.ndarray | None:
        """A user message's audio (in the session's input format), or None."""
        parts = [p for p in raw.get("content") or [] if p["type"] == "input_audio"]
        if not parts:
            return None
        if raw["role"] != "user" or len(raw["content"]) != 1 or not parts[0].get("audio"):
            message = "an audio item is a user message with one input_audio part holding audio"
            raise ProtocolError("invalid_value", message, "item.content", client_event_id)
        try:
            return decode_input(parts[0]["audio"], self.config.audio.input.format.type)
        except AudioDecodeError as exc:
            message = f"audio: {exc}"
            raise ProtocolError("invalid_value", message, "item.content", client_event_id) from None

    async def _settle_later(self, client_event_id: str | None = None) -> None:
        """Queue one settling of the history; one already queued sees every
        edit made before it runs (a burst of items is one rewrite of the
        engine's context, not one per item)."""
        if not self._settle_queued:
            self._settle_queued = True
            await self._later(self._settle_history, client_event_id)

    async def _settle_history(self) -> None:
        """Bring the engine up to date now, unless an answer is running (its
        end does, or the next answer): speech that follows an edit then gets
        the engine's early work, which a later replacement would discard.
        Settling early is only that: work queued behind it (a burst of
        edits) settles the history itself, or lets the answer do it."""
        self._settle_queued = False
        if self.conversation.dirty and not self._answering and self._ops.empty():
            await self._sync_history()

    async def _sync_history(self) -> None:
        """The engine's context becomes the conversation as it stands. An
        engine that keeps its own context (MiniCPM-o's KV cache) cannot: the
        client hears so once, and the items change without it."""
        messages = self.conversation.messages(rules.instructions(self.config))
        self.conversation.dirty = False
        try:
            await self.runtime.step(self.session.set_history, messages)
        except CapabilityError as exc:
            if not self._history_refused:
                self._history_refused = True
                message = f"{exc}: edits reach the conversation's items, not the model's context"
                await self._error(ProtocolError("unsupported", message, None, None))
            return
        self._prefilled = False
        self.context.replaced(messages)
        await self._tell_context()

    async def _tell_context(self) -> None:
        """With omnilive's extensions, tell the client when the items the
        model sees change: its truncation let the oldest go (or an edit
        brought them back)."""
        if not self.extensions:
            return
        told = self.context.changed(self.session.history_dropped, self.conversation.items)
        if told is not None:
            await self.send(server_event("omnilive.conversation.context", **told))
