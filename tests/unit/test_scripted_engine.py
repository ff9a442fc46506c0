"""The scripted engine is deterministic and shows that input reached it."""

from __future__ import annotations

import numpy as np
import pytest

from omnilive.audio import OUTPUT_RATE
from omnilive.engine_settings import ScriptedSettings
from omnilive.engines.base import EngineError
from omnilive.engines.messages import (
    AudioPart,
    ChatMessage,
    ChatOptions,
    DuplexOptions,
    HalfDuplexOptions,
    TextPart,
)
from omnilive.engines.scripted import ScriptedEngine


def engine(**kw) -> ScriptedEngine:
    e = ScriptedEngine(ScriptedSettings(**kw))
    e.load(lambda stage, fraction: None)
    return e


def chat(e, text: str, audio_s: float = 0.0):
    session = e.open_chat()
    parts = [TextPart(text)] + (
        [AudioPart(np.zeros(int(16000 * audio_s), np.float32))] if audio_s else []
    )
    tokens = session.prefill([ChatMessage("user", tuple(parts))], ChatOptions())
    return tokens, list(session.generate())


def test_chat_answer_echoes_input_with_real_audio_per_chunk():
    tokens, chunks = chat(engine(), "hello world", audio_s=1.5)
    text = "".join(c.text for c in chunks)
    assert "hello world" in text and "[audio 1.50 s]" in text
    assert tokens > 0
    for c in chunks:
        assert c.audio is not None and c.audio.dtype == np.float32
        assert c.audio.size == pytest.approx(len(c.text) * 0.05 * OUTPUT_RATE, abs=2)
        assert np.abs(c.audio).max() > 0.1
    assert chat(engine(), "hello world", 1.5)[1][0].audio.tobytes() == chunks[0].audio.tobytes()


def test_chat_failure_switches():
    with pytest.raises(EngineError):
        chat(engine(), "#fail:prefill")
    session = engine().open_chat()
    session.prefill([ChatMessage("user", (TextPart("#fail:generate " + "x" * 40),))], ChatOptions())
    gen = session.generate()
    next(gen)
    with pytest.raises(EngineError):
        next(gen)


def test_half_duplex_context_and_rollback():
    session = engine().open_half_duplex()
    session.prepare([TextPart("be nice #fail-turn:1")], HalfDuplexOptions())

    def turn(seconds: float) -> str:
        session.snapshot()
        session.prefill(np.zeros(int(16000 * seconds), np.float32))
        return "".join(c.text for c in session.generate())

    assert turn(1.0).startswith("Turn 0: heard 1.00 s; earlier turns: none")
    with pytest.raises(EngineError):
        turn(2.0)
    session.rollback()
    assert "Turn 1: heard 3.00 s; earlier turns: 1.00" in turn(3.0)


def test_duplex_schedule_force_listen_and_kv_growth():
    session = engine(duplex_schedule="LSSE").open_duplex()
    prompt = session.prepare("hi", DuplexOptions())
    units = []
    for force in (False, False, True, False, False):
        session.prefill(np.zeros(16000, np.float32), [])
        units.append(session.generate(force_listen=force))
        session.finalize()
    assert [u.is_listen for u in units] == [True, False, True, True, False]
    assert units[1].audio.size == OUTPUT_RATE and not units[1].end_of_turn
    kv = [u.kv_cache_length for u in units]
    assert kv == sorted(kv) and kv[0] > prompt
