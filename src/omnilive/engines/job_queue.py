"""The one way work crosses from an event loop to a thread and back.

A coroutine submits a :class:`Job` to a :class:`JobQueue` and awaits it; a
thread of the engine takes jobs out (:meth:`JobQueue.take`), runs them and
hands their outcomes back (:func:`deliver`). Every engine queue is this one:
the CPU engines' step loop (:mod:`omnilive.engines.steps`), the GPU engine's
batch loop and its lanes (``engines/minicpmo/runtime``).

What it guarantees, once, for all of them:

- **drop if not started**: a waiter that is cancelled before its job was taken
  removes it, and it never runs; one taken already runs to its end and its
  outcome is discarded (a taker marks its jobs started under the queue's lock,
  so there is no third case);
- **gather by key**: the default :meth:`JobQueue.take` takes the first job and,
  when it has a ``key``, the later jobs of the same key (up to ``max_gather``),
  to run as one call;
- **settle once**: an outcome reaches its future once; a future already done
  (its waiter gone) keeps its state, an error nobody awaits is logged (but a
  :class:`Stopped` one: work ended early on purpose), and a result nobody
  awaits goes to the job's ``orphan`` (e.g. a slot given back);
- **closed-loop safe**: an event loop that is gone (shutdown) is skipped;
- **StopIteration safe**: a future refuses ``StopIteration`` (it would end the
  awaiting coroutine's frame), so it is handed over as a :class:`RuntimeError`.

:func:`deliver` can wait until each event loop has run the coroutines it woke
(a handshake, not a delay), which the batch loop uses to keep sessions that go
straight on to their next step in one batch. :attr:`JobQueue.handoffs` counts
the crossings (each submission and each delivery of a job), which the GPU
engine reports per unit.

A :class:`Relay` is work that passes through several threads' queues (its
*legs*) and comes back once: the thread that ends one leg hands its outcome
straight to the next leg's queue, never to the event loop in between. What a
leg is, and whether one follows, its ``route`` decides from the outcomes so
far; the waiter gets them all at the end. A leg counts one crossing (its
queue's), the way back one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)
J = TypeVar("J", bound="Job")
P = TypeVar("P")


class Stopped(RuntimeError):
    """A job that ended early because its waiter left or its owner ended it
    (a program whose session was cancelled or closed): its waiter, if still
    there, gets this error; nobody else needs to hear of it."""


@dataclass(eq=False, kw_only=True)
class Job:
    """One piece of work handed to a thread: whoever awaits it and its outcome.

    ``future`` is None for work nobody awaits (a session's last step, a slot
    given back for a waiter that left); its error is then logged. Subclasses
    carry what the work is."""

    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[Any] | None = None
    key: str | None = None  # jobs of one key waiting together may be taken as one
    orphan: Callable[[Any], None] | None = None  # takes a result nobody awaits any more
    droppable: bool = True  # False: runs even if its waiter is cancelled (a slot's release)
    started: bool = False
    result: Any = None
    error: BaseException | None = None
    relay: Relay | None = None  # a leg of this relay: its outcome goes on to the next leg

    def abandon(self) -> None:
        """Its waiter left after it was taken: a job that runs in steps stops
        at its next one (the default runs to its end)."""

    def bind(self) -> asyncio.Future[Any]:
        """Attach this job to the running event loop; the future to await."""
        self.loop = asyncio.get_running_loop()
        self.future = self.loop.create_future()
        return self.future

    def fail(self, error: BaseException) -> None:
        self.result, self.error = None, error


def settle(job: Job) -> None:
    """On the job's event loop: its outcome to its future, once (see the module)."""
    future, error = job.future, job.error
    if future is None or future.done():  # nobody awaits it (any more)
        if error is not None and not isinstance(error, Stopped):
            log.error("%s nobody awaits failed", describe(job), exc_info=error)
        elif job.orphan is not None:
            job.orphan(job.result)
    elif error is not None:
        if isinstance(error, StopIteration):
            error = RuntimeError(f"{describe(job)} raised StopIteration: {error}")
        future.set_exception(error)
    else:
        future.set_result(job.result)


def describe(job: Job) -> str:
    fn = getattr(job, "fn", None)
    return f"{type(job).__name__} {getattr(fn, '__name__', '') or job.key or ''}".strip()


