"""The cascade's model-free pieces: text splitting, history fitting, unit buffering."""

from __future__ import annotations

import io

import numpy as np
import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.cascade.answer import (
    DUPLEX_FIRST_WORDS,
    FIRST_MAX_WORDS,
    SentenceSplitter,
    SpokenSentence,
    spoken_as,
)
from omnilive.engines.cascade.asr import (
    collapse_repeats,
    drop_echo,
    ends_in_loop,
    window_frames,
)
from omnilive.engines.cascade.conversation import Conversation
from omnilive.engines.cascade.early_work import TurnStats
from omnilive.engines.cascade.llm import Message
from omnilive.engines.cascade.models import JOIN_STAGE, ProgressBar
from omnilive.engines.cascade.reply import Reply
from omnilive.engines.cascade.tts import parse_voices, speakable
from omnilive.engines.messages import HistoryTruncation
from omnilive.engines.truncation import ContextFullError, tokens_to_drop


def split(pieces: list[str], first_words: int = FIRST_MAX_WORDS) -> list[str]:
    splitter = SentenceSplitter(first_words)
    out = [s for piece in pieces for s in splitter.feed(piece)]
    rest = splitter.flush()
    return [*out, rest] if rest else out


def test_sentences_end_at_punctuation_followed_by_space() -> None:
    pieces = ["Yes.", " Paris", " is", " 3.5", " km", " wide.", " It", " is", " old!", " Ok"]
    assert split(pieces) == ["Yes.", "Paris is 3.5 km wide.", "It is old!", "Ok"]


def test_a_sentence_is_released_as_soon_as_the_next_word_starts() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("Hello there.") == []
    assert splitter.feed(" How") == ["Hello there."]
    assert splitter.flush() == "How"


def word_pieces(text: str) -> list[str]:
    first, *rest = text.split(" ")
    return [first, *(" " + word for word in rest)]


def test_long_sentences_are_cut_after_a_clause() -> None:
    text = (
        "Sure. It is hot, and the light we see from it, "
        "which travels far, takes eight minutes to arrive."
    )
    assert split(word_pieces(text)) == [
        "Sure.",
        "It is hot, and the light we see from it,",  # the first comma after 8 words
        "which travels far, takes eight minutes to arrive.",
    ]


def test_the_first_piece_is_cut_early() -> None:
    text = "The moon is about 384,400 kilometers away from the earth on average and it is bright."
    assert split(word_pieces(text)) == [
        "The moon",  # two words, no punctuation yet
        "is about 384,400 kilometers away from the earth on average and it is bright.",
    ]
    assert split(word_pieces("When sunlight reaches us, it scatters. Short.")) == [
        "When sunlight",
        "reaches us, it scatters.",
        "Short.",
    ]


def test_a_piece_cut_between_words_is_spoken_as_a_clause() -> None:
    assert spoken_as("The moon", more=True) == "The moon,"
    assert spoken_as("It is hot, and the light we see from it,", more=True).endswith("it,")
    assert spoken_as("Paris is old.", more=True) == "Paris is old."
    assert spoken_as('He said "yes."', more=True) == 'He said "yes."'
    assert spoken_as("The moon", more=False) == "The moon"  # the answer's last words


def test_the_duplex_loop_cuts_its_first_piece_later() -> None:
    text = "The moon is about 384,400 kilometers away from the earth on average and it is bright."
    assert split(word_pieces(text), DUPLEX_FIRST_WORDS) == [
        "The moon is about 384,400 kilometers away from the earth on average",
        "and it is bright.",
    ]


def test_collapse_repeats_keeps_one_copy_of_a_loop() -> None:
    loop = [1, 2, 3, 4] * 5 + [1, 2]
    assert collapse_repeats(loop) == [1, 2, 3, 4]
    assert collapse_repeats([5, 6, 7, 8, 9]) == [5, 6, 7, 8, 9]
    assert collapse_repeats([1, 1, 1, 1]) == [1, 1, 1, 1]  # shorter than min_period


def test_a_phrase_said_over_and_over_at_the_end_is_a_loop() -> None:
    words = [10, 11, 12, 13]
    assert ends_in_loop([*words, 7, 7, 7, 7])  # "...push air down w w w w"
    assert ends_in_loop([*words, 7, 8, 7, 8, 7, 8, 7, 8])
    assert not ends_in_loop([*words, 7, 7, 7])  # three times may be speech
    assert not ends_in_loop([*words, 7, 8, 7, 8, 9])
    assert not ends_in_loop([7, 7])


