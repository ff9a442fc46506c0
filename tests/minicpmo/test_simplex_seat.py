"""The simplex seat of a slots engine (sessions/views.py: SeatedChat): one chat or
half-duplex session at a time beside the duplex slots. Opening a view must
never wait for the seat (views are opened on the worker's event loop, which
must stay free to close the previous holder); the first step waits for it.

The model here is a stand-in with the two things a seated view uses: the
seat and a way to run a step (on the caller's thread instead of a side lane).
The views' steps are coroutines the worker awaits on its event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.messages import ChatMessage, ChatOptions, TextPart
from omnilive.engines.minicpmo.sessions import views as slots
from omnilive.engines.minicpmo.sessions.views import SeatedChat
from omnilive.engines.sync_views import SyncChatSession

WAIT_S = 5.0
HELLO = [ChatMessage("user", (TextPart("Hello."),))]


class SeatModel:
    def __init__(self) -> None:
        self.seat = threading.Semaphore(1)
        self.steps: list[str] = []

    async def on_side_lane(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.steps.append(getattr(fn, "__name__", "step"))
        return fn(*args)

    def on_side_lane_nowait(self, fn: Callable[[], Any]) -> None:
        self.steps.append(getattr(fn, "__name__", "step"))
        fn()


class CountingChat(SyncChatSession):
    """Answers ``words`` chunks; records its close."""

    def __init__(self, words: int = 3) -> None:
        self.words = words
        self.closed = False

    def prefill(self, messages: list[ChatMessage], options: ChatOptions) -> int:
        return len(messages)

    def generate(self) -> Iterator[Any]:
        yield from range(self.words)

    def close(self) -> None:
        self.closed = True


async def test_opening_a_view_while_the_seat_is_held_does_not_wait_and_its_first_step_does():
    model = SeatModel()
    first_inner = CountingChat()
    first = SeatedChat(model, first_inner)  # type: ignore[arg-type]
    assert await first.prefill(HELLO, ChatOptions()) == 1
    answer = first.generate()
    assert await anext(answer) == 0  # mid-answer: the seat is held

    second = SeatedChat(model, CountingChat())  # type: ignore[arg-type]  # opened at once
    prefill = asyncio.create_task(second.prefill(HELLO, ChatOptions()), name="second")
    await asyncio.sleep(0.3)
    assert not prefill.done(), "the second chat stepped while the first held the seat"

    await answer.aclose()  # the first client left mid-answer
    first.close()
    assert await asyncio.wait_for(prefill, WAIT_S) == 1
    assert [item async for item in second.generate()] == [0, 1, 2]
    assert first_inner.closed
    second.close()
    assert model.seat.acquire(blocking=False), "the seat was not given back"


async def test_a_view_closed_before_any_step_never_takes_the_seat_and_refuses_steps():
    model = SeatModel()
    inner = CountingChat()
    chat = SeatedChat(model, inner)  # type: ignore[arg-type]
    chat.close()

    assert model.steps == []  # nothing ran, not even the inner close
    assert model.seat.acquire(blocking=False)
    model.seat.release()
    with pytest.raises(EngineError, match="closed"):
        await chat.prefill(HELLO, ChatOptions())


async def test_a_seat_held_too_long_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(slots, "SEAT_WAIT_S", 0.05)
    model = SeatModel()
    holder = SeatedChat(model, CountingChat())  # type: ignore[arg-type]
    await holder.prefill(HELLO, ChatOptions())

    waiting = SeatedChat(model, CountingChat())  # type: ignore[arg-type]
    with pytest.raises(EngineError, match="simplex seat"):
        await waiting.prefill(HELLO, ChatOptions())
    holder.close()
    assert await waiting.prefill(HELLO, ChatOptions()) == 1  # free again: it goes on
    waiting.close()
