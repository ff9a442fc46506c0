"""Half-duplex on the cascade: spoken turns, history, early answers from hear()."""

from __future__ import annotations

import numpy as np
import pytest

from omnilive.audio import INPUT_RATE
from omnilive.engines.base import CapabilityError
from omnilive.engines.cascade import CascadeEngine, half_duplex
from omnilive.engines.cascade.half_duplex import CascadeHalfDuplex
from omnilive.engines.messages import (
    AudioPart,
    GenerationOptions,
    HalfDuplexOptions,
    ImagePart,
    TextPart,
)
from omnilive.session_settings import EndOfTurnSettings
from tests.cascade.speech import Say, overlap, silence
from tests.speech import longest_pause, speak_piper

pytestmark = pytest.mark.cascade

OPTIONS = HalfDuplexOptions(generation=GenerationOptions(max_new_tokens=40, temperature=0.0))
CHUNK = INPUT_RATE // 10  # the runner's VAD hands over speech every 100 ms


def open_session(engine: CascadeEngine, system: str = "You are helpful.") -> CascadeHalfDuplex:
    session = engine.open_half_duplex()
    assert isinstance(session, CascadeHalfDuplex)
    assert session.prepare([TextPart(system)], OPTIONS) > 0
    return session


def turn(session: CascadeHalfDuplex, speech: np.ndarray) -> tuple[str, list[np.ndarray]]:
    session.snapshot()
    assert session.prefill(speech) > 0
    text, audio = "", []
    for chunk in session.generate():
        text += chunk.text
        if chunk.audio is not None:
            audio.append(chunk.audio)
    return text, audio


def listen_like_a_runner(session: CascadeHalfDuplex, speech: np.ndarray) -> np.ndarray:
    """Call hear() as the runner would: speech in chunks, then a pause."""
    heard = np.concatenate([speech, silence(0.6)])
    for end in range(CHUNK, heard.size + 1, CHUNK):
        paused = end - speech.size >= 0.2 * INPUT_RATE
        session.hear(heard[:end], paused)
    return heard


def test_two_spoken_turns_and_the_history_between_them(engine: CascadeEngine, say: Say) -> None:
    session = open_session(engine)
    first_q, second_q = "What is the capital of France?", "How far away is the moon?"
    first_text, first_audio = turn(session, say(first_q))
    assert first_text.strip() and first_audio

    session.snapshot()
    session.prefill(say(second_q))
    history = session.history
    # The second turn's prompt: system prompt, the whole first exchange, then the new question.
    assert history[0].role == "system" and history[0].content.startswith("You are helpful.")
    assert [m.role for m in history[1:]] == ["user", "assistant", "user"]
    assert overlap(first_q, history[1].content) >= 0.6
    assert history[2].content == first_text.strip()
    assert overlap(second_q, history[3].content) >= 0.8
    second = list(session.generate())
    assert any(c.audio is not None for c in second)
    assert session.history[-1].role == "assistant"
    session.close()


def test_rollback_restores_the_history_after_a_failed_turn(engine: CascadeEngine, say: Say) -> None:
    session = open_session(engine)
    turn(session, say("Hello there."))
    before = session.history
    session.snapshot()
    session.prefill(say("Tell me about the moon."))
    chunks = session.generate()
    next(chunks)  # the turn fails part way through
    chunks.close()
    assert session.history != before
    session.rollback()
    assert session.history == before
    session.close()


