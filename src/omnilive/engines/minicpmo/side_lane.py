"""The worker threads of a loaded model beside its batch loop (*lanes*):
the per-session work that touches no slot cache, each lane on a CUDA stream
of its own. A model has two: the side lane (the vocoder, the simplex seat's
steps) and the encoders' lane (vision, Whisper), so that a unit's encoders
never wait behind another session's vocoder chunk.

Why threads of their own: the batch loop's thread replays the LLM's and the
speech LM's graphs for every session; a vocoder chunk or an encoder call run
there would hold every session's next token for its length (the vocoder
alone is ~150 ms eagerly). Here they run beside the batches: the GPU
interleaves the streams' kernels, and the batch thread, which mostly waits
for its graphs (``replay`` and ``synchronize`` release the GIL), leaves the
Python interpreter to the lanes.

What makes the hand-over safe:

- one job at a time per lane, in submission order, so the shared modules'
  state that a job swaps in for its length (a session's Whisper cache, the
  vocoder's stream caches) has one user (the Whisper cache attribute, which
  the seat's steps use too, also has a lock: ``SharedModel.audio_state_lock``);
  and, on a lane whose jobs draw random numbers, never during a CUDA graph
  capture on the batch thread (``CAPTURE_LOCK``). The one
  exception to the order: a *gathered* job (:meth:`SideLane.gather`) takes
  the later jobs of its key along, which is safe because a session awaits
  each of its side calls before making the next;
- the lane waits for its stream after every job, so a result is computed
  before its session sees it;
- the tensors a job returns are marked as used on the model's default stream
  (``record_stream``): the caching allocator would otherwise hand their
  memory to the lane's next job while a kernel queued on the default stream
  (a session's ``torch.cat`` of its unit) still reads it.

On the CPU there are no streams: the lane is just a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from omnilive.engines.minicpmo.batch_graphs import CAPTURE_LOCK

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(eq=False)
class _SideJob:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    started: bool = False
    # Jobs of one gather key waiting together run as one call of ``fn`` over
    # their items (see SideLane.gather); None: a plain call.
    key: str | None = None


class SideLane:
    """One thread (and, on CUDA, one stream) running calls one at a time."""

    def __init__(
        self,
        device: torch.device,
        name: str = "minicpmo-side",
        max_gather: int = 16,
        *,
        random_draws: bool = True,
    ) -> None:
        # A lane whose jobs may draw random numbers holds CAPTURE_LOCK for each
        # job; one that never does (the encoders) runs through captures.
        self.capture_lock: Any = CAPTURE_LOCK if random_draws else contextlib.nullcontext()
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.busy_s: Counter[str] = Counter()  # seconds per function name (bounded keys)
        self.busy_count: Counter[str] = Counter()
        self._jobs: deque[_SideJob] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self.max_gather = max_gather
        self.gathered: Counter[int] = Counter()  # items per gathered call (bounded keys)
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the lane, after the calls submitted before it. A
        call cancelled before it started never runs; one already running
        finishes and its result is dropped."""
        return await self._run(_SideJob(fn, args, *self._future()))

    async def gather(self, key: str, fn: Callable[[list[Any]], list[T]], item: Any) -> T:
        """``fn([item, ...])[i]``: the calls with ``key`` waiting when the lane
        reaches the first of them run as ONE call of ``fn`` over their items
        (up to :attr:`max_gather`), each caller getting its own result, in
        place of the first. What makes it worth it: one batched encoder call
        costs about what one session's does. ``fn`` must return one result
        per item, in order; an error it raises reaches every caller."""
        return await self._run(_SideJob(fn, (item,), *self._future(), key=key))

    def _future(self) -> tuple[asyncio.Future[Any], asyncio.AbstractEventLoop]:
        loop = asyncio.get_running_loop()
        return loop.create_future(), loop

    async def _run(self, job: _SideJob) -> Any:
        with self._changed:
            if self._closed:
                raise RuntimeError("the side lane is closed")
            self._jobs.append(job)
            self._changed.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            with self._changed:
                if not job.started and job in self._jobs:
                    self._jobs.remove(job)
            raise

    def close(self) -> None:
        """Accept nothing more and cancel what waits; the running call ends."""
        with self._changed:
            self._closed = True
            jobs, self._jobs = self._jobs, deque()
            self._changed.notify()
        for job in jobs:
            with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
                job.loop.call_soon_threadsafe(job.future.cancel)

    def _next(self) -> list[_SideJob] | None:
        """The next call's jobs: the first in line and, for a gather key, every
        other job of that key in line (up to max_gather), marked started."""
        with self._changed:
            while not self._jobs and not self._closed:
                self._changed.wait()
            if self._closed:
                return None
            first = self._jobs.popleft()
            group = [first]
            if first.key is not None:
                group += [job for job in self._jobs if job.key == first.key][: self.max_gather - 1]
                for job in group[1:]:
                    self._jobs.remove(job)
            for job in group:
                job.started = True
            return group

    def _work(self) -> None:
        streamed = torch.cuda.stream(self.stream) if self.stream is not None else None
        with streamed or contextlib.nullcontext():
            while (group := self._next()) is not None:
                self._run_group(group)

    def _run_group(self, group: list[_SideJob]) -> None:
        first = group[0]
        started = time.perf_counter()
        results: list[Any] = []
        error: BaseException | None = None
        try:
            with self.capture_lock:  # see batch_graphs.CAPTURE_LOCK
                if first.key is None:
                    results = [first.fn(*first.args)]
                else:
                    results = list(first.fn([job.args[0] for job in group]))
                    if len(results) != len(group):
                        raise RuntimeError(
                            f"{first.key}: {len(results)} results for {len(group)} items"
                        )
            if self.stream is not None:
                self.stream.synchronize()
                _used_on(results, torch.cuda.default_stream(self.device))
        except BaseException as exc:  # the callers' to handle: handed over
            error = exc
            results = [None] * len(group)
        name = first.key or getattr(first.fn, "__name__", "call")
        self.busy_s[name] += time.perf_counter() - started
        self.busy_count[name] += 1
        if first.key is not None:
            self.gathered[len(group)] += 1
        for job, result in zip(group, results, strict=True):
            with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled while it ran: dropped
        if error is not None:
            log.error("a side-lane call nobody awaits failed", exc_info=error)
        return
    if isinstance(error, StopIteration):  # a future refuses it (it would end a generator)
        error = RuntimeError(f"a side-lane call raised StopIteration: {error}")
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _used_on(value: Any, stream: torch.cuda.Stream) -> None:
    """Mark every CUDA tensor in ``value`` (nested lists, tuples, dicts) as
    used on ``stream``: its memory is not reused before ``stream`` has done
    what was queued on it when the tensor was freed."""
    if isinstance(value, torch.Tensor):
        if value.is_cuda:
            value.record_stream(stream)
    elif isinstance(value, dict):
        for item in value.values():
            _used_on(item, stream)
    elif isinstance(value, list | tuple):
        for item in value:
            _used_on(item, stream)
