"""The engine seam: lanes of steps on an engine's loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import aclosing

import pytest

from omnilive.engines.base import Interruptible
from omnilive.engines.steps import StepLoop


@pytest.fixture
def steps() -> Iterator[StepLoop]:
    loop = StepLoop(1, name="test")
    yield loop
    loop.close()


async def test_a_lane_runs_its_steps_in_order_off_the_event_loop(steps: StepLoop):
    lane = steps.lane("s1")
    main = threading.get_ident()
    seen: list[tuple[int, int]] = []

    def step(n: int) -> int:
        seen.append((n, threading.get_ident()))
        time.sleep(0.01)
        return n * 10

    results = await asyncio.gather(*(lane.run(step, n) for n in range(5)))
    assert results == [0, 10, 20, 30, 40]
    assert [n for n, _ in seen] == list(range(5))
    assert all(thread != main for _, thread in seen)


async def test_errors_come_back_to_the_caller(steps: StepLoop):
    def boom() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await steps.lane("s").run(boom)


async def test_cancelling_drops_pending_steps_and_never_waits(steps: StepLoop):
    lane = steps.lane("s")
    release = threading.Event()
    ran: list[str] = []

    def slow() -> None:
        release.wait(5)
        ran.append("slow")

    def later() -> None:
        ran.append("later")

    running = asyncio.create_task(lane.run(slow))
    waiting = asyncio.create_task(lane.run(later))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    for task in (running, waiting):
        task.cancel()
    await asyncio.gather(running, waiting, return_exceptions=True)
    assert time.monotonic() - started < 0.5  # the caller did not wait for the step
    release.set()
    await asyncio.sleep(0.1)
    assert ran == ["slow"]  # the pending step was dropped


async def test_finish_runs_the_last_step_after_the_running_one_then_reports(steps: StepLoop):
    finished = asyncio.Event()
    lane = steps.lane("s", on_finished=finished.set)
    order: list[str] = []
    gate = threading.Event()
    running = asyncio.create_task(lane.run(lambda: (gate.wait(5), order.append("step"))))
    dropped = asyncio.create_task(lane.run(lambda: order.append("dropped")))
    await asyncio.sleep(0.05)
    lane.finish(lambda: order.append("close"))
    assert not finished.is_set()
    gate.set()
    await asyncio.wait_for(finished.wait(), 2)
    assert order == ["step", "close"]
    await running
    with pytest.raises(asyncio.CancelledError):
        await dropped
    with pytest.raises(RuntimeError):
        await lane.run(lambda: None)


async def test_two_lanes_share_one_thread_in_turn(steps: StepLoop):
    a, b = steps.lane("a"), steps.lane("b")
    active = threading.Lock()

    def exclusive(n: int) -> int:
        assert active.acquire(blocking=False), "two steps at once on one thread"
        time.sleep(0.01)
        active.release()
        return n

    assert await asyncio.gather(*(lane.run(exclusive, n) for n in range(4) for lane in (a, b)))


async def test_a_stream_runs_ahead_a_little_and_stops_when_left(steps: StepLoop):
    lane = steps.lane("s")
    produced: list[int] = []
    closed = threading.Event()

    def numbers() -> Iterator[int]:
        try:
            for n in range(100):
                produced.append(n)
                yield n
        finally:
            closed.set()

    got = []
    async for n in lane.stream(numbers):
        got.append(n)
        if n == 2:
            await asyncio.sleep(0.1)  # the producer may run ahead, boundedly
            assert len(produced) <= 3 + 4 + 1
            break
    assert got == [0, 1, 2]
    assert await asyncio.to_thread(closed.wait, 2)
    assert await lane.run(lambda: "next") == "next"  # the lane goes on


async def test_a_stream_raises_what_its_iterator_raised(steps: StepLoop):
    def failing() -> Iterator[int]:
        yield 1
        raise RuntimeError("mid-answer")

    lane = steps.lane("s")
    got = []
    with pytest.raises(RuntimeError, match="mid-answer"):
        async for n in lane.stream(failing):
            got.append(n)
    assert got == [1]


async def test_a_stream_whose_function_fails_before_any_item_raises_it(steps: StepLoop):
    """A plain function (not a generator) that raises when called: the reader
    gets its error instead of waiting forever."""

    def not_a_generator() -> Iterator[int]:
        raise ValueError("failed at the call")

    async def read() -> list[int]:
        return [item async for item in steps.lane("s1").stream(not_a_generator)]

    with pytest.raises(ValueError, match="failed at the call"):
        await asyncio.wait_for(read(), 5)


async def test_a_reader_leaving_interrupts_a_producer_waiting_inside_next(steps: StepLoop):
    """An engine's answer may be waiting inside ``next()`` for its next piece
    (a second of speech): leaving the stream interrupts it, so the engine's
    thread is free at once, not when that piece is done."""
    released = threading.Event()
    interrupts: list[int] = []
    closed = threading.Event()

    def pieces() -> Iterator[int]:
        try:
            yield 1
            released.wait(30)  # the next piece: long, unless interrupted
            if not interrupts:
                yield 2
        finally:
            closed.set()

    def interrupt() -> None:
        interrupts.append(threading.get_ident())
        released.set()

    lane = steps.lane("s")
    async with aclosing(lane.stream(lambda: Interruptible(pieces(), interrupt))) as items:
        async for n in items:  # the runners read answers so
            assert n == 1
            await asyncio.sleep(0.05)  # the producer is waiting for its next piece
            break
    assert interrupts == [threading.get_ident()]  # from the reader's side
    assert await asyncio.to_thread(closed.wait, 5)
    assert await asyncio.wait_for(lane.run(lambda: "next"), 5) == "next"


async def test_a_stream_read_to_its_end_is_not_interrupted(steps: StepLoop):
    interrupts: list[int] = []
    items = Interruptible(iter([1, 2, 3]), lambda: interrupts.append(1))
    got = [n async for n in steps.lane("s").stream(lambda: items)]
    assert got == [1, 2, 3]
    assert interrupts == []
