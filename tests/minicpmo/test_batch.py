"""Batched steps over per-slot KV memory against transformers' own eager path,
each session running alone with a ``DynamicCache``, on the CPU with a tiny
real Qwen3 model.

The scenario is what a batched duplex engine does: sessions with different
prompts take units (a prefill of a few positions, then greedy decode steps),
every batch holds whichever live sessions have work (ragged lengths, any
subset of the slots), sessions join late and leave early, and a released
slot is taken by a new session. Width buckets of 16 columns make the
sessions' growth cross bucket boundaries all along.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

from omnilive.engines.minicpmo.runtime.attention import (
    GQA_SLOT_ATTENTION,
    SLOT_ATTENTION,
    gqa_slot_attention,
    slot_attention,
)
from omnilive.engines.minicpmo.runtime.batch import (
    BatchedSteps,
    SlotCache,
    SlotError,
    SlotOverflow,
    StepRequest,
)
from tests.minicpmo.test_graphs import HIDDEN, tiny_llm

# float32 on both paths; the batch changes only summation order and blocking.
TIGHT = {"atol": 2e-6, "rtol": 1e-5}
VOCAB = 96


def llm_with(attention: str, seed: int = 0) -> Any:
    llm = tiny_llm(seed)
    llm.config._attn_implementation = attention  # shared by every layer
    return llm


def batched(
    llm: Any, slots: int, capacity: int, *, bucket: int = 16, attention: str | None = SLOT_ATTENTION
) -> BatchedSteps:
    cache = SlotCache(llm.config, slots, capacity, bucket=bucket)
    return BatchedSteps(llm.model, cache, llm.lm_head, attention=attention)


class Alone:
    """One session on the stock causal LM with its own DynamicCache."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.cache = DynamicCache()

    @torch.no_grad()
    def feed(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        name = "inputs_embeds" if inputs.is_floating_point() else "input_ids"
        out = self.llm(**{name: inputs[None]}, past_key_values=self.cache, use_cache=True,
                       output_hidden_states=True)  # fmt: skip
        return out.hidden_states[-1][0, -1], out.logits[0, -1]


@dataclass
class Script:
    """A session's work: feeds of given inputs, and ``None`` for a greedy
    decode step (the previous step's argmax token)."""

    start: int  # the tick it asks for a slot
    actions: list[torch.Tensor | None]
    leave_after: int | None = None  # disconnects after this many actions
    seen: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.actions) if self.leave_after is None else self.leave_after


def script(seed: int, units: int, start: int, leave_after: int | None = None) -> Script:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(VOCAB, (rng.randint(3, 17),), generator=gen)
    actions: list[torch.Tensor | None] = [prompt]
    for unit in range(units):
        count = rng.randint(1, 6)
        # Audio units arrive as embeddings, text as ids: both kinds in one batch.
        if unit % 2:
            actions.append(torch.randn(count, HIDDEN, generator=gen) * 0.02)
        else:
            actions.append(torch.randint(VOCAB, (count,), generator=gen))
        actions += [None] * rng.randint(4, 6)
    return Script(start, actions, leave_after)


def next_input(session: Script, action: torch.Tensor | None) -> torch.Tensor:
    return torch.tensor([session.seen[-1][0]]) if action is None else action


def play_alone(llm: Any, session: Script) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    alone, session.seen = Alone(llm), []
    for action in session.actions[: session.length]:
        hidden, logits = alone.feed(next_input(session, action))
        session.seen.append((int(logits.argmax()), hidden, logits))
    return session.seen


def play_batched(steps: BatchedSteps, sessions: list[Script], seed: int) -> dict[int, list[int]]:
    """Ticks until every session is done; each tick one batched step over the
    live sessions that have work this tick (each takes part with p = 0.7)."""
    rng = random.Random(seed)
    cache = steps.cache
    waiting = sorted(range(len(sessions)), key=lambda k: sessions[k].start)
    live: dict[int, int] = {}  # session -> slot
    slots_used: dict[int, list[int]] = {}
    for session in sessions:
        session.seen = []
    tick = 0
    while waiting or live:
        while waiting and sessions[waiting[0]].start <= tick and len(live) < cache.slots:
            k = waiting.pop(0)
            live[k] = cache.acquire()
            slots_used.setdefault(live[k], []).append(k)
        chosen = [k for k in live if rng.random() < 0.7] or list(live)[:1]
        rng.shuffle(chosen)  # rows in any slot order: gathered and contiguous views
        requests = []
        for k in chosen:
            session = sessions[k]
            action = session.actions[len(session.seen)]
            requests.append((live[k], next_input(session, action)))
        for k, result in zip(chosen, steps.step(requests), strict=True):
            assert result.slot == live[k] and result.logits is not None
            sessions[k].seen.append((int(result.logits.argmax()), result.hidden, result.logits))
            if len(sessions[k].seen) == sessions[k].length:
                cache.release(live.pop(k))
        tick += 1
    return slots_used


