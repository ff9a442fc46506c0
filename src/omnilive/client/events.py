"""Typed events: every message a server sends, as a frozen dataclass.

One class per message type of the chat, half-duplex, duplex and Realtime
protocols (both dialects); :func:`parse_event` turns a decoded JSON object
into one. Field names are the wire's (``text_delta`` and ``audio_data`` read
as ``text`` and ``audio``), audio arrives decoded as float32 arrays, and
fields this client does not know are kept in ``extra`` rather than dropped.
The queue events are the same classes in every mode (the Realtime API's
``session.queued`` is a :class:`Queued`), and so is :class:`ServerError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, dataclass_transform

import numpy as np

from omnilive.client.audio import decode_pcm
from omnilive.client.errors import OmniliveError, ProtocolViolationError, error_for

_AUDIO_FIELDS = ("audio",)
_EVENTS: dict[str, Callable[[dict[str, Any]], Event]] = {}
E = TypeVar("E", bound="Event")


@dataclass(frozen=True, kw_only=True)
class Event:
    """Something the server said. ``extra`` holds fields this client does not know."""

    WIRE_NAMES: ClassVar[Mapping[str, str]] = {}  # wire field → attribute, where they differ
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls: type[E], data: Mapping[str, Any]) -> E:
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            name = cls.WIRE_NAMES.get(key, key)
            if key == "type":
                continue
            if name in names and name != "extra":
                values[name] = value
            else:
                extra[key] = value
        for name in _AUDIO_FIELDS:
            if isinstance(values.get(name), str):
                values[name] = decode_pcm(values[name])
        return cls(**values, extra=extra)


def _wire(*types: str) -> Callable[[type[E]], type[E]]:
    def register(cls: type[E]) -> type[E]:
        for kind in types:
            _EVENTS[kind] = cls.from_wire
        return cls

    return register


@dataclass_transform(frozen_default=True, kw_only_default=True)
def _events(cls: type[E]) -> type[E]:
    return dataclass(frozen=True, kw_only=True)(cls)


# Events that carry audio arrays compare by identity (arrays have no truth value).
@dataclass_transform(frozen_default=True, kw_only_default=True, eq_default=False)
def _media(cls: type[E]) -> type[E]:
    return dataclass(frozen=True, kw_only=True, eq=False)(cls)


# --- every mode ------------------------------------------------------------------------


@_wire("queued", "session.queued")
@_events
class Queued(Event):
    """The request waits for a worker: its place in the queue and a wait estimate."""

    position: int
    estimated_wait_s: float | None = None
    ticket_id: str | None = None
    queue_length: int | None = None


@_wire("queue_update", "session.queue_update")
@_events
class QueueUpdate(Event):
    """The queue moved (it may carry only the fields that changed)."""

    position: int | None = None
    estimated_wait_s: float | None = None
    queue_length: int | None = None


@_wire("queue_done", "session.queue_done")
@_events
class QueueDone(Event):
    """A worker is assigned: the session starts."""


@_events
class ServerError(Event):
    """An ``error`` message. In a session that goes on (a bad message, a failed
    turn) it is only an event; one that ends the session is also raised, as
    :meth:`exception`, when the socket closes."""

    code: str
    message: str
    kind: str | None = None  # the Realtime API's client_error / server_error

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ServerError:
        error = data.get("error")
        if isinstance(error, Mapping):  # the Realtime API: {error: {code, message, type}}
            code, message, kind = error.get("code"), error.get("message"), error.get("type")
        else:
            code, message, kind = data.get("code"), error, None
        known = {"type", "error", "code"}
        return cls(
            code=str(code or "unknown"),
            message=str(message or ""),
            kind=kind,
            extra={k: v for k, v in data.items() if k not in known},
        )

    def exception(self) -> OmniliveError:
        return error_for(self.code, self.message)


_EVENTS["error"] = ServerError.from_wire


@_wire("stopped")
@_events
class Stopped(Event):
    """The session ended because the client asked (``stop``)."""


@_wire("timeout")
@_events
class SessionTimeout(Event):
    """The session ended on a timer: inactivity, a pause held too long, or no
    ``prepare`` in time. ``reason`` (duplex) is ``idle`` or ``pause``."""

    elapsed_s: float | None = None
    reason: str | None = None


@_wire("prepared")
@_events
class Prepared(Event):
    """A half-duplex or duplex session is ready for audio."""

    session_id: str | None = None
    recording_session_id: str | None = None
    warnings: list[str] = field(default_factory=list)
    timeout_s: float | None = None  # half-duplex: the inactivity timeout
    prompt_length: int | None = None  # duplex
    mode: str | None = None  # duplex: audio_duplex or omni_duplex
    vision: bool | None = None  # duplex: whether the engine sees frames
    capabilities: Mapping[str, Any] = field(default_factory=dict)


# --- chat and half-duplex -------------------------------------------------------------


@_wire("prefill_done")
@_events
class PrefillDone(Event):
    """Chat: the request is read; generation starts."""

    input_tokens: int = 0


@_wire("chunk")
@_media
class Chunk(Event):
    """A streamed piece of the answer: text and the speech for it (24 kHz)."""

    WIRE_NAMES: ClassVar[Mapping[str, str]] = {"text_delta": "text", "audio_data": "audio"}
    text: str = ""
    audio: np.ndarray | None = None


@_wire("done")
@_media
class ChatDone(Event):
    """Chat: the whole answer. When streaming, the server sends no audio here;
    :meth:`omnilive.client.Chat.ask` fills ``audio`` with the streamed pieces."""

    WIRE_NAMES: ClassVar[Mapping[str, str]] = {"audio_data": "audio"}
    text: str = ""
    generated_tokens: int = 0
    input_tokens: int = 0
    audio: np.ndarray | None = None
    recording_session_id: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@_wire("vad_state")
@_events
class VadState(Event):
    """Half-duplex: what the server's VAD hears (``speaking`` starts or stops)."""

    speaking: bool


