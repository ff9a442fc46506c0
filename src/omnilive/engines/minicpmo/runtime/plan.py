"""What the batch loop's thread runs at a tick, decided without touching a
model: the jobs sessions submit (typed: a :class:`Forward`, a :class:`LoopCall`,
a :class:`ProgramRun`) and the pure :func:`plan_tick` over them.

A tick takes, in this order:

1. the *running* programs (sessions in the middle of their decoding): their
   next step joins the batch if it fits, else waits for a later tick; an
   abandoned one (its waiter left, its slot released) is taken to be closed;
2. the *pending* jobs in submission order, at most one per slot (a session's
   next job waits for the next tick, so each session's jobs run in the order
   it submitted them; a slot with a running program takes nothing new), and
   every job of nobody's (``slot`` None): calls and programs to start, and
   forwards that fit.

A batch holds at most ``max_rows`` forwards of each model and at most
``max_positions`` padded positions (every row is padded to the longest); a
first forward always fits. Forwards left out keep their place in line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omnilive.engines.job_queue import Job

if TYPE_CHECKING:
    import torch

    from omnilive.engines.minicpmo.runtime.programs import Pick, Program


@dataclass(eq=False, kw_only=True)
class SlotJob(Job):
    """A job in a session's order: ``slot`` (None: nobody's)."""

    slot: int | None = None

    @property
    def count(self) -> int:
        """Positions it adds to its slot's context this tick (0: none)."""
        return 0


@dataclass(eq=False, kw_only=True)
class Forward(SlotJob):
    """New positions of a slot's LLM (or, with ``speech``, speech-LM) context."""

    inputs: torch.Tensor
    speech: bool = False

    @property
    def count(self) -> int:
        return int(self.inputs.shape[0])


@dataclass(eq=False, kw_only=True)
class LoopCall(SlotJob):
    """``fn(*args)`` on the loop's thread between batches. A call that is not
    ``droppable`` (a slot's release) runs even when its session is gone."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass(eq=False, kw_only=True)
class ProgramRun(SlotJob):
    """A decoding program run on the loop's thread: not started (``step``
    None), or waiting for the forward of its ``step`` (then it is *running*)."""

    program: Program[Any]
    inputs: torch.Tensor | None = None
    speech: bool = False
    pick: Pick | None = None
    abandoned: bool = False  # its waiter gave up or its slot is released: close it

    def abandon(self) -> None:
        self.abandoned = True

    @property
    def count(self) -> int:
        return 0 if self.inputs is None else int(self.inputs.shape[0])

    @property
    def stepping(self) -> bool:
        """Whether it waits for a forward (else it has to be started)."""
        return self.inputs is not None


@dataclass(frozen=True)
class Limits:
    """A tick's batch bounds, per model (LLM, speech LM)."""

    max_rows: int
    max_positions: int = 2048


@dataclass
class TickPlan:
    """One tick: ``calls`` run first in order (plain calls, programs to start
    or to close), then ``batch`` as one forward per model; ``waiting`` are the
    running programs left for a later tick; ``taken`` are the pending jobs this
    tick starts (the queue marks them started)."""

    calls: list[LoopCall | ProgramRun] = field(default_factory=list)
    batch: list[Forward | ProgramRun] = field(default_factory=list)
    waiting: list[ProgramRun] = field(default_factory=list)
    taken: list[SlotJob] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.calls or self.batch)


def fits(batch: Sequence[Forward | ProgramRun], job: Forward | ProgramRun, limits: Limits) -> bool:
    """Whether ``job``'s forward joins ``batch`` within its model's bounds:
    at most ``max_rows`` rows (with CUDA graphs, rows are padded up to the
    next captured bucket; max_rows is then the largest) and, padded to the
    longest, ``max_positions`` positions; a first forward always fits."""
    same = [other.count for other in batch if other.speech == job.speech]
    if not same:
        return True
    wider = max(*same, job.count)
    return len(same) < limits.max_rows and (len(same) + 1) * wider <= limits.max_positions


def plan_tick(
    pending: Sequence[SlotJob], running: Sequence[ProgramRun], limits: Limits
) -> TickPlan:
    """The tick's work (see the module): pure, over the jobs' slots and sizes."""
    plan = TickPlan()
    seen = {job.slot for job in running}  # slots with a job taken or left waiting
    for job in running:
        if job.abandoned:
            plan.calls.append(job)  # closed when the tick starts it again
        elif fits(plan.batch, job, limits):
            plan.batch.append(job)
        else:
            plan.waiting.append(job)
    for job in pending:
        if job.slot is not None:
            if job.slot in seen:
                continue  # after this slot's earlier job: next tick
            seen.add(job.slot)
        if isinstance(job, Forward):
            if fits(plan.batch, job, limits):
                plan.batch.append(job)
                plan.taken.append(job)
        elif isinstance(job, LoopCall | ProgramRun):
            plan.calls.append(job)
            plan.taken.append(job)
        else:
            raise TypeError(f"a batch loop cannot run a {type(job).__name__}")
    return plan