def test_drop_echo_cuts_a_sentence_begun_again() -> None:
    # Seen from Whisper on a Piper question transcribed at its pause.
    echo = "which animal is the largest on our planet? Which animal is the largest on"
    assert drop_echo(echo) == "which animal is the largest on our planet?"
    assert drop_echo("Hello there. Hello there, how are you?") == (
        "Hello there. Hello there, how are you?"  # more than the start again
    )
    second = "My friend has a birthday. What present would she like? What present would she"
    assert drop_echo(second) == "My friend has a birthday. What present would she like?"
    assert drop_echo("Yes. Yes.") == "Yes. Yes."  # one word is no echo
    assert drop_echo("I said it. It is done.") == "I said it. It is done."


def test_window_grows_with_speech_and_caps_at_30_s() -> None:
    assert window_frames(16_000) == 200  # 1 s + margin, rounded up to 2 s
    assert window_frames(16_000 * 4) == 500
    assert window_frames(16_000 * 60) == 3000


def count_words(messages: list[Message]) -> int:
    return sum(len(m.content.split()) + 1 for m in messages)


def test_fit_drops_oldest_exchanges_and_keeps_the_system_prompt() -> None:
    conversation = Conversation("be brief")
    for i in range(4):
        conversation.add("user", f"question {i}")
        conversation.add("assistant", f"answer {i}")
    new = Message("user", "last one")
    fit = conversation.fit(count_words, 12, new)
    assert fit.dropped == 6
    assert fit.messages == [Message("system", "be brief"), *conversation.turns[6:], new]
    assert fit.tokens <= 12
    conversation.commit(fit, new)
    assert conversation.turns[0] == Message("user", "question 3")
    assert conversation.turns[-1] == new


def test_a_kept_history_holds_its_newest_messages_whatever_the_budget() -> None:
    conversation = Conversation("be brief", keep=4)
    for i in range(5):
        conversation.add("user", f"question {i}")
        conversation.add("assistant", f"answer {i}")
    new = Message("user", "last one")
    fit = conversation.fit(count_words, 10_000, new)
    assert fit.messages == [Message("system", "be brief"), *conversation.turns[-4:], new]
    conversation.add("user", "an unanswered question")  # an odd count: start at a question
    fit = conversation.fit(count_words, 10_000, new)
    assert [m.content for m in fit.messages[1:-1]] == [
        "question 4",
        "answer 4",
        "an unanswered question",
    ]
    assert Conversation("s", keep=0).fit(count_words, 100).dropped == 0


def test_fit_never_keeps_an_answer_without_its_question() -> None:
    conversation = Conversation("s")
    conversation.add("user", "a b c d e f")
    conversation.add("assistant", "g")
    conversation.add("user", "h")
    conversation.add("assistant", "i")
    fit = conversation.fit(count_words, 9, Message("user", "j"))
    assert fit.messages[1].role == "user"


def test_fit_fails_when_even_the_new_turn_alone_is_too_long() -> None:
    conversation = Conversation("s")
    with pytest.raises(EngineError, match="even without history"):
        conversation.fit(count_words, 3, Message("user", "far too many words here"))


def test_rollback_restores_the_snapshot() -> None:
    conversation = Conversation("s")
    conversation.add("user", "kept")
    conversation.snapshot()
    conversation.add("assistant", "lost")
    conversation.rollback()
    assert conversation.turns == [Message("user", "kept")]


def ten_exchanges(keep: int = 0) -> Conversation:
    conversation = Conversation("be brief", keep=keep)
    for i in range(10):
        conversation.add("user", f"question number {i}")  # 4 words, 4 + 1 tokens
        conversation.add("assistant", f"answer {i}")  # 3 tokens
    return conversation


def test_truncation_disabled_keeps_every_turn_or_refuses() -> None:
    """The Realtime API's ``truncation: "disabled"``: no turn leaves, not
    even past the kept-history cap, and a prompt past the budget is refused."""
    conversation = ten_exchanges(keep=4)
    new = Message("user", "last one")
    disabled = HistoryTruncation(enabled=False)
    fit = conversation.fit(count_words, 10_000, new, truncation=disabled)
    assert fit.dropped == 0 and len(fit.messages) == 22
    with pytest.raises(ContextFullError, match="truncation is disabled"):
        conversation.fit(count_words, 40, new, truncation=disabled)
    assert conversation.fit(count_words, 40, new).dropped > 0  # auto lets them go


