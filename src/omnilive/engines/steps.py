"""The seam between sessions and an engine: sessions submit steps and await
them; the engine's loop decides when and where they run.

A synchronous engine's step (a prefill, a unit, a sentence of an answer) is
blocking work that must stay off the event loop
(:mod:`omnilive.engines.sync_views` runs its views here). A session holds a :class:`Lane`:
its steps run in the order it submitted them, one at a time, so the engine
never sees two steps of one session at once. The :class:`StepLoop` owns the
threads that run them; this one runs ready lanes on a fixed number of threads
(one per slot, the CPU engines' way), and an engine that batches the steps of
all its sessions replaces it with a loop of its own behind the same interface.

Cancelling an awaiting session drops its steps that have not started; a step
that has started finishes on its thread, and its result is discarded. A lane
that is finished (:meth:`Lane.finish`) runs one last step (releasing the
engine session) after whatever is running, then tells its owner, which is
when the slot is free again: the session itself never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from omnilive.engines.job_queue import Job, JobQueue

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")

# Items a streamed step may run ahead of its reader (bounded: a reader that
# stops reading holds the engine's thread, not unbounded memory).
STREAM_AHEAD = 4
_STOP = object()


@dataclass(eq=False, kw_only=True)
class LaneStep(Job):
    """One step of a lane: ``fn(*args)``."""

    lane: Lane
    fn: Callable[..., Any]
    args: tuple[Any, ...] = field(default_factory=tuple)


@dataclass(eq=False)
class Lane:
    """One session's queue of steps (on the loop's one queue, in order)."""

    steps: StepLoop
    name: str
    on_finished: Callable[[], None] | None = None
    _closing: bool = False

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` as this session's next step and return its result."""
        if self._closing:
            raise RuntimeError(f"lane {self.name} is finished")
        step = functools.partial(fn, *args, **kwargs)
        result: T = await self.steps.jobs.submit(LaneStep(lane=self, fn=step))
        return result

    async def stream(
        self, fn: Callable[P, Iterator[T]], *args: P.args, **kwargs: P.kwargs
    ) -> AsyncGenerator[T, None]:
        """Iterate ``fn(*args)`` as one step: the engine's thread produces items
        (at most :data:`STREAM_AHEAD` ahead of the reader), the caller reads them
        here. Leaving the loop early stops and closes the iterator, and
        interrupts it first where it can be (an ``interrupt()`` method: the
        engine's thread may be waiting inside ``next()``)."""
        loop = asyncio.get_running_loop()
        # Bounded by ``room``: at most STREAM_AHEAD items and the end are in it.
        items: asyncio.Queue[Any] = asyncio.Queue(STREAM_AHEAD + 1)
        room = threading.Semaphore(STREAM_AHEAD)
        stop = threading.Event()

        def hand_over(item: Any, error: BaseException | None = None) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is gone (shutdown)
                loop.call_soon_threadsafe(items.put_nowait, (item, error))

        made: list[Iterator[T]] = []  # the iterator, once the engine's thread made it
        ended = False

        def produce() -> None:
            iterator: Iterator[T] | None = None
            try:
                iterator = fn(*args, **kwargs)  # a plain function may fail here, before any item
                made.append(iterator)
                for item in iterator:
                    while not room.acquire(timeout=0.1):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    hand_over(item)
            except BaseException as exc:  # handed to the reader, which raises it
                hand_over(_STOP, exc)
                return
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
            hand_over(_STOP)

        if self._closing:
            raise RuntimeError(f"lane {self.name} is finished")
        job = LaneStep(lane=self, fn=produce, loop=loop)  # its outcome is the items
        self.steps.jobs.put(job)
        try:
            while True:
                item, error = await items.get()
                if item is _STOP:
                    ended = True
                    if error is not None:
                        raise error
                    return
                room.release()
                yield item
        finally:
            stop.set()
            interrupt = getattr(made[0], "interrupt", None) if made else None
            if interrupt is not None and not ended:
                try:
                    interrupt()
                except Exception:  # the stream is left either way
                    log.exception("interrupting a stream failed")
            self.steps.jobs.drop(job)

    def finish(self, last: Callable[[], Any] | None = None) -> None:
        """No more steps: pending ones are dropped, ``last`` (if any) runs once
        the running step is over, then ``on_finished`` is called."""
        if self._closing:
            return
        self._closing = True
        jobs = self.steps.jobs
        jobs.drop_where(lambda job: job.lane is self)
        finished, self.on_finished = self.on_finished, None
        if last is None and not self.steps.busy(self):
            if finished is not None:
                finished()
            return

        def close() -> None:
            if last is not None:
                try:
                    last()
                except Exception:  # the session is gone: nobody else to tell
                    log.exception("the last step of %s failed", self.name)

        job = LaneStep(lane=self, fn=close, loop=asyncio.get_running_loop())
        job.orphan = lambda _: finished() if finished is not None else None
        jobs.put(job)


class StepLoop:
    """Runs the lanes' steps on ``threads`` threads of its own: any lane's
    first step in line whose lane has none running."""

    def __init__(self, threads: int, name: str = "engine") -> None:
        self.jobs: JobQueue[LaneStep] = JobQueue(name)
        self._running: set[int] = set()  # ids of the lanes with a step running
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def lane(self, name: str, on_finished: Callable[[], None] | None = None) -> Lane:
        return Lane(self, name, on_finished)

    def busy(self, lane: Lane) -> bool:
        """Whether ``lane`` has a step running or waiting."""
        with self.jobs.lock:
            return id(lane) in self._running or self.jobs.any(lambda job: job.lane is lane)

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """One step outside any session (loading, warm-up)."""
        lane = self.lane("call")
        try:
            return await lane.run(fn, *args, **kwargs)
        finally:
            lane.finish()

    def close(self) -> None:
        self.jobs.close()

    def _choose(self, pending: Sequence[LaneStep]) -> tuple[list[LaneStep], LaneStep | None]:
        """The first step whose lane has none running (called under the lock)."""
        for job in pending:
            if id(job.lane) not in self._running:
                self._running.add(id(job.lane))
                return [job], job
        return [], None

    def _ready(self, pending: Sequence[LaneStep]) -> bool:
        return any(id(job.lane) not in self._running for job in pending)

    def _work(self) -> None:
        while (job := self.jobs.take(self._choose, ready=self._ready)) is not None:
            assert isinstance(job, LaneStep)
            try:
                job.result = job.fn(*job.args)
            except BaseException as exc:  # handed to its waiter (or logged)
                job.fail(exc)
            with self.jobs.lock:
                self._running.discard(id(job.lane))
                self.jobs.lock.notify_all()  # that lane's next step may go
            self.jobs.deliver([job])