@pytest.mark.parametrize(
    ("alone", "attention"),
    [
        ("sdpa", SLOT_ATTENTION),
        ("eager", SLOT_ATTENTION),
        ("sdpa", GQA_SLOT_ATTENTION),
        ("eager", None),  # the batch through the model's own eager attention
    ],
)
def test_batched_sessions_match_each_session_alone(alone: str, attention: str | None):
    llm = llm_with(alone)
    sessions = [
        script(1, units=7, start=0),
        script(2, units=8, start=0, leave_after=30),  # disconnects mid-unit
        script(3, units=5, start=2),  # joins late, short
        script(4, units=6, start=5),
        script(5, units=7, start=0),  # waits for a released slot
        script(6, units=6, start=9),
    ]
    wanted = [list(play_alone(llm, session)) for session in sessions]
    steps = batched(llm, slots=4, capacity=128, attention=attention)
    slots_used = play_batched(steps, sessions, seed=7)

    # Six sessions through four slots: released slots were taken again.
    assert sum(len(owners) for owners in slots_used.values()) == 6
    assert any(len(owners) > 1 for owners in slots_used.values())
    worst = 0.0
    for session, want in zip(sessions, wanted, strict=True):
        tokens = [token for token, _, _ in session.seen]
        assert tokens == [token for token, _, _ in want]
        assert sum(action is None for action in session.actions[: session.length]) >= 20
        for (_, hidden, logits), (_, want_hidden, want_logits) in zip(
            session.seen, want, strict=True
        ):
            torch.testing.assert_close(logits, want_logits, **TIGHT)
            torch.testing.assert_close(hidden, want_hidden, **TIGHT)
            worst = max(worst, float((logits - want_logits).abs().max()))
    print(f"largest logit difference ({attention} against {alone} alone): {worst:.2e}")
    assert all(not steps.cache.is_live(slot) for slot in range(4))


def test_a_step_past_capacity_is_refused_and_changes_nothing():
    llm = llm_with("sdpa", 1)
    steps = batched(llm, slots=2, capacity=12)
    first, second = steps.cache.acquire(), steps.cache.acquire()
    steps.step([(first, torch.arange(10)), (second, torch.arange(3))])
    before = [buffer.clone() for buffer in steps.cache.key_cache + steps.cache.value_cache]
    # One row that fits and one that does not: the whole step is refused.
    with pytest.raises(SlotOverflow, match="slot 0 holds 10 positions: 3 more"):
        steps.step([(second, torch.arange(2)), (first, torch.arange(3))])
    assert steps.cache.lengths == [10, 3]
    for buffer, saved in zip(steps.cache.key_cache + steps.cache.value_cache, before, strict=True):
        assert torch.equal(buffer, saved)
    steps.step([(first, torch.arange(2))])  # exactly full
    with pytest.raises(SlotOverflow):
        steps.step([(first, torch.arange(1))])
    assert steps.cache.lengths == [12, 3]


def test_a_step_over_some_slots_leaves_the_others_bit_identical():
    llm = llm_with("sdpa", 2)
    steps = batched(llm, slots=4, capacity=64)
    slots = [steps.cache.acquire() for _ in range(4)]
    steps.step([(slot, torch.randint(VOCAB, (5 + slot,))) for slot in slots])

    def state(slot: int) -> list[torch.Tensor]:
        return [buffer[slot].clone() for buffer in steps.cache.key_cache + steps.cache.value_cache]

    for taking in [(1,), (3, 0), (1, 2)]:  # one row, a gathered pair, a contiguous pair
        others = [slot for slot in slots if slot not in taking]
        before = {slot: state(slot) for slot in others}
        lengths = list(steps.cache.lengths)
        steps.step([(slot, torch.randint(VOCAB, (1 + 3 * k,))) for k, slot in enumerate(taking)])
        for slot in others:
            assert steps.cache.lengths[slot] == lengths[slot]
            for buffer, saved in zip(state(slot), before[slot], strict=True):
                assert torch.equal(buffer, saved)
        for k, slot in enumerate(taking):
            assert steps.cache.lengths[slot] == lengths[slot] + 1 + 3 * k


