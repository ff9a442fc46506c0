"""Utterance boundaries from Silero VAD on real speech."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnilive.audio import INPUT_RATE
from omnilive.engine_settings import CascadeSettings
from omnilive.engines.cascade import CascadeEngine
from omnilive.engines.cascade._vad import FrameVAD
from omnilive.engines.cascade.utterance import TurnJudging, TurnTaking, UtteranceTracker
from omnilive.session_settings import EndOfTurnSettings
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


def silence_at_finish(tracker: UtteranceTracker, speech: np.ndarray) -> float | None:
    """Fed in 0.1 s pieces, the silence (s) after ``speech`` when the
    utterance was reported finished, or None."""
    audio, piece = np.concatenate([silence(0.5), speech, silence(1.5)]), INPUT_RATE // 10
    for start in range(0, audio.size, piece):
        if tracker.feed(audio[start : start + piece]).finished is not None:
            return (start + piece) / INPUT_RATE - 0.5 - speech.size / INPUT_RATE
    return None


class Verdicts:
    """A judge that answers from a script and counts what it was asked."""

    def __init__(self, *answers: bool) -> None:
        self.answers, self.asked = list(answers), 0

    def __call__(self, audio: np.ndarray) -> bool:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]


def test_a_finished_sounding_utterance_ends_after_two_agreeing_checks(say: Say) -> None:
    speech = say("What is the capital of France?")
    silence_rule = silence_at_finish(UtteranceTracker(FrameVAD()), speech)
    judge = Verdicts(True)
    judging = TurnJudging(judge, check_ms=200, confirmations=2)
    judged = silence_at_finish(UtteranceTracker(FrameVAD(), judging=judging), speech)
    assert silence_rule is not None and judged is not None
    assert judge.asked == 2 and judged < silence_rule - 0.15, (judged, silence_rule)


def test_a_dissenting_check_leaves_the_silence_rule_in_charge(say: Say) -> None:
    speech = say("What is the capital of France?")
    silence_rule = silence_at_finish(UtteranceTracker(FrameVAD()), speech)
    judge = Verdicts(True, False, True)  # never two in a row before the rule's 640 ms
    judging = TurnJudging(judge, check_ms=200, confirmations=2)
    assert silence_at_finish(UtteranceTracker(FrameVAD(), judging=judging), speech) == silence_rule
    assert judge.asked == 3


def test_the_cascade_loads_the_end_of_turn_model_for_its_duplex_loop(
    say: Say, tmp_path: Path
) -> None:
    """The real model, as the engine wires it: a plainly finished question
    (espeak-ng speaks it the same way every time) ends before the rule."""
    settings = EndOfTurnSettings(threshold=0.8)
    engine = CascadeEngine(CascadeSettings(), tmp_path, settings)
    engine.load(lambda *_: None)
    try:
        judging = engine.stack.turn_judging
        assert judging is not None and judging.confirmations == settings.confirmations
        speech = say("How do airplanes manage to stay up in the air?")
        silence_rule = silence_at_finish(UtteranceTracker(FrameVAD()), speech)
        judged = silence_at_finish(UtteranceTracker(FrameVAD(), judging=judging), speech)
        assert silence_rule is not None and judged is not None and judged < silence_rule
    finally:
        engine.close()
    off = CascadeEngine(CascadeSettings(), tmp_path, EndOfTurnSettings(enabled=False))
    off.load(lambda *_: None)
    assert off.stack.turn_judging is None
    off.close()
