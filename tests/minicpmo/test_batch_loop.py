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
from collections.abc import Callable
from typing import Any

import pytest
import torch

from omnilive.engines.minicpmo.runtime.batch import SlotError, SlotOverflow
from omnilive.engines.minicpmo.runtime.loop import BatchLoop
from tests.minicpmo.test_batch import (
    TIGHT,
    VOCAB,
    Alone,
    Script,
    llm_with,
    next_input,
    play_alone,
    script,
)

Make = Callable[..., BatchLoop]


class Gate:
    """A plain call that holds the worker thread until opened."""

    def __init__(self) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.entered.set()
        assert self.opened.wait(5)

    @classmethod
    async def holding(cls, loop: BatchLoop) -> tuple[Gate, asyncio.Task]:
        """A gate whose call the worker thread is inside before anything else
        queues: the worker then takes the jobs queued next together, not the
        call with those queued so far. Open it to let the worker go on."""
        gate = cls()
        held = asyncio.create_task(loop.call(gate.hold))
        await asyncio.to_thread(gate.entered.wait, 5)
        return gate, held


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
    gate, held = await Gate.holding(loop)

    async def decode(slot: int) -> list[int]:
        tokens = [slot + 1]
        for _ in range(10):
            tokens += done([await loop.forward(slot, torch.tensor(tokens[-1:]))])
            bookkeeping()
        return tokens

    sessions = [asyncio.create_task(decode(slot)) for slot in slots]
    await asyncio.sleep(0)  # each session submitted its first step
    gate.opened.set()
    await asyncio.gather(held, *sessions)
    assert loop.batch_sizes == {4: 10}


async def test_a_tick_takes_one_job_per_slot_in_order_within_bounds(make: Make):
    llm = llm_with("sdpa", 11)
    loop = make(llm, slots=5, capacity=64, max_rows=2, max_positions=16)
    slots = [await loop.acquire() for _ in range(5)]
    gate, held = await Gate.holding(loop)
    alone = Alone(llm)
    first, second = torch.randint(VOCAB, (20,)), torch.randint(VOCAB, (3,))
    counts = [(slots[0], first), (slots[1], 1), (slots[2], 1), (slots[0], second),
              (slots[3], 8), (slots[4], 1)]  # fmt: skip
    jobs = [
        asyncio.create_task(loop.forward(slot, n if torch.is_tensor(n) else torch.arange(n)))
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
    gate, held = await Gate.holding(loop)
    waiting = asyncio.create_task(loop.forward(slot, torch.arange(4)))
    joining = asyncio.create_task(loop.acquire())
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
    running = asyncio.create_task(loop.forward(a, prompt))
    other = asyncio.create_task(loop.forward(b, torch.arange(3)))
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
    joining = asyncio.create_task(loop.acquire())
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
    gate, held = await Gate.holding(loop)
    jobs = [asyncio.create_task(loop.forward(slots[k], prompts[k])) for k in range(2)]
    # past its slot's capacity: refused alone, the others' batch still runs
    jobs.append(asyncio.create_task(loop.forward(slots[2], torch.arange(13))))
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
