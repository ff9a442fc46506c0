"""A Realtime conversation on the worker: the session behind OpenAI's
Realtime API (GA) dialect, on the engine's half-duplex view.

The session is the half-duplex one (the same engine steps, the same
server-side VAD, the same early work while the user speaks) plus what a
client of that API edits: a conversation of items, an input buffer it
commits itself when turn detection is off, responses it asks for, cancels
or makes with per-response options, and tools. The reader acts on every
event at once (a cancel never waits behind an answer); at most one response
runs; audio heard while it runs interrupts it when ``interrupt_response``.
Events leave in the dialect's shapes (``presenter_openai.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

import numpy as np

from omnilive.audio import INPUT_RATE, AudioDecodeError
from omnilive.audio_codecs import decode_input
from omnilive.engines.base import EngineError, GenerationOptions, HalfDuplexOptions, TextPart, Tools
from omnilive.protocol.common import parse_json_object
from omnilive.protocol.openai_realtime import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OpenAIError,
    OutputAudioClear,
    ResponseCancel,
    ResponseCreate,
    ResponseParams,
    SemanticVad,
    SessionConfig,
    SessionUpdate,
    error_event,
    parse_client_event,
    server_event,
    session_object,
)
from omnilive.vad import SileroModel, SpeechEnded, SpeechStarted, StreamingVad, VadConfig
from omnilive.worker.conversation_items import Conversation, client_item
from omnilive.worker.machines.session import Ended, Phase, SessionMachine
from omnilive.worker.presenter_openai import ResponsePresenter, item_id, usage
from omnilive.worker.runners.streaming import StreamingRunner, Work

log = logging.getLogger(__name__)

DEFAULT_INSTRUCTIONS = "You are a helpful assistant. Reply briefly and naturally."
MAX_BUFFER_S = 120  # a manually committed input buffer keeps at most this much
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 800, "high": 400, "auto": 800}
_AUDIO_DELTA = "response.output_audio.delta"


class ConversationMachine(SessionMachine):
    """The session's phases (prepared at once: the gateway configured it);
    no inactivity deadline: the gateway bounds the session's life."""

    def deadline(self) -> tuple[float, str]:
        if self.phase in (Phase.WAITING_PREPARE, Phase.PREPARING):
            return super().deadline()
        return math.inf, "timeout"


def vad_config(config: SessionConfig) -> VadConfig | None:
    detection = config.audio.input.turn_detection
    if detection is None:
        return None
    if isinstance(detection, SemanticVad):  # no end-of-turn model yet: silence by eagerness
        return VadConfig(
            threshold=0.5, min_silence_duration_ms=SEMANTIC_SILENCE_MS[detection.eagerness]
        )
    return VadConfig(
        threshold=min(max(detection.threshold, 0.2), 0.99),
        min_silence_duration_ms=max(detection.silence_duration_ms, 100),
        speech_pad_ms=min(detection.prefix_padding_ms, 1000),
    )


