"""SmolLM2 through llama.cpp: token counting, preemption, the context shift."""

from __future__ import annotations

import pytest

from omnilive.engines.base import EngineError, GenerationOptions
from omnilive.engines.cascade import CascadeEngine
from omnilive.engines.cascade.llm import Message

pytestmark = pytest.mark.cascade

GREEDY = GenerationOptions(temperature=0.0)
SYSTEM = Message("system", "You are helpful. Keep it short.")


def test_dropping_old_turns_shifts_the_cache_instead_of_rereading_it(
    engine: CascadeEngine,
) -> None:
    llm = engine.stack.llm
    turns = [
        Message("user", "What is the capital of France?"),
        Message("assistant", "The capital of France is Paris."),
        Message("user", "How far away is the moon?"),
        Message("assistant", "About 384,000 kilometers."),
        Message("user", "And the sun?"),
        Message("assistant", "About 150 million kilometers."),
    ]
    llm.clear_cache()
    long_prompt = llm.tokens([SYSTEM, *turns, Message("user", "Thanks!")])
    "".join(llm.stream(long_prompt, GREEDY, 8))

    # The oldest exchange is dropped: only the new question is evaluated.
    shorter = [SYSTEM, *turns[2:], Message("user", "Which planet is the biggest?")]
    prompt = llm.tokens(shorter)
    shifted = "".join(llm.stream(prompt, GREEDY, 16))
    system_tokens = llm.count([SYSTEM]) - 3  # without the assistant opener
    assert llm.last_reused > system_tokens + 20

    # ...and answers exactly as a model that read the whole prompt afresh.
    llm.clear_cache()
    fresh = "".join(llm.stream(prompt, GREEDY, 16))
    assert llm.last_reused == 0
    assert shifted == fresh


def test_a_new_stream_preempts_an_abandoned_one(engine: CascadeEngine) -> None:
    llm = engine.stack.llm
    first = llm.stream(llm.tokens([SYSTEM, Message("user", "Count to ten.")]), GREEDY, 30)
    next(first)
    second = "".join(llm.stream(llm.tokens([SYSTEM, Message("user", "Say hi.")]), GREEDY, 8))
    assert second
    assert list(first) == []  # the old stream ends quietly instead of corrupting the new one


def test_prompts_that_cannot_fit_are_refused(engine: CascadeEngine) -> None:
    llm = engine.stack.llm
    with pytest.raises(EngineError, match="exceeds the context"):
        next(llm.stream([1] * 2000, GREEDY, 100))
