"""What runs a tick's plan on the model (:class:`Executor`) and what drives
the decoding programs through their steps (:class:`Driver`), both on the
batch loop's thread; :mod:`~omnilive.engines.minicpmo.runtime.plan` decides
what a tick holds, :mod:`~omnilive.engines.minicpmo.runtime.loop` ties them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from omnilive.engines.job_queue import Stopped
from omnilive.engines.minicpmo.runtime.batch import BatchedSteps, StepResult
from omnilive.engines.minicpmo.runtime.graphs import SHORT_STEP, GraphCache
from omnilive.engines.minicpmo.runtime.plan import Forward, Limits, LoopCall, ProgramRun, fits
from omnilive.engines.minicpmo.runtime.programs import Step, run_picks

log = logging.getLogger(__name__)

Row = Forward | ProgramRun


class Busy:
    """Where a thread's time goes: seconds and counts per kind of work
    (bounded keys: function names and fixed labels)."""

    def __init__(self) -> None:
        self.s: Counter[str] = Counter()
        self.count: Counter[str] = Counter()

    def add(self, kind: str, started: float) -> None:
        self.s[kind] += time.perf_counter() - started
        self.count[kind] += 1


class Executor:
    """Runs forwards as batched steps of the LLM (and the speech LM), and
    plain calls, on the calling thread (the batch loop's)."""

    def __init__(
        self,
        steps: BatchedSteps,
        speech: BatchedSteps | None,
        graphs: GraphCache | None,
        speech_graphs: GraphCache | None,
        busy: Busy,
    ) -> None:
        self.steps, self.speech = steps, speech
        self.graphs, self.speech_graphs = graphs, speech_graphs
        self.busy = busy
        self.batch_sizes: Counter[int] = Counter()  # rows -> batches formed (bounded keys)
        self.speech_batch_sizes: Counter[int] = Counter()

    def call(self, job: LoopCall) -> None:
        """``job.fn(*job.args)``, its outcome in the job; the GPU work it
        queued is waited for, so its time is its own, not the next batch's."""
        started = time.perf_counter()
        try:
            job.result = job.fn(*job.args)
            if self.steps.device.type == "cuda":
                torch.cuda.current_stream(self.steps.device).synchronize()
        except BaseException as exc:  # the caller's to handle: handed over
            job.fail(exc)
        self.busy.add(getattr(job.fn, "__name__", "call"), started)

    def forward(self, batch: Sequence[Row], speech: bool) -> None:
        """One model's rows of a tick (each row's result or error in its job):
        single tokens and a unit's prefill as two steps, since in one every
        row would be padded to the longest, a decoding row costing as much
        as a prefill of a hundred positions. A row its slot cannot take (not
        live, past its capacity) fails alone first."""
        steps = self.speech if speech else self.steps
        if not batch:
            return
        if steps is None:
            for job in batch:
                job.fail(RuntimeError("this batch loop has no speech LM"))
            return
        ready = []
        for job in batch:
            try:  # one session's bad request must not fail the others' step
                steps.cache.check([job.slot], [job.count])  # type: ignore[list-item]  # a batch row always has a slot
            except Exception as exc:  # handed to that session alone
                job.fail(exc)
            else:
                ready.append(job)
        model = "speech" if speech else "llm"
        short = [job for job in ready if job.count <= SHORT_STEP]
        long = [job for job in ready if job.count > SHORT_STEP]
        for group, kind in ((short, "steps"), (long, "prefills")):
            if group:
                started = time.perf_counter()
                self._step(group, speech)
                self.busy.add(f"{model} {kind}", started)

    def _step(self, rows: list[Row], speech: bool) -> None:
        steps = self.speech if speech else self.steps
        graphs = self.speech_graphs if speech else self.graphs
        assert steps is not None
        (self.speech_batch_sizes if speech else self.batch_sizes)[len(rows)] += 1
        try:
            requests = [(job.slot, job.inputs) for job in rows]
            results = graphs.step(requests) if graphs is not None else steps.step(requests)  # type: ignore[arg-type]  # a batch row has a slot and inputs
            if steps.device.type == "cuda":
                # Handed back once the stream has produced them: no session
                # blocks its event loop reading them.
                torch.cuda.current_stream(steps.device).synchronize()
        except BaseException as exc:  # every session of the batch gets it, logged once
            slots = [job.slot for job in rows]
            log.error("batched step over slots %s failed", slots, exc_info=exc)
            for job in rows:
                job.fail(exc)
            return
        for job, result in zip(rows, results, strict=True):
            job.result = result


class Driver:
    """Advances the decoding programs: starts them, makes a batch's picks
    together, sends each its step's result and takes its next step."""

    def __init__(self, limits: Limits, busy: Busy) -> None:
        self.limits = limits
        self.busy = busy

    def start(self, job: ProgramRun, batch: list[Row]) -> bool:
        """Start ``job``'s program: True when it is done at once; else its
        first step joins ``batch`` when it fits (False, and ``job`` is in the
        batch) or waits for a later tick (False, ``job`` not in it)."""
        started = time.perf_counter()
        try:
            if self.advance(job, None):
                return True
            if fits(batch, job, self.limits):
                batch.append(job)
            return False
        finally:
            self.busy.add("program steps", started)

    def after_batch(self, batch: Sequence[Row], done: list[Any]) -> list[ProgramRun]:
        """After a batch: its programs' picks (together), then each program
        sent its result. Plain forwards and finished programs go to ``done``;
        the programs with a next step are returned."""
        if picking := [job for job in batch if isinstance(job, ProgramRun) and job.pick]:
            # Timed per pick function: the text and the speech tokens' apart.
            run_picks([job for job in picking if job.error is None], self.busy.add)
        started = time.perf_counter()
        running = []
        for job in batch:
            if not isinstance(job, ProgramRun):
                done.append(job)
            elif job.error is not None or self.advance(job, job.result):
                job.program.close()
                done.append(job)
            else:
                running.append(job)
        self.busy.add("program steps", started)
        return running

    @staticmethod
    def advance(job: ProgramRun, result: StepResult | None) -> bool:
        """Send a program its last step's result (None to start it): True when
        it is done (its outcome or error in the job), else its next step is
        the job's forward."""
        program = job.program
        job.inputs, job.result, job.error = None, None, None
        if job.abandoned:  # its waiter gave up, or its slot is being released
            program.close()
            job.error = Stopped(f"the program of slot {job.slot} was stopped")
            return True
        try:
            step = program.send(result)  # type: ignore[arg-type]  # None starts it: a generator's first send
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
