"""The cascade's voices: the Piper voice for English, espeak-ng for the rest."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from omnilive.audio import INPUT_RATE, OUTPUT_RATE, resample
from omnilive.config import load_settings
from omnilive.engines.base import EngineUnavailable
from omnilive.engines.cascade import CascadeEngine
from omnilive.engines.cascade.piper import (
    PiperVoice,
    VoiceConfig,
    VoiceFileError,
    clause_punctuation,
    packaged_voice,
    with_punctuation,
)
from omnilive.engines.cascade.tts import PIPER, foreign_voice
from omnilive.engines.messages import Voice
from tests.integration.test_startup import last_line, omnilive, serve_args

SENTENCES = (
    "I would like to book a table for four people tonight.",
    "Please open the window and let some fresh air in.",
)


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def test_clauses_keep_their_punctuation():
    assert clause_punctuation("Hello there, how are you?") == [",", "?"]
    assert clause_punctuation("No end") == ["."]
    assert with_punctuation(["a", "b"], "A, b!") == "a, b!"
    # espeak-ng split it otherwise ("e.g." is a clause of its own to it).
    assert with_punctuation(["x", "y", "z"], "x e.g. y!") == "x, y, z!"


def test_the_piper_voice_is_heard_as_written(engine: CascadeEngine):
    """Whisper transcribes the Piper voice's English back to its words."""
    tts, asr = engine.stack.tts, engine.stack.asr
    assert tts.default_voice == PIPER
    for sentence in SENTENCES:
        speech = tts.synthesize(sentence, PIPER)
        assert 1.0 < speech.size / OUTPUT_RATE < 8.0
        heard = asr.transcribe(resample(speech, OUTPUT_RATE, INPUT_RATE)).text
        missing = words(sentence) - words(heard)
        assert len(missing) <= 1, (sentence, heard)


def test_a_chinese_answer_is_spoken_by_espeak(engine: CascadeEngine):
    tts = engine.stack.tts
    answer = "你好，很高兴认识你。"
    assert foreign_voice(answer) == "cmn" and foreign_voice("Hello, world.") is None
    spoken = tts.synthesize(answer, PIPER)
    # espeak-ng is deterministic: the very samples of its Mandarin voice.
    assert np.array_equal(spoken, tts.espeak.synthesize(answer, "cmn"))
    assert spoken.size > OUTPUT_RATE // 2


def test_voices_a_request_names(engine: CascadeEngine):
    tts = engine.stack.tts
    assert tts.resolve_voice(None).espeak == PIPER
    assert tts.resolve_voice(Voice(language="en-us")).espeak == PIPER
    assert tts.resolve_voice(Voice(name="de")).espeak == "de"  # an espeak-ng voice
    cloned = tts.resolve_voice(Voice(reference=np.zeros(16000, np.float32)))
    assert cloned.espeak == PIPER and "voice cloning is not available" in cloned.warnings[0]


def test_a_broken_voice_is_one_clear_error(tmp_path: Path):
    with pytest.raises(VoiceFileError, match="does not exist"):
        PiperVoice(tmp_path / "none.onnx").load()
    model = tmp_path / "bad.onnx"
    model.write_bytes(b"not a model")
    (tmp_path / "bad.onnx.json").write_text(packaged_voice().with_suffix(".onnx.json").read_text())
    with pytest.raises(VoiceFileError, match="not a loadable ONNX model"):
        PiperVoice(model).load()
    (tmp_path / "bad.onnx.json").write_text('{"audio": {}}')
    with pytest.raises(VoiceFileError, match="not a Piper voice configuration"):
        VoiceConfig.read(tmp_path / "bad.onnx.json")
    assert issubclass(VoiceFileError, EngineUnavailable)  # not retried at start-up


def test_a_missing_voice_stops_serve_with_one_line(tmp_path: Path):
    missing = tmp_path / "nowhere.onnx"
    run = omnilive(
        tmp_path, *serve_args(tmp_path, "--engine", "cascade"),
        env={"OMNILIVE_CASCADE__PIPER_VOICE": str(missing)},
    )  # fmt: skip
    assert run.returncode == 3, run.stderr[-3000:]
    assert last_line(run) == (
        "omnilive serve: no worker can serve: worker w0 cannot load its engine: "
        f"the Piper voice {missing} does not exist"
    )
    assert "Traceback" not in run.stderr


def test_the_voice_settings_are_validated():
    assert load_settings(environ={}).cascade.tts == "piper"
    assert load_settings(environ={"OMNILIVE_CASCADE__TTS": "espeak"}).cascade.tts == "espeak"
    with pytest.raises(ValueError, match="tts"):
        load_settings(environ={"OMNILIVE_CASCADE__TTS": "festival"})
