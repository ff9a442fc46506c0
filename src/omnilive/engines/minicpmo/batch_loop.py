"""A step scheduler for one loaded model: the LLM steps of many live sessions
batched on the one thread that owns the model.

Sessions are coroutines on an event loop; each owns a slot of the model's
:class:`~omnilive.engines.minicpmo.batch.SlotCache` and submits work for it:
``await loop.forward(slot, inputs)`` (new positions of its LLM context) and
``await loop.call(fn, *args, slot=slot)`` (blocking work between batches) and
``await loop.side_call(fn, *args)`` (work that touches no slot: the encoders,
the vocoder, on the :class:`~omnilive.engines.minicpmo.side_lane.SideLane`
beside the batches). The worker thread runs *ticks*: it takes what is
pending, in submission order, at most one job per slot (a session's next job
waits for the next tick, so each session's jobs run in the order it submitted
them), runs the plain calls one by one, then every forward of the tick as ONE
:meth:`~omnilive.engines.minicpmo.batch.BatchedSteps.step`.

A session's decoding loop can run on the worker thread itself as a *program*
(``await loop.run(slot, program)``): a generator that yields each
:class:`Step` it needs and is sent that step's result. The worker advances
every running program right after each batch and puts its next step in the
next one, so sessions decoding at once share every batch (lockstep), and a
unit's dozens of steps cost one hand-off to the worker and one back instead
of one each way per step. A step's *pick* (the next token's choice) is made
right after its batch, together with the other programs' picks of the same
kind (:mod:`~omnilive.engines.minicpmo.programs`).

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

from omnilive.engines.minicpmo.batch import BatchedSteps, StepResult
from omnilive.engines.minicpmo.batch_graphs import SHORT_STEP, GraphCache
from omnilive.engines.minicpmo.programs import Pick, Program, Step, run_picks
from omnilive.engines.minicpmo.side_lane import SideLane

log = logging.getLogger(__name__)
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


@dataclass(eq=False)
class _Job:
    slot: int | None  # the session whose order it keeps; None: nobody's
    inputs: torch.Tensor | None  # a forward's new positions, or
    fn: Callable[..., Any] | None  # plain work
    args: tuple[Any, ...]
    future: asyncio.Future[Any] | None  # None: nobody awaits it
    loop: asyncio.AbstractEventLoop
    droppable: bool = True
    orphan: Callable[[Any], None] | None = None  # takes a result nobody awaits any more
    speech: bool = False  # a forward of the speech LM (else of the LLM)
    program: Program[Any] | None = None  # advanced on the worker thread
    pick: Pick | None = None  # made of its step's result, with the tick's others
    abandoned: bool = False  # a started program nobody awaits any more
    started: bool = False
    result: Any = None
    error: BaseException | None = None

    @property
    def count(self) -> int:
        return 0 if self.inputs is None else int(self.inputs.shape[0])


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
        name: str = "minicpmo-batch",
    ) -> None:
        self.steps = steps
        self.speech = speech
        self.side = side
        self.encoders = encoders
        if speech is not None and speech.cache.slots != steps.cache.slots:
            raise ValueError("the speech LM's cache needs as many slots as the LLM's")
        if graphs is None:
            graphs = steps.device.type == "cuda"
        self.graphs = GraphCache(steps) if graphs is True else graphs or None
        self.speech_graphs = (
            GraphCache(speech) if speech is not None and self.graphs is not None else None
        )
        self.max_rows = max_rows or steps.cache.slots
        self.max_positions = max_positions
        self.batch_sizes: Counter[int] = Counter()  # rows -> batches formed (bounded keys)
        self.speech_batch_sizes: Counter[int] = Counter()
        # Where the worker thread's time goes (read through busy()); bounded keys.
        self.busy_s: Counter[str] = Counter()
        self.busy_count: Counter[str] = Counter()
        self._pending: deque[_Job] = deque()
        # Programs whose next step waits for a batch (their jobs hold it).
        self._running: list[_Job] = []
        self._changed = threading.Condition()
        self._closed = False
        self.stream = (
            torch.cuda.Stream(steps.device, priority=LOOP_STREAM_PRIORITY)
            if steps.device.type == "cuda"
            else None
        )
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    # --- what sessions await, on their event loop --------------------------------------

    async def acquire(self) -> int:
        """A slot for a new session, or :class:`SlotError` when all are live."""
        return await self._submit(None, fn=self._acquire_slot, orphan=self._release_soon)

    async def forward(self, slot: int, inputs: torch.Tensor) -> StepResult:
        """Append ``inputs`` (token ids ``[n]`` or embeddings ``[n, hidden]``) to
        ``slot``'s context in the next batch it fits; its last position's
        hidden state and logits."""
        return await self._submit(slot, inputs=inputs)

    async def speech_forward(self, slot: int, inputs: torch.Tensor) -> StepResult:
        """:meth:`forward` for the speech LM's context of ``slot``."""
        if self.speech is None:
            raise RuntimeError("this batch loop has no speech LM")
        return await self._submit(slot, inputs=inputs, speech=True)

    async def run(self, slot: int, program: Program[T]) -> T:
        """Run ``program`` for ``slot`` on the worker thread, in order with
        that session's other jobs; what it returns. Cancelled, it is closed
        after its running batch (the steps it took stay in the slot)."""
        return await self._submit(slot, program=program)

    async def call(self, fn: Callable[..., T], *args: Any, slot: int | None = None) -> T:
        """``fn(*args)`` on the worker thread, between batches; with ``slot``,
        in order with that session's forwards."""
        return await self._submit(slot, fn=fn, args=args)

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

    async def encoder_call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the encoders' lane (beside the side lane's vocoder
        and simplex steps), or on the side lane where there is none."""
        if self.encoders is None:
            return await self.side_call(fn, *args)
        return await self.encoders.call(fn, *args)

    async def encoder_gather(self, key: str, fn: Callable[[list[Any]], list[T]], item: Any) -> T:
        """``fn`` over ``item`` and the other sessions' items of ``key``
        waiting with it, as one call on the encoders' lane (or the side lane;
        :meth:`SideLane.gather`)."""
        return await self._gather(self.encoders or self.side, key, fn, item)

    async def _gather(
        self, lane: SideLane | None, key: str, fn: Callable[[list[Any]], list[T]], item: Any
    ) -> T:
        if lane is None:  # no lanes: on this loop's thread, alone
            return (await self.call(fn, [item]))[0]
        return await lane.gather(key, fn, item)

    async def warm_graphs(self) -> int:
        """Capture both models' CUDA graphs of every batch and step bucket now
        (:meth:`GraphCache.warm`), before any session joins; how many."""
        return await self.call(self._warm_graphs)

    def _warm_graphs(self) -> int:
        return sum(graphs.warm() for graphs in (self.graphs, self.speech_graphs) if graphs)

    async def release(self, slot: int) -> None:
        """End ``slot``'s session: its jobs not taken yet are dropped; the slot
        is emptied after its running batch, if any, even if this is cancelled."""
        with self._changed:
            dropped = [job for job in self._pending if job.slot == slot and job.droppable]
            self._pending = deque(job for job in self._pending if job not in dropped)
            for job in self._running:
                if job.slot == slot:
                    job.abandoned = True
        for job in dropped:
            _cancel(job)
        await self._submit(slot, fn=self._release_slot, args=(slot,), droppable=False)

    def pending(self) -> int:
        """Jobs waiting for a tick, running programs included (what
        ``/status`` may show, tests check)."""
        with self._changed:
            return len(self._pending) + len(self._running)

    def close(self) -> None:
        """Accept nothing more and cancel what is pending; the worker ends after
        its running tick (join :attr:`thread` to wait for it)."""
        with self._changed:
            self._closed = True
            pending, self._pending = [*self._running, *self._pending], deque()
            self._running = []
            self._changed.notify()
        for job in pending:
            _cancel(job)
        for lane in (self.side, self.encoders):
            if lane is not None:
                lane.close()

    # --- the queue ------------------------------------------------------------------------

    async def _submit(
        self,
        slot: int | None,
        inputs: torch.Tensor | None = None,
        fn: Callable[..., Any] | None = None,
        args: tuple[Any, ...] = (),
        *,
        droppable: bool = True,
        orphan: Callable[[Any], None] | None = None,
        speech: bool = False,
        program: Program[Any] | None = None,
    ) -> Any:
        loop = asyncio.get_running_loop()
        job = _Job(slot, inputs, fn, args, loop.create_future(), loop, droppable, orphan, speech,
                   program)  # fmt: skip
        self._enqueue(job)
        try:
            return await job.future  # type: ignore[misc]
        except asyncio.CancelledError:
            if job.droppable:
                with self._changed:
                    if not job.started and job in self._pending:
                        self._pending.remove(job)
                    job.abandoned = True  # a running program: closed at its next step
            raise

    def _enqueue(self, job: _Job) -> None:
        with self._changed:
            if self._closed:
                raise RuntimeError("the batch loop is closed")
            self._pending.append(job)
            self._changed.notify()

    def _release_soon(self, slot: int) -> None:
        """A slot acquired for a session that stopped waiting for it."""
        job = _Job(slot, None, self._release_slot, (slot,), None,
                   asyncio.get_running_loop(), droppable=False)  # fmt: skip
        with contextlib.suppress(RuntimeError):  # closed: the cache goes with the loop
            self._enqueue(job)

    def _acquire_slot(self) -> int:
        slot = self.steps.cache.acquire()
        if self.speech is not None:
            self.speech.cache.acquire(slot)
        return slot

    def _release_slot(self, slot: int) -> None:
        self.steps.cache.release(slot)
        if self.speech is not None and self.speech.cache.is_live(slot):
            self.speech.cache.release(slot)

    # --- the worker thread ----------------------------------------------------------------

    def _work(self) -> None:
        if self.stream is None:
            self._ticks()
            return
        with torch.cuda.stream(self.stream):
            self._ticks()

    def _ticks(self) -> None:
        default = torch.cuda.default_stream(self.steps.device) if self.stream else None
        while (tick := self._next_tick()) is not None:
            plain, batch = tick
            if default is not None:
                # What sessions queued on the default stream (their inputs,
                # e.g. a unit's embeddings joined) comes before this tick's work.
                self.stream.wait_stream(default)  # type: ignore[union-attr]
            done: list[_Job] = []  # what goes back to the sessions after this tick
            for job in plain:
                started = time.perf_counter()
                if job.program is not None:  # starts; its first step joins this batch if it fits
                    if self._advance(job, None):
                        done.append(job)
                    elif _fits(batch, job, self.max_rows, self.max_positions):
                        batch.append(job)
                    else:
                        self._keep_running(job)
                    self._account("program steps", started)
                    continue
                try:
                    job.result = job.fn(*job.args)  # type: ignore[misc]
                    self._settle_device()
                except BaseException as exc:  # the caller's to handle: handed over
                    job.error = exc
                self._account(getattr(job.fn, "__name__", "call"), started)
                done.append(job)
            llm = [job for job in batch if not job.speech]
            self._run_batch(llm, self.steps, self.graphs)
            if self.speech is not None:
                speech = [job for job in batch if job.speech]
                self._run_batch(speech, self.speech, self.speech_graphs)
            running = self._finish_steps(batch, done)
            # A tick with LLM work takes several speech-LM steps' time: the
            # programs in their speech take as many steps in it (in order,
            # each after its pick), instead of one a tick behind the LLM's.
            for _ in range(SPEECH_ROUNDS_PER_TICK - 1 if llm and self.speech else 0):
                if not (speech := [job for job in running if job.speech and not job.abandoned]):
                    break
                self._run_batch(speech, self.speech, self.speech_graphs)  # type: ignore[arg-type]
                running = [job for job in running if job not in speech]
                running += self._finish_steps(speech, done)
            self._keep_running(*running)
            if done:
                started = time.perf_counter()
                self._hand_back(done)
                self._account("hand back", started)

    def _finish_steps(self, batch: list[_Job], done: list[_Job]) -> list[_Job]:
        """After a batch: its programs' picks (together), then each program
        sent its result. The finished go to ``done``; the programs with a
        next step are returned."""
        if picking := [job for job in batch if job.pick is not None and job.error is None]:
            started = time.perf_counter()
            run_picks(picking)  # the programs' next tokens, chosen together
            self._account("picks", started)
        started = time.perf_counter()
        running = []
        for job in batch:
            if job.program is None:
                done.append(job)
            elif job.error is not None or self._advance(job, job.result):
                job.program.close()
                done.append(job)
            else:
                running.append(job)
        self._account("program steps", started)
        return running

    def _advance(self, job: _Job, result: StepResult | None) -> bool:
        """Send a program its last step's result (None to start it): True when
        it is done (its outcome or error in the job), else its next step is
        the job's forward."""
        program = job.program
        assert program is not None
        job.inputs, job.result, job.error = None, None, None
        if job.abandoned:  # its waiter gave up, or its slot is being released
            program.close()
            job.error = RuntimeError(f"the program of slot {job.slot} was stopped")
            return True
        try:
            step = program.send(result)  # type: ignore[arg-type]
        except StopIteration as stop:
            job.result = stop.value
            return True
        except BaseException as exc:  # the program's caller gets it
            job.error = exc
            return True
        if not isinstance(step, Step):
            job.error = TypeError(f"a program yielded {type(step).__name__}, not a Step")
            return True
        job.inputs, job.speech, job.pick = step.inputs, step.speech, step.pick
        return False

    def _keep_running(self, *jobs: _Job) -> None:
        with self._changed:
            self._running.extend(jobs)

    def _settle_device(self) -> None:
        """Wait for the GPU work a plain call queued: its time is its own in
        :attr:`busy_s`, not the next batch's."""
        if self.steps.device.type == "cuda":
            torch.cuda.current_stream(self.steps.device).synchronize()

    def _account(self, kind: str, started: float) -> None:
        self.busy_s[kind] += time.perf_counter() - started
        self.busy_count[kind] += 1

    def busy(self) -> dict[str, dict[str, float]]:
        """Where the loop's thread spent its time, per kind of work (plain
        calls by function name, the batches, the hand-backs, the graph
        captures within the batches), then the lanes' calls (``side <name>``,
        ``encoders <name>``): seconds, count and mean milliseconds, since the
        loop started."""
        lanes = [("", self.busy_s, self.busy_count)]
        for name, graphs in (("llm", self.graphs), ("speech", self.speech_graphs)):
            if graphs is not None:  # within its batches' time, shown apart
                captured = Counter({f"{name} graph captures": graphs.capture_s})
                lanes.append(("", captured, Counter({f"{name} graph captures": graphs.captures})))
        for prefix, lane in (("side ", self.side), ("encoders ", self.encoders)):
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

    def _next_tick(self) -> tuple[list[_Job], list[_Job]] | None:
        """What runs now: the first job of each slot in line (and every job of
        nobody's), forwards within the batch bounds. Marked started under the
        lock, so a cancelled waiter either removed its job first or lets it run."""
        with self._changed:
            while not self._pending and not self._running and not self._closed:
                self._changed.wait()
            if self._closed:
                return None
            plain: list[_Job] = []
            batch: list[_Job] = []
            # Running programs first: they are in the middle of their work.
            running, self._running = self._running, []
            seen = {job.slot for job in running}  # slots with a job taken or left waiting
            for job in running:
                if job.abandoned:
                    plain.append(job)  # closed when the tick starts it again
                elif _fits(batch, job, self.max_rows, self.max_positions):
                    batch.append(job)
                else:
                    self._running.append(job)
            for job in self._pending:
                if job.slot is not None:
                    if job.slot in seen:
                        continue  # after this slot's earlier job: next tick
                    seen.add(job.slot)
                if job.inputs is None:
                    plain.append(job)
                elif _fits(batch, job, self.max_rows, self.max_positions):
                    batch.append(job)
            for job in (*plain, *batch):
                job.started = True
            self._pending = deque(job for job in self._pending if not job.started)
            return plain, batch

    def _run_batch(self, batch: list[_Job], steps: BatchedSteps, graphs: GraphCache | None) -> None:
        ready = []
        for job in batch:
            try:  # one session's bad request must not fail the others' step
                steps.cache.check([job.slot], [job.count])  # type: ignore[list-item]
            except Exception as exc:  # handed to that session alone
                job.error = exc
            else:
                ready.append(job)
        # Single tokens and a unit's prefill as two steps: in one, every row
        # would be padded to the longest, a decoding row costing as much as a
        # prefill of a hundred positions.
        model = "llm" if steps is self.steps else "speech"
        short = [job for job in ready if job.count <= SHORT_STEP]
        long = [job for job in ready if job.count > SHORT_STEP]
        for group, kind in ((short, "steps"), (long, "prefills")):
            if group:
                started = time.perf_counter()
                self._step(group, steps, graphs)
                self._account(f"{model} {kind}", started)

    def _step(self, ready: list[_Job], steps: BatchedSteps, graphs: GraphCache | None) -> None:
        sizes = self.batch_sizes if steps is self.steps else self.speech_batch_sizes
        sizes[len(ready)] += 1
        try:
            requests = [(job.slot, job.inputs) for job in ready]
            results = graphs.step(requests) if graphs is not None else steps.step(requests)
            if steps.device.type == "cuda":
                # Handed back once the stream has produced them: no session
                # blocks its event loop reading them.
                torch.cuda.current_stream(steps.device).synchronize()
        except BaseException as exc:  # every session of the batch gets it, logged once
            log.error("batched step over slots %s failed", [job.slot for job in ready],
                      exc_info=exc)  # fmt: skip
            for job in ready:
                job.error = exc
            return
        for job, result in zip(ready, results, strict=True):
            job.result = result

    def _hand_back(self, jobs: list[_Job]) -> None:
        """Settle the tick's futures on their loops and wait until each loop
        has run the sessions it woke (see the module's docstring)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        for job in jobs:
            by_loop.setdefault(job.loop, []).append(job)
        turns = []
        for loop, settled in by_loop.items():
            turned = threading.Event()
            with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
                loop.call_soon_threadsafe(_settle, settled, turned)
                turns.append(turned)
        for turned in turns:
            turned.wait(HANDOFF_TIMEOUT)


def _fits(batch: list[_Job], job: _Job, max_rows: int, max_positions: int) -> bool:
    """Whether ``job``'s forward joins ``batch`` within its model's bounds:
    at most ``max_rows`` rows (with CUDA graphs, rows are padded up to the
    next captured bucket; max_rows is then the largest) and, padded to the
    longest, ``max_positions`` positions; a first forward always fits."""
    same = [other.count for other in batch if other.speech == job.speech]
    if not same:
        return True
    wider = max(*same, job.count)
    return len(same) < max_rows and (len(same) + 1) * wider <= max_positions


def _settle(jobs: list[_Job], turned: threading.Event) -> None:
    """On the sessions' loop: deliver, then mark the loop's next turn, which
    comes after the callbacks of the futures just set (the woken sessions)."""
    for job in jobs:
        future = job.future
        if future is None or future.done():  # cancelled while running: discarded
            if job.error is not None and future is None:
                log.error("%s of slot %s failed", job.fn, job.slot, exc_info=job.error)
            elif job.error is None and job.orphan is not None:
                job.orphan(job.result)
        elif job.error is not None:
            future.set_exception(job.error)
        else:
            future.set_result(job.result)
    asyncio.get_running_loop().call_soon(turned.set)


def _cancel(job: _Job) -> None:
    if job.future is not None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
            job.loop.call_soon_threadsafe(job.future.cancel)
