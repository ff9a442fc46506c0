"""The one thread-to-loop primitive (engines/job_queue.py): submit, drop if
not started, gather by key, settle once, closed-loop and StopIteration safe.
The engines' queues (steps.py, the GPU engine's batch loop and lanes) are
built on it; their own tests cover only what they add."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from omnilive.engines.job_queue import Job, JobQueue, Relay, Stopped, deliver, settle

WAIT_S = 5.0


@dataclass(eq=False, kw_only=True)
class Work(Job):
    fn: Callable[..., Any]
    args: tuple[Any, ...] = field(default_factory=tuple)


class Worker:
    """One thread taking jobs (gathered by key: ``fn`` over their args)."""

    def __init__(self, queue: JobQueue[Work]) -> None:
        self.queue = queue
        self.calls: list[list[Any]] = []
        self.thread = threading.Thread(target=self.work, daemon=True)
        self.thread.start()

    def work(self) -> None:
        while (group := self.queue.take()) is not None:
            first = group[0]
            try:
                if first.key is None:
                    results = [first.fn(*first.args)]
                else:
                    items = [job.args[0] for job in group]
                    self.calls.append(items)
                    results = first.fn(items)
                for job, result in zip(group, results, strict=True):
                    job.result = result
            except BaseException as exc:
                for job in group:
                    job.fail(exc)
            self.queue.deliver(group)


@pytest.fixture
def queue() -> Iterator[JobQueue[Work]]:
    queue: JobQueue[Work] = JobQueue("test")
    worker = Worker(queue)
    yield queue
    queue.close()
    worker.thread.join(WAIT_S)
    assert not worker.thread.is_alive()


async def held(queue: JobQueue[Work]) -> tuple[asyncio.Task[Any], threading.Event]:
    """A job that holds the worker until the event is set (started on return)."""
    entered, release = threading.Event(), threading.Event()

    def block() -> str:
        entered.set()
        release.wait(WAIT_S)
        return "released"

    task = asyncio.create_task(queue.submit(Work(fn=block)), name="held")
    assert await asyncio.to_thread(entered.wait, WAIT_S)
    return task, release


async def test_a_job_runs_off_the_loop_and_its_result_and_errors_come_back(queue):
    main = threading.get_ident()
    assert await queue.submit(Work(fn=threading.get_ident)) != main

    def boom() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await queue.submit(Work(fn=boom))
    assert queue.handoffs == 4  # two jobs, each submitted and delivered


async def test_a_job_cancelled_before_it_starts_never_runs_and_a_running_one_ends(queue):
    running, release = await held(queue)
    ran: list[str] = []
    waiting = asyncio.create_task(queue.submit(Work(fn=ran.append, args=("no",))), name="w")
    await asyncio.sleep(0)
    waiting.cancel()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting  # dropped before the worker is free
    with pytest.raises(asyncio.CancelledError):
        await running  # its waiter is gone; the job itself runs to its end
    release.set()
    assert await queue.submit(Work(fn=lambda: "next")) == "next"
    assert ran == []


async def test_a_job_that_is_not_droppable_runs_though_its_waiter_left(queue):
    running, release = await held(queue)
    ran = threading.Event()
    job = Work(fn=ran.set, droppable=False)
    waiting = asyncio.create_task(queue.submit(job), name="release")
    await asyncio.sleep(0)
    waiting.cancel()
    release.set()
    await running
    assert await asyncio.to_thread(ran.wait, WAIT_S)


async def test_jobs_of_one_key_waiting_together_are_taken_as_one_up_to_max_gather():
    worker = Worker(JobQueue("gather", max_gather=2))
    try:
        running, release = await held(worker.queue)
        jobs = [
            asyncio.create_task(
                worker.queue.submit(
                    Work(fn=lambda items: [2 * i for i in items], args=(n,), key=key)
                ),
                name=f"j{n}",
            )
            for n, key in enumerate(["a", "b", "a", "a", "a"])
        ]
        await asyncio.sleep(0)
        jobs[2].cancel()  # left out of its group
        with pytest.raises(asyncio.CancelledError):
            await jobs[2]
        release.set()
        await running
        done = await asyncio.gather(*jobs, return_exceptions=True)
        assert [done[n] for n in (0, 1, 3, 4)] == [0, 2, 6, 8]
        assert worker.calls == [[0, 3], [1], [4]]
    finally:
        worker.queue.close()
        worker.thread.join(WAIT_S)


async def test_close_refuses_new_jobs_cancels_the_waiting_and_ends_the_taker(queue):
    running, release = await held(queue)
    waiting = asyncio.create_task(queue.submit(Work(fn=lambda: 1)), name="waiting")
    await asyncio.sleep(0)
    assert queue.close() != []
    release.set()
    assert await running == "released"
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(RuntimeError, match="closed"):
        await queue.submit(Work(fn=lambda: 2))


async def test_stop_iteration_reaches_the_caller_as_an_error(queue):
    with pytest.raises(RuntimeError, match="StopIteration"):
        await queue.submit(Work(fn=next, args=(iter(()),)))


async def test_an_outcome_settles_once_and_an_orphan_or_error_nobody_awaits_is_handled(
    caplog: pytest.LogCaptureFixture,
):
    loop = asyncio.get_running_loop()
    orphans: list[Any] = []
    gone = Work(fn=print, orphan=orphans.append)
    gone.bind().cancel()
    gone.result = 7
    settle(gone)
    assert orphans == [7]

    twice = Work(fn=print)
    future = twice.bind()
    twice.result = 1
    settle(twice)
    twice.result = 2
    settle(twice)  # a second outcome does not change the first
    assert future.result() == 1

    nobody = Work(fn=print, loop=loop)
    nobody.fail(ValueError("lost"))
    with caplog.at_level(logging.ERROR):
        settle(nobody)
    assert "lost" in caplog.text

    # Work stopped on purpose after its waiter left is nobody's failure.
    caplog.clear()
    left = Work(fn=print)
    left.bind().cancel()
    left.fail(Stopped("the program of slot 0 was stopped"))
    with caplog.at_level(logging.DEBUG):
        settle(left)
    assert caplog.records == []


def test_delivering_to_a_closed_loop_is_skipped():
    loop = asyncio.new_event_loop()
    job = Work(fn=print, loop=loop)
    job.future = loop.create_future()
    loop.close()
    assert deliver([job], turn_timeout=0.1) == 1  # no error, no wait past the timeout


async def test_deliver_waits_until_the_loop_ran_what_it_woke():
    job = Work(fn=print)
    future = job.bind()
    job.result = "done"
    order: list[str] = []

    async def woken() -> None:
        order.append(await future)

    task = asyncio.create_task(woken(), name="woken")
    await asyncio.sleep(0)
    await asyncio.to_thread(deliver, [job], WAIT_S)
    order.append("handed back")
    await task
    assert order == ["done", "handed back"]


# --- relays: work that goes from thread to thread and back once ----------------------


@pytest.fixture
def two() -> Iterator[tuple[JobQueue[Work], JobQueue[Work]]]:
    workers = [Worker(JobQueue("first")), Worker(JobQueue("second"))]
    yield workers[0].queue, workers[1].queue
    for worker in workers:
        worker.queue.close()
        worker.thread.join(WAIT_S)


def legs(*steps: tuple[JobQueue[Work], Callable[[list[Any]], Any]]) -> Relay:
    """A relay whose leg k runs ``fn(results so far)`` in queue k."""

    def route(relay: Relay) -> tuple[JobQueue[Any], Job] | None:
        if len(relay.results) == len(steps):
            return None
        queue, fn = steps[len(relay.results)]
        return queue, Work(fn=fn, args=(list(relay.results),))

    return Relay(route)


async def test_a_relay_passes_from_thread_to_thread_and_comes_back_once(two):
    first, second = two
    main = threading.get_ident()

    def where(_: list[Any]) -> int:
        return threading.get_ident()

    relay = legs((first, where), (second, where), (first, lambda done: len(done)))
    one, other, count = await relay.run()
    assert main not in (one, other) and one != other and count == 2
    assert relay.crossings == 4  # three legs, one way back
    assert first.handoffs == 3 and second.handoffs == 1  # each leg queued; one delivery


async def test_an_error_in_a_leg_or_its_route_ends_the_relay_and_reaches_the_waiter(two):
    first, second = two
    ran: list[str] = []

    def boom(_: list[Any]) -> None:
        raise ValueError("leg")

    relay = legs((first, boom), (second, lambda _: ran.append("no")))
    with pytest.raises(ValueError, match="leg"):
        await relay.run()
    assert relay.crossings == 2

    def route(relay: Relay) -> tuple[JobQueue[Any], Job] | None:
        if relay.results:
            raise LookupError("route")  # on the first leg's thread
        return first, Work(fn=lambda: 1)

    with pytest.raises(LookupError, match="route"):
        await Relay(route).run()
    assert ran == []


async def test_a_relay_cancelled_while_a_leg_waits_drops_it_and_starts_no_more(two):
    first, second = two
    running, release = await held(second)  # the second queue is busy
    ran: list[str] = []
    relay = legs((first, lambda _: "one"), (second, lambda _: ran.append("two")))
    task = asyncio.create_task(relay.run(), name="relay")

    def handed_on() -> None:  # the first leg's outcome, queued as the second leg
        while len(second) == 0:
            time.sleep(0.001)

    await asyncio.to_thread(handed_on)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(second) == 0  # dropped before it started
    release.set()
    await running
    assert await second.submit(Work(fn=lambda: "next")) == "next"
    assert ran == [] and relay.results == ["one"]


async def test_a_relay_cancelled_while_a_leg_runs_starts_no_later_leg(two):
    first, second = two
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold(_: list[Any]) -> str:
        entered.set()
        release.wait(WAIT_S)
        return "one"

    relay = legs((first, hold), (second, lambda _: ran.append("two")))
    task = asyncio.create_task(relay.run(), name="relay")
    assert await asyncio.to_thread(entered.wait, WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await first.submit(Work(fn=lambda: "after")) == "after"  # the first leg has ended
    assert ran == [] and second.handoffs == 0  # its outcome went nowhere
