"""A Realtime conversation's responses on the worker: at most one runs; it
is made from the conversation (or, out of band, from its own ``input``),
with the session's settings or its own for this once, streamed through
the presenter, and cancelled at the engine's next step when asked or when
the user starts speaking. Mixed into the OpenAI Realtime runner, which owns
the session's state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from omnilive.engines.base import EngineError, HalfDuplexSession
from omnilive.engines.messages import ChatMessage
from omnilive.protocol.common import ProtocolError
from omnilive.protocol.openai_realtime import (
    ResponseCancel,
    ResponseParams,
    SessionConfig,
    error_event,
)
from omnilive.worker.openai import machine as rules
from omnilive.worker.openai.context import ContextMirror
from omnilive.worker.openai.items import (
    Conversation,
    client_item,
    conversation_full,
    messages_of,
)
from omnilive.worker.openai.presenter import ResponsePresenter, item_id, usage
from omnilive.worker.outbox import Outbox
from omnilive.worker.runtime import SessionRecord, WorkerRuntime

log = logging.getLogger(__name__)
_AUDIO_DELTA = "response.output_audio.delta"


class Responses:
    # The runner's, read and written here.
    runtime: WorkerRuntime
    record: SessionRecord
    session: HalfDuplexSession
    outbox: Outbox
    config: SessionConfig
    conversation: Conversation
    session_id: str
    _prefilled: bool  # the last speech is in the engine, unanswered
    _input_tokens: int  # what the engine heard since the last response
    _spoken_ms: dict[str, float]  # assistant item → its audio's length
    context: ContextMirror

    if TYPE_CHECKING:  # the runner's methods (stubs here would shadow them)

        def spawn(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...
        async def send(self, message: dict[str, Any]) -> None: ...
        async def _sync_history(self) -> None: ...
        async def _apply_tools(self, params: ResponseParams | None = None) -> None: ...
        async def _tell_context(self) -> None: ...

    def _init_responses(self) -> None:
        self._response: asyncio.Task[None] | None = None
        self._presenter: ResponsePresenter | None = None
        self._cancel_reason = "client_cancelled"

    @property
    def _answering(self) -> bool:
        return self._response is not None and not self._response.done()

    def _answering_into(self, item_id: str) -> bool:
        """Whether the running response is making the item ``item_id``."""
        return (
            self._answering and self._presenter is not None and self._presenter.is_output(item_id)
        )

    async def _create_response(self, params: ResponseParams, client_event_id: str | None) -> None:
        if self._answering:
            message = "the conversation already has an active response"
            code = "conversation_already_has_active_response"
            raise ProtocolError(code, message, None, client_event_id)
        if params.conversation != "none" and self.conversation.full:
            raise conversation_full(client_event_id)  # its answer would have no room
        context = self._own_context(params, client_event_id)
        modalities = params.output_modalities or self.config.output_modalities
        in_conversation = params.conversation != "none"
        presenter = ResponsePresenter(
            "audio" in modalities,
            self.config.audio.output.format.type,
            self.conversation if in_conversation else None,
            metadata=params.metadata,
        )
        self._presenter = presenter
        work = self._respond(params, presenter, context)
        self._response = self.spawn(f"response-{presenter.id}", work)

    def _own_context(
        self, params: ResponseParams, client_event_id: str | None
    ) -> list[ChatMessage] | None:
        """A response's own ``input`` as the engine's messages (None: it
        answers the conversation); references are looked up now."""
        if params.input is None:
            return None
        items = []
        for entry in params.input:
            if entry.type == "item_reference":
                items.append(self.conversation.get(entry.id, client_event_id))
            else:
                items.append(client_item(entry.model_dump(mode="json"), item_id()))
        return messages_of(params.instructions or rules.instructions(self.config), items)

    async def _respond(
        self,
        params: ResponseParams,
        presenter: ResponsePresenter,
        context: list[ChatMessage] | None,
    ) -> None:
        session = self.session
        out_tokens, status, reason = 0, "completed", None
        answered = False
        error: dict[str, str] | None = None
        own_tools, own_options = rules.overrides(params)
        out_of_band = context is not None or params.conversation == "none"
        await self.send(presenter.created()[0])
        try:
            if own_tools:
                await self._apply_tools(params)
            if own_options:
                await self.runtime.step(session.set_options, rules.options(self.config, params))
            if context is not None:
                self.context.unknown()  # until the conversation is written again
                await self.runtime.step(session.set_history, context)
                self._prefilled = False
            elif self.conversation.dirty:
                await self._sync_history()
            await self.runtime.step(session.snapshot)
            if not self._prefilled or params.instructions or out_of_band:
                instructions = None if context is not None else params.instructions
                await self.runtime.step(session.respond, instructions)
            self._prefilled = False
            answered = not out_of_band  # the engine's context holds an answer from here
            async for chunk in self.runtime.stream(session.generate):
                out_tokens += chunk.n_tokens
                if chunk.tool_call is not None:
                    events = presenter.tool_call(chunk.tool_call)
                else:
                    events = presenter.chunk(chunk.text, chunk.audio)
                for event in events:
                    await self.send(event)
        except asyncio.CancelledError:
            status, reason = "cancelled", self._cancel_reason
            raise
        except EngineError as exc:
            status = "failed"
            log.warning("response %s of %s failed: %s", presenter.id, self.session_id, exc)
            await self.runtime.step(session.rollback)
            failed = f"the response failed: {exc}"
            code = rules.engine_error_code(exc)
            kind = "server_error" if code == "inference_error" else "invalid_request_error"
            error = {"type": kind, "code": code, "message": failed}
            await self.send(error_event(code, failed, kind=kind))
        finally:
            log.info("response %s %s: %s", presenter.id, status, session.turn_timings)
            await self._finish(params, presenter, status, reason, out_tokens, error)
            if out_of_band:  # the engine's context holds what the conversation does not
                self.conversation.dirty = True
            elif answered and status != "failed":  # a failed one was rolled back
                self.context.turn(tuple(item["id"] for item in presenter.output))
                await self._tell_context()

    async def _finish(
        self,
        params: ResponseParams,
        presenter: ResponsePresenter,
        status: str,
        reason: str | None,
        out_tokens: int,
        error: dict[str, str] | None = None,
    ) -> None:
        spoken = presenter.spoken_ms
        heard, self._input_tokens = self._input_tokens, 0
        used = usage(heard, out_tokens, presenter.audio)
        for event in presenter.done(status, used, reason, error):
            await self.send(event)
        if params.conversation != "none":  # its items joined the conversation as they came
            for item in presenter.output:
                if item["type"] == "function_call":
                    self.conversation.dirty = True  # the engine's context has no calls
                elif presenter.audio:
                    self._spoken_ms[item["id"]] = spoken
        own_tools, own_options = rules.overrides(params)
        if own_tools:
            await self._apply_tools()
        if own_options:
            await self.runtime.step(self.session.set_options, rules.options(self.config))
        self.conversation.dirty = self.conversation.dirty or bool(params.instructions)

    async def _cancel(self, event: ResponseCancel) -> None:
        running = self._presenter if self._answering else None
        if running is None or (event.response_id and event.response_id != running.id):
            message = "no active response to cancel"
            raise ProtocolError("response_cancel_not_active", message, None, event.event_id)
        await self._cancel_response("client_cancelled")

    async def _cancel_response(self, reason: str) -> None:
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
