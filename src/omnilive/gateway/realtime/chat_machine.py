"""Turn-based chat over the Realtime API (``mode=chat``, the newer dialect),
without I/O.

QUEUED → CONNECTED → ACTIVE ⇄ RESPONDING → CLOSED. The session holds one
worker slot from ``session.queue_done`` to its end; ``session.init`` (kept
if it comes while queued) creates it, each ``input.append`` is one whole
chat turn, answered as ``response.output.delta`` (``text`` and ``audio``,
when streaming) and ``response.done``. Inputs that arrive during an answer
wait their turn (a few at most). The worker serves each turn as a
``/ws/chat`` request; this machine turns its messages into the dialect's.
Every violation is fatal, as everywhere in this dialect.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from omnilive.gateway.realtime.machine import Action, Close, ToClient
from omnilive.protocol.chat import ChatRequest
from omnilive.protocol.common import ProtocolError, load_json
from omnilive.protocol.realtime import QUEUE_EVENT_NAMES, CloseReason
from omnilive.protocol.realtime_v2 import (
    CLOSE_FATAL,
    InputAppend,
    SessionClose,
    SessionInit,
    TokenUsage,
    UsageMeter,
    V2Reason,
    closed_event,
    event,
    new_response_id,
    output_delta,
    parse_event,
    violation,
)
from omnilive.transitions import IllegalTransition

MAX_WAITING_INPUTS = 4
_SERVER_ENDS = {
    CloseReason.TIMEOUT: V2Reason.TIMEOUT,
    CloseReason.SERVER_SHUTDOWN: V2Reason.SERVER_SHUTDOWN,
}


class ChatState(StrEnum):
    QUEUED = "queued"
    CONNECTED = "connected"
    ACTIVE = "active"
    RESPONDING = "responding"
    CLOSED = "closed"


@dataclass(frozen=True)
class StartTurn:
    """Serve one chat request on the session's worker (``serial`` tells turns apart)."""

    request: ChatRequest
    serial: int


@dataclass(frozen=True)
class CancelTurn:
    """Abandon the turn in progress (the session is closing)."""


ChatAction = Action | StartTurn | CancelTurn


@dataclass(frozen=True)
class _Turn:
    request: ChatRequest
    input_id: str | None
    response_id: str


def chat_request(turn: dict[str, Any]) -> dict[str, Any]:
    """A turn in this dialect as a ``/ws/chat`` request: its defaults differ
    (no speech unless asked, 256 new tokens, length penalty 1.1), and
    ``use_tts_template`` also asks for speech."""
    request = {k: v for k, v in turn.items() if k not in ("input_id", "response_id")}
    tts = dict(request.get("tts") or {})
    tts["enabled"] = bool(tts.get("enabled", False) or request.pop("use_tts_template", False))
    generation = {"max_new_tokens": 256, "length_penalty": 1.1, **(request.get("generation") or {})}
    return {**request, "tts": tts, "generation": generation}


