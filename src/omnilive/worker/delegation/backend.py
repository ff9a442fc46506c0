"""The ``responses`` delegation's backend, run by omnilive itself: any
OpenAI-compatible chat-completions server (``live.backend``) with the
session's backend model, instructions and function tools
(``delegation.responses``), answering from the conversation so far.

Its answer streams to the app as Responses streaming events, each shaped as
``openai.types.responses.ResponseStreamEvent`` (``response.created``,
``response.output_item.added``, ``response.output_text.delta`` / ``.done``,
``response.function_call_arguments.done``, ``response.output_item.done``,
``response.completed`` or ``response.failed``), wrapped by the session in
``response.event``. A function call waits for the app's output
(``response.item.create`` + ``response.create``); the text is what the live
model relays to the user.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from omnilive.engines.base import EngineError
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.remote_llm import RemoteChat
from omnilive.engines.messages import GenerationOptions, ToolCall, Tools
from omnilive.ids import mint
from omnilive.protocol.openai_live import FunctionChoice, ResponsesConfig

DEFAULT_INSTRUCTIONS = (
    "You are the backend of a voice assistant: do what the user asked, with your tools "
    "where they help, and answer in one or two short sentences that can be read out."
)
DEFAULT_MAX_TOKENS = 256
Emit = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class BackendAnswer:
    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    failed: str | None = None


class ResponseStream:
    """One backend response's Responses events, numbered in order."""

    def __init__(self, model: str) -> None:
        self.id = mint("resp", 12)
        self.model = model
        self.created_at = int(time.time())
        self._sequence = 0
        self.output: list[dict[str, Any]] = []
        self._message: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def snapshot(self, status: str, error: dict[str, str] | None = None) -> dict[str, Any]:
        """The response as lifecycle events show it: output, tools and input
        left out, as OpenAI's Live API does to keep them small."""
        response: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "model": self.model, "status": status, "output": [], "tools": [],
            "tool_choice": "auto", "parallel_tool_calls": False,
        }  # fmt: skip
        if error is not None:
            response["error"] = error
        return response

    def created(self) -> dict[str, Any]:
        return self._event("response.created", response=self.snapshot("in_progress"))

    def text(self, piece: str) -> list[dict[str, Any]]:
        events = []
        if self._message is None:
            self._message = {"id": mint("msg", 12), "type": "message", "role": "assistant",
                             "status": "in_progress", "content": [], "text": ""}  # fmt: skip
            self.output.append(self._message)
            item = {k: v for k, v in self._message.items() if k != "text"}
            events.append(self._added(item))
        self._message["text"] += piece
        events.append(
            self._event(
                "response.output_text.delta", item_id=self._message["id"],
                output_index=self.output.index(self._message), content_index=0,
                delta=piece, logprobs=[],
            )
        )  # fmt: skip
        return events

    def call(self, call: ToolCall) -> list[dict[str, Any]]:
        item = {"id": mint("fc", 12), "type": "function_call", "call_id": call.call_id,
                "name": call.name, "arguments": call.arguments, "status": "completed"}  # fmt: skip
        self.output.append(item)
        index = len(self.output) - 1
        return [
            self._added({**item, "arguments": "", "status": "in_progress"}),
            self._event(
                "response.function_call_arguments.done", item_id=item["id"],
                output_index=index, arguments=call.arguments, name=call.name,
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def _added(self, item: dict[str, Any]) -> dict[str, Any]:
        return self._event(
            "response.output_item.added", output_index=len(self.output) - 1, item=item
        )

    def done(self, failed: str | None = None) -> list[dict[str, Any]]:
        events = []
        message = self._message
        if message is not None:
            index = self.output.index(message)
            text = message["text"]
            events.append(
                self._event(
                    "response.output_text.done", item_id=message["id"], output_index=index,
                    content_index=0, text=text, logprobs=[],
                )
            )  # fmt: skip
            item = {**{k: v for k, v in message.items() if k != "text"}, "status": "completed"}
            item["content"] = [{"type": "output_text", "text": text, "annotations": []}]
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        if failed is not None:
            error = {"code": "server_error", "message": failed}
            events.append(self._event("response.failed", response=self.snapshot("failed", error)))
        else:
            events.append(self._event("response.completed", response=self.snapshot("completed")))
        return events


class ResponsesBackend:
    """The backend of one session: a server, the session's configuration."""

    def __init__(self, chat: RemoteChat, model_override: str = "") -> None:
        self.chat = chat
        self.model_override = model_override

    def messages(self, config: ResponsesConfig, history: list[Message]) -> list[Message]:
        return [Message("system", config.instructions or DEFAULT_INSTRUCTIONS), *history]

    async def answer(
        self, config: ResponsesConfig, history: list[Message], emit: Emit
    ) -> BackendAnswer:
        """One backend response to ``history``, streamed through ``emit``."""
        model = self.model_override or config.model
        stream = ResponseStream(model)
        await emit(stream.created())
        tools = Tools(tuple(f.model_dump(exclude_none=True) for f in config.functions()),
                      _choice(config))  # fmt: skip
        max_tokens = config.max_output_tokens or DEFAULT_MAX_TOKENS
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | ToolCall | BaseException | None] = asyncio.Queue(
            max_tokens + 64  # a token or a call each: bounded by the answer's own cap
        )

        def produce() -> None:
            try:
                prompt = self.chat.tokens(self.messages(config, history), tools)
                options = GenerationOptions(max_new_tokens=max_tokens, do_sample=False)
                for piece in self.chat.stream(prompt, options, max_tokens):
                    loop.call_soon_threadsafe(pieces.put_nowait, piece)
                loop.call_soon_threadsafe(pieces.put_nowait, None)
            except (EngineError, OSError, ValueError) as exc:  # the server's failure, told
                loop.call_soon_threadsafe(pieces.put_nowait, exc)

        answer = BackendAnswer()
        producer = asyncio.create_task(asyncio.to_thread(produce), name=f"backend-{stream.id}")
        try:
            while (piece := await pieces.get()) is not None:
                if isinstance(piece, BaseException):
                    answer.failed = str(piece)
                    break
                if isinstance(piece, ToolCall):
                    answer.calls.append(piece)
                    for event in stream.call(piece):
                        await emit(event)
                else:
                    answer.text += piece
                    for event in stream.text(piece):
                        await emit(event)
        finally:
            await asyncio.wait([producer])  # the thread runs to its end: its call cannot stop
        for event in stream.done(answer.failed):
            await emit(event)
        return answer


def _choice(config: ResponsesConfig) -> str:
    choice = config.tool_choice or "auto"
    if isinstance(choice, FunctionChoice):
        return f"function:{choice.name}"
    return choice


def call_output(item: dict[str, Any]) -> tuple[str, str] | None:
    """A ``function_call_output`` item's (call id, output text), else None."""
    if item.get("type") != "function_call_output" or not isinstance(item.get("call_id"), str):
        return None
    output = item.get("output")
    return item["call_id"], output if isinstance(output, str) else json.dumps(output)


def user_text(item: dict[str, Any]) -> str | None:
    """A user or developer ``message`` item's text, else None."""
    if item.get("type", "message") != "message" or item.get("role") not in ("user", "developer"):
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return None
