"""The cascade's language model as any OpenAI-compatible chat-completions
server (``cascade.llm.url``): vLLM, llama.cpp's or llama-cpp-python's
server, Ollama, a hosted API.

It stands where :class:`~omnilive.engines.cascade.llm.LlamaChat` does: a
"prompt" is the messages themselves (with the tools offered), token counts
are estimates (the server tokenizes), and :meth:`stream` yields the answer's
text as the server streams it, and each tool call, whole, once its
arguments are complete. Tools go to the server natively (``tools``,
``tool_choice``); a call it streams that cannot be read is an
:class:`EngineError`, which the session reports, never a silent drop.

A stream is finished only when the server says so (a ``finish_reason``, or
``[DONE]``): one that ends without it broke (llama-cpp-python's server
answers 200, then fails, when it cannot stream what it was asked), and the
answer fails rather than passing for an empty one. Servers that cannot
stream an answer whose tool choice is ``auto`` are asked for it whole
(``cascade.llm.stream_auto_tools = false``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from omnilive.engines.base import EngineError, EngineUnavailable
from omnilive.engines.cascade.llm import Message
from omnilive.engines.messages import GenerationOptions, ToolCall, Tools

log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 4  # for fitting a conversation: the server's tokenizer is not at hand


@dataclass(frozen=True)
class RemotePrompt:
    messages: list[Message]
    tools: Tools = field(default_factory=Tools)


def tool_choice(tools: Tools) -> Any:
    if tools.choice.startswith("function:"):
        return {"type": "function", "function": {"name": tools.choice.removeprefix("function:")}}
    return tools.choice


class RemoteChat:
    """An OpenAI-compatible server as the cascade's language model."""

    build_plan = None
    last_reused = 0
    supports_tools = True

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None,
        n_ctx: int,
        timeout_s: float,
        stream_auto_tools: bool = True,
        temperature: float | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.n_ctx = n_ctx
        self.stream_auto_tools = stream_auto_tools
        self.temperature = temperature  # the server's own, over the session's
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=timeout_s)

    @classmethod
    def from_settings(cls, settings: Any) -> RemoteChat:
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        return cls(
            settings.url,
            settings.model,
            key,
            settings.n_ctx,
            settings.timeout_s,
            settings.stream_auto_tools,
            settings.temperature,
        )

    def load(self) -> None:
        """The server must answer, and serve the model named (or any, if none is)."""
        try:
            answer = self._client.get(f"{self.url}/models")
            answer.raise_for_status()
            models = [m.get("id") for m in answer.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise EngineUnavailable(f"language model server {self.url}: {exc}") from None
        if not self.model and models:
            self.model = models[0]
        log.info("cascade language model: %s at %s", self.model, self.url)

    def close(self) -> None:
        self._client.close()

    def clear_cache(self) -> None:
        """Nothing is cached here."""

    def tokens(self, messages: list[Message], tools: Tools | None = None) -> RemotePrompt:
        return RemotePrompt(list(messages), tools or Tools())

    def count(self, messages: list[Message]) -> int:
        return sum(len(m.content) // CHARS_PER_TOKEN + 4 for m in messages)

    def stream(
        self, prompt: RemotePrompt, options: GenerationOptions, max_tokens: int
    ) -> Iterator[str | ToolCall]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.as_dict() for m in prompt.messages],
            "max_tokens": max_tokens,
            "temperature": self._temperature(options),
            "top_p": options.top_p,
            "stream": True,
        }
        if prompt.tools.offered:
            body["tools"] = [_tool(f) for f in prompt.tools.functions]
            body["tool_choice"] = tool_choice(prompt.tools)
            if prompt.tools.choice == "auto" and not self.stream_auto_tools:
                yield from self._whole(body)
                return
        calls: dict[int, dict[str, str]] = {}
        finished = False
        try:
            with self._client.stream("POST", f"{self.url}/chat/completions", json=body) as answer:
                _check_status(answer)
                for line in answer.iter_lines():
                    event = _event(line)
                    if event is None:
                        continue
                    if event is _DONE:
                        finished = True
                        break
                    choice = _choice(event)
                    finished = finished or bool(choice.get("finish_reason"))
                    delta = choice.get("delta")
                    if not isinstance(delta, dict):
                        continue
                    if delta.get("content"):
                        yield delta["content"]
                    for call in delta.get("tool_calls") or []:
                        _gather(calls, call)
        except httpx.HTTPError as exc:
            raise EngineError(f"language model server: {exc}") from None
        if not finished:
            raise EngineError(_UNFINISHED + _hint(prompt.tools))
        for index in sorted(calls):
            yield _finished(calls[index])

    def _temperature(self, options: GenerationOptions) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if options.greedy else options.temperature

    def _whole(self, body: dict[str, Any]) -> Iterator[str | ToolCall]:
        """The answer asked for in one piece: its text, then its calls."""
        try:
            answer = self._client.post(
                f"{self.url}/chat/completions", json={**body, "stream": False}
            )
            _check_status(answer)
            message = _choice(answer.json()).get("message")
        except httpx.HTTPError as exc:
            raise EngineError(f"language model server: {exc}") from None
        except ValueError:
            raise EngineError(f"language model server: not JSON: {answer.text[:200]}") from None
        if not isinstance(message, dict):
            raise EngineError(f"language model server: no message in {answer.text[:200]}")
        if message.get("content"):
            yield message["content"]
        for index, call in enumerate(message.get("tool_calls") or []):
            calls: dict[int, dict[str, str]] = {}
            _gather(calls, {**call, "index": index})
            yield _finished(calls[index])


