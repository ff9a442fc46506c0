# ruff: noqa: F811 - the test_slot_engine fixtures, imported, are requested by name
"""A half-duplex conversation longer than its slot's context: the oldest
turns leave, the system prompt and the last turns stay, and the session
answers on, its ledger (what a client's edits cut back to) still true."""

from __future__ import annotations

import numpy as np
import pytest

from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    GenerationOptions,
    HalfDuplexOptions,
    HistoryTruncation,
    TextPart,
)
from omnilive.engines.truncation import ContextFullError
from tests.minicpmo.test_slot_conversation import force, opened, tokens
from tests.minicpmo.test_slot_engine import engine, tiny  # noqa: F401 - the fixtures

SPEECH_S = 3.0


async def turn(view, answer: str) -> str:
    force(view, answer)
    await view.snapshot()
    speech = np.random.default_rng(len(answer)).normal(0, 0.05, int(16_000 * SPEECH_S))
    await view.prefill(speech.astype(np.float32))
    return "".join([chunk.text async for chunk in view.generate()])


def first_positions(session, length: int) -> list:
    cache = session.loop.steps.cache
    return [keys[session.slot, :, :length].clone() for keys in cache.key_cache]


async def test_the_oldest_turns_leave_and_the_conversation_answers_on(engine):
    async with opened(engine) as view:
        session = view._session
        capacity = session.loop.steps.cache.capacity
        system = session.kv_length
        system_keys = first_positions(session, system)
        said, lengths = [], []
        while session.window.dropped_turns < 6:
            said.append(await turn(view, f"Answer {len(said)}."))
            lengths.append(session.kv_length)
            assert session.kv_length == session.loop.steps.cache.lengths[session.slot]
            assert session.kv_length <= capacity
            kinds = [entry.kind for entry in view._ledger]
            assert kinds == ["system", *["speech", "assistant"] * (len(kinds) // 2)]
            starts = [entry.start for entry in view._ledger]
            assert starts[:2] == [0, system] and starts == sorted(starts)
            # The client's turns let go: each turn's speech and answer given, less those held.
            assert view.history_dropped == 2 * len(said) - (len(kinds) - 1)
            assert len(said) < 200, "the window never slid"
        assert said == [f"Answer {index}." for index in range(len(said))]
        assert max(lengths) > capacity // 2  # the context filled before it slid
        kept = first_positions(session, system)
        assert all(a.equal(b) for a, b in zip(kept, system_keys, strict=True))
        # The answer in the context is where the ledger says: cut to what
        # was heard, it is written again from there (the window sliding on
        # if the answer's room asks for it).
        assert await view.keep_heard("Answer") is True
        heard = view._ledger[-1]
        assert (heard.kind, heard.text) == ("assistant", "Answer")
        closed = "<|im_end|>\n<|im_start|>assistant\nAnswer<|im_end|>\n"
        assert session.kv_length == heard.start + len(tokens(view, closed))
        assert await turn(view, "Still here.") == "Still here."


async def test_a_turn_rolled_back_after_a_slide_leaves_the_slid_context(engine):
    async with opened(engine) as view:
        session = view._session
        while True:
            before, ledger = session.kv_length, list(view._ledger)
            dropped = session.window.dropped_positions
            await view.snapshot()
            speech = np.random.default_rng(3).normal(0, 0.05, int(16_000 * SPEECH_S))
            await view.prefill(speech.astype(np.float32))
            if session.window.dropped_positions > dropped:
                break
            force(view, "Yes.")
            assert "".join([c.text async for c in view.generate()]) == "Yes."
        slid = session.window.dropped_positions - dropped
        await view.rollback()  # the turn whose speech made the room is undone
        assert session.kv_length == before - slid
        assert [e.start for e in view._ledger] == sorted(e.start for e in view._ledger)
        assert len(view._ledger) < len(ledger)
        assert await turn(view, "On we go.") == "On we go."


def long_history() -> list[ChatMessage]:
    """A chat of 30 exchanges, far more than a 1,024-position context."""
    words = " ".join(f"word{index}" for index in range(40))
    history = [ChatMessage("system", (TextPart("Be brief."),))]
    for index in range(30):
        history.append(ChatMessage("user", (TextPart(f"Question {index}: {words}"),)))
        history.append(ChatMessage("assistant", (TextPart(f"Answer {index}."),)))
    return [*history, ChatMessage("user", (TextPart("And now?"),))]


async def test_a_chat_longer_than_the_context_is_answered_from_its_last_turns(engine):
    history = long_history()
    chat = engine.open_chat()
    try:
        options = ChatOptions(generation=GenerationOptions(max_new_tokens=6))
        length = await chat.prefill(history, options)
        session = chat._session
        assert length == session.kv_length <= session.loop.steps.cache.capacity
        assert 0 < session.window.dropped_turns < 30  # the oldest left, not every one
        chunks = [chunk async for chunk in chat.generate()]
        assert sum(chunk.n_tokens for chunk in chunks) > 0
    finally:
        chat.close()


async def heard_turns(view, count: int) -> list[tuple[int, int]]:
    """``count`` turns; after each message's prefill, the history's length
    (what follows the system prompt) and the turns let go so far."""
    session, seen = view._session, []
    system = session.kv_length
    for index in range(count):
        force(view, f"Answer {index}.")
        await view.snapshot()
        speech = np.random.default_rng(index).normal(0, 0.05, int(16_000 * SPEECH_S))
        await view.prefill(speech.astype(np.float32))
        seen.append((session.kv_length - system, session.window.dropped_turns))
        assert "".join([chunk.text async for chunk in view.generate()]) == f"Answer {index}."
    return seen


async def test_truncation_disabled_lets_no_turn_go_and_refuses_the_one_past_the_context(engine):
    """The Realtime API's ``truncation: "disabled"``: the history never slides;
    the message that would pass the context is refused, the session kept."""
    async with opened(engine) as view:
        stay = HalfDuplexOptions(tts_enabled=False, truncation=HistoryTruncation(enabled=False))
        await view.set_options(stay)
        session = view._session
        capacity = session.loop.steps.cache.capacity
        with pytest.raises(ContextFullError, match="truncation is disabled"):
            await heard_turns(view, 200)
        assert session.window.dropped_turns == 0
        assert session.kv_length > capacity // 2  # it filled up to the refusal
        await view.rollback()
        assert session.kv_length == session.loop.steps.cache.lengths[session.slot]


async def test_a_retention_ratio_lets_the_history_go_to_its_share_of_the_limit(engine):
    """``retention_ratio`` 0.5 of ``post_instructions`` 400: the history
    stays under 400, and each slide takes it to at most 200 with the new
    message, so it slides every few turns, not at each."""
    async with opened(engine) as view:
        rule = HistoryTruncation(limit_tokens=400, retention_ratio=0.5)
        await view.set_options(HalfDuplexOptions(tts_enabled=False, truncation=rule))
        seen = await heard_turns(view, 14)
    assert all(history <= 400 for history, _ in seen)
    slides = [(h, d) for (h, d), (_, before) in zip(seen[1:], seen, strict=False) if d > before]
    assert len(slides) >= 2
    assert all(history <= 200 for history, _ in slides)
    assert seen[-1][1] < len(seen) - 2  # whole runs of turns between the slides