def test_a_retention_ratio_drops_to_its_share_of_the_limit() -> None:
    """Past ``post_instructions`` (here 40 of the history's tokens), turns
    leave until the history is at most ``retention_ratio`` (0.5) of it."""
    conversation = ten_exchanges()
    new = Message("user", "last one")
    system = count_words([Message("system", "be brief")])
    rule = HistoryTruncation(limit_tokens=40, retention_ratio=0.5)
    fit = conversation.fit(count_words, 10_000, new, truncation=rule)
    assert count_words(fit.messages) - system <= 20
    assert fit.messages[1].role == "user" and fit.messages[-1] == new
    limited = conversation.fit(
        count_words, 10_000, new, truncation=HistoryTruncation(limit_tokens=40)
    )
    assert 20 < count_words(limited.messages) - system <= 40  # no ratio: only what must go
    short = Conversation("be brief")
    short.add("user", "hi")
    assert short.fit(count_words, 10_000, new, truncation=rule).dropped == 0  # under the limit


def test_tokens_to_drop_reads_the_limit_under_the_contexts_room() -> None:
    assert tokens_to_drop(HistoryTruncation(), 90, 20, 100) == 10
    assert tokens_to_drop(HistoryTruncation(limit_tokens=500), 90, 20, 100) == 10
    assert (
        tokens_to_drop(HistoryTruncation(limit_tokens=50, retention_ratio=0.2), 40, 20, 100) == 50
    )
    assert tokens_to_drop(HistoryTruncation(enabled=False), 40, 20, 100) == 0
    with pytest.raises(ContextFullError):
        tokens_to_drop(HistoryTruncation(enabled=False), 90, 20, 100)


def test_an_answer_that_repeats_an_earlier_one_lets_the_history_go() -> None:
    """A small model that copies one earlier answer copies it for every
    question after: the repeat ends the history, so the next is answered afresh."""
    conversation = Conversation("s")
    moon = "The moon is a mysterious and beautiful celestial body, full of secrets."
    conversation.add("user", "Tell me about the moon.")
    conversation.add("assistant", moon)
    conversation.add("user", "Yes?")
    conversation.add("assistant", "Yes, of course.")  # short answers may come twice
    conversation.add("user", "And again?")
    conversation.add("assistant", "Yes, of course.")
    assert len(conversation.turns) == 6
    conversation.add("user", "What is the largest animal?")
    conversation.add("assistant", moon.upper().replace(",", "") + " It is.")  # the same words
    assert conversation.turns == []
    conversation.add("user", "What is the largest animal?")
    conversation.add("assistant", moon)  # nothing earlier to repeat now
    assert len(conversation.turns) == 2


def sentence(text: str, seconds: float) -> SpokenSentence:
    audio = np.full(round(seconds * 24_000), 0.1, dtype=np.float32)
    return SpokenSentence(text, audio, n_tokens=3, llm_ms=1.0, tts_ms=1.0)


def test_reply_hands_out_whole_units_and_marks_the_last() -> None:
    reply = Reply(np.zeros(10, dtype=np.float32))
    assert reply.take(wait_s=0.0) is None  # nothing yet: still thinking
    reply.push(sentence("One.", 1.5))
    reply.push(sentence("Two.", 0.8))
    reply.finish()
    first = reply.take(wait_s=0.0)
    second = reply.take(wait_s=0.0)
    third = reply.take(wait_s=0.0)
    assert first is not None and second is not None and third is not None
    assert (first.audio.size, second.audio.size, third.audio.size) == (24_000, 24_000, 7_200)
    assert [s.text for s in first.sentences] == ["One."]
    assert [s.text for s in second.sentences] == ["Two."]  # begins at 1.5 s
    assert third.sentences == []
    assert (first.last, second.last, third.last) == (False, False, True)
    after = reply.take(wait_s=0.0)
    assert after is not None and after.last and after.audio.size == 0


def test_reply_take_waits_for_a_full_unit_only_as_long_as_told() -> None:
    reply = Reply(np.zeros(10, dtype=np.float32))
    reply.push(sentence("Short.", 0.5))
    piece = reply.take(wait_s=0.05)
    assert piece is not None and piece.audio.size == 12_000 and not piece.last