def test_padding_never_reaches_a_slot():
    """A one-position row batched with a seven-position one: only its one
    position is written and counted, and it goes on exactly as if alone."""
    llm = llm_with("sdpa", 3)
    steps = batched(llm, slots=2, capacity=32)
    short, long = steps.cache.acquire(), steps.cache.acquire()
    alone = Alone(llm)
    prompt = torch.randint(VOCAB, (4,))
    steps.step([(short, prompt)])
    alone.feed(prompt)
    before = [buffer[short].clone() for buffer in steps.cache.key_cache + steps.cache.value_cache]
    token = torch.tensor([7])
    result, _ = steps.step([(short, token), (long, torch.randint(VOCAB, (7,)))])
    assert steps.cache.lengths == [5, 7]
    capacity = steps.cache.capacity  # (the columns past it are scratch, never read)
    for buffer, saved in zip(steps.cache.key_cache + steps.cache.value_cache, before, strict=True):
        changed = (buffer[short, :, :capacity] != saved[:, :capacity]).any(dim=0).any(dim=-1)
        assert changed.nonzero().flatten().tolist() == [4]  # the new position only
    # Weights require grad here: no step keeps autograd history in the buffers.
    assert not result.logits.requires_grad and not steps.cache.key_cache[0].requires_grad
    want_hidden, want_logits = alone.feed(token)
    torch.testing.assert_close(result.logits, want_logits, **TIGHT)
    torch.testing.assert_close(result.hidden, want_hidden, **TIGHT)
    # and later steps see no trace of the padding
    goes_on_as_alone(steps, short, alone, [torch.tensor([k]) for k in range(3)])


def one_slot(seed: int) -> tuple[BatchedSteps, int, Alone]:
    llm = llm_with("sdpa", seed)
    steps = batched(llm, slots=1, capacity=48)
    return steps, steps.cache.acquire(), Alone(llm)


def goes_on_as_alone(steps: BatchedSteps, slot: int, alone: Alone, feeds: list) -> None:
    for inputs in feeds:
        (result,) = steps.step([(slot, inputs)])
        torch.testing.assert_close(result.logits, alone.feed(inputs)[1], **TIGHT)


def test_a_reused_slot_sees_nothing_of_its_last_session():
    steps, slot, alone = one_slot(4)
    steps.step([(slot, torch.randint(VOCAB, (40,)))])
    steps.cache.release(slot)
    assert steps.cache.lengths == [0]
    assert all(not buffer.any() for buffer in steps.cache.key_cache + steps.cache.value_cache)
    assert steps.cache.acquire() == slot
    goes_on_as_alone(steps, slot, alone, [torch.randint(VOCAB, (6,)), torch.tensor([3])])


def test_a_cropped_slot_goes_on_from_what_it_kept():
    steps, slot, alone = one_slot(5)
    goes_on_as_alone(steps, slot, alone, [torch.randint(VOCAB, (9,))])
    steps.step([(slot, torch.randint(VOCAB, (5,)))])  # a turn rolled back
    steps.cache.crop(slot, 9)
    goes_on_as_alone(steps, slot, alone, [torch.tensor([1]), torch.randint(VOCAB, (3,))])


def test_slots_are_used_only_while_live():
    llm = llm_with("sdpa", 6)
    steps = batched(llm, slots=2, capacity=8)
    first = steps.cache.acquire()
    steps.cache.acquire()
    with pytest.raises(SlotError, match="all 2 slots are live"):
        steps.cache.acquire()
    with pytest.raises(SlotError, match="appears twice"):
        steps.step([(first, torch.tensor([1])), (first, torch.tensor([2]))])
    steps.cache.release(first)
    with pytest.raises(SlotError, match="slot 0 is not live"):
        steps.step([(first, torch.tensor([1]))])
    with pytest.raises(SlotError, match="slot 0 is not live"):
        steps.cache.release(first)
    with pytest.raises(SlotError, match="only inside"):
        steps.backbone(input_ids=torch.tensor([[1]]), past_key_values=steps.cache)
    assert steps.step([]) == []


