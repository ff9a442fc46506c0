"""Nothing a session holds outlives it: 50 sessions of every view on one model."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    DuplexOptions,
    HalfDuplexOptions,
    TextPart,
    Voice,
)
from tests.minicpmo.conftest import EngineFactory, voice
from tests.minicpmo.fake_model import FakeUnifiedMiniCPMO


def voice_files() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("omnilive-voice-*.wav"))


@pytest.mark.parametrize("factory", [None, FakeUnifiedMiniCPMO], ids=["checkpoint", "unified"])
def test_fifty_sessions_leave_no_state_behind(
    make_engine: EngineFactory, factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The voices' files in a folder of this test's: other tests running beside
    # it write theirs in the system's temporary folder.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine, backend = make_engine(**({"factory": factory} if factory else {}))
    model = backend.model
    files_before = voice_files()
    held = []
    for k in range(50):
        kind = k % 3
        if kind == 0:
            session = engine.open_duplex()
            session.prepare("Hi.", DuplexOptions(tts_voice=Voice(voice(1.0, seed=k))))
            for _ in range(4):
                session.prefill(voice(1.0), [])
                session.generate()
                session.finalize()
        elif kind == 1:
            session = engine.open_chat()
            session.prefill([ChatMessage("user", (TextPart(f"q{k}"),))], ChatOptions())
            list(session.generate())
        else:
            session = engine.open_half_duplex()
            session.prepare([TextPart("Hi.")], HalfDuplexOptions())
            session.snapshot()
            session.prefill(voice(1.0))
            list(session.generate())
        session.close()
        held.append(backend.memory_stats()["allocated_mib"])
    assert held == [0.0] * 50
    assert model.llm_past_key_values is None and model.token2wav_cache is None
    assert model.duplex_object.decoder.cache is None and model.duplex_object.total_hidden == []
    assert backend.releases >= 50
    assert voice_files() == files_before
