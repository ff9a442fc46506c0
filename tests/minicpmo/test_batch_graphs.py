"""Graphs of batched steps by bucket, simulated on the CPU (the same static
inputs copied in and outputs copied out as a CUDA replay), against each
session running alone with transformers' own path."""

from __future__ import annotations

import pytest
import torch

from omnilive.engines.minicpmo.runtime.batch import BatchedSteps, StepRequest, rows_view
from omnilive.engines.minicpmo.runtime.graphs import (
    PREFIX_SPAN,
    SHORT_STEP,
    GraphCache,
    batch_buckets,
    bucket_for,
)
from tests.minicpmo.test_batch import TIGHT, VOCAB, Alone, batched, llm_with


def buffers(steps: BatchedSteps) -> list[torch.Tensor]:
    return [buffer.clone() for buffer in steps.cache.key_cache + steps.cache.value_cache]


def prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


def test_buckets():
    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    assert batch_buckets(16) == (1, 2, 4, 8, 16)
    assert batch_buckets(1) == (1,)
    assert bucket_for(3, (1, 2, 4)) == 4 and bucket_for(5, (1, 2, 4)) is None


@pytest.mark.parametrize("real", range(1, 8))
def test_padded_ticks_match_each_session_alone(real: int):
    llm = llm_with("eager")
    steps = batched(llm, slots=8, capacity=96)
    graphs = GraphCache(steps)
    assert not graphs.capture  # on the CPU: simulated
    alone = [Alone(llm) for _ in range(real)]
    # Slots in falling order from the last: a prefix of all 8 when there are
    # enough requests, else gathered rows (never a neighbours' view).
    slots = [steps.cache.acquire() for _ in range(8)][::-1][:real]
    feeds = [prompt(k, 9 + 2 * k) for k in range(real)]  # ragged prefills: padded to 16, 32
    for tick in range(7):  # a prefill, greedy decode steps, ragged steps
        if tick in (3, 5):  # counts of 1 to 4 (bucket 4), other rows' the second time
            feeds = [torch.cat([feed, prompt(10 * tick + k, (k + tick) % 4)])
                     for k, feed in enumerate(feeds)]  # fmt: skip
        results = graphs.step(zip(slots, feeds, strict=True))
        for k, (session, result) in enumerate(zip(alone, results, strict=True)):
            hidden, logits = session.feed(feeds[k])
            torch.testing.assert_close(result.logits, logits, **TIGHT)
            torch.testing.assert_close(result.hidden, hidden, **TIGHT)
            assert int(result.logits.argmax()) == int(logits.argmax())
            feeds[k] = torch.tensor([int(result.logits.argmax())])
    # Single tokens read the prefix of 8 when there are enough requests;
    # longer steps only when their own bucket is 8 (an empty row of a
    # prefill computes as much as a real one).
    rows = bucket_for(real, graphs.batch_sizes)
    prefix = PREFIX_SPAN * real >= 8
    short = {(8, False) if prefix else (rows, True)}
    long = {(8, False) if rows == 8 else (rows, True)}
    assert {(key[0], key[3]) for key in graphs.graphs if key[1] <= SHORT_STEP} == short
    assert {(key[0], key[3]) for key in graphs.graphs if key[1] > SHORT_STEP} == long
    assert {key[1] for key in graphs.graphs} >= {1, 4} and graphs.eager == 0