def test_voice_listing_keeps_espeak_voices_and_drops_mbrola() -> None:
    listing = (
        "Pty Language       Age/Gender VoiceName          File                 Other Languages\n"
        " 2  en-us           --/M      English_(America)  gmw/en-US            (en 3)\n"
        " 5  en-us           --/F      us-mbrola-1        mb/mb-us1            (en 8)\n"
        " 5  fr-fr           --/M      French_(France)    roa/fr               (fr 5)\n"
    )
    voices = parse_voices(listing)
    assert {"en-us", "english_(america)", "fr-fr", "fr"} <= voices
    assert "us-mbrola-1" not in voices


def test_markup_is_not_read_out() -> None:
    assert speakable("**Paris** is `nice`") == "Paris is nice"
    assert speakable("...") == ""


def test_progress_bar_reports_to_callback_and_stream() -> None:
    seen: list[tuple[str, float]] = []
    stream = io.StringIO()
    bar = ProgressBar(1000, lambda stage, f: seen.append((stage, f)), stream)
    for _ in range(100):
        bar.advance(10)
    assert [round(f * 100) for _, f in seen] == list(range(0, 101, 5))
    assert all(stage == JOIN_STAGE for stage, _ in seen)
    # Not a terminal: a few whole lines, not hundreds of redraws.
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5 and "  0%" in lines[0] and "100%" in lines[-1]
    assert "\r" not in stream.getvalue()


def test_turn_timings_report_the_figures_a_turn_has() -> None:
    stats = TurnStats("hi", 101.26, speculative=True, judged_tokens=9, early_audio_ms=300.04)
    assert stats.timings(None) == {
        "asr_ms": 101.3,
        "speculative": 1.0,
        "judged_tokens": 9.0,
        "early_audio_ms": 300.0,
    }
    sentence = SpokenSentence("Hello there", None, 3, llm_ms=55.54, tts_ms=60.0)
    assert stats.timings(sentence)["llm_first_sentence_ms"] == 55.5
    assert TurnStats().timings(None) == {"asr_ms": 0.0, "speculative": 0.0}
    # the words' judgement is a probability: kept to three places, not one
    assert TurnStats(words_end_p=0.01234).timings(None)["words_end_p"] == 0.012


def test_dropped_counts_the_clients_turns_that_left_the_front() -> None:
    """``history_dropped``'s count: each message the client gave is a turn,
    a text-less one joining the turn before it, so that what leaves the
    front is counted in the client's messages (the Realtime items it names)."""
    conversation = Conversation("be brief")
    q = [Message("user", f"question number {i}") for i in range(3)]
    a = [Message("assistant", f"answer {i}") for i in range(3)]
    # None: untranscribed speech (before the first message: never held).
    conversation.set_turns([None, q[0], a[0], None, q[1], a[1], q[2], a[2]])
    assert conversation.dropped == 1 and conversation.spans() == [1, 2, 1, 1, 1, 1]
    fit = conversation.fit(count_words, 10_000, truncation=HistoryTruncation(limit_tokens=12))
    conversation.commit(fit)
    assert conversation.turns[0] == q[2]
    assert conversation.dropped == 1 + 5  # q0, a0 with the empty one after it, q1, a1
    conversation.snapshot()
    conversation.add("user", "one more question")
    conversation.add("assistant", "")  # said nothing: joins the question
    assert conversation.spans() == [1, 1, 2]
    conversation.commit(conversation.fit(count_words, 4, truncation=HistoryTruncation()))
    assert conversation.turns == [] and conversation.dropped == 6 + 4
    conversation.rollback()
    assert conversation.turns == [q[2], a[2]] and conversation.dropped == 6
    assert conversation.cut_answer("") and conversation.spans() == [2]  # the answer went
    assert not conversation.cut_answer("x")  # the last turn is no answer now


def test_a_repeat_lets_every_turn_go_and_counts_them() -> None:
    conversation = Conversation("s")
    moon = "The moon is a mysterious and beautiful celestial body, full of secrets."
    conversation.add("user", "Tell me about the moon.")
    conversation.add("assistant", moon)
    conversation.add("user", "Again?")
    conversation.add("assistant", moon)
    assert conversation.turns == [] and conversation.dropped == 4
