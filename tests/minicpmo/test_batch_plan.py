"""The batch loop's planner (runtime/plan.py): what a tick takes, decided
without a model or a thread, as gateway/scheduler.py is tested."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from omnilive.engines.minicpmo.runtime.plan import Forward, Limits, LoopCall, ProgramRun, plan_tick

LIMITS = Limits(max_rows=4, max_positions=64)


def rows(n: int) -> Any:
    return SimpleNamespace(shape=(n,))  # what the planner reads of a tensor


def forward(slot: int | None, n: int = 1, speech: bool = False) -> Forward:
    return Forward(slot=slot, inputs=rows(n), speech=speech)


def program(slot: int, n: int | None = None, speech: bool = False) -> ProgramRun:
    job = ProgramRun(slot=slot, program=iter(()))  # type: ignore[arg-type]
    if n is not None:  # running: waiting for the forward of its step
        job.inputs, job.speech = rows(n), speech
    return job


def test_one_job_per_slot_in_submission_order_and_all_of_nobodys():
    first, second = forward(0), forward(0)
    other = forward(1)
    free = [LoopCall(fn=print), LoopCall(fn=print)]
    plan = plan_tick([first, second, other, *free], [], LIMITS)
    assert plan.batch == [first, other]
    assert plan.calls == free
    assert plan.taken == [first, other, *free]  # the slot's second waits for the next tick


def test_a_running_program_comes_first_and_holds_its_slots_new_jobs_back():
    running = program(0, n=1)
    behind = LoopCall(slot=0, fn=print)
    other = forward(1)
    plan = plan_tick([behind, other], [running], LIMITS)
    assert plan.batch == [running, other]
    assert plan.calls == []
    assert plan.taken == [other]


def test_an_abandoned_program_is_taken_to_be_closed_and_a_new_one_to_be_started():
    gone, new = program(0, n=1), program(1)
    gone.abandoned = True
    plan = plan_tick([new], [gone], LIMITS)
    assert plan.calls == [gone, new]
    assert plan.batch == []
    assert plan.taken == [new]


def test_rows_and_padded_positions_are_bounded_per_model_and_a_first_forward_always_fits():
    many = [forward(slot) for slot in range(6)]
    plan = plan_tick(many, [], LIMITS)
    assert plan.batch == many[:4]  # max_rows
    long = [forward(0, n=40), forward(1, n=20), forward(2, n=1, speech=True)]
    plan = plan_tick(long, [], LIMITS)
    assert plan.batch == [long[0], long[2]]  # 2 x 40 > 64; the speech LM's rows apart
    alone = forward(0, n=500)
    assert plan_tick([alone], [], LIMITS).batch == [alone]


def test_running_programs_that_do_not_fit_wait_for_a_later_tick():
    running = [program(slot, n=30) for slot in range(3)]
    plan = plan_tick([], running, LIMITS)
    assert plan.batch == running[:2]
    assert plan.waiting == running[2:]
    assert not plan_tick([], [], LIMITS)


def test_an_unknown_job_is_refused():
    from omnilive.engines.minicpmo.runtime.plan import SlotJob

    with pytest.raises(TypeError):
        plan_tick([SlotJob(slot=0)], [], LIMITS)
