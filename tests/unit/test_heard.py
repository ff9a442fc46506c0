"""What the user heard of an answer (``worker/heard.py``)."""

from __future__ import annotations

from omnilive.worker.heard import SpokenAnswer, heard_text

CHUNKS = [("Hello there, ", 1000.0), ("how are you ", 1000.0), ("today?", 500.0)]


def test_whole_chunks_played_are_kept():
    assert heard_text(CHUNKS, 2000) == "Hello there, how are you"
    assert heard_text(CHUNKS, 5000) == "Hello there, how are you today?"
    assert heard_text(CHUNKS, 0) == ""


def test_a_chunk_played_in_part_keeps_its_share_of_words():
    assert heard_text(CHUNKS, 1500) == "Hello there, how"
    assert heard_text(CHUNKS, 1100) == "Hello there,"


def test_text_without_audio_goes_with_the_audio_before_it():
    assert heard_text([("a ", 1000.0), ("b ", 0.0), ("c", 1000.0)], 1000) == "a b"


def test_a_spoken_answer_measures_its_audio_at_24_khz():
    answer = SpokenAnswer(3)
    answer.add("Hi ", 24_000)
    answer.add("you.", 12_000)
    assert answer.audio_ms == 1500 and answer.text == "Hi you."
