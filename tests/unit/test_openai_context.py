"""Which items the model still sees (``omnilive.conversation.context``):
the engine's count of turns let go, named by the items each turn came from."""

from __future__ import annotations

import pytest

from omnilive.engines.messages import ChatMessage, TextPart
from omnilive.worker.openai.context import ContextMirror

pytestmark = pytest.mark.fast


def history(*ids: str) -> list[ChatMessage]:
    system = ChatMessage("system", (TextPart("Be brief."),))
    return [system, *(ChatMessage("user", (TextPart(i),), item_id=i) for i in ids)]


def test_the_count_names_the_oldest_items_and_each_change_is_told_once():
    mirror = ContextMirror()
    mirror.replaced(history("a", "b"))
    mirror.turn(("c",))  # speech heard
    mirror.turn(("d", "e"))  # an answer: a message and a call
    items = {"a", "b", "c", "d", "e"}
    assert mirror.changed(0, items) is None  # nothing left: nothing to tell
    told = mirror.changed(3, items)
    assert told == {"oldest_item_id": "d", "dropped_item_ids": ["a", "b", "c"], "dropped_items": 3}
    assert mirror.changed(3, items) is None  # told already
    assert mirror.changed(4, items) == {
        "oldest_item_id": None, "dropped_item_ids": ["d", "e"], "dropped_items": 5}  # fmt: skip
    mirror.replaced(history("b", "c", "d", "e"))  # "a" deleted; the rest written again
    assert mirror.changed(1, items - {"a"}) == {
        "oldest_item_id": "c", "dropped_item_ids": [], "dropped_items": 1}  # fmt: skip


def test_nothing_is_told_without_a_count_or_while_the_context_is_not_the_items():
    mirror = ContextMirror()
    mirror.replaced(history("a", "b"))
    assert mirror.changed(None, {"a", "b"}) is None  # the engine does not say
    mirror.unknown()  # an out-of-band response's own input
    mirror.turn(("c",))
    assert mirror.changed(2, {"a", "b", "c"}) is None
    mirror.replaced(history("a", "b", "c"))
    assert mirror.changed(1, {"a", "b", "c"})["dropped_item_ids"] == ["a"]