def _tool(function: dict[str, Any]) -> dict[str, Any]:
    spec = {k: v for k, v in function.items() if k in ("name", "description", "parameters")}
    spec.setdefault("parameters", {"type": "object", "properties": {}})
    return {"type": "function", "function": spec}


_DONE: dict[str, Any] = {}  # the stream's own end, ``data: [DONE]``
_UNFINISHED = "the language model server ended its answer without finishing it"


def _hint(tools: Tools) -> str:
    if tools.offered and tools.choice == "auto":
        return (
            " (a server that cannot stream an answer with tool_choice auto, as "
            "llama-cpp-python's chatml-function-calling, needs cascade.llm.stream_auto_tools "
            "= false)"
        )
    return ""


def _check_status(answer: httpx.Response) -> None:
    if answer.status_code != 200:
        answer.read()
        raise EngineError(f"language model server: {answer.status_code} {answer.text[:300]}")


def _event(line: str) -> dict[str, Any] | None:
    """One server-sent event line as its JSON object (:data:`_DONE` for the
    end, None for lines that are no data); an ``error`` the server streams
    instead of an answer is an :class:`EngineError` with its message."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return _DONE
    try:
        event = json.loads(data)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise EngineError(f"language model server sent an unreadable event: {data[:200]}")
    if event.get("error"):
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise EngineError(f"language model server: {str(message)[:300]}")
    return event


def _choice(event: Any) -> dict[str, Any]:
    """The first choice of a completion (or of one chunk of it); {} if none."""
    choices = event.get("choices") if isinstance(event, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else {}


def _gather(calls: dict[int, dict[str, str]], piece: dict[str, Any]) -> None:
    """Add one streamed piece of a tool call (OpenAI streams name and id
    once, then the arguments in fragments)."""
    index = piece.get("index", 0)
    call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
    function = piece.get("function") or {}
    call["id"] = piece.get("id") or call["id"]
    call["name"] = function.get("name") or call["name"]
    call["arguments"] += function.get("arguments") or ""


def _finished(call: dict[str, str]) -> ToolCall:
    if not call["name"]:
        raise EngineError("the language model made a tool call without a name")
    arguments = call["arguments"] or "{}"
    try:
        json.loads(arguments)
    except ValueError:
        raise EngineError(f"the tool call's arguments are not JSON: {arguments[:200]}") from None
    return ToolCall(call["id"] or f"call_{abs(hash(arguments)) % 10**12}", call["name"], arguments)
