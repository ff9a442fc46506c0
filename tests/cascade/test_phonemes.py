"""The Piper voice's phonemizer: one espeak-ng process that keeps running."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from omnilive.engines.cascade.phonemes import MARKER, MAX_LINE_BYTES, Phonemizer, once

TEXTS = [
    "Mastering a new language",
    "Hello there, how are you? I am fine.",
    "For instance, e.g. this one.",
    "...",
    "Two lines\nof text.",
    "Numbers like 3.5 and 1,200 are read out.",
]


@pytest.fixture
def phonemizer():
    phonemizer = Phonemizer("en-us")
    yield phonemizer
    phonemizer.close()


def pid(phonemizer: Phonemizer) -> int | None:
    process = phonemizer._process
    return None if process is None else process.pid


def test_one_process_phonemizes_as_espeak_started_afresh(phonemizer: Phonemizer) -> None:
    for text in TEXTS:
        assert phonemizer.clauses(text) == once("en-us", " ".join(text.split()).encode())
    first = pid(phonemizer)
    phonemizer.clauses("And once more.")
    assert first is not None and pid(phonemizer) == first


def test_text_the_process_cannot_take_goes_to_a_one_shot_espeak(phonemizer: Phonemizer) -> None:
    long = "word " * (MAX_LINE_BYTES // 5 + 10)
    assert phonemizer.clauses(long) == once("en-us", long.strip().encode())
    marked = f"Say {MARKER} please"
    assert phonemizer.clauses(marked) == once("en-us", marked.encode())
    assert pid(phonemizer) is None  # neither started the process


def test_a_dead_process_loses_no_request(phonemizer: Phonemizer) -> None:
    expected = once("en-us", b"The weather is nice today.")
    assert phonemizer.clauses("Good morning.")
    dead = phonemizer._process
    assert dead is not None
    dead.kill()
    dead.wait()
    assert phonemizer.clauses("The weather is nice today.") == expected  # found dead: one-shot
    assert phonemizer.clauses("The weather is nice today.") == expected  # one-shot again
    assert phonemizer.clauses("The weather is nice today.") == expected  # a new process
    assert pid(phonemizer) not in (None, dead.pid)


def test_callers_on_many_threads_each_get_their_own_text(phonemizer: Phonemizer) -> None:
    expected = {text: once("en-us", " ".join(text.split()).encode()) for text in TEXTS}
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda text: (text, phonemizer.clauses(text)), TEXTS * 8))
    assert all(clauses == expected[text] for text, clauses in got)
