"""What a half-duplex conversation's slot holds, entry by entry, and how a
conversation a client edited maps onto it (no torch, no I/O).

MiniCPM-o keeps its context as a KV cache, not as messages. To let a client
edit the conversation (the Realtime API's items: delete, truncate, insert,
tools), the view keeps a ledger: one :class:`Entry` per message in the slot,
with where it starts in the cache and the session's turn state just before
it. :func:`wanted` turns the client's messages into the entries the context
should hold, reusing the ledger's where they say the same thing (speech is
matched by its item id, or bound to the user item at its place the first
time); the view then crops the cache to the first entry that differs and
writes the rest again. Speech is written again as speech (the ledger keeps
the samples), so an edit never turns what the model heard into a
transcript.

Tools are written as the model's chat template writes them: in the system
message (``# Tools`` ... ``<tools>`` one JSON object a line ``</tools>``);
the model calls one as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(:class:`ToolCallScanner` reads those out of the answer's text).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnilive.engines.base import EngineError
from omnilive.engines.messages import ChatMessage, ToolCall, Tools

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

# The template's words around the tools, as the checkpoint's chat template has them.
_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass(eq=False)
class Entry:
    """One message in the slot. ``kind``: ``system`` (the instructions and
    tools), ``speech`` (a user's recording), ``user``, ``assistant``,
    ``tool`` (a call's output) or ``note`` (a later system message)."""

    kind: str
    text: str = ""
    calls: tuple[tuple[str, str], ...] = ()  # an assistant's (name, arguments)
    speech: np.ndarray | None = None
    item_id: str | None = None  # the client's item, once known
    # The client's turns it stands for (HalfDuplexBasics.history_dropped):
    # merged messages and the text-less ones after it that it holds nothing
    # of; the system entry's, those before the first message it holds.
    span: int = 1
    start: int = 0  # where it starts in the slot's cache
    state: dict[str, Any] = field(default_factory=dict)  # the turn state before it

    def says_the_same(self, other: Entry) -> bool:
        if self is other:
            return True
        if self.kind != other.kind or self.kind == "speech":
            return False
        return (self.text.strip(), self.calls) == (other.text.strip(), other.calls)


def tools_block(tools: Tools) -> str:
    """What the system message gains for ``tools`` ("" for none), as the
    chat template renders OpenAI's function tools."""
    if not tools.offered:
        return ""
    lines = [json.dumps(_chat_tool(f), ensure_ascii=False) for f in tools.functions]
    block = _TOOLS_HEAD + "".join("\n" + line for line in lines) + _TOOLS_TAIL
    if tools.choice == "required":
        block += "\n\nCall one of these functions now."
    elif tools.choice.startswith("function:"):
        block += f"\n\nCall the function {tools.choice.removeprefix('function:')} now."
    return block


def system_text(instructions: str, tools: Tools) -> str:
    """The first system message's text: the instructions, then the tools."""
    block = tools_block(tools)
    if not block:
        return instructions
    return f"{instructions}\n\n{block}" if instructions else block


def _chat_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A Realtime API function tool (flat: name, description, parameters) in
    the chat-completions shape the model was trained on."""
    if "function" in function:
        return {"type": "function", "function": function["function"]}
    body = {k: v for k, v in function.items() if k != "type" and v is not None}
    return {"type": "function", "function": body}


def call_text(calls: tuple[tuple[str, str], ...]) -> str:
    """An assistant's calls as the template writes them after its text."""
    return "\n".join(
        f'{CALL_OPEN}\n{{"name": "{name}", "arguments": {arguments or "{}"}}}\n{CALL_CLOSE}'
        for name, arguments in calls
    )


def wanted(ledger: list[Entry], system: str, messages: list[ChatMessage]) -> list[Entry]:
    """The entries the context should hold for ``messages`` (the engine's
    messages, system first, as :func:`omnilive.worker.openai.items.messages_of`
    makes them) under the system text ``system``: the ledger's own entries
    wherever they say the same thing at the same place, new ones after."""
    spoken = {e.item_id: e for e in ledger if e.kind == "speech" and e.item_id}
    first = Entry("system", system)
    out = [ledger[0] if ledger and ledger[0].says_the_same(first) else first]
    out[0].span = 0
    history = messages[1:] if messages and messages[0].role == "system" else messages
    for message, count in _merged(history):
        place = ledger[len(out)] if len(out) < len(ledger) else None
        entry = _entry_of(message, place, spoken)
        if entry is None:
            out[-1].span += count
            continue
        entry = place if place is not None and place.says_the_same(entry) else entry
        entry.span = count
        out.append(entry)
    return out


def _entry_of(message: ChatMessage, place: Entry | None, spoken: dict[str, Entry]) -> Entry | None:
    if message.role == "user":
        if message.item_id is not None and message.item_id in spoken:
            return spoken[message.item_id]
        if place is not None and place.kind == "speech" and place.item_id is None:
            place.item_id = message.item_id  # the recording this item stands for
            return place
        return Entry("user", message.text) if message.text.strip() else None
    if message.role == "assistant":
        calls = tuple((c.name, c.arguments) for c in message.tool_calls)
        if not message.text.strip() and not calls:
            return None
        return Entry("assistant", message.text, calls)
    if message.role == "tool":
        return Entry("tool", message.text)
    return Entry("note", message.text) if message.text.strip() else None


def _merged(messages: list[ChatMessage]) -> list[tuple[ChatMessage, int]]:
    """Consecutive assistant messages as one (the template writes an answer's
    text and its calls as one message), each with how many it stands for."""
    out: list[tuple[ChatMessage, int]] = []
    for message in messages:
        last, count = out[-1] if out else (None, 0)
        if last is not None and last.role == message.role == "assistant":
            parts = last.parts + message.parts
            calls = last.tool_calls + message.tool_calls
            out[-1] = (ChatMessage("assistant", parts, tool_calls=calls), count + 1)
        else:
            out.append((message, 1))
    return out


def first_difference(ledger: list[Entry], entries: list[Entry]) -> int:
    """How many leading entries the ledger and ``entries`` share."""
    same = 0
    for old, new in zip(ledger, entries, strict=False):
        if old is not new:
            break
        same += 1
    return same


class ToolCallScanner:
    """Reads an answer's text as it streams: what is said passes through,
    ``<tool_call>{json}</tool_call>`` becomes a :class:`ToolCall`. A call that
    is not JSON with a ``name`` is an :class:`EngineError` (the session says
    so; nothing is dropped silently)."""

    def __init__(self) -> None:
        self._held = ""  # text that may be the start of a call's opening
        self._call: str | None = None  # a call's text so far, while inside one
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """What of ``text`` is said, and the calls it completed."""
        self._held += text
        said, made = "", []
        while self._held:
            if self._call is not None:
                end = self._held.find(CALL_CLOSE)
                if end < 0:
                    self._call += self._held
                    self._held = ""
                    break
                made.append(self._parse(self._call + self._held[:end]))
                self._held = self._held[end + len(CALL_CLOSE) :]
                self._call = None
                continue
            start = self._held.find(CALL_OPEN)
            if start >= 0:
                said += self._held[:start]
                self._held = self._held[start + len(CALL_OPEN) :]
                self._call = ""
                continue
            keep = _partial_suffix(self._held, CALL_OPEN)
            said += self._held[: len(self._held) - keep]
            self._held = self._held[len(self._held) - keep :]
            break
        self.calls += made
        return said, made

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The answer ended: a call left open is parsed as it stands (the
        model stopped before its closing tag)."""
        if self._call is not None:
            call, self._call = self._call + self._held, None
            self._held = ""
            made = [self._parse(call)]
            self.calls += made
            return "", made
        said, self._held = self._held, ""
        return said, []

    @staticmethod
    def _parse(text: str) -> ToolCall:
        try:
            body = json.loads(text.strip())
        except ValueError:
            raise EngineError(f"the model's tool call is not JSON: {text.strip()[:200]}") from None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise EngineError(f"the model's tool call names no function: {text.strip()[:200]}")
        arguments = body.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise EngineError(
                    f"the model's tool call arguments are not JSON: {arguments[:200]}"
                ) from None
        encoded = json.dumps(arguments, ensure_ascii=False)
        return ToolCall(f"call_{secrets.token_hex(8)}", body["name"], encoded)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that begins ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
