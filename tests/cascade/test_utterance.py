"""Utterance boundaries from Silero VAD on real speech."""

from __future__ import annotations

import numpy as np
import pytest

from omnilive.audio import INPUT_RATE
from omnilive.engines.cascade._vad import FrameVAD
from omnilive.engines.cascade.utterance import TurnTaking, UtteranceTracker
from tests.cascade.speech import Say, silence

pytestmark = pytest.mark.cascade


def feed_in_units(tracker: UtteranceTracker, audio: np.ndarray) -> list[np.ndarray]:
    finished = []
    for start in range(0, audio.size, INPUT_RATE):
        heard = tracker.feed(audio[start : start + INPUT_RATE])
        if heard.finished is not None:
            finished.append(heard.finished)
    return finished


def test_one_utterance_with_its_pre_roll_and_tail(say: Say) -> None:
    speech = say("What is the capital of France?")
    tracker = UtteranceTracker(FrameVAD())
    (utterance,) = feed_in_units(tracker, np.concatenate([silence(1.0), speech, silence(1.5)]))
    params = tracker.params
    extra_s = (params.preroll_ms + params.tail_ms) / 1000 + 0.1
    assert speech.size * 0.8 < utterance.size < speech.size + extra_s * INPUT_RATE
    assert not tracker.in_speech


def test_a_short_pause_does_not_split_an_utterance(say: Say) -> None:
    audio = np.concatenate(
        [silence(0.5), say("What is the capital"), silence(0.3), say("of France?"), silence(1.5)]
    )
    assert len(feed_in_units(UtteranceTracker(FrameVAD()), audio)) == 1


def test_a_long_pause_does(say: Say) -> None:
    audio = np.concatenate(
        [silence(0.5), say("Hello there."), silence(1.2), say("How are you?"), silence(1.5)]
    )
    assert len(feed_in_units(UtteranceTracker(FrameVAD()), audio)) == 2


def test_silence_and_faint_noise_are_not_speech() -> None:
    rng = np.random.default_rng(1)
    audio = np.concatenate([silence(1.0), rng.normal(0, 0.003, 3 * INPUT_RATE)]).astype(np.float32)
    tracker = UtteranceTracker(FrameVAD())
    assert feed_in_units(tracker, audio) == []
    assert not tracker.in_speech


def test_an_earlier_utterance_can_be_put_in_front(say: Say) -> None:
    tracker = UtteranceTracker(FrameVAD(), TurnTaking())
    earlier = say("What is the capital")
    rest = np.concatenate([say("of France?"), silence(1.5)])
    started = tracker.feed(rest[:INPUT_RATE])
    assert started.started and tracker.in_speech
    tracker.prepend(earlier)
    (utterance,) = [u for u in feed_in_units(tracker, rest[INPUT_RATE:])]
    assert utterance.size > earlier.size
    np.testing.assert_array_equal(utterance[: earlier.size], earlier)
