"""Half-duplex: one simplex session kept across turns, with snapshot and rollback."""

from __future__ import annotations

import pytest

from omnilive.engines.base import EngineError
from omnilive.engines.messages import AudioPart, HalfDuplexOptions, TextPart, Voice
from tests.minicpmo.conftest import EngineFactory, voice
from tests.minicpmo.fake_model import FakeUnifiedMiniCPMO


def turn(session, speech_s: float = 1.0) -> tuple[int, str]:
    session.snapshot()
    added = session.prefill(voice(speech_s))
    chunks = list(session.generate())
    return added, "".join(c.text for c in chunks)


@pytest.mark.parametrize("factory", [None, FakeUnifiedMiniCPMO], ids=["checkpoint", "unified"])
def test_turns_accumulate_context_in_one_session(make_engine: EngineFactory, factory):
    engine, backend = make_engine(**({"factory": factory} if factory else {}))
    model = backend.model
    session = engine.open_half_duplex()
    reference = voice(2.0, seed=5)
    system = [TextPart("You are helpful."), AudioPart(voice(1.0, seed=9))]
    prompt_length = session.prepare(system, HalfDuplexOptions(voice=Voice(reference)))
    assert prompt_length == model.llm_past_key_values.get_seq_length() > 0
    assert model.voices[-1] is reference
    added, first = turn(session)
    assert added == 3 + 10  # the user-turn marker and one second of speech
    assert first.startswith(f"heard{prompt_length + added}")
    length_after_first = model.llm_past_key_values.get_seq_length()
    added, second = turn(session, 2.0)
    assert second.startswith(f"heard{length_after_first + added}")  # the first turn is still there
    assert len({p["session_id"] for p in model.prefills}) == 1
    assert [p["role"] for p in model.prefills] == ["system", "user", "user"]
    assert all(g["generate_audio"] for g in model.generations)
    session.close()
    assert model.live == 0


def test_rollback_restores_the_context_of_before_the_failed_turn(make_engine: EngineFactory):
    engine, backend = make_engine()
    model = backend.model
    session = engine.open_half_duplex()
    session.prepare([TextPart("Hi.")], HalfDuplexOptions(tts_enabled=False))
    turn(session)
    before = model.llm_past_key_values.get_seq_length()
    flags = (model.new_user_msg, model.llm_generated, model.llm_generate_completed)
    model.fail_generate_after = 4
    session.snapshot()
    session.prefill(voice(1.0))
    chunks = session.generate()
    next(chunks)
    with pytest.raises(EngineError, match="generation exploded"):
        next(chunks)
    assert model.llm_past_key_values.get_seq_length() > before
    session.rollback()
    assert model.llm_past_key_values.get_seq_length() == before
    assert (model.new_user_msg, model.llm_generated, model.llm_generate_completed) == flags
    model.fail_generate_after = None
    added, text = turn(session)
    assert text.startswith(f"heard{before + added}")  # continues as if the failure never was
    session.close()


def test_generate_needs_a_prefill(make_engine: EngineFactory):
    engine, _ = make_engine()
    session = engine.open_half_duplex()
    with pytest.raises(EngineError, match="before prepare"):
        session.prefill(voice(1.0))
    session.prepare([TextPart("Hi.")], HalfDuplexOptions())
    with pytest.raises(EngineError, match="generate before prefill"):
        session.generate()
    session.close()
