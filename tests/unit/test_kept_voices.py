"""The engine's kept voice preparations (content.KeptVoices): made once per
voice by its samples, the last few kept, and read from any thread."""

from __future__ import annotations

import threading

import numpy as np

from omnilive.engines.minicpmo.content import KeptVoices


def voice(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, 1600).astype(np.float32)


def test_peek_reads_what_get_prepared_and_prepares_nothing() -> None:
    made: list[int] = []
    kept: KeptVoices[str] = KeptVoices(kept=2)
    assert kept.peek(voice(1)) is None and len(kept) == 0
    first = kept.get(voice(1), lambda s: made.append(1) or f"prepared {s.size}")
    assert kept.peek(voice(1)) is first  # the same samples, a fresh array
    assert kept.peek(voice(1).astype(np.float64)) is first  # as float32, the engine's audio
    assert kept.peek(voice(2)) is None
    assert made == [1] and len(kept) == 1


def test_a_peeked_voice_is_the_last_to_be_forgotten() -> None:
    forgotten: list[str] = []
    kept: KeptVoices[str] = KeptVoices(kept=2, forget=forgotten.append)
    kept.get(voice(1), lambda s: "one")
    kept.get(voice(2), lambda s: "two")
    assert kept.peek(voice(1)) == "one"  # now the most recent
    kept.get(voice(3), lambda s: "three")
    assert forgotten == ["two"]
    assert kept.peek(voice(1)) == "one" and kept.peek(voice(2)) is None


def test_forgetting_and_preparing_run_outside_the_lock() -> None:
    """A preparation (~0.1 s of the side lane) or a forget that reads the
    kept voices does not hold peek() on another thread back."""
    kept: KeptVoices[str] = KeptVoices(kept=1)
    kept.get(voice(1), lambda s: "one")
    kept.forget = lambda old: seen.append(kept.peek(voice(2)))
    seen: list[str | None] = []
    preparing, peeked = threading.Event(), threading.Event()

    def prepare(samples: np.ndarray) -> str:
        preparing.set()
        assert peeked.wait(10)  # another thread peeks while this prepares
        return "two"

    worker = threading.Thread(target=kept.get, args=(voice(2), prepare))
    worker.start()
    assert preparing.wait(10)
    assert kept.peek(voice(1)) == "one"
    peeked.set()
    worker.join(10)
    assert not worker.is_alive()
    assert seen == ["two"]  # the forget of "one" read the new voice
