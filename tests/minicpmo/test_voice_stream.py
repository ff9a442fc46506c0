"""A session's voice (vocoder.py) on the CPU: how :class:`VoiceStream` cuts
speech tokens into vocoder chunks, on a fake runner whose audio tells which
tokens it voiced from which state; and :class:`ModelCodeRunner` over the
benchmarks' tone stand-in of the vocoder."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from omnilive.engines.minicpmo.sessions.duplex.unit_rules import SILENCE_TOKEN
from omnilive.engines.minicpmo.sessions.voice.vocoder import (
    OUT_RATE,
    VOCODER_CHUNK,
    ModelCodeRunner,
    VoiceStream,
    one_by_one,
)

SAMPLES_PER_TOKEN = OUT_RATE // VOCODER_CHUNK  # 960: 40 ms at 24 kHz
SILENCE = [SILENCE_TOKEN] * 3
STANDIN = Path(__file__).parents[2] / "benchmarks/standins/tone_vocoder.py"

State = tuple[Any, ...]


def rendered(tokens: list[int], seen: int) -> np.ndarray:
    """The fake runner's audio: each token as one value over its 40 ms, the
    token's own shifted by how many tokens the turn voiced before it."""
    values = [token / 10_000 + (seen + i) / 1_000 for i, token in enumerate(tokens)]
    return np.repeat(np.asarray(values, dtype=np.float32), SAMPLES_PER_TOKEN)


class FakeRunner:
    """A deterministic chunk runner: the state is the prompt and every token
    voiced so far (immutable); a chunk voices all but the lookahead unless
    ``last``, its audio depending on the state (a leaked state shows)."""

    lookahead = 3

    def __init__(self) -> None:
        self.calls: list[tuple[State, list[int], bool]] = []

    def open(self, prompt_wav: str) -> State:
        return (prompt_wav,)

    def chunks(self, calls: list[tuple[State, list[int], bool]]) -> list[tuple[np.ndarray, State]]:
        return one_by_one(self, calls)

    def chunk(self, state: State, tokens: list[int], last: bool) -> tuple[np.ndarray, State]:
        self.calls.append((state, list(tokens), last))
        voiced = tokens if last else tokens[: len(tokens) - self.lookahead]
        return rendered(voiced, len(state) - 1), (*state, *voiced)


def speech(count: int, start: int = 100) -> list[int]:
    return list(range(start, start + count))


def test_a_fresh_stream_holds_three_silence_tokens():
    runner = FakeRunner()
    stream = VoiceStream(runner, "voice.wav")
    assert stream.buffer == SILENCE
    assert stream.live == ("voice.wav",)
    assert runner.calls == []


def test_a_second_of_tokens_is_voiced_keeping_the_lookahead():
    runner = FakeRunner()
    stream = VoiceStream(runner, "voice.wav")
    tokens = speech(25)

    samples = stream.push(tokens, last=False, flush=False)

    voiced = SILENCE + tokens[:22]
    assert samples is not None
    assert len(samples) == OUT_RATE
    np.testing.assert_array_equal(samples, rendered(voiced, 0))
    assert runner.calls == [(("voice.wav",), SILENCE + tokens, False)]
    assert stream.buffer == tokens[22:]
    assert stream.live == ("voice.wav", *voiced)

    # The next second goes on from the state and the tokens kept back.
    more = speech(25, start=500)
    assert stream.push(more[:24], last=False, flush=False) is None
    samples = stream.push(more[24:], last=False, flush=False)
    assert samples is not None
    np.testing.assert_array_equal(samples, rendered(tokens[22:] + more[:22], 25))
    assert stream.buffer == more[22:]


def test_fewer_tokens_than_a_chunk_give_nothing():
    runner = FakeRunner()
    stream = VoiceStream(runner, "voice.wav")

    assert stream.push(speech(24), last=False, flush=False) is None
    assert stream.push([], last=False, flush=False) is None
    assert runner.calls == []
    assert stream.buffer == SILENCE + speech(24)


def test_flush_voices_a_short_buffer_padded_in_front_to_a_second():
    runner = FakeRunner()
    stream = VoiceStream(runner, "voice.wav")

    # Seven tokens (the lookahead plus four) are not enough even for a flush.
    assert stream.push(speech(4), last=False, flush=True) is None
    assert runner.calls == []

    tokens = [*speech(4), 777]
    samples = stream.push([777], last=False, flush=True)

    voiced = SILENCE + tokens[:2]  # the lookahead plus five: five voiced
    assert samples is not None
    assert len(samples) == OUT_RATE
    pad = OUT_RATE - len(voiced) * SAMPLES_PER_TOKEN
    np.testing.assert_array_equal(samples[:pad], np.zeros(pad, np.float32))
    np.testing.assert_array_equal(samples[pad:], rendered(voiced, 0))
    assert runner.calls == [(("voice.wav",), SILENCE + tokens, False)]
    assert stream.buffer == tokens[2:]


def test_flush_of_a_long_buffer_voices_it_in_chunks_but_the_lookahead():
    runner = FakeRunner()
    stream = VoiceStream(runner, "voice.wav")
    tokens = speech(40)

    samples = stream.push(tokens, last=False, flush=True)

    buffered = SILENCE + tokens
    voiced = buffered[:-3]
    assert samples is not None
    assert len(samples) == len(voiced) * SAMPLES_PER_TOKEN  # over a second: no padding
    np.testing.assert_array_equal(samples, rendered(voiced, 0))
    assert [(len(tokens), last) for _, tokens, last in runner.calls] == [
        (VOCODER_CHUNK + 3, False),
        (len(buffered) - VOCODER_CHUNK, False),
    ]
    assert stream.buffer == buffered[-3:]