class ConversationRunner(StreamingRunner):
    """One GA-dialect session; :meth:`run` returns when it has ended."""

    machine: ConversationMachine

    def _init_state(self) -> None:
        self.machine = ConversationMachine(
            self.settings.limits.first_message_timeout_s, time.monotonic()
        )
        self.session = self.runtime.engine.open_half_duplex()
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
        self._response: asyncio.Task[None] | None = None
        self._presenter: ResponsePresenter | None = None
        self._hear: asyncio.Task[None] | None = None
        self._hear_wanted: tuple[np.ndarray, bool] | None = None
        self._spoken_ms: dict[str, float] = {}  # assistant item → its audio's length

    # --- the session's tasks --------------------------------------------------------

    def _main_tasks(self) -> dict[str, Work]:
        return {"reader": self._read}

    async def _wind_down(self) -> None:
        await self._cancel_response("client_cancelled", tell=False)
        await self._stop_hear()

    async def _goodbye(self, ended: Ended) -> None:
        """The GA dialect has no goodbye event: the socket closes."""

    async def _error(self, exc: OpenAIError) -> None:
        await self.send(error_event(exc.code, exc.message, exc.param, exc.event_id))

    # --- reading ------------------------------------------------------------------------

    async def _read(self) -> None:
        max_bytes = self.settings.limits.max_message_bytes
        async for raw in self.frames:
            data = parse_json_object(raw, max_bytes)  # the gateway checked it
            if data.get("type") == "internal.openai":
                await self._start(data)
                continue
            try:
                await self._handle(parse_client_event(data))
            except OpenAIError as exc:
                await self._error(exc)
            except EngineError as exc:  # a capability the engine lacks, a failed step
                await self._error(OpenAIError("unsupported", str(exc), None, data.get("event_id")))
        self.machine.disconnected()

    async def _start(self, data: dict[str, Any]) -> None:
        self.session_id = data.get("session_id") or self.session_id
        self.model = data.get("model") or self.model
        self.config = SessionConfig.model_validate(data.get("session") or {})
        self.machine.prepare()
        await self.runtime.step(
            self.record, self.session.prepare, [TextPart(self._instructions())], self._options()
        )
        await self._apply_tools(self.config.tools, self.config.tool_choice)
        self.machine.prepared(time.monotonic())
        await self._new_vad()

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
        elif isinstance(event, ItemRetrieve):
            item = self.conversation.get(event.item_id, event.event_id)
            await self.send(server_event("conversation.item.retrieved", item=item))
        elif isinstance(event, ItemDelete):
            self.conversation.delete(event.item_id, event.event_id)
            await self.send(server_event("conversation.item.deleted", item_id=event.item_id))
        elif isinstance(event, ItemTruncate):
            await self._truncate(event)
        elif isinstance(event, ResponseCreate):
            await self._create_response(event.response, event.event_id)
        elif isinstance(event, ResponseCancel):
            await self._cancel(event)
        elif isinstance(event, OutputAudioClear):
            message = "output_audio_buffer.clear is for WebRTC connections; this one is a WebSocket"
            raise OpenAIError("unsupported", message, "type", event.event_id)

    # --- the session's configuration ----------------------------------------------------

    def _instructions(self) -> str:
        return self.config.instructions or DEFAULT_INSTRUCTIONS

    def _options(self, params: ResponseParams | None = None) -> HalfDuplexOptions:
        modalities = (params and params.output_modalities) or self.config.output_modalities
        limit = (params and params.max_output_tokens) or self.config.max_output_tokens
        tokens = 4096 if limit == "inf" else int(limit)
        return HalfDuplexOptions(
            generation=GenerationOptions(max_new_tokens=tokens, length_penalty=1.1),
            tts_enabled="audio" in modalities,
        )

    async def _apply_tools(self, tools: Any, choice: Any) -> None:
        functions = tuple(t.model_dump(exclude_none=True) for t in tools)
        name = choice if isinstance(choice, str) else f"function:{choice.name}"
        await self.runtime.step(self.record, self.session.set_tools, Tools(functions, name))

    async def _update(self, event: SessionUpdate) -> None:
        before = self.config
        self.config = event.session  # the gateway sends the whole session
        if self.config.instructions != before.instructions:
            self.conversation.dirty = True
        if self.config.output_modalities != before.output_modalities or (
            self.config.max_output_tokens != before.max_output_tokens
        ):
            await self.runtime.step(self.record, self.session.set_options, self._options())
        if self.config.tools != before.tools or self.config.tool_choice != before.tool_choice:
            await self._apply_tools(self.config.tools, self.config.tool_choice)
        if self.config.audio.input.turn_detection != before.audio.input.turn_detection:
            await self._new_vad()
        session = session_object(self.session_id, self.config, self.model)
        await self.send(server_event("session.updated", session=session))

    async def _new_vad(self) -> None:
        config = vad_config(self.config)
        self.vad = (
            None if config is None else StreamingVad(await asyncio.to_thread(SileroModel), config)
        )

    # --- input audio -----------------------------------------------------------------------

    async def _append(self, event: AudioAppend) -> None:
        try:
            samples = decode_input(event.audio, self.config.audio.input.format.type)
        except AudioDecodeError as exc:
            raise OpenAIError("invalid_value", f"audio: {exc}", "audio", event.event_id) from None
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
            elif isinstance(vad_event, SpeechEnded):
                item = self._speech_item or item_id()
                self._speech_item = None
                await self.send(
                    server_event(
                        "input_audio_buffer.speech_stopped",
                        audio_end_ms=round(self.heard_ms),
                        item_id=item,
                    )
                )
                await self._commit_speech(vad_event.segment, item)
                return
        if self.vad.speaking and self._response is None:
            self._want_hear(self.vad.speech_so_far, self.vad.paused)

    async def _speech_started(self, at_ms: float) -> None:
        detection = self.config.audio.input.turn_detection
        self._speech_item = item_id()
        await self.send(
            server_event(
                "input_audio_buffer.speech_started",
                audio_start_ms=round(at_ms),
                item_id=self._speech_item,
            )
        )
        if detection is not None and detection.interrupt_response:
            await self._cancel_response("turn_detected")

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
            raise OpenAIError("input_audio_buffer_commit_empty", message, None, client_event_id)
        speech = np.concatenate(self.buffer)
        self.buffer, self.buffer_ms = [], 0.0
        await self._commit_speech(speech, item_id())

    async def _commit_speech(self, speech: np.ndarray, new_id: str) -> None:
        """The user's turn: an item, the engine hears it, its transcript, and
        (as turn detection says) a response."""
        await self._cancel_response("turn_detected")
        await self._stop_hear()
        item = {
            "id": new_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        previous = self.conversation.add(item)
        await self.send(
            server_event("input_audio_buffer.committed", previous_item_id=previous, item_id=new_id)
        )
        await self.send(
            server_event("conversation.item.added", previous_item_id=previous, item=item)
        )
        if self.conversation.dirty:
            await self._sync_history()
        await self.runtime.step(self.record, self.session.prefill, speech)
        self._prefilled = True
        transcript = self.session.transcript
        item["content"][0]["transcript"] = transcript
        await self.send(server_event("conversation.item.done", item=item))
        await self._send_transcript(new_id, transcript)
        detection = self.config.audio.input.turn_detection
        if detection is None or detection.create_response:
            await self._create_response(ResponseParams(), None)

    async def _send_transcript(self, item: str, transcript: str | None) -> None:
        if self.config.audio.input.transcription is None:
            return
        ids = {"item_id": item, "content_index": 0}
        if transcript is None:
            error = {
                "type": "transcription_error",
                "code": "unsupported",
                "message": "this engine does not transcribe speech",
                "param": None,
            }
            await self.send(
                server_event(
                    "conversation.item.input_audio_transcription.failed", **ids, error=error
                )
            )
            return
        await self.send(
            server_event(
                "conversation.item.input_audio_transcription.delta", **ids, delta=transcript
            )
        )
        seconds = {"type": "duration", "seconds": 0}
        await self.send(
            server_event(
                "conversation.item.input_audio_transcription.completed",
                **ids,
                transcript=transcript,
                usage=seconds,
            )
        )

    # --- early work while the user speaks (as half-duplex) ---------------------------

    def _want_hear(self, speech: np.ndarray, paused: bool) -> None:
        self._hear_wanted = (speech, paused)
        if self._hear is None or self._hear.done():
            self._hear = self.spawn("hear", self._hear_loop())

    async def _hear_loop(self) -> None:
        while self._hear_wanted is not None:
            (speech, paused), self._hear_wanted = self._hear_wanted, None
            try:
                await self.runtime.step(self.record, self.session.hear, speech, paused)
            except EngineError as exc:
                log.warning("early hearing of %s failed: %s", self.record.session_id, exc)

    async def _stop_hear(self) -> None:
        self._hear_wanted = None
        if self._hear is not None:
            hear, self._hear = self._hear, None
            await asyncio.wait([hear])

    # --- items --------------------------------------------------------------------------------

    async def _create_item(self, event: ItemCreate) -> None:
        item = client_item(event.item.model_dump(mode="json"), item_id())
        if item["type"] == "message" and any(p["type"] == "input_audio" for p in item["content"]):
            message = "audio items are not taken yet: append audio to the input buffer instead"
            raise OpenAIError("unsupported", message, "item.content", event.event_id)
        previous = self.conversation.add(item, event.previous_item_id, event.event_id)
        self.conversation.dirty = True
        await self.send(
            server_event("conversation.item.added", previous_item_id=previous, item=item)
        )
        await self.send(
            server_event("conversation.item.done", previous_item_id=previous, item=item)
        )

    async def _truncate(self, event: ItemTruncate) -> None:
        spoken = self._spoken_ms.get(event.item_id, 0.0)
        self.conversation.truncate(
            event.item_id, event.content_index, event.audio_end_ms, spoken, event.event_id
        )
        await self.send(
            server_event(
                "conversation.item.truncated",
                item_id=event.item_id,
                content_index=event.content_index,
                audio_end_ms=event.audio_end_ms,
            )
        )

    async def _sync_history(self) -> None:
        """The engine's context becomes the conversation as it stands."""
        messages = self.conversation.messages(self._instructions())
        await self.runtime.step(self.record, self.session.set_history, messages)
        self.conversation.dirty = False
        self._prefilled = False

    # --- responses ------------------------------------------------------------------------------

    async def _create_response(self, params: ResponseParams, client_event_id: str | None) -> None:
        if self._response is not None and not self._response.done():
            message = "the conversation already has an active response"
            raise OpenAIError(
                "conversation_already_has_active_response", message, None, client_event_id
            )
        if params.conversation == "none" or params.input is not None:
            message = "out-of-band responses (conversation: none, input) are not served yet"
            raise OpenAIError("unsupported", message, "response.conversation", client_event_id)
        modalities = params.output_modalities or self.config.output_modalities
        presenter = ResponsePresenter(
            "audio" in modalities,
            self.config.audio.output.format.type,
            self.conversation.last_id,
            metadata=params.metadata,
        )
        self._presenter = presenter
        self._response = self.spawn(f"response-{presenter.id}", self._respond(params, presenter))

    async def _respond(self, params: ResponseParams, presenter: ResponsePresenter) -> None:
        record, session = self.record, self.session
        out_tokens, status, reason = 0, "completed", None
        await self.send(presenter.created()[0])
        try:
            if params.tools is not None or params.tool_choice is not None:
                await self._apply_tools(
                    params.tools if params.tools is not None else self.config.tools,
                    params.tool_choice or self.config.tool_choice,
                )
            if params.output_modalities or params.max_output_tokens:
                await self.runtime.step(record, session.set_options, self._options(params))
            if self.conversation.dirty:
                await self._sync_history()
            await self.runtime.step(record, session.snapshot)
            if not self._prefilled or params.instructions:
                await self.runtime.step(record, session.respond, params.instructions)
            self._prefilled = False
            async for chunk in self.runtime.stream(record, session.generate):
                out_tokens += chunk.n_tokens
                if chunk.tool_call is not None:
                    events = presenter.tool_call(chunk.tool_call)
                else:
                    events = presenter.chunk(chunk.text, chunk.audio)
                for event in events:
                    await self.send(event)
        except asyncio.CancelledError:
            status, reason = "cancelled", getattr(self, "_cancel_reason", "client_cancelled")
            raise
        except EngineError as exc:
            status = "failed"
            log.warning("response %s of %s failed: %s", presenter.id, self.session_id, exc)
            await self.runtime.step(record, session.rollback)
            await self.send(
                error_event("inference_error", f"the response failed: {exc}", kind="server_error")
            )
        finally:
            await self._finish(params, presenter, status, reason, out_tokens)

    async def _finish(
        self,
        params: ResponseParams,
        presenter: ResponsePresenter,
        status: str,
        reason: str | None,
        out_tokens: int,
    ) -> None:
        spoken = presenter.spoken_ms
        for event in presenter.done(status, usage(0, out_tokens, presenter.audio), reason):
            await self.send(event)
        for item in presenter.output:
            self.conversation.add(item)
            if item["type"] == "function_call":
                self.conversation.dirty = True  # the engine's context has no calls
            elif presenter.audio:
                self._spoken_ms[item["id"]] = spoken
        if params.tools is not None or params.tool_choice is not None:
            await self._apply_tools(self.config.tools, self.config.tool_choice)
        if params.output_modalities or params.max_output_tokens:
            await self.runtime.step(self.record, self.session.set_options, self._options())
        self.conversation.dirty = self.conversation.dirty or bool(params.instructions)

    async def _cancel(self, event: ResponseCancel) -> None:
        running = (
            self._presenter if self._response is not None and not self._response.done() else None
        )
        if running is None or (event.response_id and event.response_id != running.id):
            raise OpenAIError(
                "response_cancel_not_active", "no active response to cancel", None, event.event_id
            )
        await self._cancel_response("client_cancelled")

    async def _cancel_response(self, reason: str, tell: bool = True) -> None:
        """Stop the answer: queued audio is dropped, the step in flight
        finishes, what was said stays in the conversation."""
        task, self._response = self._response, None
        if task is None or task.done():
            return
        self._cancel_reason = reason
        self.outbox.drop(lambda m: m.get("type") == _AUDIO_DELTA)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([task])
