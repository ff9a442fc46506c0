"""A chat or half-duplex conversation that outgrows its slot: its oldest
whole turns leave the context, the system prompt and the last turn stay.

A turn starts where a user message opens a new exchange. Its span in the
slot starts after the closing tokens of the message before it (the previous
answer's ``<|tts_eos|><|im_end|>``, which its prompt carries first), so
dropping the spans of the oldest turns leaves a context that reads as if
they had never been: the system prompt, closed, then the first kept user
message. The positions go with
:func:`~omnilive.engines.minicpmo.runtime.cache_edits.drop_positions`, which
re-rotates the keys that stay, as the duplex window does: nothing kept is
written again, and the turns kept keep their speech and images as heard.

The kept turns' cached keys and values were computed while the dropped
turns were there to attend to; what they say is kept, and the next messages
attend only to what stays (the model code's own duplex window makes the same
trade).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omnilive.engines.minicpmo.runtime.cache_edits import drop_positions
from omnilive.engines.minicpmo.runtime.loop import BatchLoop

# (first dropped turn's start, first kept turn's old start, positions dropped)
SlideListener = Callable[[int, int, int], None]


@dataclass(frozen=True)
class Turn:
    """Where a turn starts: ``start`` the context's length before its
    prompt, ``closing`` the closing tokens that prompt opens with (the
    message before), ``state`` the session's turn state then."""

    start: int
    closing: int
    state: dict[str, Any]


class TurnWindow:
    """The turns of one slot's conversation, and the slides that keep it in
    its context."""

    def __init__(self, loop: BatchLoop, slot: int, theta: float) -> None:
        self.loop = loop
        self.slot = slot
        self.theta = theta
        self.turns: list[Turn] = []
        self.dropped_turns = 0
        self.dropped_positions = 0
        self.listener: SlideListener | None = None

    def opened(self, turn: Turn) -> None:
        self.turns.append(turn)

    def cropped(self, length: int) -> None:
        """The context was cut back to ``length``: the turns after it are gone."""
        self.turns = [turn for turn in self.turns if turn.start < length]

    async def make_room(self, need: int, length: int) -> int:
        """Drop the fewest oldest turns of a context ``length`` long that free
        ``need`` positions (as many as may go when none free enough; the
        last turn in the context stays); the positions dropped."""
        held = [turn for turn in self.turns if turn.start < length]  # not one being written
        if len(held) < 2:
            return 0
        first = held[0]
        begin = first.start + first.closing
        kept = held[1]
        for kept in held[1:]:
            if kept.start + kept.closing - begin >= need:
                break
        dropped = kept.start + kept.closing - begin
        cache = self.loop.steps.cache
        await self.loop.call(
            drop_positions, cache, self.slot, begin, dropped, self.theta, slot=self.slot
        )
        index = self.turns.index(kept)
        # The first kept turn now follows what the first dropped one followed.
        moved = dataclasses.replace(
            kept, start=first.start, closing=first.closing, state=first.state
        )
        later = [dataclasses.replace(t, start=t.start - dropped) for t in self.turns[index + 1 :]]
        self.turns = [moved, *later]
        self.dropped_turns += index
        self.dropped_positions += dropped
        if self.listener is not None:
            self.listener(first.start, kept.start, dropped)
        return dropped
