"""The streaming VAD: its state machine on synthetic audio, then real Silero
on speech made by espeak-ng."""

from __future__ import annotations

import numpy as np
import pytest

from omnilive.end_of_turn import TurnJudge, Verdict, verdict
from omnilive.session_settings import EndOfTurnSettings
from omnilive.vad import (
    SileroModel,
    SpeechDiscarded,
    SpeechEnded,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    StreamingVad,
    TurnCheck,
    VadConfig,
)
from omnilive.worker.runners.hearing import with_turn_checks
from tests.speech import silence, speak

RATE = 16_000


class LoudnessModel:
    """Speech probability 1 for loud windows, 0 for quiet: makes the state
    machine's timing exact so it can be checked sample by sample."""

    window = 512

    def probability(self, frame: np.ndarray) -> float:
        return 1.0 if np.abs(frame).max() > 0.1 else 0.0

    def reset(self) -> None:
        pass


def loud(seconds: float) -> np.ndarray:
    return np.full(round(seconds * RATE), 0.5, np.float32)


def vad(**overrides) -> StreamingVad:
    config = VadConfig(**{"ignore_initial_ms": 0, **overrides})
    return StreamingVad(LoudnessModel(), config)


def feed_all(v: StreamingVad, audio: np.ndarray, chunk: int = 8000) -> list:
    events = []
    for i in range(0, audio.size, chunk):
        events.extend(v.feed(audio[i : i + chunk]))
    return events


def test_start_and_end_with_padding_on_both_sides():
    v = vad(speech_pad_ms=32, min_silence_duration_ms=320)
    # 0.512 s quiet then 1.024 s loud, aligned to windows, then 1 s quiet
    audio = np.concatenate([silence(0.512), loud(1.024), silence(1.0)])
    audio[:8192] = 0.001 * np.arange(8192) / 8192  # a distinguishable ramp before the trigger
    events = feed_all(v, audio, chunk=1000)
    started = [e for e in events if isinstance(e, SpeechStarted)]
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    assert [e.at_ms for e in started] == [512.0]
    assert len(ended) == 1
    segment = ended[0].segment
    pad = 512  # 32 ms
    assert ended[0].speech_ms == pytest.approx(1024)
    assert segment.size == 16384 + 2 * pad
    # the leading pad is audio from before the trigger, not zeros or speech
    np.testing.assert_array_equal(segment[:pad], audio[8192 - pad : 8192])
    assert np.all(segment[pad : pad + 16384] == 0.5)
    assert np.all(segment[-pad:] == 0)


def test_short_speech_is_discarded():
    v = vad(min_speech_duration_ms=200, min_silence_duration_ms=200)
    events = feed_all(v, np.concatenate([silence(0.5), loud(0.064), silence(1.0)]))
    assert any(isinstance(e, SpeechStarted) for e in events)
    assert [type(e) for e in events] == [SpeechStarted, SpeechPaused, SpeechDiscarded]


def test_pause_shorter_than_min_silence_does_not_end_speech():
    v = vad(min_silence_duration_ms=800)
    audio = np.concatenate([silence(0.5), loud(0.5), silence(0.5), loud(0.5), silence(1.0)])
    events = feed_all(v, audio)
    kinds = [type(e) for e in events]
    assert kinds == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechEnded]
    assert events[-1].speech_ms == pytest.approx(1500, abs=40)


def test_min_silence_decides_when_speech_ends():
    for ms in (300, 900):
        v = vad(min_silence_duration_ms=ms)
        audio = np.concatenate([loud(0.5), silence(2.0)])
        consumed = 0
        for i in range(0, audio.size, 512):
            consumed += 512
            if any(isinstance(e, SpeechEnded) for e in v.feed(audio[i : i + 512])):
                break
        silence_heard_ms = 1000 * (consumed - 8000) / RATE
        assert ms <= silence_heard_ms < ms + 64


def test_cold_start_guard_ignores_initial_audio():
    v = StreamingVad(LoudnessModel(), VadConfig(ignore_initial_ms=500, min_silence_duration_ms=200))
    assert feed_all(v, np.concatenate([loud(0.4), silence(0.5)])) == []
    events = feed_all(v, np.concatenate([loud(0.5), silence(0.5)]))
    assert isinstance(events[0], SpeechStarted)
    v.ignore_initial(500)
    assert feed_all(v, loud(0.4)) == []