class RealtimeChatMachine:
    dialect = "realtime_v2"
    task_type = "chat"  # it queues, and holds its worker, like a chat request

    def __init__(
        self,
        session_id: str,
        check: Callable[[dict[str, Any]], ChatRequest],
        max_bytes: int | None = None,
    ) -> None:
        """``check`` validates a chat request (raises ``ValueError`` with the reason);
        ``max_bytes`` is the largest client frame."""
        self.session_id = session_id
        self.check = check
        self.max_bytes = max_bytes
        self.state = ChatState.QUEUED
        self.usage = UsageMeter()
        self._init_waiting = False
        self._waiting: deque[_Turn] = deque()
        self._turn: _Turn | None = None
        self.turn_serial = 0
        self._text: list[str] = []

    # --- the queue -----------------------------------------------------------------

    def queue_event(self, message: dict[str, Any]) -> list[ChatAction]:
        actions: list[ChatAction] = [
            ToClient({**message, "type": QUEUE_EVENT_NAMES[message["type"]]})
        ]
        if message["type"] == "queue_done":
            self._move(ChatState.QUEUED, ChatState.CONNECTED)
            if self._init_waiting:
                actions.extend(self._create())
        return actions

    # --- the client -----------------------------------------------------------------

    def client_frame(self, raw: str | bytes) -> list[ChatAction]:
        if self.state is ChatState.CLOSED:
            return []
        try:
            data = load_json(raw, self.max_bytes)
        except ProtocolError as exc:  # not JSON, nested too deeply, too large
            return self._fatal(f"an event is a JSON object: {exc.message}")
        try:
            if not isinstance(data, dict):
                raise violation("an event is a JSON object of valid text")
            event_ = parse_event(data)
            if isinstance(event_, SessionClose):
                return self._close(event_.reason or V2Reason.CLIENT_CLOSED)
            if isinstance(event_, SessionInit):
                return self._init()
            return self._append(event_)
        except ProtocolError as exc:  # this dialect's refusals all end the session
            return self._fatal(exc.message)

    def _init(self) -> list[ChatAction]:
        if self._init_waiting or self.state in (ChatState.ACTIVE, ChatState.RESPONDING):
            raise violation("session.init is sent once")
        if self.state is ChatState.QUEUED:
            self._init_waiting = True
            return []
        return self._create()

    def _create(self) -> list[ChatAction]:
        self.state = ChatState.ACTIVE
        created = event(
            "session.created",
            session_id=self.session_id,
            mode="turn_based",
            metrics={},
            usage=self.usage.total.to_dict(),
        )
        return [ToClient(created)]

    def _append(self, append: InputAppend) -> list[ChatAction]:
        if self.state not in (ChatState.ACTIVE, ChatState.RESPONDING):
            raise violation("input.append before session.created")
        try:
            request = self.check(chat_request(append.input))
        except ValueError as exc:
            raise violation(f"input: {exc}") from None
        response_id = append.input.get("response_id")
        turn = _Turn(
            request,
            _label(append.input.get("input_id")),
            _label(response_id) or new_response_id(),
        )
        if len(self._waiting) >= MAX_WAITING_INPUTS:
            raise violation(f"more than {MAX_WAITING_INPUTS} inputs wait for an answer")
        self._waiting.append(turn)
        return self._next_turn() if self.state is ChatState.ACTIVE else []

    def _next_turn(self) -> list[ChatAction]:
        if not self._waiting:
            self.state = ChatState.ACTIVE
            return []
        self._turn = self._waiting.popleft()
        self._text = []
        self.state = ChatState.RESPONDING
        self.turn_serial += 1
        return [StartTurn(self._turn.request, self.turn_serial)]

    def answering(self, serial: int) -> bool:
        """Whether turn ``serial`` still waits for its ``done``."""
        return self.state is ChatState.RESPONDING and self.turn_serial == serial

    # --- the worker ------------------------------------------------------------------

    def worker_message(self, raw: str) -> list[ChatAction]:
        """One message of the ``/ws/chat`` answer to the current turn."""
        turn = self._turn
        if self.state is not ChatState.RESPONDING or turn is None:
            return []
        message = json.loads(raw)
        kind = message.get("type")
        ids = {"session_id": self.session_id, "response_id": turn.response_id,
               "input_id": turn.input_id}  # fmt: skip
        if kind == "chunk":
            actions: list[ChatAction] = []
            if message.get("text_delta"):
                self._text.append(message["text_delta"])
                actions.append(ToClient(output_delta("text", text=message["text_delta"], **ids)))
            if message.get("audio_data"):
                audio = output_delta("audio", audio=message["audio_data"], sample_rate=24000, **ids)
                actions.append(ToClient(audio))
            return actions
        if kind == "done":
            usage = self.usage.step(
                TokenUsage(
                    input_text=int(message.get("input_tokens") or 0),
                    output_text=int(message.get("generated_tokens") or 0),
                )
            )
            done = event(
                "response.done",
                **ids,
                text=message.get("text") or "".join(self._text),
                audio=message.get("audio_data"),
                reason="turn_end",
                metrics=message.get("timings") or {},
                recording_session_id=message.get("recording_session_id"),
                **usage,
            )
            self._turn = None
            return [ToClient(done), *self._next_turn()]
        if kind == "error":
            return self._fatal(f"{message.get('code', 'inference_error')}: {message.get('error')}")
        return []

    def turn_lost(self, why: str) -> list[ChatAction]:
        """The worker's answer ended without ``done`` (it died, or refused)."""
        return self._fatal(why)

    # --- endings ------------------------------------------------------------------

    def end(self, reason: CloseReason) -> list[ChatAction]:
        if self.state is ChatState.CLOSED:
            return []
        if reason in _SERVER_ENDS:
            return self._close(_SERVER_ENDS[reason])
        return self._fatal(f"the session ended: {reason}")

    def _close(self, reason: str) -> list[ChatAction]:
        responding = self.state is ChatState.RESPONDING
        self.state = ChatState.CLOSED
        closed = closed_event(self.session_id, reason, usage=self.usage.total.to_dict())
        return [*([CancelTurn()] if responding else []), ToClient(closed), Close()]

    def _fatal(self, message: str) -> list[ChatAction]:
        responding = self.state is ChatState.RESPONDING
        self.state = ChatState.CLOSED
        closed = closed_event(self.session_id, V2Reason.BACKEND_ERROR, message)
        return [
            *([CancelTurn()] if responding else []),
            ToClient(closed),
            Close(CLOSE_FATAL, V2Reason.BACKEND_ERROR),
        ]

    def _move(self, expected: ChatState, target: ChatState) -> None:
        if self.state is not expected:
            raise IllegalTransition(f"{self.state} → {target} (expected {expected})")
        self.state = target


def _label(value: Any) -> str | None:
    """A client's id for an input or response, echoed as given (a short string)."""
    return value[:256] if isinstance(value, str) and value else None
