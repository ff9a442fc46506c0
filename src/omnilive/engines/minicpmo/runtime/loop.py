"""A step scheduler for one loaded model: the LLM steps of many live sessions
batched on the one thread that owns the model.

Sessions are coroutines on an event loop; each owns a slot of the model's
:class:`~omnilive.engines.minicpmo.runtime.batch.SlotCache` and submits work for it:
``await loop.forward(slot, inputs)`` (new positions of its LLM context) and
``await loop.call(fn, *args, slot=slot)`` (blocking work between batches) and
``await loop.side_call(fn, *args)`` (work that touches no slot: the encoders,
the vocoder, on the :class:`~omnilive.engines.minicpmo.runtime.lanes.SideLane`
beside the batches). Work that goes on from one of these threads to another
without coming back in between (a duplex unit: encoders, its forward and
decisions, its voice) is a :class:`~omnilive.engines.job_queue.Relay` of
their legs (:meth:`BatchLoop.encoder_leg`, :meth:`BatchLoop.program_leg`,
:meth:`BatchLoop.side_leg`). The worker thread runs *ticks*: it takes what is
pending, in submission order, at most one job per slot (a session's next job
waits for the next tick, so each session's jobs run in the order it submitted
them), runs the plain calls one by one, then every forward of the tick as ONE
:meth:`~omnilive.engines.minicpmo.runtime.batch.BatchedSteps.step`.

A session's decoding loop can run on the worker thread itself as a *program*
(``await loop.run(slot, program)``): a generator that yields each
:class:`Step` it needs and is sent that step's result. The worker advances
every running program right after each batch and puts its next step in the
next one, so sessions decoding at once share every batch (lockstep), and a
unit's dozens of steps cost one hand-off to the worker and one back instead
of one each way per step. A step's *pick* (the next token's choice) is made
right after its batch, together with the other programs' picks of the same
kind (:mod:`~omnilive.engines.minicpmo.runtime.programs`).

After a tick the worker hands the results to the sessions' event loop and
waits until that loop has run the sessions it woke (a handshake, not a
delay): a session that goes straight on to its next step has submitted it by
then, so sessions decoding in lockstep stay in one batch instead of splitting
into two that alternate.

Joining and leaving are jobs of the same queue (:meth:`BatchLoop.acquire`,
:meth:`BatchLoop.release`), run between batches, so the cache has one owner
and needs no lock. Cancellation:

- a job not taken yet is dropped: it never runs, and the awaiting side only
  takes a lock the worker holds while it picks a tick, never during a step;
- a forward already in the running batch is not undone: its result is
  discarded, and the slot keeps the new positions (its length advanced, the
  KV consistent with it). A session that goes on after such a cancellation
  must allow for them (crop back); one that leaves releases the slot, which
  runs after that batch. A release is never dropped, even if its waiter is
  cancelled, and a slot acquired for a waiter that gave up is released.

A forward that its slot cannot take (not live, past its capacity) fails alone
before the batch runs. A batch that fails reaches every session in it with
the same exception, is logged once, and changes no slot's length (what it
wrote past the lengths is masked and overwritten later); the next tick runs.
A tick with LLM work runs the programs in their speech a few speech-LM steps.

The tick is plan (:func:`~omnilive.engines.minicpmo.runtime.plan.plan_tick`,
pure) -> execute (:class:`~omnilive.engines.minicpmo.runtime.execute.Executor`)
-> update (:class:`~omnilive.engines.minicpmo.runtime.execute.Driver`: picks,
programs advanced) -> hand back (:func:`~omnilive.engines.job_queue.deliver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from omnilive.engines.job_queue import Job, JobQueue, cancel
from omnilive.engines.minicpmo.runtime.batch import BatchedSteps, StepResult
from omnilive.engines.minicpmo.runtime.execute import Busy, Driver, Executor, Row
from omnilive.engines.minicpmo.runtime.graphs import GraphCache
from omnilive.engines.minicpmo.runtime.lanes import LaneCall, SideLane
from omnilive.engines.minicpmo.runtime.plan import (
    Forward,
    Limits,
    LoopCall,
    ProgramRun,
    SlotJob,
    TickPlan,
    plan_tick,
)
from omnilive.engines.minicpmo.runtime.programs import Program

T = TypeVar("T")

# The batch loop's CUDA stream is the device's most urgent (a lower number is
# more urgent; out-of-range values map to the highest priority there is): the
# lanes' encoders and vocoder, on streams of the default priority, run in
# what the sessions' steps leave of the GPU instead of slowing every step.
LOOP_STREAM_PRIORITY = -5

# The longest the worker waits for an event loop to take a tick's results
# (the handshake normally ends within one turn; this covers a stopped loop).
HANDOFF_TIMEOUT = 0.5

# Speech-LM steps a program may take in a tick that also runs LLM work (an
# LLM step or prefill takes ~3-5 speech-LM steps' time on an H200).
SPEECH_ROUNDS_PER_TICK = 3


class BatchLoop:
    """The one worker thread of a model (one per GPU) and its queue of jobs.

    A batch holds at most ``max_rows`` forwards (default: every slot) and at
    most ``max_positions`` padded positions: :class:`BatchedSteps` pads every
    row to the longest one, so a batch costs rows x longest; ragged prefills of
    many long requests are split over ticks instead of building one giant
    padded batch. A forward longer than the bound still runs, alone. Forwards
    left out keep their place in line, so they come first at the next tick.

    ``graphs`` runs each tick's forwards as a replay of the CUDA graph of its
    buckets (:class:`GraphCache`): ``None`` (the default) makes one when the
    model is on CUDA and none on the CPU; ``False`` runs every step eagerly.

    ``speech`` (optional) is a second model's steps over a cache with as many
    slots, the speech LM's: slot ``k`` of both caches is one session's (they
    are acquired and released together), and a tick runs one batch of each
    model's forwards (:meth:`speech_forward`), in the same per-slot order.

    ``side`` (optional) runs :meth:`side_call` work on a second thread;
    without it that work runs on this loop's thread, between batches.
    ``encoders`` (optional) runs :meth:`encoder_call` work on a third, so a
    unit's encoders never wait behind another session's vocoder chunk.
    ``prep`` (optional) is a lane of CPU threads for the work before the
    encoders that would load their lane (a unit's image processing and mel
    features, :meth:`prep_leg`); without it that work runs on the encoders'.
    """

    def __init__(
        self,
        steps: BatchedSteps,
        *,
        speech: BatchedSteps | None = None,
        max_rows: int | None = None,
        max_positions: int = 2048,
        graphs: GraphCache | bool | None = None,
        side: SideLane | None = None,
        encoders: SideLane | None = None,
        prep: SideLane | None = None,
        name: str = "minicpmo-batch",
    ) -> None:
        self.steps = steps
        self.speech = speech
        self.side = side
        self.encoders = encoders
        self.prep = prep
        if speech is not None and speech.cache.slots != steps.cache.slots:
            raise ValueError("the speech LM's cache needs as many slots as the LLM's")
        if graphs is None:
            graphs = steps.device.type == "cuda"
        llm_graphs = GraphCache(steps) if graphs is True else graphs or None
        speech_graphs = (
            GraphCache(speech) if speech is not None and llm_graphs is not None else None
        )
        self.limits = Limits(max_rows or steps.cache.slots, max_positions)
        # Where the worker thread's time goes (read through busy()).
        self.busy_clock = Busy()
        self.executor = Executor(steps, speech, llm_graphs, speech_graphs, self.busy_clock)
        self.driver = Driver(self.limits, self.busy_clock)
        self.jobs: JobQueue[SlotJob] = JobQueue(name)
        # Programs whose next step waits for a batch (guarded by jobs.lock).
        self.running: list[ProgramRun] = []
        self.stream = (
            torch.cuda.Stream(steps.device, priority=LOOP_STREAM_PRIORITY)
            if steps.device.type == "cuda"
            else None
        )
        self.thread = threading.Thread(target=run_ticks, args=(self,), name=name, daemon=True)
        self.thread.start()

    @property
    def graphs(self) -> GraphCache | None:
        return self.executor.graphs

    @property
    def speech_graphs(self) -> GraphCache | None:
        return self.executor.speech_graphs

    @property
    def batch_sizes(self) -> Counter[int]:
        return self.executor.batch_sizes

    @property
    def speech_batch_sizes(self) -> Counter[int]:
        return self.executor.speech_batch_sizes

    # --- what sessions await, on their event loop --------------------------------------

    async def acquire(self) -> int:
        """A slot for a new session, or :class:`SlotError` when all are live."""
        return await self.jobs.submit(LoopCall(fn=self._acquire_slot, orphan=self._release_soon))

    async def forward(self, slot: int, inputs: torch.Tensor) -> StepResult:
        """Append ``inputs`` (token ids ``[n]`` or embeddings ``[n, hidden]``) to
        ``slot``'s context in the next batch it fits; its last position's
        hidden state and logits."""
        return await self.jobs.submit(Forward(slot=slot, inputs=inputs))

    async def speech_forward(self, slot: int, inputs: torch.Tensor) -> StepResult:
        """:meth:`forward` for the speech LM's context of ``slot``."""
        if self.speech is None:
            raise RuntimeError("this batch loop has no speech LM")
        return await self.jobs.submit(Forward(slot=slot, inputs=inputs, speech=True))

    async def run(self, slot: int, program: Program[T]) -> T:
        """Run ``program`` for ``slot`` on the worker thread, in order with
        that session's other jobs; what it returns. Cancelled, it is closed
        after its running batch (the steps it took stay in the slot)."""
        job = ProgramRun(slot=slot, program=program)
        try:
            return await self.jobs.submit(job)
        except asyncio.CancelledError:
            job.abandoned = True  # a running program: closed at its next step
            raise

    async def call(self, fn: Callable[..., T], *args: Any, slot: int | None = None) -> T:
        """``fn(*args)`` on the worker thread, between batches; with ``slot``,
        in order with that session's forwards."""
        return await self.jobs.submit(LoopCall(slot=slot, fn=fn, args=args))

    async def side_call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the side lane (work that touches no slot cache);
        a session awaits it before its next job, which keeps its order."""
        if self.side is None:
            return await self.call(fn, *args)
        return await self.side.call(fn, *args)

    async def side_gather(self, key: str, fn: Callable[[list[Any]], list[T]], item: Any) -> T:
        """``fn`` over ``item`` and the other sessions' items of ``key``
        waiting with it, as one call on the side lane (:meth:`SideLane.gather`)."""
        return await self._gather(self.side, key, fn, item)

    async def encoder_gather(self, key: str, fn: Callable[[list[Any]], list[T]], item: Any) -> T:
        """``fn`` over ``item`` and the other sessions' items of ``key``
        waiting with it, as one call on the encoders' lane (or the side lane
        where there is none)."""
        return await self._gather(self.encoders or self.side, key, fn, item)

    async def _gather(
        self, lane: SideLane | None, key: str, fn: Callable[[list[Any]], list[T]], item: Any
    ) -> T:
        if lane is None:  # no lanes: on this loop's thread, alone
            return await self.call(_alone, fn, item)
        return await lane.gather(key, fn, item)

    async def encoder_call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the encoders' lane (beside the side lane's vocoder
        and simplex steps), or on the side lane where there is none."""
        if self.encoders is None:
            return await self.side_call(fn, *args)
        return await self.encoders.call(fn, *args)

    # --- the legs of a relay (job_queue.Relay): work that goes from thread to
    # thread without coming back to the event loop in between

    def program_leg(self, slot: int, program: Program[Any]) -> tuple[JobQueue[Any], Job]:
        """:meth:`run` as a relay's leg."""
        return self.jobs, ProgramRun(slot=slot, program=program)

    def encoder_leg(
        self, key: str, fn: Callable[[list[Any]], list[Any]], item: Any
    ) -> tuple[JobQueue[Any], Job]:
        """``fn`` over ``item`` and the other items of ``key`` waiting with it,
        as one call on the encoders' lane (or the side lane; :meth:`SideLane.gather`)."""
        return self._lane_leg(self.encoders or self.side, key, fn, item)

    def side_leg(
        self, key: str, fn: Callable[[list[Any]], list[Any]], item: Any
    ) -> tuple[JobQueue[Any], Job]:
        """``fn`` over ``item`` and the other items of ``key`` waiting with it,
        as one call on the side lane (:meth:`SideLane.gather`)."""
        return self._lane_leg(self.side, key, fn, item)

    def prep_leg(self, fn: Callable[[Any], Any], item: Any) -> tuple[JobQueue[Any], Job]:
        """``fn(item)`` on the CPU threads of ``prep`` as a relay's leg (only
        where there is that lane)."""
        if self.prep is None:
            raise RuntimeError("this batch loop has no CPU lane")
        return self.prep.jobs, LaneCall(fn=fn, args=(item,))

    def _lane_leg(
        self, lane: SideLane | None, key: str, fn: Callable[[list[Any]], list[Any]], item: Any
    ) -> tuple[JobQueue[Any], Job]:
        if lane is None:  # no lanes: on this loop's thread, alone
            return self.jobs, LoopCall(fn=_alone, args=(fn, item))
        return lane.jobs, LaneCall(fn=fn, args=(item,), key=key)

    async def warm_graphs(self) -> int:
        """Capture both models' CUDA graphs of every batch and step bucket now
        (:meth:`GraphCache.warm`), before any session joins; how many."""
        return await self.call(self._warm_graphs)

    def _warm_graphs(self) -> int:
        return sum(graphs.warm() for graphs in (self.graphs, self.speech_graphs) if graphs)

    async def release(self, slot: int) -> None:
        """End ``slot``'s session: its jobs not taken yet are dropped; the slot
        is emptied after its running batch, if any, even if this is cancelled."""
        self._leaving(slot)
        await self.jobs.submit(
            LoopCall(slot=slot, fn=self._release_slot, args=(slot,), droppable=False)
        )

    def release_nowait(self, slot: int) -> None:
        """:meth:`release` from any thread, awaited by nobody (a session's
        close): a failure is logged on the loop's thread."""
        self._leaving(slot)
        self.jobs.put(LoopCall(slot=slot, fn=self._release_slot, args=(slot,), droppable=False))

    def _leaving(self, slot: int) -> None:
        self.jobs.drop_where(lambda job: job.slot == slot and job.droppable)
        with self.jobs.lock:
            for job in self.running:
                if job.slot == slot:
                    job.abandoned = True

    def pending(self) -> int:
        """Jobs waiting for a tick, running programs included (what
        ``/status`` may show, tests check)."""
        with self.jobs.lock:
            return len(self.jobs) + len(self.running)

    @property
    def handoffs(self) -> int:
        """Thread crossings of this loop's jobs and its lanes' so far."""
        lanes = [lane.jobs for lane in self.lanes]
        return sum(queue.handoffs for queue in (self.jobs, *lanes))

    @property
    def lanes(self) -> list[SideLane]:
        return [lane for lane in (self.side, self.encoders, self.prep) if lane is not None]

    def close(self) -> None:
        """Accept nothing more and cancel what is pending; the worker ends after
        its running tick (join :attr:`thread` to wait for it)."""
        with self.jobs.lock:
            running, self.running = self.running, []
        self.jobs.close()
        for job in running:
            cancel(job)
        for lane in self.lanes:
            lane.close()

    def _release_soon(self, slot: int) -> None:
        """A slot acquired for a session that stopped waiting for it."""
        job = LoopCall(slot=slot, fn=self._release_slot, args=(slot,), droppable=False)
        job.loop = asyncio.get_running_loop()
        with contextlib.suppress(RuntimeError):  # closed: the cache goes with the loop
            self.jobs.put(job)

    def _acquire_slot(self) -> int:
        slot = self.steps.cache.acquire()
        if self.speech is not None:
            self.speech.cache.acquire(slot)
        return slot

    def _release_slot(self, slot: int) -> None:
        self.steps.cache.release(slot)
        if self.speech is not None and self.speech.cache.is_live(slot):
            self.speech.cache.release(slot)

    def busy(self) -> dict[str, dict[str, float]]:
        """Where the loop's thread spent its time, per kind of work (plain
        calls by function name, the batches, the hand-backs, the graph
        captures within the batches), then the lanes' calls (``side <name>``,
        ``encoders <name>``): seconds, count and mean milliseconds, since the
        loop started."""
        lanes = [("", self.busy_clock.s, self.busy_clock.count)]
        for name, graphs in (("llm", self.graphs), ("speech", self.speech_graphs)):
            if graphs is not None:  # within its batches' time, shown apart
                captured = Counter({f"{name} graph captures": graphs.capture_s})
                lanes.append(("", captured, Counter({f"{name} graph captures": graphs.captures})))
        for prefix, lane in (
            ("side ", self.side),
            ("encoders ", self.encoders),
            ("prep ", self.prep),
        ):
            if lane is not None:
                lanes.append((prefix, lane.busy_s, lane.busy_count))
        return {
            prefix + kind: {
                "s": round(seconds, 2),
                "n": counts[kind],
                "mean_ms": round(1000 * seconds / max(1, counts[kind]), 2),
            }
            for prefix, spent, counts in lanes
            for kind, seconds in spent.most_common()
        }

    # --- the worker thread's parts ----------------------------------------------------

    def next_plan(self) -> TickPlan | None:
        """Wait for work; the tick's plan, its running programs and pending
        jobs taken under the queue's lock (None: closed)."""

        def choose(pending: Sequence[SlotJob]) -> tuple[list[SlotJob], TickPlan]:
            plan = plan_tick(pending, self.running, self.limits)
            self.running = plan.waiting
            return plan.taken, plan

        return self.jobs.take(choose, ready=lambda pending: bool(pending or self.running))  # type: ignore[return-value]  # given choose, take returns its plan

    def keep_running(self, jobs: Sequence[ProgramRun]) -> None:
        with self.jobs.lock:
            self.running.extend(jobs)


