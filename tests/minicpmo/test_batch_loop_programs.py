"""Decoding programs on the batch loop: sessions' decoding loops run as
generators on the worker thread, their steps batched tick by tick, against
transformers' own path on the CPU with a tiny real Qwen3 model."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import torch

from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from omnilive.engines.minicpmo.runtime.programs import Pick, Program, Step
from tests.minicpmo.test_batch import (
    TIGHT,
    VOCAB,
    Alone,
    batched,
    llm_with,
)
from tests.minicpmo.test_batch_loop import Gate, Make, bookkeeping


def greedy(first: int, steps: int, threads: set[threading.Thread],
           stepped: threading.Event | None = None) -> Program[list[int]]:  # fmt: skip
    """A session's decoding loop as a program: ``steps`` greedy tokens after
    ``first``, noting the thread each step was decided on (and setting
    ``stepped`` after the first)."""
    tokens = [first]
    for _ in range(steps):
        result = yield Step(torch.tensor(tokens[-1:]))
        threads.add(threading.current_thread())
        if stepped is not None:
            stepped.set()
        bookkeeping()
        tokens.append(int(result.logits.argmax()))
    return tokens


async def test_programs_decode_in_lockstep_on_the_worker_and_match_each_session_alone(
    make: Make,
):
    """Programs started together share every batch however long their work
    between steps, run on the worker thread, and decide what each session
    alone on the stock model decides; a program started later joins the
    running ones' batches at once."""
    llm = llm_with("sdpa", 16)
    loop = make(llm, slots=5, capacity=64)
    slots = [await loop.acquire() for _ in range(5)]
    gate, held = await Gate.holding(loop)
    threads: set[threading.Thread] = set()
    stepped = threading.Event()
    together = [asyncio.create_task(loop.run(slot, greedy(slot + 3, 24, threads, stepped)))
                for slot in slots[:4]]  # fmt: skip
    await asyncio.sleep(0)
    gate.opened.set()
    await held
    assert await asyncio.to_thread(stepped.wait, 5)  # the four are running: one more joins
    late = await loop.run(slots[4], greedy(9, 3, threads))
    results = await asyncio.gather(*together)

    assert threads == {loop.thread}
    assert loop.batch_sizes[4] + loop.batch_sizes[5] == 24 and loop.batch_sizes[5] == 3
    for slot, tokens in zip([*slots[:4], slots[4]], [*results, late], strict=True):
        alone, want = Alone(llm), [tokens[0]]
        for _ in range(len(tokens) - 1):
            want.append(int(alone.feed(torch.tensor(want[-1:]))[1].argmax()))
        assert tokens == want and loop.steps.cache.lengths[slot] == len(tokens) - 1
    assert loop.pending() == 0


async def test_a_program_keeps_its_place_among_its_sessions_jobs(make: Make):
    """A slot's job submitted after its program runs after the program's last
    step; a program that fails or yields what is not a step fails alone."""
    llm = llm_with("sdpa", 17)
    loop = make(llm, slots=3, capacity=64)
    a, b, c = [await loop.acquire() for _ in range(3)]
    threads: set[threading.Thread] = set()

    def failing() -> Program[None]:
        yield Step(torch.tensor([1]))
        raise ValueError("a program failed")

    def wrong() -> Program[None]:
        yield torch.tensor([1])  # type: ignore[misc]

    results = await asyncio.gather(
        loop.run(a, greedy(5, 4, threads)),
        loop.call(lambda: loop.steps.cache.lengths[a], slot=a),
        loop.run(b, failing()),
        loop.run(c, wrong()),
        loop.forward(b, torch.tensor([2])),
        return_exceptions=True,
    )
    assert results[1] == 4  # after the program's four steps
    assert isinstance(results[2], ValueError) and isinstance(results[3], TypeError)
    assert "not a Step" in str(results[3])
    assert loop.steps.cache.lengths == [4, 2, 0]


async def test_the_picks_of_a_tick_are_made_together_and_a_failing_pick_fails_alone(make: Make):
    """Programs stepping together get their steps' picks from ONE call of the
    pick function a tick (the tokens of all sessions chosen at once); a
    pick that raises fails its own programs, not the others'."""
    llm = llm_with("sdpa", 20)
    loop = make(llm, slots=4, capacity=64)
    slots = [await loop.acquire() for _ in range(4)]
    calls: list[list[int]] = []

    def argmaxes(steps: list[tuple[Any, int]]) -> list[int]:
        calls.append(sorted(slot for _, slot in steps))
        return [int(result.logits.argmax()) for result, _ in steps]

    def broken(steps: list[tuple[Any, int]]) -> list[int]:
        raise ValueError("a pick failed")

    def picking(slot: int, first: int, fn: Any) -> Program[list[int]]:
        tokens = [first]
        for _ in range(6):
            tokens.append((yield Step(torch.tensor(tokens[-1:]), pick=Pick(fn, slot))).picked)
        return tokens

    gate, held = await Gate.holding(loop)
    runs = [asyncio.create_task(loop.run(slot, picking(slot, slot + 3, argmaxes)))
            for slot in slots[:3]]  # fmt: skip
    failing = asyncio.create_task(loop.run(slots[3], picking(slots[3], 2, broken)))
    await asyncio.sleep(0)
    gate.opened.set()
    await held
    results = await asyncio.gather(*runs)
    with pytest.raises(ValueError, match="a pick failed"):
        await failing

    assert calls == [slots[:3]] * 6
    for tokens in results:
        alone, want = Alone(llm), [tokens[0]]
        for _ in range(6):
            want.append(int(alone.feed(torch.tensor(want[-1:]))[1].argmax()))
        assert tokens == want
    assert loop.steps.cache.lengths == [6, 6, 6, 1] and loop.pending() == 0