@_wire("generating")
@_events
class Generating(Event):
    """Half-duplex: the speech ended and the model is answering it."""

    speech_duration_ms: float = 0.0


@_wire("turn_done")
@_events
class TurnDone(Event):
    """Half-duplex: the answer of one turn is complete."""

    turn_index: int
    text: str = ""


@_wire("interrupted")
@_events
class Interrupted(Event):
    """Half-duplex with ``config={"barge_in": True}``: the user spoke over
    answer ``turn_index``, which stops here; that speech is the next turn."""

    turn_index: int


@_wire("playback_applied")
@_events
class PlaybackApplied(Event):
    """Half-duplex: the answer to :meth:`HalfDuplex.report_playback`. The
    model's context now holds ``heard_text`` of that answer (``context`` is
    ``cut``), or all of it (``unchanged``: all was heard, or the engine cannot
    roll its context back)."""

    turn_index: int
    played_ms: int = 0
    heard_text: str = ""
    context: str = "unchanged"


# --- duplex ----------------------------------------------------------------------------


@_wire("result")
@_media
class Result(Event):
    """Duplex: what the model did with one second of input: listened, or spoke."""

    WIRE_NAMES: ClassVar[Mapping[str, str]] = {"audio_data": "audio"}
    is_listen: bool
    text: str = ""
    audio: np.ndarray | None = None
    end_of_turn: bool = False
    unit_index: int | None = None
    current_time: float | None = None
    kv_cache_length: int | None = None
    context_capacity: int | None = None
    evicted_units: int = 0
    wall_clock_ms: float | None = None
    server_send_ts: float | None = None
    cost_prefill_ms: float | None = None
    cost_llm_ms: float | None = None
    cost_tts_prep_ms: float | None = None
    cost_tts_ms: float | None = None
    cost_token2wav_ms: float | None = None
    cost_all_ms: float | None = None
    n_tokens: int | None = None
    n_tts_tokens: int | None = None
    vision_slices: int | None = None
    vision_tokens: int | None = None
    dropped_chunks: int = 0
    dropped_chunks_total: int = 0


@_wire("paused")
@_events
class Paused(Event):
    timeout: float | None = None


@_wire("resumed")
@_events
class Resumed(Event):
    pass


@_wire("updated")
@_events
class Updated(Event):
    """Duplex: new instructions or voice apply from the next turn (``warnings``: what could not)."""

    applied: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# --- the Realtime API ------------------------------------------------------------------


