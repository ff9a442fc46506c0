"""A Live session's delegations, beside its unit loop: the judge reads each
transcribed user turn; a turn it delegates is a ``session.delegation.created``
and then, by the session's owner:

- ``client``: the app works on it and answers with ``commentary`` (said) or
  ``thinking`` (silent) appends naming the delegation's id;
- ``responses``: omnilive's backend (``backend.py``) answers from the
  conversation, its events wrapped in ``response.event``; its function
  calls go to the app, whose outputs (``response.item.create`` +
  ``response.create``) continue it; its text is commentary the model says.

Unless a commentary or thinking append comes first, the model says the
session's acknowledgement (``live.acknowledgement``) once the
delegation's ``acknowledgement_delay_ms`` passed: every such append
cancels the acknowledgements still pending, as OpenAI's Live API does.

The flow does no I/O of its own: it is handed how to send an event, how to
write a note into the model's context and how to start a task of the session.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from omnilive.engines.appends import ContextNote, NoteKind
from omnilive.engines.cascade.llm import Message
from omnilive.engines.messages import ToolCall
from omnilive.ids import mint
from omnilive.protocol.common import ProtocolError
from omnilive.protocol.openai_live import ResponsesDelegation, SessionConfig
from omnilive.protocol.openai_live_events import (
    delegation_created,
    refusal_event,
    response_event,
)
from omnilive.worker.delegation.backend import ResponsesBackend, call_output, user_text
from omnilive.worker.delegation.judge import Delegable, Judge, tools_of

log = logging.getLogger(__name__)
MAX_HISTORY = 64  # messages of the conversation the backend reads, newest kept
MAX_DELEGATIONS = 256  # client delegations whose ids appends may name, newest kept

Send = Callable[[dict[str, Any]], Awaitable[None]]
Say = Callable[[ContextNote], Awaitable[None]]
Spawn = Callable[[str, Coroutine[Any, Any, None]], asyncio.Task[None]]


@dataclass
class _Pending:
    """A responses delegation whose backend called functions: it waits for their outputs."""

    delegation_id: str
    calls: list[ToolCall]
    outputs: dict[str, str] = field(default_factory=dict)


class DelegationFlow:
    def __init__(
        self,
        judge: Judge,
        backend: ResponsesBackend | None,
        acknowledgement: str,
        send: Send,
        say: Say,
        spawn: Spawn,
    ) -> None:
        self.judge = judge
        self.backend = backend
        self.acknowledgement = acknowledgement
        self._send, self._say, self._spawn = send, say, spawn
        self.config: SessionConfig | None = None
        self.history: deque[Message] = deque(maxlen=MAX_HISTORY)
        self.delegations: deque[str] = deque(maxlen=MAX_DELEGATIONS)  # client ones' ids
        self._acks: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: _Pending | None = None  # a backend response waiting for outputs
        self._extra: list[Message] = []  # the app's own input items for the next response
        self.verdicts: list[tuple[str, bool, str]] = []  # (turn, delegated, why), for benchmarks

    def delegable(self) -> Delegable:
        config = self.config
        if config is None:
            return Delegable()
        tools: tuple[dict[str, Any], ...] = ()
        if isinstance(config.delegation, ResponsesDelegation):
            tools = tools_of(config.delegation.responses.tools)
        return Delegable(config.instructions or "", tools)

    # --- the conversation, as the backend reads it ---------------------------------------

    def heard(self, text: str) -> None:
        self.history.append(Message("user", text))

    def said(self, text: str) -> None:
        """The model's words: a unit's text joins its turn's message."""
        last = self.history[-1] if self.history else None
        if last is not None and last.role == "assistant" and not last.tool_calls:
            self.history[-1] = Message("assistant", f"{last.content} {text}".strip())
        else:
            self.history.append(Message("assistant", text.strip()))

    # --- turns ---------------------------------------------------------------------------

    async def turn(self, text: str, end_ms: int) -> str | None:
        """A transcribed user turn: the id of the delegation it made, if any."""
        self.heard(text)
        verdict = await self.judge.judge(text, self.delegable())
        self.verdicts.append((text, verdict.delegate, verdict.why))
        if not verdict.delegate or self.config is None:
            return None
        delegation_id = mint("dlg", 12)
        log.info("delegation %s: %s", delegation_id, verdict.why)
        if self.config.owner == "client":
            self.delegations.append(delegation_id)
            await self._send(delegation_created(delegation_id, "client", end_ms))
        else:
            self._start(f"responses-{delegation_id}", self._respond(delegation_id, end_ms))
        self._start(f"ack-{delegation_id}", self._acknowledge(delegation_id))
        return delegation_id

    async def _acknowledge(self, delegation_id: str) -> None:
        assert self.config is not None
        task = asyncio.current_task()
        assert task is not None
        self._acks[delegation_id] = task
        try:
            await asyncio.sleep(self.config.acknowledgement_delay_ms / 1000)
            del self._acks[delegation_id]
            await self._say(ContextNote(NoteKind.COMMENTARY, self.acknowledgement))
        except asyncio.CancelledError:
            self._acks.pop(delegation_id, None)
            raise

    def appended(self, kind: str, delegation_id: str | None, event_id: str | None) -> None:
        """Check an append's delegation id; commentary and thinking cancel
        the acknowledgements still pending."""
        if delegation_id is not None and delegation_id not in self.delegations:
            message = f"no client delegation {delegation_id!r} in this session"
            raise ProtocolError("delegation_not_found", message, "delegation_id", event_id)
        if kind in ("commentary", "thinking"):
            for task in list(self._acks.values()):
                task.cancel()

    # --- responses delegations ---------------------------------------------------------------

    async def _respond(self, delegation_id: str | None, end_ms: int | None = None) -> None:
        """One backend response; its text is said, its calls wait for the app."""
        config, backend = self.config, self.backend
        assert config is not None and isinstance(config.delegation, ResponsesDelegation)
        if backend is None:
            error = ProtocolError("backend_error", "no live.backend.url is configured", None)
            await self._send(_error(error))
            return
        if end_ms is not None and delegation_id is not None:
            created = delegation_created(delegation_id, "responses", end_ms)
            await self._send(created)

        async def emit(event: dict[str, Any]) -> None:
            await self._send(response_event(event, delegation_id))

        history = [*self.history, *self._extra]
        self._extra = []
        answer = await backend.answer(config.delegation.responses, history, emit)
        if answer.failed is not None:
            return
        if answer.calls:
            self.history.append(Message("assistant", answer.text, tuple(answer.calls)))
            self._waiting = _Pending(delegation_id or "", answer.calls)
            return
        if answer.text.strip():
            for task in list(self._acks.values()):
                task.cancel()
            await self._say(ContextNote(NoteKind.COMMENTARY, answer.text.strip()))

    def item(self, item: dict[str, Any], event_id: str | None) -> None:
        """``response.item.create``: a function's output, or a message for the backend."""
        output = call_output(item)
        if output is not None:
            call_id, text = output
            waiting = self._waiting
            if waiting is None or call_id not in {c.call_id for c in waiting.calls}:
                message = f"no function call {call_id!r} is waiting for its output"
                raise ProtocolError("invalid_value", message, "item.call_id", event_id)
            waiting.outputs[call_id] = text
            self.history.append(Message("tool", text, tool_call_id=call_id))
            return
        said = user_text(item)
        if said is None:
            message = "the backend takes function_call_output items and user or developer messages"
            raise ProtocolError("invalid_value", message, "item.type", event_id)
        role = "user" if item.get("role") == "user" else "system"
        self._extra.append(Message(role, said))

    def create(self, event_id: str | None) -> None:
        """``response.create``: continue the delegation waiting for outputs, or a new response."""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            missing = [c.call_id for c in waiting.calls if c.call_id not in waiting.outputs]
            if missing:
                self._waiting = waiting
                message = f"the backend still waits for the output of {missing}"
                raise ProtocolError("invalid_value", message, None, event_id)
            self._start(f"responses-{waiting.delegation_id}", self._respond(waiting.delegation_id))
            return
        self._start("responses-create", self._respond(None))

    # --- tasks ---------------------------------------------------------------------------

    def _start(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        task = self._spawn(name, work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel what is still running (the session ended) and wait for it."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def _error(error: ProtocolError) -> dict[str, Any]:
    return refusal_event(error, "server_error")
