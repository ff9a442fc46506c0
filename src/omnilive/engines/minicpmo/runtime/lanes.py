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

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from omnilive.engines.job_queue import Job, JobQueue
from omnilive.engines.minicpmo.runtime.graphs import CAPTURE_LOCK

T = TypeVar("T")


@dataclass(eq=False, kw_only=True)
class LaneCall(Job):
    """``fn(*args)``; with a ``key``, ``fn`` takes the items of every job of
    that key taken with it (``args[0]`` each) and returns their results."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = field(default_factory=tuple)


class SideLane:
    """One thread (and, on CUDA, one stream) running calls one at a time;
    with ``threads`` > 1 on the CPU (work that touches no GPU: a unit's image
    processing and mel features), that many threads taking calls in order."""

    def __init__(
        self,
        device: torch.device,
        name: str = "minicpmo-side",
        max_gather: int = 16,
        *,
        random_draws: bool = True,
        threads: int = 1,
    ) -> None:
        if threads > 1 and device.type != "cpu":
            raise ValueError("a lane of several threads runs CPU work only")
        # A lane whose jobs may draw random numbers holds CAPTURE_LOCK for each
        # job; one that never does (the encoders) runs through captures.
        self.capture_lock: Any = CAPTURE_LOCK if random_draws else contextlib.nullcontext()
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.busy_s: Counter[str] = Counter()  # seconds per function name (bounded keys)
        self.busy_count: Counter[str] = Counter()
        self.jobs: JobQueue[LaneCall] = JobQueue(name, max_gather)
        self.gathered: Counter[int] = Counter()  # items per gathered call (bounded keys)
        self._clock = threading.Lock()  # the busy counters, with several threads
        self.threads = [
            threading.Thread(target=self._work, name=f"{name}-{k}" if k else name, daemon=True)
            for k in range(threads)
        ]
        for thread in self.threads:
            thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self.threads[0]

    @property
    def max_gather(self) -> int:
        return self.jobs.max_gather

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the lane, after the calls submitted before it. A
        call cancelled before it started never runs; one already running
        finishes and its result is dropped."""
        return await self.jobs.submit(LaneCall(fn=fn, args=args))

    async def gather(self, key: str, fn: Callable[[list[Any]], list[T]], item: Any) -> T:
        """``fn([item, ...])[i]``: the calls with ``key`` waiting when the lane
        reaches the first of them run as ONE call of ``fn`` over their items
        (up to :attr:`max_gather`), each caller getting its own result, in
        place of the first. What makes it worth it: one batched encoder call
        costs about what one session's does. ``fn`` must return one result
        per item, in order; an error it raises reaches every caller."""
        return await self.jobs.submit(LaneCall(fn=fn, args=(item,), key=key))

    def close(self) -> None:
        """Accept nothing more and cancel what waits; the running call ends."""
        self.jobs.close()

    def _work(self) -> None:
        streamed = torch.cuda.stream(self.stream) if self.stream is not None else None
        with streamed or contextlib.nullcontext():
            while (group := self.jobs.take()) is not None:
                if group:
                    self._run_group(group)

    def _run_group(self, group: list[LaneCall]) -> None:
        first = group[0]
        started = time.perf_counter()
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
            for job, result in zip(group, results, strict=True):
                job.result = result
        except BaseException as exc:  # the callers' to handle: handed over
            for job in group:
                job.fail(exc)
        name = first.key or getattr(first.fn, "__name__", "call")
        with self._clock:
            self.busy_s[name] += time.perf_counter() - started
            self.busy_count[name] += 1
            if first.key is not None:
                self.gathered[len(group)] += 1
        self.jobs.deliver(group)


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