def test_empty_rows_change_no_slot():
    steps = batched(llm_with("eager"), slots=4, capacity=64)
    graphs = GraphCache(steps, batch_sizes=(4,))
    slots = [steps.cache.acquire() for _ in range(4)]
    steps.step([(slot, prompt(slot, 5 + slot)) for slot in slots])
    before, held = buffers(steps), list(steps.cache.lengths)
    scratch, idle = steps.cache.scratch, steps.cache.idle
    plan = steps.plan([StepRequest(slots[2], prompt(9, 3))], rows=4, length=4)
    assert plan.slots == (slots[2],) and plan.rows[1:].eq(idle).all()
    assert plan.write[1:].eq(scratch).all() and plan.last[1:].eq(0).all()
    assert plan.mask[1:, 0, :, 1:].eq(torch.finfo(torch.float32).min).all()
    assert plan.mask[1:, 0, :, 0].eq(0).all()
    # One real row of 3 positions in a bucket of 4 rows and 4 positions.
    graphs.step([(slots[2], prompt(9, 3))])
    # 1 request on slot 2: the prefix of 3 slots, in the request's own bucket of 4.
    assert list(graphs.graphs) == [(4, 4, 16, False)]
    for now, then in zip(buffers(steps), before, strict=True):
        changed = (now != then).any(dim=(1, 3)).nonzero().tolist()  # [row, column]
        for row, column in changed:
            assert column == scratch or (row == slots[2] and held[row] <= column < held[row] + 3)
        assert now[idle, :, :scratch].eq(0).all()
        # Every slot but the real one bit-identical, their scratch columns included.
        others = [s for s in slots if s != slots[2]]
        assert torch.equal(now[others], then[others])
    assert steps.cache.lengths == [held[0], held[1], held[2] + 3, held[3]]


def test_a_tick_never_sees_the_previous_ticks_static_inputs():
    llm = llm_with("eager")
    steps = batched(llm, slots=4, capacity=64)
    graphs = GraphCache(steps)
    slots = [steps.cache.acquire() for _ in range(4)]
    steps.step([(slot, prompt(slot, 4 + slot)) for slot in slots])
    graphs.step([(slot, prompt(10 + slot, 1)) for slot in slots])  # 4 rows: bucket 4
    # Slot 3 goes back a position and on with another token, off the graph...
    steps.cache.crop(slots[3], steps.cache.lengths[slots[3]] - 1)
    steps.step([(slots[3], prompt(20, 1))])
    kept = buffers(steps)
    # ...then 3 rows in the same bucket: its 4th row is empty, not slot 3's last.
    results = graphs.step([(slot, prompt(30 + slot, 1)) for slot in slots[:3]])
    assert len(graphs.graphs) == 1 and len(results) == 3
    for now, then in zip(buffers(steps), kept, strict=True):
        assert torch.equal(now[slots[3]], then[slots[3]])
    for slot, result in zip(slots[:3], results, strict=True):
        alone = Alone(llm)
        for feed in (prompt(slot, 4 + slot), prompt(10 + slot, 1)):
            alone.feed(feed)
        _, logits = alone.feed(prompt(30 + slot, 1))
        torch.testing.assert_close(result.logits, logits, **TIGHT)


def test_the_bound_evicts_the_least_recently_replayed_graph():
    steps = batched(llm_with("eager"), slots=4, capacity=128)
    graphs = GraphCache(steps, max_graphs=2, step_lengths=(1, 2, 4, 8, 16, 32, 64))
    slots = [steps.cache.acquire() for _ in range(4)]
    graphs.step([(slots[0], prompt(0, 1))])  # (1, 1, 16): the prefix of slot 0
    graphs.step([(slots[0], prompt(1, 2)), (slots[1], prompt(2, 1))])  # (2, 2, 16)
    graphs.step([(slots[0], prompt(3, 1))])  # (1, 1, 16) again: most recent
    graphs.step([(slot, prompt(4, 3)) for slot in slots])  # (4, 4, 16): evicts (2, 2)
    assert list(graphs.graphs) == [(1, 1, 16, False), (4, 4, 16, False)]
    assert graphs.captures == 3
    graphs.step([(slots[0], prompt(5, 70))])  # past the step buckets: eager
    assert graphs.eager == 1 and len(graphs.graphs) == 2


