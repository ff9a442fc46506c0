"""The rules of one chat request on the worker, without I/O.

RECEIVED → DECODED → PREFILLING → GENERATING → FINISHING → DONE, or FAILED or
CANCELLED on the way. The runner (``worker/runners/chat.py``) decodes the
request and runs the engine's steps, feeds the machine what they produced as
typed events (with the times it read) and does what the machine answers: a
message for the client, or the request's turn for its recording. The answer's
bookkeeping is the machine's: tokens, timings, the audio a non-streaming
answer sends with ``done``, and what the recording keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from omnilive.audio import pcm_to_b64
from omnilive.protocol.chat import chunk_message, done_message, prefill_done_message
from omnilive.protocol.common import ErrorCode, error_message
from omnilive.recording.turns import TurnOutput, TurnStatus
from omnilive.transitions import IllegalTransition


class ChatState(StrEnum):
    RECEIVED = "received"
    DECODED = "decoded"  # the engine can take it; nothing is open yet
    PREFILLING = "prefilling"  # the engine session and the recording are open
    GENERATING = "generating"
    FINISHING = "finishing"  # the answer is complete and ``done`` is on its way
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


ENDED = frozenset({ChatState.DONE, ChatState.FAILED, ChatState.CANCELLED})
LIVE = tuple(state for state in ChatState if state not in ENDED)

# --- events in (times: ``now`` on the runner's monotonic clock, ``wall`` epoch) ---


@dataclass(frozen=True)
class Decoded:
    """The request decoded and the engine can take every kind of its content."""


@dataclass(frozen=True)
class PrefillStarted:
    """The engine session and the recording (``None``: not recorded) are open."""

    recording_id: str | None


@dataclass(frozen=True)
class Prefilled:
    input_tokens: int
    now: float


@dataclass(frozen=True, eq=False)  # arrays do not compare as a bool
class Chunk:
    text: str
    audio: np.ndarray | None  # 24 kHz
    n_tokens: int
    now: float
    wall: float  # when it goes out: where the recording places its audio


@dataclass(frozen=True)
class Generated:
    """The answer is complete; ``warnings``: what the engine could not do as asked."""

    warnings: Sequence[str]
    now: float
    wall: float


@dataclass(frozen=True)
class DoneSent:
    """``done`` reached the socket: only now is the request done."""


@dataclass(frozen=True)
class ClientGone:
    """The client left, or a send to it failed."""


@dataclass(frozen=True)
class Failure:
    error: str


class DecodeFailed(Failure):
    """The content cannot be decoded (it passed the gateway's checks of its shape)."""


class Unsupported(Failure):
    """The engine cannot take some of the content (an image, say)."""


class GenerationFailed(Failure):
    """The engine failed (``EngineError``) while prefilling or answering."""


class UnexpectedError(Failure):
    """A step failed in a way nothing foresaw (a bug): the client is still told."""


Event = Decoded | PrefillStarted | Prefilled | Chunk | Generated | DoneSent | ClientGone | Failure

# --- actions out -------------------------------------------------------------------


@dataclass(frozen=True)
class ToClient:
    message: dict[str, Any]


@dataclass(frozen=True, eq=False)
class Record:
    """The request's turn for its recording (what it produced, however it ended)."""

    request_ts: float
    output: TurnOutput
    timings: dict[str, float]
    status: TurnStatus
    error: str | None = None


Action = ToClient | Record


@dataclass
class _Answer:
    """What the answer produced so far."""

    input_tokens: int = 0
    generated_tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    output: TurnOutput = field(default_factory=TurnOutput)
    held_audio: list[np.ndarray] = field(default_factory=list)  # sent with ``done``
    warnings: list[str] = field(default_factory=list)


class ChatMachine:
    """One chat request. ``started`` (monotonic seconds) is where its timings
    count from, ``request_ts`` (epoch seconds) where its recording places it."""

    def __init__(self, streaming: bool, started: float, request_ts: float) -> None:
        self.streaming = streaming
        self.started = started
        self.request_ts = request_ts
        self.state = ChatState.RECEIVED
        self.recording_id: str | None = None
        self.answer = _Answer()
        # Once the prefill starts, the recording gets the turn however it ends.
        self._recorded = False

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def handle(self, event: Event) -> list[Action]:
        """Take one event; returns what to do, in order (a recording's turn last).
        Raises :class:`IllegalTransition` for an event the state cannot follow."""
        match event:
            case Decoded():
                self._move(event, ChatState.DECODED, ChatState.RECEIVED)
                return []
            case DecodeFailed(error):
                return self._refuse(event, error, ErrorCode.INVALID_REQUEST)
            case Unsupported(error):
                return self._refuse(event, error, ErrorCode.UNSUPPORTED)
            case PrefillStarted(recording_id):
                self._move(event, ChatState.PREFILLING, ChatState.DECODED)
                self.recording_id, self._recorded = recording_id, True
                return []
            case Prefilled():
                return self._prefilled(event)
            case Chunk():
                return self._chunk(event)
            case Generated():
                return self._generated(event)
            case DoneSent():
                self._move(event, ChatState.DONE, ChatState.FINISHING)
                return self._record("done")
            case GenerationFailed(error):
                allowed: tuple[ChatState, ...] = (ChatState.PREFILLING, ChatState.GENERATING)
                return self._fail(event, f"inference failed: {error}", error, allowed)
            case UnexpectedError(error):
                allowed = (ChatState.RECEIVED, ChatState.PREFILLING, ChatState.GENERATING)
                return self._fail(event, f"internal error: {error}", error, allowed)
            case ClientGone():
                self._move(event, ChatState.CANCELLED, *LIVE)
                return self._record("interrupted")
        raise TypeError(f"not a chat event: {event!r}")

    def _move(self, event: Event, target: ChatState, *allowed: ChatState) -> None:
        if self.state not in allowed:
            raise IllegalTransition(f"{type(event).__name__} in {self.state}")
        self.state = target

    def _ms(self, now: float) -> float:
        return round((now - self.started) * 1000, 1)

    # --- the answer ------------------------------------------------------------------

    def _prefilled(self, event: Prefilled) -> list[Action]:
        self._move(event, ChatState.GENERATING, ChatState.PREFILLING)
        self.answer.input_tokens = event.input_tokens
        self.answer.timings["prefill_ms"] = self._ms(event.now)
        return [ToClient(prefill_done_message(event.input_tokens))]

    def _chunk(self, event: Chunk) -> list[Action]:
        self._move(event, ChatState.GENERATING, ChatState.GENERATING)
        answer = self.answer
        answer.timings.setdefault("first_chunk_ms", self._ms(event.now))
        answer.generated_tokens += event.n_tokens
        if not self.streaming:
            # Its audio reaches the client (and the recording) in one piece, with ``done``.
            if event.audio is not None and event.audio.size:
                answer.held_audio.append(event.audio)
            answer.output.add(event.text, None, event.wall)
            return []
        answer.output.add(event.text, event.audio, event.wall)
        audio = pcm_to_b64(event.audio) if event.audio is not None else None
        return [ToClient(chunk_message(event.text, audio))]

    def _generated(self, event: Generated) -> list[Action]:
        self._move(event, ChatState.FINISHING, ChatState.GENERATING)
        answer = self.answer
        answer.warnings = list(event.warnings)
        total_ms = (event.now - self.started) * 1000
        timings = answer.timings
        timings.update(
            # An answer without chunks had its "first chunk" when it ended.
            first_chunk_ms=round(timings.get("first_chunk_ms", total_ms), 1),
            generate_ms=round(total_ms - timings["prefill_ms"], 1),
            total_ms=round(total_ms, 1),
        )
        full_audio = None
        if answer.held_audio:
            joined = np.concatenate(answer.held_audio)
            full_audio = pcm_to_b64(joined)
            answer.output.audio.append((event.wall, joined))
        text = "".join(answer.output.text)
        done = done_message(
            text,
            answer.generated_tokens,
            answer.input_tokens,
            full_audio,
            self.recording_id,
            dict(timings),
            answer.warnings,
        )
        return [ToClient(done)]

    # --- endings ---------------------------------------------------------------------

    def _refuse(self, event: Event, error: str, code: ErrorCode) -> list[Action]:
        """A request the worker cannot serve: nothing was opened, nothing is recorded."""
        self._move(event, ChatState.FAILED, ChatState.RECEIVED)
        return [ToClient(error_message(error, code))]

    def _fail(
        self, event: Event, message: str, error: str, allowed: tuple[ChatState, ...]
    ) -> list[Action]:
        self._move(event, ChatState.FAILED, *allowed)
        told = ToClient(error_message(message, ErrorCode.INFERENCE_ERROR))
        return [told, *self._record("failed", error)]

    def _record(self, status: TurnStatus, error: str | None = None) -> list[Action]:
        if not self._recorded:
            return []
        answer = self.answer
        return [Record(self.request_ts, answer.output, dict(answer.timings), status, error)]