def test_chunk_size_does_not_change_the_result():
    audio = np.concatenate([silence(0.3), loud(0.7), silence(0.9), loud(0.4), silence(1.0)])
    results = []
    for chunk in (160, 512, 4000, 8000, audio.size):
        events = feed_all(vad(min_silence_duration_ms=500), audio, chunk)
        results.append([(type(e).__name__, getattr(e, "speech_ms", None)) for e in events])
    assert all(r == results[0] for r in results)


def test_paused_property_tracks_silence_after_speech():
    v = vad(min_silence_duration_ms=800)
    v.feed(loud(0.5))
    assert v.speaking and not v.paused
    v.feed(silence(0.3))
    assert v.paused and v.speech_so_far.size > 0


def test_a_pause_can_be_ended_at_once_and_says_how_long_it_has_lasted():
    v = vad(min_silence_duration_ms=1600, speech_pad_ms=0)
    assert v.end_pause() is None  # nothing said
    feed_all(v, np.concatenate([loud(1.024), silence(0.512)]), chunk=512)
    assert v.silence_ms == pytest.approx(512, abs=1)
    ended = v.end_pause()
    assert isinstance(ended, SpeechEnded)
    assert ended.speech_ms == pytest.approx(1024, abs=1)
    assert ended.segment.size == round(1.024 * RATE)  # the silence is not the turn's
    assert not v.speaking and v.silence_ms == 0 and v.end_pause() is None
    feed_all(v, loud(1.024), chunk=512)
    assert v.speaking and v.end_pause() is None  # speaking, not paused


def test_silero_finds_spoken_sentence():
    sentence = speak("The quick brown fox jumps over the lazy dog.")
    audio = np.concatenate([silence(1.0), sentence, silence(1.5)])
    v = StreamingVad(SileroModel(), VadConfig(threshold=0.5, min_silence_duration_ms=500))
    events = feed_all(v, audio)
    ended = [e for e in events if isinstance(e, SpeechEnded)]
    assert len(ended) == 1, events
    duration_ms = 1000 * sentence.size / RATE
    # Silero ends speech at the last voiced window; espeak's pauses between words are short
    assert abs(ended[0].speech_ms - duration_ms) < 400
    started = next(e for e in events if isinstance(e, SpeechStarted))
    assert 900 <= started.at_ms <= 1300


def test_silero_ignores_silence_and_noise():
    rng = np.random.default_rng(0)
    noise = (0.005 * rng.standard_normal(RATE * 3)).astype(np.float32)
    v = StreamingVad(SileroModel(), VadConfig())
    assert feed_all(v, noise) == []


def test_a_silence_is_offered_for_a_turn_check_every_end_check():
    v = vad(min_silence_duration_ms=800, end_check_ms=192)
    events = feed_all(v, np.concatenate([loud(1.024), silence(0.512)]), chunk=512)
    checks = [e for e in events if isinstance(e, TurnCheck)]
    assert [c.round for c in checks] == [1, 2] and not any(
        isinstance(e, SpeechEnded) for e in events
    )
    assert {c.pause for c in checks} == {round(1.024 * RATE)}  # the silence's first sample
    assert checks[0].speech.size >= round(1.2 * RATE)
    # Judged complete: the turn ends at its silence, with what the speaker waited.
    ended = v.judged(checks[0], True)
    assert isinstance(ended, SpeechEnded) and not v.speaking
    assert ended.speech_ms == pytest.approx(1024) and 480 <= ended.silence_ms <= 544


def test_the_first_check_may_come_sooner_and_the_rest_keep_their_spacing():
    v = vad(end_check_ms=192, first_check_ms=96, min_silence_duration_ms=1000, speech_pad_ms=0)
    v.feed(loud(0.512))
    checks = [e for e in feed_all(v, silence(0.9), chunk=512) if isinstance(e, TurnCheck)]
    assert [round(c.silence_ms) for c in checks] == [96, 288, 480, 672, 864]
    assert [c.round for c in checks] == [1, 2, 3, 4, 5]