def test_a_prefix_tick_reads_a_view_and_changes_no_other_slot():
    """Requests on slots 0, 3 and 4 with slot 1 released (a hole) and slots 2
    and 5 live but idle: one graph over the prefix of 8 slots, no gather,
    each request on its slot's row, every other slot bit-identical."""
    llm = llm_with("eager")
    steps = batched(llm, slots=8, capacity=64)
    graphs = GraphCache(steps)
    slots = [steps.cache.acquire() for _ in range(6)]
    assert slots == list(range(6))  # the lowest free slot each time
    alone = {slot: Alone(llm) for slot in slots}
    for slot in slots:
        feed = prompt(slot, 4 + slot)
        steps.step([(slot, feed)])
        alone[slot].feed(feed)
    steps.cache.release(1)
    asked = [4, 0, 3]  # any order: results come back in it
    feeds = [prompt(20 + slot, 1) for slot in asked]
    requests = [StepRequest(slot, feed) for slot, feed in zip(asked, feeds, strict=True)]
    plan = steps.plan(requests, rows=8, length=1, prefix=True)
    assert plan.prefix and not plan.gather and plan.index == (4, 0, 3)
    assert plan.rows.tolist() == [0, 8, 8, 3, 4, 8, 8, 8]  # 8: the idle row
    assert plan.write[[1, 2, 5, 6, 7]].eq(steps.cache.scratch).all()
    keys = steps.cache.key_cache[0]
    assert rows_view(keys, plan).data_ptr() == keys.data_ptr()  # a view, no copy
    before, held = buffers(steps), list(steps.cache.lengths)
    results = graphs.step(requests)
    assert list(graphs.graphs) == [(8, 1, 16, False)] and graphs.gathers == 0
    for slot, feed, result in zip(asked, feeds, results, strict=True):
        hidden, logits = alone[slot].feed(feed)
        assert result.slot == slot
        torch.testing.assert_close(result.logits, logits, **TIGHT)
        torch.testing.assert_close(result.hidden, hidden, **TIGHT)
    untouched = [1, 2, 5, 6, 7]
    for now, then in zip(buffers(steps), before, strict=True):
        assert torch.equal(now[untouched], then[untouched])  # scratch columns included
        assert now[steps.cache.idle, :, : steps.cache.scratch].eq(0).all()
    assert steps.cache.lengths == [held[s] + (s in asked) for s in range(8)]
    assert steps.cache.acquire() == 1  # the hole is filled first


def test_warm_captures_every_batch_bucket_and_leaves_the_slots_free_and_empty():
    llm = llm_with("eager")
    steps = batched(llm, slots=4, capacity=96)
    graphs = GraphCache(steps, step_lengths=(1, 2, 4, 8, 16))
    before = buffers(steps)

    captured = graphs.warm((1, 4, 16, 32))  # 32: past the step buckets, not graphed

    prefixes = {(rows, length, False) for rows in (1, 2, 4) for length in (1, 4, 16)}
    # Gathered: one request on the last slot; two there, for a prefill (a
    # decoding step of the two reads the prefix of 4); three read the prefix.
    gathered = {(1, 1, True), (1, 4, True), (1, 16, True), (2, 16, True)}
    assert {(key[0], key[1], key[3]) for key in graphs.graphs} == prefixes | gathered
    assert captured == graphs.captures == len(prefixes | gathered)
    assert steps.cache.lengths[: steps.cache.slots] == [0] * steps.cache.slots
    assert [steps.cache.acquire() for _ in range(4)] == [0, 1, 2, 3]  # all free again
    # Emptied: the next owners inherit nothing (empty rows write only the
    # idle row and the scratch column, which no step ever reads).
    slots, scratch = steps.cache.slots, steps.cache.scratch
    for was, now in zip(before, buffers(steps), strict=True):
        assert torch.equal(was[:slots, :, :scratch], now[:slots, :, :scratch])
    # A session's step of a warmed shape replays a graph: nothing more captured.
    alone = Alone(llm)
    result = graphs.step([(0, prompt(1, 3))])[0]
    _, logits = alone.feed(prompt(1, 3))
    torch.testing.assert_close(result.logits, logits, **TIGHT)
    assert graphs.captures == captured