@_events
class _V2(Event):
    """Fields every event of the newer dialect may carry."""

    session_id: str | None = None
    response_id: str | None = None
    input_id: str | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    server_send_ts: float | None = None
    chunk_index: int | None = None
    chunk_usage: Mapping[str, Any] | None = None
    usage: Mapping[str, Any] | None = None


@_wire("session.created")
@_events
class SessionCreated(_V2):
    """The Realtime session is configured. ``prompt_length`` in the older
    dialect; ``mode`` (``full_duplex`` / ``turn_based``) in the newer."""

    recording_session_id: str | None = None
    prompt_length: int | None = None
    mode: str | None = None
    warnings: list[str] = field(default_factory=list)


@_wire("response.listen")
@_events
class Listen(_V2):
    """The model listens (the newer dialect's ``kind: listen`` delta too; after
    speech, it marks the end of the model's turn)."""

    kv_cache_length: int | None = None


@_wire("response.output_audio.delta")
@_media
class Speech(Event):
    """The older dialect: a second of speech with its text."""

    text: str = ""
    audio: np.ndarray | None = None
    end_of_turn: bool = False
    kv_cache_length: int | None = None


@_media
class TextDelta(_V2):
    """The newer dialect: text the model says (it leads the audio)."""

    text: str = ""


@_media
class AudioDelta(_V2):
    """The newer dialect: speech (24 kHz)."""

    audio: np.ndarray | None = None
    sample_rate: int = 24000


@_wire("response.done")
@_media
class ResponseDone(_V2):
    """The newer dialect's chat mode: one answer complete (``audio`` only when not streaming)."""

    text: str = ""
    audio: np.ndarray | None = None
    reason: str | None = None
    recording_session_id: str | None = None


@_wire("session.updated")
@_events
class SessionUpdated(Event):
    """The older dialect: a later ``session.update`` applied (``warnings``: what could not)."""

    session: Mapping[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@_wire("response.cancelled")
@_events
class ResponseCancelled(Event):
    pass


@_wire("session.closed")
@_events
class SessionClosed(_V2):
    """The Realtime session ended; ``reason`` says why (``stopped``/``user_stop``,
    ``timeout``, ``context_full``, ``server_shutdown``, ``error``/``backend_error``)."""

    reason: str | None = None
    diagnostic: Mapping[str, Any] | None = None

    @property
    def message(self) -> str:
        return str((self.diagnostic or {}).get("message") or self.reason or "")


def _output_delta(data: dict[str, Any]) -> Event:
    kind = data.get("kind")
    rest = {k: v for k, v in data.items() if k != "kind"}
    if kind == "text":
        return TextDelta.from_wire(rest)
    if kind == "audio":
        return AudioDelta.from_wire(rest)
    if kind == "listen":
        listen = Listen.from_wire(rest)
        kv = listen.metrics.get("kv_cache_length")
        return dataclasses.replace(listen, kv_cache_length=kv)
    return UnknownEvent(type=f"response.output.delta/{kind}", data=data)


_EVENTS["response.output.delta"] = _output_delta


@_wire("session.resumed")
@_events
class SessionResumed(Event):
    """The connection dropped and the client resumed the session on a new one
    (``docs/resume.md``): ``replayed`` events it missed follow, ``events_lost``
    were beyond the server's replay log, and the server received no input for
    ``input_gap_ms``."""

    session_id: str
    resume_token: str
    last_seq: int = 0
    replayed: int = 0
    events_lost: int = 0
    input_gap_ms: int = 0


@_events
class UnknownEvent(Event):
    """A message type this client does not know (a newer server): passed on as it came."""

    type: str
    data: Mapping[str, Any] = field(default_factory=dict, repr=False)


def parse_event(data: Mapping[str, Any]) -> Event:
    """A decoded server message as its typed event; raises
    :class:`ProtocolViolationError` for one without a ``type`` or with fields
    of the wrong shape."""
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolViolationError(f"a server message without a type: {sorted(data)}")
    parse = _EVENTS.get(kind)
    if parse is None:
        return UnknownEvent(type=kind, data=dict(data))
    try:
        return parse(dict(data))
    except (TypeError, ValueError) as exc:
        raise ProtocolViolationError(f"unreadable {kind} message: {exc}") from None
