"""The seam between sessions and an engine: sessions submit steps and await
them; the engine's loop decides when and where they run.

Every engine step (a prefill, a unit, a sentence of an answer) is blocking
work that must stay off the event loop. A session holds a :class:`Lane`:
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
import logging
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# Items a streamed step may run ahead of its reader (bounded: a reader that
# stops reading holds the engine's thread, not unbounded memory).
STREAM_AHEAD = 4
_STOP = object()


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any] | None  # None: nobody awaits the result
    loop: asyncio.AbstractEventLoop
    started: bool = False
    dropped: bool = False


@dataclass(eq=False)
class Lane:
    """One session's queue of steps."""

    steps: StepLoop
    name: str
    on_finished: Callable[[], None] | None = None
    _pending: deque[_Job] = field(default_factory=deque)
    _running: _Job | None = None
    _closing: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` as this session's next step and return its result."""
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop.create_future(), loop)
        self._submit(job)
        try:
            return await job.future  # type: ignore[misc]
        except asyncio.CancelledError:
            self._drop(job)
            raise

    async def stream(self, fn: Callable[..., Iterator[T]], *args: Any) -> AsyncIterator[T]:
        """Iterate ``fn(*args)`` as one step: the engine's thread produces items
        (at most :data:`STREAM_AHEAD` ahead of the reader), the caller reads them
        here. Leaving the loop early stops and closes the iterator, and
        interrupts it first where it can be (an ``interrupt()`` method: the
        engine's thread may be waiting inside ``next()``)."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
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
                iterator = fn(*args)  # a plain function may fail here, before any item
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

        job = _Job(produce, (), loop.create_future(), loop)
        self._submit(job)
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
            self._drop(job)

    def finish(self, last: Callable[[], Any] | None = None) -> None:
        """No more steps: pending ones are dropped, ``last`` (if any) runs once
        the running step is over, then ``on_finished`` is called."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for job in self._pending:
                job.dropped = True
                _cancel(job)
            self._pending.clear()
            if last is not None:
                self._pending.append(_Job(last, (), None, asyncio.get_running_loop()))
            idle = self._running is None
        if idle:
            self._next()

    # --- bookkeeping ------------------------------------------------------------

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self._closing:
                raise RuntimeError(f"lane {self.name} is finished")
            self._pending.append(job)
            idle = self._running is None
        if idle:
            self._next()

    def _drop(self, job: _Job) -> None:
        with self._lock:
            if not job.started and job in self._pending:
                self._pending.remove(job)
                job.dropped = True

    def _next(self) -> None:
        """Hand the next pending step to the loop, or report the lane done."""
        with self._lock:
            if self._running is not None:
                return
            job = self._pending.popleft() if self._pending else None
            self._running = job
            finished = job is None and self._closing
        if job is not None:
            self.steps.schedule(self, job)
        elif finished and self.on_finished is not None:
            callback, self.on_finished = self.on_finished, None
            callback()

    def _done(self, job: _Job) -> None:
        """Called on the engine's thread when ``job`` has run."""
        with self._lock:
            self._running = None
        with contextlib.suppress(RuntimeError):  # the event loop is gone (shutdown)
            job.loop.call_soon_threadsafe(self._next)


def _cancel(job: _Job) -> None:
    if job.future is not None:
        job.loop.call_soon_threadsafe(job.future.cancel)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class StepLoop:
    """Runs the lanes' steps on ``threads`` threads of its own."""

    def __init__(self, threads: int, name: str = "engine") -> None:
        self._queue: queue.SimpleQueue[tuple[Lane, _Job] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def lane(self, name: str, on_finished: Callable[[], None] | None = None) -> Lane:
        return Lane(self, name, on_finished)

    def schedule(self, lane: Lane, job: _Job) -> None:
        self._queue.put((lane, job))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """One step outside any session (loading, warm-up)."""
        lane = self.lane("call")
        try:
            return await lane.run(fn, *args)
        finally:
            with contextlib.suppress(RuntimeError):
                lane.finish()

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while (entry := self._queue.get()) is not None:
            lane, job = entry
            if job.dropped:
                lane._done(job)
                continue
            job.started = True
            try:
                result, error = job.fn(*job.args), None
            except BaseException as exc:
                result, error = None, exc
                if job.future is None:
                    log.error("step %s of %s failed", job.fn, lane.name, exc_info=exc)
            if job.future is not None:
                with contextlib.suppress(RuntimeError):  # the event loop is gone (shutdown)
                    job.loop.call_soon_threadsafe(_settle, job.future, result, error)
            lane._done(job)
