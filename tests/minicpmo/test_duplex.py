"""Full duplex through the model's duplex object: units, listen controls, finalize."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnilive.engines.base import EngineError
from omnilive.engines.messages import DuplexOptions, Voice
from tests.minicpmo.conftest import EngineFactory, voice
from tests.minicpmo.fake_model import FakeUnifiedMiniCPMO, LegacyMiniCPMO

SECOND = voice(1.0, seed=11)


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, "JPEG")
    return buffer.getvalue()


def run_units(session, n: int, force: set[int] = frozenset(), frames: int = 0):
    units = []
    for k in range(n):
        session.prefill(SECOND, [jpeg()] * frames, 1)
        units.append(session.generate(force_listen=k in force))
        session.finalize()
    return units


@pytest.mark.parametrize("factory", [None, FakeUnifiedMiniCPMO], ids=["checkpoint", "unified"])
def test_units_listen_speak_and_end_turns(make_engine: EngineFactory, factory):
    engine, backend = make_engine(force_listen_units=2, **({"factory": factory} if factory else {}))
    session = engine.open_duplex()
    prompt_length = session.prepare("You are helpful.", DuplexOptions())
    duplex = backend.model.duplex_object
    duplex.plan = "LLSSEL"  # the first two are forced to listen anyway
    assert prompt_length == duplex.decoder.get_cache_length() > 0
    units = run_units(session, 8)
    assert [u.is_listen for u in units] == [True, True, False, False, False, True, True, True]
    assert [u.end_of_turn for u in units] == [False, False, False, False, True, False, False, False]
    speak = units[2]
    assert speak.text.startswith("w3.0") and speak.n_tokens == 18 and speak.n_tts_tokens == 25
    assert speak.audio is not None and speak.audio.size == 24000 and speak.audio.dtype == np.float32
    assert speak.cost_llm_ms == pytest.approx(20) and speak.cost_token2wav_ms == pytest.approx(5)
    assert units[0].audio is None and units[0].text == ""  # listening sends no silence
    lengths = [u.kv_cache_length for u in units]
    assert lengths == sorted(lengths) and lengths[0] > prompt_length
    generates = [c for name, c in duplex.calls if name == "generate"]
    assert [g["force_listen"] for g in generates] == [True, True] + [False] * 6
    assert all(g["max_speak"] == 20 and g["decode_mode"] == "sampling" for g in generates)
    session.close()


def test_a_forced_listen_ends_the_spoken_turn(make_engine: EngineFactory):
    engine, backend = make_engine(force_listen_units=0)
    session = engine.open_duplex()
    session.prepare("Hi.", DuplexOptions())
    backend.model.duplex_object.plan = "S"
    units = run_units(session, 4, force={2})
    assert [u.is_listen for u in units] == [False, False, True, False]
    assert backend.model.duplex_object.decoder.cache.entries.count("turn_eos") == 1
    session.close()


def test_speak_tokens_per_unit_are_bounded_by_the_setting(make_engine: EngineFactory):
    engine, _ = make_engine(force_listen_units=0, max_speak_tokens_per_unit=5)
    session = engine.open_duplex()
    session.prepare("Hi.", DuplexOptions())
    unit = run_units(session, 1)[0]
    assert not unit.is_listen and unit.n_tokens == 3
    session.close()


def test_finalize_runs_between_units_and_its_absence_is_an_error(make_engine: EngineFactory):
    engine, backend = make_engine(force_listen_units=0)
    session = engine.open_duplex()
    session.prepare("Hi.", DuplexOptions())
    session.prefill(SECOND, [])
    session.generate()
    with pytest.raises(EngineError, match="before finalize_unit"):
        session.prefill(SECOND, [])  # the runner must finalize first
    session.finalize()
    session.prefill(SECOND, [])
    session.generate()
    session.finalize()
    names = [name for name, _ in backend.model.duplex_object.calls]
    assert names == [
        "prepare",
        "prefill",
        "generate",
        "finalize",
        "prefill",
        "generate",
        "finalize",
    ]
    session.close()


def test_omni_units_report_the_vision_the_model_fed(make_engine: EngineFactory):
    engine, _ = make_engine()
    session = engine.open_duplex()
    session.prepare("Look.", DuplexOptions(vision=True))
    stats = session.prefill(SECOND, [jpeg(), jpeg()], 2)
    assert (stats.vision_slices, stats.vision_tokens) == (4, 256)
    assert stats.cost_ms == pytest.approx(4.0)
    session.generate()
    session.finalize()
    assert session.prefill(SECOND, [], 2).vision_slices == 0
    session.close()


def test_voices_go_to_the_prompt_and_the_speech_decoder(make_engine: EngineFactory):
    engine, backend = make_engine()
    session = engine.open_duplex()
    llm, tts = voice(1.0, seed=1), voice(1.5, seed=2)
    session.prepare("Hi.", DuplexOptions(llm_voice=Voice(llm), tts_voice=Voice(tts)))
    prepare = backend.model.duplex_object.calls[0][1]
    assert prepare["ref_audio"] is llm and prepare["prefix"] == "Hi." and prepare["suffix"] is None
    wav = Path(prepare["prompt_wav_path"])
    assert wav.is_file() and wav.stat().st_size == 44 + 2 * tts.size
    session.close()
    assert not wav.exists()  # the temporary voice file goes with the session


def test_the_default_voice_without_voices_and_the_unified_prompt_format(make_engine: EngineFactory):
    engine, backend = make_engine(factory=FakeUnifiedMiniCPMO)
    session = engine.open_duplex()
    session.prepare("Hi.", DuplexOptions())
    prepare = backend.model.duplex_object.calls[0][1]
    assert prepare["ref_audio"].size == 32000  # the engine's default voice
    assert prepare["prefix"] == "<|im_start|>system\nHi.\n<|audio_start|>"
    assert prepare["suffix"] == "<|audio_end|><|im_end|>"
    assert backend.model.mode_switches[-1].value == "duplex"
    session.close()


def test_older_duplex_code_listens_through_its_break_event(make_engine: EngineFactory):
    engine, backend = make_engine(factory=LegacyMiniCPMO, force_listen_units=1)
    session = engine.open_duplex()
    session.prepare("Hi.", DuplexOptions())
    duplex = backend.model.duplex_object
    duplex.plan = "S"
    units = run_units(session, 3)
    assert [u.is_listen for u in units] == [True, False, False]
    assert not duplex.break_set  # cleared after the forced unit
    assert "finalize" not in [name for name, _ in duplex.calls]
    session.close()


def test_a_failing_unit_is_an_engine_error_and_the_session_goes_on(make_engine: EngineFactory):
    engine, backend = make_engine(force_listen_units=0)
    session = engine.open_duplex()
    session.prepare("Hi.", DuplexOptions())
    duplex = backend.model.duplex_object
    duplex.fail_in = "generate"
    session.prefill(SECOND, [])
    with pytest.raises(EngineError, match="duplex generate: RuntimeError: CUDA out of memory"):
        session.generate()
    duplex.fail_in = None
    assert not session.generate().is_listen  # the pending unit is still there to decide
    session.finalize()
    session.close()


def test_switching_views_on_one_model(make_engine: EngineFactory):
    engine, backend = make_engine(factory=FakeUnifiedMiniCPMO)
    model = backend.model
    for _ in range(2):
        duplex = engine.open_duplex()
        duplex.prepare("Hi.", DuplexOptions())
        run_units(duplex, 4)
        duplex.close()
        chat = engine.open_chat()
        from omnilive.engines.messages import ChatMessage, ChatOptions, TextPart

        chat.prefill([ChatMessage("user", (TextPart("hello"),))], ChatOptions())
        assert list(chat.generate())
        chat.close()
    assert [m.value for m in model.mode_switches][-4:] == ["duplex", "streaming"] * 2
    assert model.live == 0


def test_step_graphs_run_only_inside_sessions(make_engine: EngineFactory):
    engine, backend = make_engine(factory=FakeUnifiedMiniCPMO)
    graphs = backend.graphs
    assert graphs is not None and not graphs.active  # the warm-up session released them
    duplex = engine.open_duplex()
    duplex.prepare("Hi.", DuplexOptions())
    assert graphs.active and graphs.attached is backend.model.duplex_object
    run_units(duplex, 2)
    duplex.close()
    assert not graphs.active
    released = graphs.releases
    chat = engine.open_chat()
    from omnilive.engines.messages import ChatMessage, ChatOptions, TextPart

    chat.prefill([ChatMessage("user", (TextPart("hello"),))], ChatOptions())
    assert graphs.active and graphs.attached is None  # a simplex view: no decoder to hook
    list(chat.generate())
    chat.close()
    assert not graphs.active and graphs.releases > released


def test_step_graphs_can_be_switched_off(make_engine: EngineFactory):
    engine, backend = make_engine(cuda_graphs=False)
    assert backend.graphs is None
    duplex = engine.open_duplex()
    duplex.prepare("Hi.", DuplexOptions())
    assert run_units(duplex, 2)
    duplex.close()
