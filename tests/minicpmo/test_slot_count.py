"""How many slots the minicpmo engine serves: a count that does not fit,
none fitting, and one slot, which is the slot path at a batch of one (no
second serving path). On the tests' own tiny model (``tiny/``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from omnilive.audio import wav_bytes
from omnilive.engine_settings import ContextWindowSettings, MiniCPMoSettings
from omnilive.engines.base import EngineError
from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    DuplexOptions,
    GenerationOptions,
    TextPart,
)
from omnilive.engines.minicpmo import MiniCPMoEngine
from tests.minicpmo.conftest import voice, write_checkpoint
from tests.minicpmo.test_slot_engine import run_session
from tests.minicpmo.tiny.backend import TinyBackend


@dataclass(frozen=True)
class Tiny:
    path: Path  # a checkpoint folder (the files the engine checks)
    voice: Path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    folder = tmp_path_factory.mktemp("tiny_slot_count")
    speaker = folder / "voice.wav"
    speaker.write_bytes(wav_bytes(voice(2.0, seed=7), 16000))
    return Tiny(write_checkpoint(folder / "ckpt"), speaker)


def test_too_many_slots_for_the_memory_is_one_clear_refusal(tiny: Tiny) -> None:
    from omnilive.engines.base import EngineUnavailable

    settings = MiniCPMoSettings(
        model_path=tiny.path, device="cpu", slots=64, context_length=32768, warmup=False
    )
    engine = MiniCPMoEngine(settings, backend=TinyBackend(5.0))
    try:
        with pytest.raises(EngineUnavailable, match=r"64 session slot\(s\) need .* fit"):
            engine.load(lambda stage, fraction: None)
    finally:
        engine.close()


def test_unset_slots_with_not_even_one_fitting_is_one_clear_refusal(tiny: Tiny) -> None:
    # No fallback to the model's own code: that path is the oracle only.
    from omnilive.engines.base import EngineUnavailable

    settings = MiniCPMoSettings(
        model_path=tiny.path, device="cpu", slots=0, context_length=32768, warmup=False,
        memory_headroom_gb=4.9,
    )  # fmt: skip
    engine = MiniCPMoEngine(settings, backend=TinyBackend(5.0))
    try:
        with pytest.raises(EngineUnavailable, match=r"1 session slot\(s\) need .* 0 fit"):
            engine.load(lambda stage, fraction: None)
    finally:
        engine.close()


@pytest.fixture
def one_slot(tiny: Tiny) -> Any:
    settings = MiniCPMoSettings(
        model_path=tiny.path, device="cpu", slots=1, context_length=1024,
        duplex_window=ContextWindowSettings(high_tokens=600, low_tokens=450),
        default_voice=tiny.voice, force_listen_units=0, memory_headroom_gb=1.0,
    )  # fmt: skip
    engine = MiniCPMoEngine(settings, backend=TinyBackend(64.0))
    engine.load(lambda stage, fraction: None)  # the warm-up runs on the one slot too
    yield engine
    engine.close()


async def test_one_slot_is_the_slot_path_at_a_batch_of_one(one_slot: Any) -> None:
    """``slots = 1`` is served as any other count (one serving path): its
    views are the slot views, a second session is refused until the first
    closes, and a chat takes the slot as a duplex session does."""
    from omnilive.engines.minicpmo.sessions.duplex.view import SlotDuplexSession
    from omnilive.engines.minicpmo.sessions.simplex.views import SlotChat, SlotHalfDuplex

    engine = one_slot
    assert engine.capabilities.slots == 1 and engine.capabilities.context_length == 1024
    assert isinstance(engine.open_half_duplex(), SlotHalfDuplex)
    results = await run_session(engine, seed=4, units=3, omni=False)
    assert [unit.kv_cache_length > 0 for _, unit in results] == [True] * 3
    held = engine.open_duplex()
    assert isinstance(held, SlotDuplexSession)
    await held.prepare("The one session.", DuplexOptions())
    chat = engine.open_chat()
    assert isinstance(chat, SlotChat)
    try:
        with pytest.raises(EngineError, match="every session slot"):
            await chat.prefill([ChatMessage("user", (TextPart("Hi."),))], ChatOptions())
    finally:
        chat.close()
    held.close()
    chat = engine.open_chat()
    try:
        options = ChatOptions(generation=GenerationOptions(max_new_tokens=4))
        await chat.prefill([ChatMessage("user", (TextPart("Hi."),))], options)
        pieces = [piece async for piece in chat.generate()]
        assert pieces and any(piece.text for piece in pieces)
    finally:
        chat.close()
