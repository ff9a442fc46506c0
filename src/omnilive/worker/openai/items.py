"""A Realtime session's conversation: its items in order, without I/O.

Items are kept in the OpenAI Realtime API's item shape (the only dialect
that has items): user, assistant and system messages, function calls and
their outputs. :meth:`Conversation.messages` turns them into the engine's
chat messages, speech as its transcript. Every edit says whether the
engine's own context has to be replaced (``dirty``).
"""

from __future__ import annotations

from typing import Any

from omnilive.engines.messages import ChatMessage, TextPart, ToolCall
from omnilive.protocol.common import ProtocolError

Item = dict[str, Any]
MAX_ITEMS = 4096


def conversation_full(event_id: str | None) -> ProtocolError:
    message = f"the conversation holds its {MAX_ITEMS} items: delete some to add more"
    return ProtocolError("conversation_full", message, None, event_id)


def _not_found(item_id: str, event_id: str | None) -> ProtocolError:
    message = f"no item with id {item_id[:64]!r} in the conversation"
    return ProtocolError("item_not_found", message, "item_id", event_id)


class Conversation:
    def __init__(self) -> None:
        self.items: dict[str, Item] = {}
        self.dirty = False  # edited since the engine last saw it

    @property
    def last_id(self) -> str | None:
        return next(reversed(self.items), None)

    @property
    def full(self) -> bool:
        return len(self.items) >= MAX_ITEMS

    def add(
        self,
        item: Item,
        previous_item_id: str | None = None,
        event_id: str | None = None,
        answer: bool = False,
    ) -> str | None:
        """Insert ``item`` after ``previous_item_id`` (at the end when None;
        ``"root"``: first); returns the id it follows. A full conversation
        takes no more items from the client (``conversation_full``; the
        session goes on, and deleting items makes room); an ``answer``'s own
        items, of a response that began with room, still join it."""
        if item["id"] in self.items:
            raise ProtocolError(
                "item_already_exists", f"item {item['id']!r} exists", "item.id", event_id
            )
        if self.full and not answer:
            raise conversation_full(event_id)
        if previous_item_id is None:
            after = self.last_id
            self.items[item["id"]] = item
            return after
        if previous_item_id != "root" and previous_item_id not in self.items:
            raise _not_found(previous_item_id, event_id)
        order = list(self.items.items())
        at = 0 if previous_item_id == "root" else [k for k, _ in order].index(previous_item_id) + 1
        order.insert(at, (item["id"], item))
        self.items = dict(order)
        self.dirty = True
        return None if previous_item_id == "root" else previous_item_id

    def get(self, item_id: str, event_id: str | None = None) -> Item:
        item = self.items.get(item_id)
        if item is None:
            raise _not_found(item_id, event_id)
        return item

    def delete(self, item_id: str, event_id: str | None = None) -> None:
        self.get(item_id, event_id)
        del self.items[item_id]
        self.dirty = True

    def truncate(
        self,
        item_id: str,
        content_index: int,
        audio_end_ms: int,
        spoken_ms: float,
        event_id: str | None = None,
    ) -> None:
        """Cut an assistant's spoken answer to what the user heard: its
        transcript keeps the share of words that ``audio_end_ms`` of its
        ``spoken_ms`` covered."""
        item = self.get(item_id, event_id)
        content = item.get("content") or []
        if item.get("role") != "assistant" or content_index >= len(content):
            message = "only an assistant message's content can be truncated"
            raise ProtocolError("invalid_value", message, "content_index", event_id)
        part = content[content_index]
        if part.get("type") != "output_audio":
            raise ProtocolError(
                "invalid_value", "that content has no audio", "content_index", event_id
            )
        if audio_end_ms > spoken_ms + 1:
            message = f"audio_end_ms {audio_end_ms} is past the audio's {spoken_ms:.0f} ms"
            raise ProtocolError("invalid_value", message, "audio_end_ms", event_id)
        words = (part.get("transcript") or "").split()
        share = audio_end_ms / spoken_ms if spoken_ms else 0.0
        part["transcript"] = " ".join(words[: round(len(words) * share)])
        self.dirty = True

    def messages(self, instructions: str) -> list[ChatMessage]:
        """The conversation as the engine's messages, the instructions first."""
        return messages_of(instructions, list(self.items.values()))


def messages_of(instructions: str, items: list[Item]) -> list[ChatMessage]:
    """Items as the engine's messages, the instructions first; speech as its
    transcript. A message with no text (speech not transcribed) is an empty
    message with its item id: an engine that keeps the speech itself
    (MiniCPM-o) knows it by that id; the others skip it."""
    out = [ChatMessage("system", (TextPart(instructions),))]
    out.extend(_message_of(item) for item in items)
    return out


def text_of(item: Item) -> str:
    pieces = []
    for part in item.get("content") or []:
        piece = part.get("text") if part.get("text") is not None else part.get("transcript")
        if piece:
            pieces.append(piece)
    return " ".join(pieces)


def _message_of(item: Item) -> ChatMessage:
    kind = item["type"]
    if kind == "function_call":
        call = ToolCall(
            item.get("call_id") or item["id"], item["name"], item.get("arguments") or ""
        )
        return ChatMessage("assistant", (), tool_calls=(call,), item_id=item["id"])
    if kind == "function_call_output":
        output = (TextPart(item["output"]),)
        return ChatMessage("tool", output, tool_call_id=item["call_id"], item_id=item["id"])
    text = text_of(item)
    parts = (TextPart(text),) if text else ()
    return ChatMessage(item["role"], parts, item_id=item["id"])


def client_item(item: dict[str, Any], new_id: str) -> Item:
    """A client's item as the conversation keeps it: with an id, its
    content in the server's shape (``input_audio`` keeps no audio)."""
    kept = {k: v for k, v in item.items() if v is not None}
    kept["id"] = kept.get("id") or new_id
    kept["object"] = "realtime.item"
    kept["status"] = "completed"
    if "content" in kept:
        kept["content"] = [
            {k: v for k, v in part.items() if k != "audio" and v is not None}
            for part in kept["content"]
        ]
    return kept