async def test_an_engine_that_judges_words_is_checked_sooner():
    class Runtime:
        turn_judge = TurnJudge(EndOfTurnSettings(check_after_ms=200, words_check_after_ms=100))

    rule = VadConfig(min_silence_duration_ms=800)
    by_sound = await with_turn_checks(Runtime(), rule)  # type: ignore[arg-type]
    assert (by_sound.end_check_ms, by_sound.first_check_ms) == (200, None)
    by_words = await with_turn_checks(Runtime(), rule, judges_words=True)  # type: ignore[arg-type]
    assert (by_words.end_check_ms, by_words.first_check_ms) == (200, 100)


def test_a_turn_ends_when_its_last_checks_all_find_it_complete():
    def two_checks(confirmations: int) -> tuple[StreamingVad, list[TurnCheck]]:
        v = vad(min_silence_duration_ms=800, end_check_ms=192, end_confirmations=confirmations)
        events = feed_all(v, np.concatenate([loud(1.024), silence(0.512)]), chunk=512)
        return v, [e for e in events if isinstance(e, TurnCheck)]

    v, (first, second) = two_checks(2)
    assert v.judged(first, True) is None and v.speaking  # one verdict is not enough
    assert isinstance(v.judged(second, True), SpeechEnded)
    v, (first, second) = two_checks(2)
    assert v.judged(second, True) is None  # verdicts may come back in any order
    assert isinstance(v.judged(first, True), SpeechEnded)
    v, (first, second) = two_checks(2)
    assert v.judged(first, False) is None and v.judged(second, True) is None and v.speaking
    v, (first, _) = two_checks(2)
    assert isinstance(v.judged(first, True, settled=True), SpeechEnded)  # words need no second


def test_the_words_lead_the_verdict_and_a_plainly_going_voice_vetoes_it():
    settings = EndOfTurnSettings(threshold=0.9, words_threshold=0.3, audio_veto=0.05)
    assert verdict(settings, audio_p=0.95, words_p=None) == Verdict(True, settled=False)
    assert verdict(settings, audio_p=0.5, words_p=None) == Verdict(False, settled=False)
    # "Can you tell me about the" sounded finished (0.93) but its words are not
    assert verdict(settings, audio_p=0.93, words_p=0.001) == Verdict(False, settled=True)
    # a finished question in a voice the audio model misreads (0.06)
    assert verdict(settings, audio_p=0.06, words_p=0.72) == Verdict(True, settled=True)
    assert verdict(settings, audio_p=0.01, words_p=0.72) == Verdict(False, settled=True)


class _Unheard:
    """An audio model that must not be run."""

    def probability(self, audio: np.ndarray) -> float:
        raise AssertionError("the audio model ran")


async def test_without_a_veto_judged_words_decide_and_the_audio_model_is_not_run():
    judge = TurnJudge(EndOfTurnSettings(words_threshold=0.2, audio_veto=0.0))
    judge._model = _Unheard()  # loaded, as ready() leaves it
    audio = silence(1.0)
    assert await judge.complete(audio, words_p=0.72) == Verdict(True, settled=True)
    assert await judge.complete(audio, words_p=0.01) == Verdict(False, settled=True)
    with pytest.raises(AssertionError, match="ran"):
        await judge.complete(audio, words_p=None)  # no words: the sound alone judges


def test_a_turn_check_is_void_once_speech_resumes_and_the_rule_still_ends_it():
    v = vad(min_silence_duration_ms=640, end_check_ms=128)
    first = feed_all(v, np.concatenate([loud(0.512), silence(0.256)]), chunk=512)
    check = next(e for e in first if isinstance(e, TurnCheck))
    feed_all(v, loud(0.512), chunk=512)  # the speaker goes on: that pause is over
    assert v.judged(check, True) is None and v.speaking
    rest = feed_all(v, silence(1.0), chunk=512)
    checks = [e for e in rest if isinstance(e, TurnCheck)]
    assert [c.round for c in checks] == [1, 2, 3, 4]  # the new pause, each 128 ms until 640
    [ended] = [e for e in rest if isinstance(e, SpeechEnded)]  # judged incomplete: the rule
    assert ended.silence_ms == pytest.approx(640, abs=32)


def test_without_an_end_check_nothing_is_offered():
    events = feed_all(vad(min_silence_duration_ms=320), np.concatenate([loud(1), silence(1)]))
    assert not any(isinstance(e, TurnCheck) for e in events)
