"""The side lane (runtime/lanes.py) on the CPU: one worker thread beside the event
loop, running calls one at a time in submission order. What its queue
guarantees (dropping, gathering, settling) is tested once, in
tests/unit/test_job_queue.py; here, what the lane adds.

Where a test needs calls waiting behind a running one, it holds the lane in a
first call blocked on a :class:`threading.Event`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest
import torch

from omnilive.engines.minicpmo.runtime.lanes import SideLane

WAIT_S = 5.0
T = TypeVar("T")


@pytest.fixture
async def lane() -> AsyncIterator[SideLane]:
    lane = SideLane(torch.device("cpu"), name="test-side")
    yield lane
    lane.close()
    lane.thread.join(WAIT_S)


async def hold(lane: SideLane) -> tuple[asyncio.Task[str], threading.Event]:
    """A call that occupies the lane until the returned event is set (it has
    started once this returns)."""
    entered, release = threading.Event(), threading.Event()

    def blocker() -> str:
        entered.set()
        release.wait(WAIT_S)
        return "released"

    task = asyncio.create_task(lane.call(blocker))
    assert await asyncio.to_thread(entered.wait, WAIT_S), "the lane never started the call"
    return task, release


async def queued_together(lane: SideLane, calls: list[Coroutine[Any, Any, T]]) -> list[Any]:
    """``calls`` (the lane's coroutines) all queued behind a held call before
    the lane goes on; their futures, once the held call has ended."""
    running, release = await hold(lane)
    futures = [asyncio.create_task(call) for call in calls]
    await asyncio.sleep(0)  # all queued behind the held call
    release.set()
    assert await running == "released"
    return futures


async def test_calls_run_in_submission_order_on_one_thread_off_the_loop(lane: SideLane):
    ran: list[tuple[int, int]] = []

    def record(index: int) -> int:
        time.sleep(0.001 * (index % 3))  # uneven lengths: order is not left to timing
        ran.append((index, threading.get_ident()))
        return index * index

    results = await asyncio.gather(*(lane.call(record, index) for index in range(12)))

    assert results == [index * index for index in range(12)]
    assert [index for index, _ in ran] == list(range(12))
    threads = {ident for _, ident in ran}
    assert len(threads) == 1
    assert threads != {threading.get_ident()}  # not the event loop's thread
    assert threads == {lane.thread.ident}


async def test_an_error_reaches_the_caller_and_the_lane_goes_on(lane: SideLane):
    def broken(value: int) -> int:
        raise ValueError(f"no good: {value}")

    with pytest.raises(ValueError, match="no good: 7"):
        await lane.call(broken, 7)

    assert await lane.call(lambda a, b: a + b, 2, 3) == 5
    assert lane.thread.is_alive()


async def test_a_call_cancelled_while_it_runs_finishes_and_the_lane_goes_on(lane: SideLane):
    running, release = await hold(lane)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    release.set()

    assert await lane.call(lambda: "next") == "next"
    assert lane.busy_count["blocker"] == 1


async def test_busy_time_and_count_are_kept_per_function_name(lane: SideLane):
    def short() -> None:
        time.sleep(0.002)

    def longer() -> None:
        time.sleep(0.03)

    for _ in range(3):
        await lane.call(short)
    await lane.call(longer)

    assert lane.busy_count == {"short": 3, "longer": 1}
    assert set(lane.busy_s) == {"short", "longer"}
    assert 0.006 <= lane.busy_s["short"] < lane.busy_s["longer"]
    assert lane.busy_s["longer"] >= 0.03


async def test_after_close_calls_are_refused_and_the_thread_ends(lane: SideLane):
    assert await lane.call(lambda: 1) == 1
    lane.close()
    with pytest.raises(RuntimeError, match="closed"):
        await lane.call(lambda: 2)
    lane.thread.join(WAIT_S)
    assert not lane.thread.is_alive()


# --- gathered calls -----------------------------------------------------------------------


async def test_gathered_calls_waiting_together_run_as_one_call_each_with_its_result(
    lane: SideLane,
):
    calls: list[list[int]] = []

    def squares(items: list[int]) -> list[int]:
        calls.append(list(items))
        return [item * item for item in items]

    plain, *gathered = await queued_together(
        lane, [lane.call(lambda: "plain"), *(lane.gather("sq", squares, k) for k in range(5))]
    )

    assert await asyncio.gather(*gathered) == [0, 1, 4, 9, 16]
    assert await plain == "plain"
    assert calls == [[0, 1, 2, 3, 4]]
    assert lane.gathered == {5: 1}
    assert lane.busy_count["sq"] == 1


async def test_a_gathered_error_reaches_every_caller_and_a_short_answer_is_an_error(
    lane: SideLane,
):
    def broken(items: list[int]) -> list[int]:
        raise ValueError(f"no good: {items}")

    def short(items: list[int]) -> list[int]:
        return items[:1]

    failing = await queued_together(lane, [lane.gather("bad", broken, k) for k in range(3)])
    for job in failing:
        with pytest.raises(ValueError, match=r"no good: \[0, 1, 2\]"):
            await job

    shorted = await queued_together(lane, [lane.gather("short", short, k) for k in range(2)])
    for job in shorted:
        with pytest.raises(RuntimeError, match="1 results for 2 items"):
            await job
    assert await lane.gather("short", short, 9) == 9  # alone it is fine; the lane goes on


async def test_a_lane_without_random_draws_runs_through_a_capture_and_the_other_waits():
    from omnilive.engines.minicpmo.runtime.graphs import CAPTURE_LOCK

    drawing = SideLane(torch.device("cpu"), name="test-side")
    encoders = SideLane(torch.device("cpu"), name="test-encoders", random_draws=False)
    capturing, let_go = threading.Event(), threading.Event()

    def capture() -> None:  # another thread holds the lock, as a graph capture does
        with CAPTURE_LOCK:
            capturing.set()
            let_go.wait(WAIT_S)

    holder = threading.Thread(target=capture)
    holder.start()
    try:
        assert capturing.wait(WAIT_S)
        drawn = asyncio.create_task(drawing.call(lambda: "drawn"))
        # The encoders' call ends while the capture still holds the lock...
        assert await asyncio.wait_for(encoders.call(lambda: "encoded"), WAIT_S) == "encoded"
        await asyncio.sleep(0.05)
        assert not drawn.done()  # ...the other lane's waits for it
        let_go.set()
        assert await asyncio.wait_for(drawn, WAIT_S) == "drawn"
    finally:
        let_go.set()
        holder.join(WAIT_S)
        for lane in (drawing, encoders):
            lane.close()
            lane.thread.join(WAIT_S)