def test_last_voices_the_rest_and_restarts_the_turn():
    runner = FakeRunner()
    stream = VoiceStream(runner, "voice.wav")
    tokens = speech(10)

    samples = stream.push(tokens, last=True, flush=False)

    voiced = SILENCE + tokens  # the lookahead too: nothing comes after
    assert samples is not None
    assert len(samples) == len(voiced) * SAMPLES_PER_TOKEN  # the end: not padded
    np.testing.assert_array_equal(samples, rendered(voiced, 0))
    assert runner.calls == [(("voice.wav",), voiced, True)]
    assert stream.buffer == SILENCE
    assert stream.live == ("voice.wav",)

    # The next turn starts again from the voice's base and the silence.
    fresh = VoiceStream(FakeRunner(), "voice.wav")
    again = speech(25, start=300)
    first = stream.push(again, last=False, flush=False)
    assert runner.calls[-1][0] == ("voice.wav",)
    assert runner.calls[-1][1][:3] == SILENCE
    expected = fresh.push(again, last=False, flush=False)
    assert first is not None and expected is not None
    np.testing.assert_array_equal(first, expected)


def test_last_after_whole_seconds_voices_them_then_the_rest():
    runner = FakeRunner()
    stream = VoiceStream(runner, "voice.wav")
    tokens = speech(30)

    samples = stream.push(tokens, last=True, flush=False)

    assert samples is not None
    np.testing.assert_array_equal(samples, rendered(SILENCE + tokens, 0))
    assert [last for _, _, last in runner.calls] == [False, True]
    assert stream.live == ("voice.wav",)


PUSHES: list[tuple[list[int], bool, bool]] = [
    (speech(10), False, False),
    (speech(20, start=200), False, False),
    (speech(6, start=400), False, True),
    (speech(31, start=500), False, False),
    (speech(4, start=700), True, False),
    (speech(27, start=800), False, False),
    (speech(9, start=900), False, True),
    (speech(2, start=990), True, True),
]


def play(stream: VoiceStream, pushes: list[tuple[list[int], bool, bool]]) -> list[Any]:
    return [stream.push(tokens, last=last, flush=flush) for tokens, last, flush in pushes]


def test_two_streams_on_one_runner_sound_as_each_alone():
    other = [(list(reversed(tokens)), last, flush) for tokens, last, flush in PUSHES[3:]]
    other += PUSHES[:3]
    alone_a = play(VoiceStream(FakeRunner(), "a.wav"), PUSHES)
    alone_b = play(VoiceStream(FakeRunner(), "b.wav"), other)

    shared = FakeRunner()
    a, b = VoiceStream(shared, "a.wav"), VoiceStream(shared, "b.wav")
    together_a, together_b = [], []
    for push_a, push_b in zip(PUSHES, other, strict=True):
        together_a += play(a, [push_a])
        together_b += play(b, [push_b])

    assert sum(samples is not None for samples in alone_a) >= 4  # the check has audio
    for alone, together in ((alone_a, together_a), (alone_b, together_b)):
        assert [samples is None for samples in together] == [s is None for s in alone]
        for mine, theirs in zip(together, alone, strict=True):
            if mine is not None:
                np.testing.assert_array_equal(mine, theirs)
    assert {call[0][0] for call in shared.calls} == {"a.wav", "b.wav"}


# --- ModelCodeRunner over the tone stand-in ---------------------------------------------------


def tone_standin() -> ModuleType:
    """The benchmarks' stand-in vocoder module, loaded from its file."""
    pytest.importorskip("soundfile")
    spec = importlib.util.spec_from_file_location("tone_vocoder_standin", STANDIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def prompt_wav(tmp_path: Path) -> str:
    soundfile = pytest.importorskip("soundfile")
    t = np.arange(8_000, dtype=np.float32) / 16_000
    path = tmp_path / "prompt.wav"
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16_000)
    return str(path)


def test_model_code_runner_voices_a_second_with_the_vocoders_own_caches_left(prompt_wav: str):
    vocoder = tone_standin().Token2wav("unused")
    before = {name: object() for name in ("cache", "stream_cache", "hift_cache_dict")}
    for name, value in before.items():
        setattr(vocoder, name, value)
    runner = ModelCodeRunner(vocoder)
    assert runner.lookahead == vocoder.flow.pre_lookahead_len

    stream = VoiceStream(runner, prompt_wav)
    for name, value in before.items():
        assert getattr(vocoder, name) is value, name
    assert float(stream.base["stream_cache"]["level"]) == pytest.approx(0.3 / np.sqrt(2), rel=1e-2)
    assert stream.base["prompt_wav"] == prompt_wav

    tokens = speech(25, start=4000)
    samples = stream.push(tokens, last=False, flush=False)

    assert samples is not None
    assert samples.dtype == np.float32
    assert samples.shape == (OUT_RATE,)
    assert float(np.abs(samples).max()) <= 1.0
    # The tone of the second's tokens (the silence and the first 22), as int16 PCM.
    tone = vocoder._render(SILENCE + tokens[:22])
    np.testing.assert_allclose(samples, tone, atol=2 / 32768)
    for name, value in before.items():
        assert getattr(vocoder, name) is value, name
