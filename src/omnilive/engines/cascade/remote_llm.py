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
        self, url: str, model: str, api_key: str | None, n_ctx: int, timeout_s: float
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.n_ctx = n_ctx
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=timeout_s)

    @classmethod
    def from_settings(cls, settings: Any) -> RemoteChat:
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        return cls(settings.url, settings.model, key, settings.n_ctx, settings.timeout_s)

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
            "temperature": 0.0 if options.greedy else options.temperature,
            "top_p": options.top_p,
            "stream": True,
        }
        if prompt.tools.offered:
            body["tools"] = [_tool(f) for f in prompt.tools.functions]
            body["tool_choice"] = tool_choice(prompt.tools)
        calls: dict[int, dict[str, str]] = {}
        try:
            with self._client.stream("POST", f"{self.url}/chat/completions", json=body) as answer:
                if answer.status_code != 200:
                    answer.read()
                    raise EngineError(
                        f"language model server: {answer.status_code} {answer.text[:300]}"
                    )
                for line in answer.iter_lines():
                    delta = _delta(line)
                    if delta is None:
                        continue
                    if delta.get("content"):
                        yield delta["content"]
                    for call in delta.get("tool_calls") or []:
                        _gather(calls, call)
        except httpx.HTTPError as exc:
            raise EngineError(f"language model server: {exc}") from None
        for index in sorted(calls):
            yield _finished(calls[index])


def _tool(function: dict[str, Any]) -> dict[str, Any]:
    spec = {k: v for k, v in function.items() if k in ("name", "description", "parameters")}
    spec.setdefault("parameters", {"type": "object", "properties": {}})
    return {"type": "function", "function": spec}


def _delta(line: str) -> dict[str, Any] | None:
    """The ``delta`` of one server-sent event line (None for others)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return None
    try:
        choices = json.loads(data).get("choices") or []
    except (ValueError, AttributeError):
        raise EngineError(f"language model server sent an unreadable event: {data[:200]}") from None
    delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
    return delta if isinstance(delta, dict) else None


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