def test_history_is_bounded_by_the_context(
    engine: CascadeEngine, say: Say, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = engine.stack.llm
    # Evaluating a prompt that fills 2048 tokens takes seconds on two cores;
    # a smaller context makes the same rule bite after a few short turns.
    monkeypatch.setattr(llm, "n_ctx", 200)
    session = open_session(engine, "You are helpful. Keep it short.")
    questions = [
        "What is the capital of France?",
        "How far away is the moon?",
        "Why is the sky blue?",
        "What do bees make?",
        "Name a big planet.",
        "What time is it?",
    ]
    for question in questions:
        turn(session, say(question))
        history = session.history
        budget = llm.n_ctx - engine.stack.spoken_budget(OPTIONS.generation)
        assert llm.count(history[:-1]) <= budget  # the last prompt fitted
    assert history[0].role == "system" and history[0].content.startswith("You are helpful.")
    assert history[1].role == "user"
    assert len(history) < 1 + 2 * len(questions)  # the oldest exchanges went...
    assert overlap(questions[0], history[1].content) < 0.5
    assert overlap(questions[-1], history[-2].content) >= 0.75  # ...the newest stayed
    session.close()


def test_an_answer_started_during_the_pause_is_used(engine: CascadeEngine, say: Say) -> None:
    session = open_session(engine)
    question = "Why is the sky blue during the day?"
    heard = listen_like_a_runner(session, say(question))
    session.snapshot()
    session.prefill(heard)
    assert session.stats.speculative
    assert overlap(question, session.stats.transcript) >= 0.8
    chunks = list(session.generate())
    assert any(c.audio is not None for c in chunks)
    assert session.history[-1].content == "".join(c.text for c in chunks).strip()
    session.close()


def test_without_early_answers_the_turn_waits_for_prefill(engine: CascadeEngine, say: Say) -> None:
    """cascade.early_answer off: hearing starts nothing (no transcript, no
    answer); the turn is transcribed and answered from prefill."""
    session = CascadeHalfDuplex(engine.stack, engine.require, early=False)
    session.prepare([TextPart("You are helpful.")], OPTIONS)
    question = "Why is the sky blue during the day?"
    heard = listen_like_a_runner(session, say(question))
    session.settle()
    assert session.partial_transcript == ""
    text, audio = turn(session, heard)
    assert not session.stats.speculative
    assert overlap(question, session.stats.transcript) >= 0.8
    assert text.strip() and audio
    session.close()


def test_the_words_heard_at_a_pause_say_whether_the_turn_is_over(engine: CascadeEngine) -> None:
    """The early answer started at a pause judges its words on the way: a
    finished question scores high, a sentence cut off at a comma near 0
    (Smart Turn finds this one finished by its sound)."""
    cut_off = speak_piper("The weather today is, really nice for a walk.")
    verdicts = []
    for speech in (speak_piper("Which animal is the largest on our planet?"), cut_off):
        session = open_session(engine)
        if speech is cut_off:
            speech = speech[: longest_pause(speech)[0]]
        heard = listen_like_a_runner(session, speech)
        session.settle()  # a runner's check comes 200 ms into the pause; here at once
        verdicts.append(session.end_of_turn(heard))
        assert session.end_of_turn(np.concatenate([heard, speech])) is None  # other speech
        session.close()
    finished, unfinished = verdicts
    assert finished is not None and unfinished is not None
    threshold = EndOfTurnSettings().words_threshold  # what the worker's verdict asks
    assert finished > threshold > unfinished, verdicts


def test_words_still_being_judged_are_not_yet_finished(
    engine: CascadeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check that finds the judgement in flight hears "not yet" (0.0), not
    "no opinion" (which would leave the turn to the audio model alone), and
    the next check gets the words' own estimate."""
    monkeypatch.setattr(half_duplex, "JUDGE_WAIT_S", 0.0)
    session = open_session(engine)
    heard = listen_like_a_runner(session, speak_piper("Which animal is the largest on our planet?"))
    assert session.end_of_turn(heard) == 0.0  # Whisper is still at it
    session.settle()
    assert session.end_of_turn(heard) > EndOfTurnSettings().words_threshold
    session.close()


def test_a_transcript_made_in_a_quiet_moment_is_reused(engine: CascadeEngine, say: Say) -> None:
    session = open_session(engine)
    question = "How far away is the moon?"
    speech = say(question)
    heard = np.concatenate([speech, silence(0.6)])
    for end in range(CHUNK, heard.size + 1, CHUNK):
        session.settle()  # as if each chunk came 100 ms apart on an idle machine
        session.hear(heard[:end], paused=end - speech.size >= 0.4 * INPUT_RATE)
    session.prefill(heard)
    assert session.stats.speculative and session.stats.transcribed_early
    assert overlap(question, session.stats.transcript) >= 0.8
    list(session.generate())
    session.close()


def test_words_heard_while_the_user_speaks_are_read_ahead(engine: CascadeEngine, say: Say) -> None:
    """The partial transcripts made while the user speaks are evaluated into
    the LLM's cache: at the pause, the words' judgement (and the answer's
    prefill) evaluates only what was said since."""
    speech = say("Could you tell me how far away the moon is from the earth?")
    heard = np.concatenate([speech, silence(0.6)])

    def judged_tokens(heard_while_speaking: bool) -> int:
        engine.stack.llm.clear_cache()
        session = open_session(engine)
        for end in range(CHUNK, heard.size + 1, CHUNK):
            paused = end - speech.size >= 0.2 * INPUT_RATE
            if heard_while_speaking or paused:
                session.settle()  # as if each chunk came 100 ms apart on an idle machine
                session.hear(heard[:end], paused)
        session.prefill(heard)
        stats = session.stats
        list(session.generate())
        session.close()
        assert stats.speculative and stats.judged_tokens is not None
        return stats.judged_tokens

    read_ahead, at_the_pause = judged_tokens(True), judged_tokens(False)
    assert read_ahead < at_the_pause / 2, (read_ahead, at_the_pause)


def test_early_work_is_discarded_when_the_speech_changes(engine: CascadeEngine, say: Say) -> None:
    session = open_session(engine)
    listen_like_a_runner(session, say("What is the capital of France?"))
    other = "Please describe the weather in London today."
    session.snapshot()
    session.prefill(say(other))
    assert not session.stats.speculative
    assert overlap(other, session.stats.transcript) >= 0.8
    assert overlap(other, session.history[-1].content) >= 0.8
    list(session.generate())
    session.close()


def test_speech_after_a_pause_cancels_the_early_answer(engine: CascadeEngine, say: Say) -> None:
    session = open_session(engine)
    start = say("What is the capital")
    heard = listen_like_a_runner(session, start)  # the user pauses mid-question...
    rest = np.concatenate([heard, say("of France?")])
    session.hear(rest, paused=False)  # ...and goes on
    session.prefill(rest)
    assert not session.stats.speculative
    assert "france" in session.stats.transcript.lower()
    list(session.generate())
    session.close()


def test_partial_transcripts_while_the_user_speaks(engine: CascadeEngine, say: Say) -> None:
    session = open_session(engine)
    speech = say("How far away is the moon from the earth in kilometers?")
    for end in range(CHUNK, speech.size + 1, CHUNK):
        session.hear(speech[:end], paused=False)
    session.close()  # waits for the background thread
    assert overlap("how far away is the moon", session.partial_transcript) >= 0.6


def test_system_content_it_cannot_see_is_refused(engine: CascadeEngine) -> None:
    session = engine.open_half_duplex()
    with pytest.raises(CapabilityError, match="image"):
        session.prepare([TextPart("Look:"), ImagePart(b"\xff\xd8jpeg")], OPTIONS)
    session.close()


def test_a_reference_voice_in_the_system_content_is_reported(
    engine: CascadeEngine, say: Say
) -> None:
    session = open_session(engine)
    session.prepare([TextPart("Mimic this voice."), AudioPart(say("My voice."))], OPTIONS)
    assert any("voice cloning is not available" in w for w in session.warnings)
    assert "Mimic this voice." in session.history[0].content
    session.close()
