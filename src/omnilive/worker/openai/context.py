"""Which of a Realtime conversation's items the model still sees, without I/O.

An engine whose context outgrows its room lets its oldest turns go (the
session's ``truncation``) and says how many
(:attr:`~omnilive.engines.base.HalfDuplexBasics.history_dropped`), counted
in the turns it was given: each message of a written history, each speech
heard, each answer. :class:`ContextMirror` keeps those turns as the items
they came from, in the same order, so the count names the items; the
client hears of it in omnilive's ``omnilive.conversation.context``
(with ``omnilive_extensions``): the oldest item the model still sees, and
the items it let go since the last such event.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from omnilive.engines.messages import ChatMessage


class ContextMirror:
    """The engine's turns, each as the ids of the items it came from."""

    def __init__(self) -> None:
        # None: the engine holds what no item says (an out-of-band
        # response's own input) until the conversation is written again.
        self.turns: list[tuple[str, ...]] | None = []
        self.told: list[str] = []  # the items last said to be out of the context

    def replaced(self, messages: list[ChatMessage]) -> None:
        """The engine's context became ``messages`` (the instructions first,
        then one message per item)."""
        self.turns = [(m.item_id,) if m.item_id else () for m in messages[1:]]

    def turn(self, item_ids: tuple[str, ...]) -> None:
        """The engine heard, or answered with, one more turn: these items."""
        if self.turns is not None:
            self.turns.append(item_ids)

    def unknown(self) -> None:
        self.turns = None

    def changed(self, dropped: int | None, items: Container[str]) -> dict[str, Any] | None:
        """The event's fields when what the model sees differs from what
        was last told (None: no change, or nothing to go by). ``dropped``:
        the engine's count of turns let go; ``items``: the conversation's
        ids, since a deleted item is no longer anyone's to see."""
        if dropped is None or self.turns is None:
            return None
        gone = [i for turn in self.turns[:dropped] for i in turn if i in items]
        if gone == self.told:
            return None
        before, self.told = set(self.told), gone
        held = (i for turn in self.turns[dropped:] for i in turn if i in items)
        return {
            "oldest_item_id": next(held, None),
            "dropped_item_ids": [i for i in gone if i not in before],
            "dropped_items": len(gone),
        }