class Heads(torch.nn.Module):
    """What transformers' attention functions read of an attention layer."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize("length", [1, 5])
@pytest.mark.parametrize("strided", [False, True])
def test_slot_attention_equals_transformers_sdpa_and_eager(length: int, strided: bool):
    """Both slot functions (query heads folded; SDPA's ``enable_gqa`` with the
    mask) against the stock ones, which repeat K/V: 8 query heads on 2 K/V
    heads, a ragged per-row mask, K/V as a SlotCache hands them (whole
    buffers, or a width's strided view of wider ones)."""
    gen = torch.Generator().manual_seed(length)
    batch, heads, kv_heads, dim, width = 3, 8, 2, 16, 48
    columns = width + 32 if strided else width
    # [B, L, heads, dim] transposed, as the layers make them
    query = torch.randn(batch, length, heads, dim, generator=gen).transpose(1, 2)
    key, value = (
        torch.randn(batch, kv_heads, columns, dim, generator=gen)[:, :, :width] for _ in range(2)
    )
    assert key.is_contiguous() is not strided
    held = torch.tensor([0, 17, width - length])  # the last row sees every column
    limit = held[:, None] + torch.arange(length)
    visible = torch.arange(width) <= limit[:, :, None]
    mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    mask = mask[:, None]
    module, scaling = Heads(heads // kv_heads), dim**-0.5
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)
    want_eager, _ = eager_attention_forward(module, query, key, value, mask, scaling=scaling)
    for attend in (slot_attention, gqa_slot_attention):
        got, weights = attend(module, query, key, value, mask, scaling=scaling)
        assert weights is None and got.shape == (batch, length, heads, dim)
        torch.testing.assert_close(got, want, **TIGHT)
        torch.testing.assert_close(got, want_eager, **TIGHT)


def test_steps_name_their_attention_only_while_they_run():
    """The model's config names the slot attention during a step only: the
    stock forward afterwards, or after a step that failed, is the model's own."""
    llm = llm_with("sdpa", 7)
    layer = llm.model.layers[0].self_attn
    seen: list[str] = []
    layer.register_forward_pre_hook(
        lambda module, _: seen.append(module.config._attn_implementation)
    )
    steps = batched(llm, slots=1, capacity=16)
    slot = steps.cache.acquire()
    steps.step([(slot, torch.arange(3))])
    assert seen == [SLOT_ATTENTION] and llm.config._attn_implementation == "sdpa"

    def fail(module: Any, _: Any) -> None:
        raise RuntimeError("a failing layer")

    failing = layer.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="a failing layer"):
        steps.step([(slot, torch.tensor([1]))])
    failing.remove()
    assert llm.config._attn_implementation == "sdpa" and steps.cache.lengths == [3]
    llm(input_ids=torch.arange(3)[None])
    assert seen == [SLOT_ATTENTION, SLOT_ATTENTION, "sdpa"]
    llm.config._attn_implementation_internal = None  # what the property reads as "eager"
    steps.step([(slot, torch.tensor([2]))])
    assert llm.config._attn_implementation_internal is None


def test_width_buckets_are_the_smallest_that_hold_every_needed_column():
    config = tiny_llm().config
    cache = SlotCache(config, 1, 70, bucket=32)
    assert cache.columns == 80 and cache.widths == (32, 64, 80)
    for needed in range(1, cache.capacity + 1):
        width = cache.width_for(needed)
        assert width in cache.widths and width >= needed
        assert all(narrower < needed for narrower in cache.widths if narrower < width)
    with pytest.raises(ValueError, match="multiple of 16"):
        SlotCache(config, 1, 70, bucket=24)


def test_a_step_crossing_a_width_bucket_sees_every_real_position():
    """A slot holding 14 positions takes 5 more (columns 14 to 18) next to a
    row that needs 4 columns: the step reads the 32-column bucket, a narrower
    read is refused, a wider one (a larger bucket's graph) changes nothing,
    and both rows go on exactly as alone, across the next boundary too."""
    llm = llm_with("sdpa", 8)
    steps = batched(llm, slots=2, capacity=40, bucket=16)
    assert steps.cache.widths == (16, 32, 48)
    long, short = steps.cache.acquire(), steps.cache.acquire()
    alone = {long: Alone(llm), short: Alone(llm)}
    for slot, count in ((long, 14), (short, 3)):
        prompt = torch.randint(VOCAB, (count,))
        steps.step([(slot, prompt)])
        alone[slot].feed(prompt)
    requests = [
        StepRequest(long, torch.randint(VOCAB, (5,))),
        StepRequest(short, torch.tensor([4])),
    ]
    plan = steps.plan(requests)
    assert plan.width == 32
    with pytest.raises(ValueError, match="needing 19 columns cannot read 16"):
        steps.plan(requests, width=16)
    embeds = steps.embed(requests)
    wide_hidden, wide_logits = steps.run(embeds, steps.plan(requests, width=48))
    hidden, logits = steps.run(embeds, plan)  # (rewrites the same new positions)
    steps.cache.commit(plan)
    torch.testing.assert_close(wide_logits, logits, **TIGHT)
    torch.testing.assert_close(wide_hidden, hidden, **TIGHT)
    for b, request in enumerate(requests):
        want_hidden, want_logits = alone[request.slot].feed(request.inputs)
        torch.testing.assert_close(logits[b], want_logits, **TIGHT)
        torch.testing.assert_close(hidden[b], want_hidden, **TIGHT)
    goes_on_as_alone(steps, long, alone[long], [torch.tensor([k]) for k in range(15)])
    assert steps.cache.lengths[long] == 34  # read through the 48-column bucket