def cancel(job: Job) -> None:
    """From any thread: cancel the job's waiter (the loop being gone is fine)."""
    if job.future is not None and job.loop is not None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
            job.loop.call_soon_threadsafe(job.future.cancel)


def deliver(jobs: Iterable[Job], turn_timeout: float | None = None) -> int:
    """From a worker thread: settle ``jobs`` on their event loops, one call
    per loop; with ``turn_timeout``, then wait (at most that long) until each
    loop has run what the settled futures woke. How many loops were reached."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Job]] = {}
    for job in jobs:
        if job.loop is None:
            settle(job)  # nobody's: logged or orphaned here
        else:
            by_loop.setdefault(job.loop, []).append(job)
    turns: list[threading.Event] = []
    for loop, settled in by_loop.items():
        turned = threading.Event() if turn_timeout is not None else None
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
            loop.call_soon_threadsafe(_settle_all, settled, turned)
            if turned is not None:
                turns.append(turned)
    for turned in turns:
        turned.wait(turn_timeout)
    return len(by_loop)


def _settle_all(jobs: list[Job], turned: threading.Event | None) -> None:
    for job in jobs:
        settle(job)
    if turned is not None:
        # The loop's next turn comes after the callbacks of the futures just
        # set, i.e. after the coroutines they woke have run to their next await.
        asyncio.get_running_loop().call_soon(turned.set)


def first_with_its_key(pending: Sequence[J], max_gather: int) -> list[J]:
    """The default choice of :meth:`JobQueue.take`: the first job in line and,
    for a keyed job, every later job of its key, up to ``max_gather`` in all."""
    first = pending[0]
    if first.key is None:
        return [first]
    same = [job for job in pending if job.key == first.key and job is not first]
    return [first, *same[: max_gather - 1]]


class JobQueue(Generic[J]):
    """Jobs submitted from event loops, taken by the threads of one owner.

    :attr:`lock` is the queue's condition: an owner that keeps jobs of its own
    beside the queue (the batch loop's running programs) guards them with it.
    """

    def __init__(self, name: str, max_gather: int = 16) -> None:
        self.name = name
        self.max_gather = max_gather
        self.lock = threading.Condition()
        self.handoffs = 0  # submissions and deliveries (a thread crossing each)
        self._pending: deque[J] = deque()
        self._closed = False

    # --- the event loop's side ---------------------------------------------------------

    async def submit(self, job: J) -> Any:
        """Queue ``job`` and await its outcome; cancelled before the job was
        taken, it is dropped (never runs) unless it is not ``droppable``."""
        future = job.bind()
        self.put(job)
        try:
            return await future
        except asyncio.CancelledError:
            if job.droppable:
                self.drop(job)
            raise

    def put(self, job: J) -> None:
        """Queue ``job`` without awaiting it (:class:`RuntimeError` once closed)."""
        with self.lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            self._pending.append(job)
            self.handoffs += 1
            self.lock.notify_all()

    def drop(self, job: J) -> bool:
        """Remove ``job`` if no thread has taken it; whether it was removed."""
        with self.lock:
            if job.started or job not in self._pending:
                return False
            self._pending.remove(job)
            return True

    def drop_where(self, predicate: Callable[[J], bool]) -> list[J]:
        """Remove the waiting jobs ``predicate`` picks and cancel their waiters."""
        with self.lock:
            dropped = [job for job in self._pending if predicate(job)]
            self._pending = deque(job for job in self._pending if job not in dropped)
        for job in dropped:
            cancel(job)
        return dropped

    def close(self) -> list[J]:
        """Accept nothing more and cancel what waits (a running job ends);
        the jobs cancelled. A thread waiting in :meth:`take` gets None."""
        with self.lock:
            self._closed = True
            dropped, self._pending = list(self._pending), deque()
            self.lock.notify_all()
        for job in dropped:
            cancel(job)
        return dropped

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        with self.lock:
            return len(self._pending)

    # --- the threads' side -------------------------------------------------------------

    def take(
        self,
        choose: Callable[[Sequence[J]], tuple[Sequence[J], P]] | None = None,
        *,
        ready: Callable[[Sequence[J]], bool] | None = None,
    ) -> P | list[J] | None:
        """What runs now. ``choose(pending)`` returns the jobs to start and
        what to give the thread (default: :func:`first_with_its_key`, those
        jobs); it is called under the lock, so the jobs it returns are marked
        started before any waiter can drop them. Blocks until ``ready(pending)``
        (default: something is pending); None once the queue is closed."""
        with self.lock:
            while not self._closed and not (ready or bool)(self._pending):
                self.lock.wait()
            if self._closed:
                return None
            chosen: Sequence[J]
            outcome: P | list[J]
            if choose is None:
                chosen = outcome = first_with_its_key(tuple(self._pending), self.max_gather)
            else:
                chosen, outcome = choose(tuple(self._pending))
            for job in chosen:
                job.started = True
            if chosen:
                self._pending = deque(job for job in self._pending if not job.started)
            return outcome

    def any(self, predicate: Callable[[J], bool]) -> bool:
        """Whether a waiting job satisfies ``predicate``."""
        with self.lock:
            return any(predicate(job) for job in self._pending)

    def deliver(self, jobs: Sequence[J], turn_timeout: float | None = None) -> None:
        """:func:`deliver`, counted in :attr:`handoffs`; a relay's leg goes on
        to the relay's next leg instead, where there is one."""
        back = [job for job in jobs if job.relay is None or not job.relay.pass_on(job)]
        if back:
            with self.lock:
                self.handoffs += len(back)
            deliver(back, turn_timeout)

    def notify(self) -> None:
        """Wake the threads waiting in :meth:`take` (their owner's state changed)."""
        with self.lock:
            self.lock.notify_all()


# ``route(relay)``: the next leg (the queue it waits in and its job) after the
# outcomes in ``relay.results``, or None: back to the waiter.
Route = Callable[["Relay"], "tuple[JobQueue[Any], Job] | None"]


class Relay:
    """Work that passes from thread to thread and returns to its event loop
    once (see the module). ``route`` runs on the event loop for the first
    leg, then on the thread that ended the last leg: it must be quick and
    touch nothing a thread does not own. An error in a leg (or in ``route``)
    ends the relay and reaches the waiter."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.results: list[Any] = []  # each leg's outcome, in order
        self.crossings = 0  # threads crossed: each leg's queue, and the way back
        self.loop: asyncio.AbstractEventLoop | None = None
        self.future: asyncio.Future[Any] | None = None
        self._at: tuple[JobQueue[Any], Job] | None = None

    async def run(self) -> list[Any]:
        """Run the legs; their outcomes. Cancelled, the leg in a queue is
        dropped (or, taken already, abandoned) and no later leg starts."""
        self.loop = asyncio.get_running_loop()
        self.future = self.loop.create_future()
        first = self.route(self)
        if first is None:
            return self.results
        self._enter(*first)
        try:
            await self.future
        except asyncio.CancelledError:
            if (at := self._at) is not None:
                self._stop(*at)
            raise
        return self.results

    def pass_on(self, job: Job) -> bool:
        """On the thread that ran ``job`` (a leg): its outcome to the next
        leg; False when it goes back to the waiter instead (its error, the
        last leg, or a ``route`` that failed: then ``job`` carries that)."""
        if job.error is not None:
            self.crossings += 1
            return False
        self.results.append(job.result)
        try:
            onward = self.route(self)
            if onward is None:
                self.crossings += 1
                return False
            if self.future is not None and self.future.done():
                return True  # the waiter left: nothing more runs
            self._enter(*onward)
        except Exception as exc:  # the waiter's to handle (e.g. a closed queue)
            job.fail(exc)
            self.crossings += 1
            return False
        if self.future is not None and self.future.done():
            # The waiter left while the leg was queued; whichever of us looks
            # second stops it (see run's cancellation).
            self._stop(*onward)
        return True

    def _enter(self, queue: JobQueue[Any], job: Job) -> None:
        job.loop, job.future, job.relay = self.loop, self.future, self
        self._at = (queue, job)
        self.crossings += 1
        queue.put(job)

    @staticmethod
    def _stop(queue: JobQueue[Any], job: Job) -> None:
        if job.droppable and not queue.drop(job):
            job.abandon()
