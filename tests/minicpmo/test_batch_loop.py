"""The batching step scheduler with asyncio sessions against transformers'
own path, each session running alone with a ``DynamicCache``, on the CPU with
a tiny real Qwen3 model.

Where a test needs several jobs pending at one tick, it holds the worker
thread in a plain call (:class:`Gate`) while the sessions submit them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import torch

from omnilive.engines.minicpmo.runtime.batch import SlotError, SlotOverflow
from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from omnilive.engines.minicpmo.runtime.programs import Pick, Program, Step
from tests.minicpmo.test_batch import (
    TIGHT,
    VOCAB,
    Alone,
    Script,
    batched,
    llm_with,
    next_input,
    play_alone,
    script,
)

Make = Callable[..., BatchLoop]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    """Batch loops over a model's slots, closed after the test (their threads end)."""
    made: list[BatchLoop] = []

    def make(llm: Any, slots: int, capacity: int, **options: Any) -> BatchLoop:
        made.append(BatchLoop(batched(llm, slots, capacity), **options))
        return made[-1]

    yield make
    for loop in made:
        loop.close()
        await asyncio.to_thread(loop.thread.join, 5)
        assert not loop.thread.is_alive()


class Gate:
    """A plain call that holds the worker thread until opened."""

    def __init__(self) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.entered.set()
        assert self.opened.wait(5)


def done(results: list) -> list[int]:
    return [int(result.logits.argmax()) for result in results]


async def play(loop: BatchLoop, session: Script, after: asyncio.Event | None,
               reached: list[asyncio.Event], left: asyncio.Event) -> int:  # fmt: skip
    """A session: waits for ``after``, takes a slot, runs its script through
    the loop (reporting each action it has done in ``reached``), leaves."""
    if after is not None:
        await after.wait()
    slot = await loop.acquire()
    try:
        for n, action in enumerate(session.actions[: session.length]):
            result = await loop.forward(slot, next_input(session, action))
            assert result.slot == slot and result.logits is not None
            session.seen.append((int(result.logits.argmax()), result.hidden, result.logits))
            if n < len(reached):
                reached[n].set()
    finally:
        await loop.release(slot)
        left.set()
    return slot


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
async def test_concurrent_sessions_match_each_session_alone(make: Make, graphs: bool):
    llm = llm_with("eager")
    sessions = [
        script(1, units=7, start=0),  # the one the late joiners follow
        script(2, units=9, start=0, leave_after=34),  # disconnects mid-unit
        script(3, units=5, start=0),  # short
        script(4, units=6, start=0),
        script(5, units=6, start=0),
        script(6, units=5, start=3),  # joins once session 0 has done 3 actions
        script(7, units=6, start=34),  # joins once session 1 has left: takes its slot
    ]
    wanted = [list(play_alone(llm, session)) for session in sessions]
    for session in sessions:
        session.seen = []
    # graphs=True: ticks padded to buckets, through simulated graphs on the CPU.
    loop = make(llm, slots=6, capacity=128, **({"graphs": True} if graphs else {}))
    assert (loop.graphs is not None) == graphs  # none by default on the CPU
    reached = [asyncio.Event() for _ in range(8)]
    left = [asyncio.Event() for _ in sessions]
    after = {5: reached[3], 6: left[1]}
    plays = [play(loop, s, after.get(k), reached if k == 0 else [], left[k])
             for k, s in enumerate(sessions)]  # fmt: skip
    slots = await asyncio.gather(*plays)

    assert slots[6] == slots[1] and len(set(slots[:6])) == 6
    requests = sum(session.length for session in sessions)
    batches = sum(loop.batch_sizes.values())
    assert sum(rows * n for rows, n in loop.batch_sizes.items()) == requests
    print(f"{requests} requests in {batches} batches: {sorted(loop.batch_sizes.items())}")
    # Batches of every live session most of the time; the singles are the
    # tails of the sessions that end last.
    assert batches < requests / 2 and loop.batch_sizes[6] >= 20
    for session, want in zip(sessions, wanted, strict=True):
        assert sum(action is None for action in session.actions[: session.length]) >= 20
        assert [token for token, _, _ in session.seen] == [token for token, _, _ in want]
        for (_, hidden, logits), (_, want_hidden, want_logits) in zip(
            session.seen, want, strict=True
        ):
            torch.testing.assert_close(logits, want_logits, **TIGHT)
            torch.testing.assert_close(hidden, want_hidden, **TIGHT)
    assert loop.pending() == 0
    assert not any(loop.steps.cache.is_live(slot) for slot in range(6))
    if loop.graphs is not None:  # rows of 1 to 6 on buckets 1, 2, 4, 6
        assert {rows for rows, _, _, _ in loop.graphs.graphs} <= {1, 2, 4, 6}
        assert loop.graphs.captures >= 4 and loop.graphs.eager == 0
        # Most ticks read a prefix of the slots as a view; the tails of
        # sessions alone on a high slot (a hole below them) gather their rows.
        gathered = {key for key in loop.graphs.graphs if key[3]}
        assert gathered and len(gathered) < len(loop.graphs.graphs)
        assert 0 < loop.graphs.gathers < batches / 2