def _alone(fn: Callable[[list[Any]], list[T]], item: Any) -> T:
    return fn([item])[0]


def run_ticks(loop: BatchLoop) -> None:
    """The batch loop's thread: plan, execute, update, hand back, until closed."""
    with torch.cuda.stream(loop.stream) if loop.stream is not None else contextlib.nullcontext():
        default = torch.cuda.default_stream(loop.steps.device) if loop.stream else None
        while (plan := loop.next_plan()) is not None:
            if default is not None:
                # What sessions queued on the default stream (their inputs,
                # e.g. a unit's embeddings joined) comes before this tick's work.
                loop.stream.wait_stream(default)  # type: ignore[union-attr]  # not None: default is set only with a stream
            done = run_tick(loop, plan)
            if done:
                started = time.perf_counter()
                loop.jobs.deliver(done, HANDOFF_TIMEOUT)
                loop.busy_clock.add("hand back", started)


def run_tick(loop: BatchLoop, plan: TickPlan) -> list[SlotJob]:
    """One tick's work on the models; the jobs it finished (the running
    programs with a next step are kept for the next tick)."""
    executor, driver = loop.executor, loop.driver
    done: list[SlotJob] = []
    batch: list[Row] = list(plan.batch)
    for job in plan.calls:
        if isinstance(job, ProgramRun):  # starts (or closes); its first step may join the batch
            if driver.start(job, batch):
                done.append(job)
            elif job not in batch:
                loop.keep_running([job])
            continue
        executor.call(job)
        done.append(job)
    llm = [job for job in batch if not job.speech]
    executor.forward(llm, speech=False)
    executor.forward([job for job in batch if job.speech], speech=True)
    running = driver.after_batch(batch, done)
    # A tick with LLM work takes several speech-LM steps' time: the programs
    # in their speech take as many steps in it (in order, each after its
    # pick), instead of one a tick behind the LLM's.
    for _ in range(SPEECH_ROUNDS_PER_TICK - 1 if llm and loop.speech else 0):
        if not (speech := [job for job in running if job.speech and not job.abandoned]):
            break
        executor.forward(speech, speech=True)
        running = [job for job in running if job not in speech]
        running += driver.after_batch(speech, done)
    loop.keep_running(running)
    return done
