"""SmolLM2 through llama.cpp: token counting, preemption, the context shift."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.cascade import CascadeEngine
from omnilive.engines.cascade.llm import Message
from omnilive.engines.messages import GenerationOptions
from omnilive.session_settings import EndOfTurnSettings

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


# As Whisper writes them: a finished question without its "?", a speaker
# cut off at a pause with a "." added.
FINISHED = ["What is a good name for a small black cat", "Tell me something about the ocean."]
CUT_OFF = ["I would like to book a table for", "I need to buy some."]


def test_the_model_hears_whether_a_message_is_finished(engine: CascadeEngine) -> None:
    """Its chance of a sentence ending right after the words (their own
    closing punctuation left out): high for a finished question, near
    nothing for one cut off mid-sentence."""
    llm = engine.stack.llm
    system = Message("system", "You are a helpful assistant. Reply briefly and naturally.")
    finished = [llm.end_probability([system, Message("user", t)]) for t in FINISHED]
    cut_off = [llm.end_probability([system, Message("user", t)]) for t in CUT_OFF]
    assert min(finished) > 0.15 > 0.05 > max(cut_off), (finished, cut_off)


# As Whisper wrote them from espeak-ng voices the rules were not tuned to
# (benchmarks/turn_verdicts): finished questions whose bare words the model
# would rather go on, and speakers stopped at a pause, some of them with a
# "?" or "..." Whisper added.
HEARD_FINISHED = ["Where is the best place to watch the sunset?",
                  "how many legs does a spider half?"]  # fmt: skip
HEARD_CUT_OFF = ["We should plan a trip to...", "Can you tell me how to?",
                 "My brother is coming to visit.", "I am looking for a recipe."]  # fmt: skip


EXCHANGES = [
    ("How far away is the sun from the earth?", "About 150 million kilometres."),
    ("What should I cook for dinner tonight?", "Try a simple pasta with vegetables."),
    ("Why is the sky blue during the day?", "Sunlight scatters off the air."),
    ("Can you suggest a good movie for a rainy evening?", "The Princess Bride."),
    ("What time is it in Tokyo right now?", "I cannot check the time."),
    ("I think I would like to order a pizza for dinner.", "A margherita is a good pick."),
    ("You tell me how to get to the train station.", "Ask a local for directions."),
]


def test_the_words_as_heard_finish_a_question_the_bare_words_would_not(
    engine: CascadeEngine,
) -> None:
    """Whisper's "?" is read too: the model's chance that the message ends
    after it finishes these questions (their bare words score under the
    words' threshold), and a speaker stopped on "to" stays unfinished
    whatever Whisper wrote after it. A "." is not read so: after a few
    exchanges the model would end the message after "a recipe."."""
    llm = engine.stack.llm
    threshold = EndOfTurnSettings().words_threshold
    system = Message("system", "You are a helpful assistant. Answer in one short sentence.")
    finished, bare = [], []
    for words in HEARD_FINISHED:
        finished.append(llm.end_probability([system, Message("user", words)]))
        bare.append(llm.last_readings[0])
    assert max(bare) < threshold <= min(finished), (bare, finished)
    history = [Message(role, text) for pair in EXCHANGES
               for role, text in zip(("user", "assistant"), pair, strict=True)]  # fmt: skip
    # (With these exchanges before it, "My brother is coming to visit." is
    # finished by its bare words already, 0.28: a gap of the bare reading.)
    for before, stopped in (([], HEARD_CUT_OFF), (history, HEARD_CUT_OFF[:2] + HEARD_CUT_OFF[3:])):
        cut_off = [llm.end_probability([system, *before, Message("user", t)]) for t in stopped]
        assert max(cut_off) < threshold, (len(before), cut_off)


def test_judging_the_words_leaves_them_cached_for_the_answer(engine: CascadeEngine) -> None:
    llm = engine.stack.llm
    messages = [SYSTEM, Message("user", "Name a colour")]
    prompt = llm.tokens(messages)
    llm.clear_cache()
    llm.end_probability(messages)
    judged_then_answered = "".join(llm.stream(prompt, GREEDY, 12))
    assert llm.last_reused >= len(prompt) - 6  # only the assistant's opener is new
    llm.clear_cache()
    assert "".join(llm.stream(prompt, GREEDY, 12)) == judged_then_answered
    with pytest.raises(EngineError, match="not the user's"):
        llm.end_probability([SYSTEM])
    assert llm.end_probability([SYSTEM, Message("user", " ... ")]) == 0.0


@pytest.mark.parametrize("words", ["I need to buy some.", "What is the capital of France?"])
def test_judging_with_the_answer_prompt_leaves_it_ready_to_sample(
    engine: CascadeEngine, monkeypatch: pytest.MonkeyPatch, words: str
) -> None:
    """Given the answer's prompt, the judgement evaluates its opener in the
    same pass: the words' chance is what a judgement alone finds, and the
    answer evaluates nothing of its prompt before its first token, yet says
    what a model that read it afresh says."""
    llm = engine.stack.llm
    messages = [SYSTEM, Message("user", words)]
    prompt = llm.tokens(messages)
    llm.clear_cache()
    alone = llm.end_probability(messages)
    llm.clear_cache()
    together = llm.end_probability(messages, prompt)
    assert llm.last_judged == len(prompt)
    assert together == pytest.approx(alone, abs=0.02), (alone, together)

    starts: list[int] = []  # where each evaluation began in the cache
    model = llm._llm
    evaluate = model.eval

    def recorded(tokens: list[int]) -> None:
        if tokens:
            starts.append(model.n_tokens)
        evaluate(tokens)

    monkeypatch.setattr(model, "eval", recorded)
    ready = "".join(llm.stream(prompt, GREEDY, 12))
    monkeypatch.undo()
    assert starts and min(starts) == len(prompt)  # only the answer's tokens were evaluated
    llm.clear_cache()
    assert "".join(llm.stream(prompt, GREEDY, 12)) == ready


def test_a_judgement_longer_than_a_batch_reads_the_words_end(engine: CascadeEngine) -> None:
    """A cold cache and more tokens than one llama.cpp batch (512): all but
    the last batch are evaluated first, the chance is still the words' own."""
    llm = engine.stack.llm
    story = "The weather was mild and the streets were quiet that morning. " * 50
    messages = [SYSTEM, Message("user", story + "Can you tell me the capital of France?")]
    prompt = llm.tokens(messages)
    assert len(prompt) > 600
    llm.clear_cache()
    alone = llm.end_probability(messages)
    llm.clear_cache()
    together = llm.end_probability(messages, prompt)
    assert llm.last_judged == len(prompt)
    assert together == pytest.approx(alone, abs=0.02) and alone > 0.15, (alone, together)
    assert "".join(llm.stream(prompt, GREEDY, 6))


def test_the_model_runs_on_one_thread_whoever_calls(
    engine: CascadeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp's OpenMP barriers stop spinning once a second thread has
    called in (a token then took ~30 ms instead of ~11 on 2 cores): every
    evaluation, a judgement's or a stream's, runs on the model's own thread."""
    llm = engine.stack.llm
    model = llm._llm
    threads: set[str] = set()
    evaluate = model.eval

    def recorded(tokens):
        threads.add(threading.current_thread().name)
        return evaluate(tokens)

    monkeypatch.setattr(model, "eval", recorded)
    messages = [SYSTEM, Message("user", "What is the capital of France?")]

    def judge_and_answer() -> None:
        llm.clear_cache()
        llm.end_probability(messages)
        "".join(llm.stream(llm.tokens(messages), GREEDY, 4))

    with ThreadPoolExecutor(2) as callers:
        for call in [callers.submit(judge_and_answer) for _ in range(2)]:
            call.result()
    judge_and_answer()  # and from the test's own thread
    assert len(threads) == 1 and threading.current_thread().name not in threads, threads