def bookkeeping() -> None:
    """A session's own work on the event loop between two steps (sampling,
    events to its client), long enough to let other threads take the GIL."""
    time.sleep(0.002)


async def test_sessions_decoding_in_lockstep_stay_in_one_batch(make: Make):
    """After each batch the worker waits until the woken sessions submitted
    their next steps: four sessions decoding together never split, however
    long each one's work between its steps."""
    llm = llm_with("sdpa", 10)
    loop = make(llm, slots=4, capacity=64)
    slots = [await loop.acquire() for _ in range(4)]
    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    # The worker is inside the call before anything else queues: it takes
    # the jobs below together, not the call with those queued so far.
    await asyncio.to_thread(gate.entered.wait, 5)

    async def decode(slot: int) -> list[int]:
        tokens = [slot + 1]
        for _ in range(10):
            tokens += done([await loop.forward(slot, torch.tensor(tokens[-1:]))])
            bookkeeping()
        return tokens

    sessions = [asyncio.ensure_future(decode(slot)) for slot in slots]
    await asyncio.sleep(0)  # each session submitted its first step
    gate.opened.set()
    await asyncio.gather(held, *sessions)
    assert loop.batch_sizes == {4: 10}


async def test_a_tick_takes_one_job_per_slot_in_order_within_bounds(make: Make):
    llm = llm_with("sdpa", 11)
    loop = make(llm, slots=5, capacity=64, max_rows=2, max_positions=16)
    slots = [await loop.acquire() for _ in range(5)]
    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    await asyncio.to_thread(gate.entered.wait, 5)
    alone = Alone(llm)
    first, second = torch.randint(VOCAB, (20,)), torch.randint(VOCAB, (3,))
    counts = [(slots[0], first), (slots[1], 1), (slots[2], 1), (slots[0], second),
              (slots[3], 8), (slots[4], 1)]  # fmt: skip
    jobs = [
        asyncio.ensure_future(loop.forward(slot, n if torch.is_tensor(n) else torch.arange(n)))
        for slot, n in counts
    ]
    await asyncio.sleep(0)
    assert loop.pending() == 6
    gate.opened.set()
    results = await asyncio.gather(held, *jobs)
    # 20 positions alone (two rows would pad to 40); the two 1s (max_rows);
    # slot 0's second step, after its first, with the 8 (2 x 8 = 16); the last 1.
    assert loop.batch_sizes == {1: 2, 2: 2}
    assert loop.steps.cache.lengths == [23, 1, 1, 8, 1]
    alone.feed(first)
    torch.testing.assert_close(results[4].logits, alone.feed(second)[1], **TIGHT)