async def test_a_cancelled_program_is_closed_after_its_batch_and_its_slot_released(make: Make):
    llm = llm_with("sdpa", 18)
    loop = make(llm, slots=2, capacity=64)
    a, b = await loop.acquire(), await loop.acquire()
    closed, stepped = threading.Event(), threading.Event()

    def endless() -> Program[None]:
        try:
            while True:
                yield Step(torch.tensor([3]))
                stepped.set()
        finally:
            closed.set()

    running = asyncio.create_task(loop.run(a, endless()))
    assert await asyncio.to_thread(stepped.wait, 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await loop.release(a)
    assert closed.is_set() and not loop.steps.cache.is_live(a) and loop.pending() == 0
    # The other slot goes on as alone, and the released one serves a new session.
    alone = Alone(llm)
    result = await loop.forward(b, torch.tensor([4]))
    torch.testing.assert_close(result.logits, alone.feed(torch.tensor([4]))[1], **TIGHT)
    assert await loop.acquire() == a and loop.steps.cache.lengths[a] == 0


async def test_a_tick_runs_its_single_tokens_and_its_prefills_as_two_steps(make: Make):
    """Rows are padded to the batch's longest: a decoding row in a prefill's
    batch would cost as much as the prefill, so a tick runs them apart."""
    llm = llm_with("sdpa", 19)
    loop = make(llm, slots=3, capacity=64)
    slots = [await loop.acquire() for _ in range(3)]
    steps: list[int] = []
    llm.model.register_forward_pre_hook(lambda _, args, kwargs: steps.append(1), with_kwargs=True)
    gate, held = await Gate.holding(loop)
    inputs = [torch.randint(VOCAB, (20,)), torch.tensor([5]), torch.tensor([6, 7])]
    jobs = [asyncio.create_task(loop.forward(slot, x))
            for slot, x in zip(slots, inputs, strict=True)]  # fmt: skip
    await asyncio.sleep(0)
    gate.opened.set()
    await held
    results = await asyncio.gather(*jobs)
    assert len(steps) == 2 and loop.batch_sizes == {1: 1, 2: 1}
    for x, result in zip(inputs, results, strict=True):
        torch.testing.assert_close(result.logits, Alone(llm).feed(x)[1], **TIGHT)


def stepping(first: int, steps: int, speech: bool, ticks: list[int], loop: BatchLoop
             ) -> Program[list[int]]:  # fmt: skip
    """``steps`` greedy tokens on the LLM or the speech LM, noting after each
    how many LLM batches the loop had run."""
    tokens = [first]
    for _ in range(steps):
        result = yield Step(torch.tensor(tokens[-1:]), speech=speech)
        ticks.append(loop.batch_sizes.total())
        tokens.append(int(result.logits.argmax()))
    return tokens


async def test_a_tick_with_llm_work_runs_a_speaking_program_several_speech_steps(make: Make):
    """An LLM step costs a few speech-LM steps: a program in its speech takes
    SPEECH_ROUNDS_PER_TICK of them in a tick that also runs LLM work (each
    after the last's result: the same tokens as alone)."""
    from omnilive.engines.minicpmo.runtime.loop import SPEECH_ROUNDS_PER_TICK

    llm, speech_llm = llm_with("sdpa", 20), llm_with("sdpa", 21)
    loop = make(llm, slots=2, capacity=64, speech=batched(speech_llm, 2, 64))
    talker, speaker = await loop.acquire(), await loop.acquire()
    gate, held = await Gate.holding(loop)
    llm_ticks: list[int] = []
    speech_ticks: list[int] = []
    talking = asyncio.create_task(loop.run(talker, stepping(3, 4, False, llm_ticks, loop)))
    speaking = asyncio.create_task(loop.run(speaker, stepping(5, 9, True, speech_ticks, loop)))
    await asyncio.sleep(0)
    gate.opened.set()
    await held
    said, spoken = await asyncio.gather(talking, speaking)

    assert SPEECH_ROUNDS_PER_TICK == 3
    assert llm_ticks == [1, 2, 3, 4]
    assert speech_ticks == [1, 1, 1, 2, 2, 2, 3, 3, 3]  # three a tick beside the LLM's
    for model, tokens in ((llm, said), (speech_llm, spoken)):
        alone, want = Alone(model), [tokens[0]]
        for _ in range(len(tokens) - 1):
            want.append(int(alone.feed(torch.tensor(want[-1:]))[1].argmax()))
        assert tokens == want