async def test_a_cancelled_waiting_request_never_runs(make: Make):
    llm = llm_with("sdpa", 12)
    loop = make(llm, slots=2, capacity=32)
    slot = await loop.acquire()
    forwards: list[int] = []
    llm.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    await asyncio.to_thread(gate.entered.wait, 5)
    waiting = asyncio.ensure_future(loop.forward(slot, torch.arange(4)))
    joining = asyncio.ensure_future(loop.acquire())
    await asyncio.sleep(0)
    assert loop.pending() == 2
    started = time.monotonic()
    for task in (waiting, joining):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert time.monotonic() - started < 0.5 and not gate.opened.is_set()
    assert loop.pending() == 0
    gate.opened.set()
    await held
    await loop.call(lambda: None)  # a tick after: nothing else ran
    assert forwards == [] and not loop.batch_sizes
    assert loop.steps.cache.lengths == [0, 0] and not loop.steps.cache.is_live(1)


async def test_a_request_cancelled_in_the_running_batch_advances_its_slot(make: Make):
    """Its result is discarded without waiting for the batch; the batch ran
    for it, so its slot holds the new positions and goes on from them."""
    llm = llm_with("sdpa", 13)
    loop = make(llm, slots=3, capacity=32)
    a, b = await loop.acquire(), await loop.acquire()
    entered, go = threading.Event(), threading.Event()

    def hold(*_: Any) -> None:  # (a pre-hook's return value would replace the inputs)
        entered.set()
        go.wait(5)

    hook = llm.model.layers[0].register_forward_pre_hook(hold)
    prompt = torch.randint(VOCAB, (5,))
    running = asyncio.ensure_future(loop.forward(a, prompt))
    other = asyncio.ensure_future(loop.forward(b, torch.arange(3)))
    await asyncio.to_thread(entered.wait, 5)
    started = time.monotonic()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert time.monotonic() - started < 0.5 and not go.is_set()
    hook.remove()
    go.set()
    await other
    assert loop.batch_sizes == {2: 1} and loop.steps.cache.lengths[:2] == [5, 3]
    alone = Alone(llm)
    alone.feed(prompt)
    token = torch.tensor([7])
    result = await loop.forward(a, token)
    torch.testing.assert_close(result.logits, alone.feed(token)[1], **TIGHT)

    # A slot acquired for a session that stopped waiting is released.
    cache, real = loop.steps.cache, loop.steps.cache.acquire
    entered.clear()
    go.clear()
    cache.acquire = lambda: (entered.set(), go.wait(5), real())[-1]
    joining = asyncio.ensure_future(loop.acquire())
    await asyncio.to_thread(entered.wait, 5)
    joining.cancel()
    with pytest.raises(asyncio.CancelledError):
        await joining
    go.set()
    await loop.call(lambda: None)
    assert not cache.is_live(2)
    del cache.acquire
    await loop.release(a)
    assert not cache.is_live(a) and cache.lengths[a] == 0


async def test_an_error_in_a_batch_reaches_its_sessions_and_the_next_batch_runs(
    make: Make, caplog: pytest.LogCaptureFixture
):
    llm = llm_with("sdpa", 14)
    loop = make(llm, slots=3, capacity=12)
    slots = [await loop.acquire() for _ in range(3)]
    alone = [Alone(llm) for _ in slots]
    prompts = [torch.randint(VOCAB, (n,)) for n in (4, 6, 2)]
    failing = [True]

    def fail(*_: Any) -> None:
        if failing.pop() if failing else False:
            raise RuntimeError("a failing layer")

    llm.model.layers[1].register_forward_pre_hook(fail)
    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    # The worker is inside the call before anything else queues: it takes
    # the jobs below together, not the call with those queued so far.
    await asyncio.to_thread(gate.entered.wait, 5)
    jobs = [asyncio.ensure_future(loop.forward(slots[k], prompts[k])) for k in range(2)]
    # past its slot's capacity: refused alone, the others' batch still runs
    jobs.append(asyncio.ensure_future(loop.forward(slots[2], torch.arange(13))))
    await asyncio.sleep(0)
    gate.opened.set()
    with caplog.at_level(logging.ERROR):
        await held
        first, second, third = await asyncio.gather(*jobs, return_exceptions=True)
    assert isinstance(first, RuntimeError) and first is second
    assert isinstance(third, SlotOverflow)
    assert [r.message for r in caplog.records] == ["batched step over slots [0, 1] failed"]
    assert loop.steps.cache.lengths == [0, 0, 0] and loop.batch_sizes == {2: 1}

    results = await asyncio.gather(*(loop.forward(slots[k], prompts[k]) for k in range(3)))
    for session, result, prompt in zip(alone, results, prompts, strict=True):
        torch.testing.assert_close(result.logits, session.feed(prompt)[1], **TIGHT)
    assert loop.batch_sizes == {2: 1, 3: 1}
    with pytest.raises(SlotError, match="all 3 slots are live"):
        await loop.acquire()


async def test_calls_run_on_the_loop_thread_in_order_with_their_sessions_forwards(make: Make):
    llm = llm_with("sdpa", 15)
    loop = make(llm, slots=2, capacity=32)
    a, b = await loop.acquire(), await loop.acquire()
    threads: set[threading.Thread] = set()
    llm.model.register_forward_pre_hook(lambda *_: threads.add(threading.current_thread()))
    seen: list[tuple[str, int]] = []

    def look(tag: str) -> str:
        threads.add(threading.current_thread())
        seen.append((tag, loop.steps.cache.lengths[a]))
        return tag

    def encoder_fails() -> None:
        raise ValueError("an encoder failed")

    results = await asyncio.gather(
        loop.forward(a, torch.arange(4)),
        loop.call(look, "after 4", slot=a),
        loop.forward(b, torch.arange(6)),
        loop.forward(a, torch.tensor([1])),
        loop.call(encoder_fails, slot=b),
        loop.call(look, "after 5", slot=a),
        loop.forward(b, torch.tensor([2])),
        return_exceptions=True,
    )
    assert seen == [("after 4", 4), ("after 5", 5)] and results[5] == "after 5"
    assert isinstance(results[4], ValueError)
    assert threads == {loop.thread} and loop.steps.cache.lengths == [5, 7]
    assert await loop.call(threading.current_thread) is loop.thread


# --- programs: decoding loops on the worker thread --------------------------------------


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
    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    # The worker is inside the call before anything else queues: it takes
    # the jobs below together, not the call with those queued so far.
    await asyncio.to_thread(gate.entered.wait, 5)
    threads: set[threading.Thread] = set()
    stepped = threading.Event()
    together = [asyncio.ensure_future(loop.run(slot, greedy(slot + 3, 24, threads, stepped)))
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

    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    # The worker is inside the call before anything else queues: it takes
    # the jobs below together, not the call with those queued so far.
    await asyncio.to_thread(gate.entered.wait, 5)
    runs = [asyncio.ensure_future(loop.run(slot, picking(slot, slot + 3, argmaxes)))
            for slot in slots[:3]]  # fmt: skip
    failing = asyncio.ensure_future(loop.run(slots[3], picking(slots[3], 2, broken)))
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

    running = asyncio.ensure_future(loop.run(a, endless()))
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
    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    await asyncio.to_thread(gate.entered.wait, 5)
    inputs = [torch.randint(VOCAB, (20,)), torch.tensor([5]), torch.tensor([6, 7])]
    jobs = [asyncio.ensure_future(loop.forward(slot, x))
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
    gate = Gate()
    held = asyncio.ensure_future(loop.call(gate.hold))
    await asyncio.to_thread(gate.entered.wait, 5)
    llm_ticks: list[int] = []
    speech_ticks: list[int] = []
    talking = asyncio.ensure_future(loop.run(talker, stepping(3, 4, False, llm_ticks, loop)))
    speaking = asyncio.ensure_future(loop.run(speaker, stepping(5, 9, True, speech_ticks, loop)))
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
