"""How many slots the minicpmo engine serves: a count that does not fit,
none fitting, and one slot, which is the slot path at a batch of one (no
second serving path). On the tests' own tiny model (``tiny/``)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
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
    UnitInput,
)
from omnilive.engines.minicpmo import MiniCPMoEngine
from omnilive.protocol.internal import LoadOutcome
from omnilive.worker.runtime import WorkerRuntime
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


@pytest.mark.parametrize(
    ("slots", "headroom_gb", "refusal"),
    [
        (64, 1.0, r"64 session slot\(s\) need .* fit"),
        # Unset, and not even one fits: no fallback to the model's own code
        # (that path is the oracle only).
        (0, 4.9, r"1 session slot\(s\) need .* 0 fit"),
    ],
)
def test_slots_that_do_not_fit_are_one_clear_refusal(
    tiny: Tiny, slots: int, headroom_gb: float, refusal: str
) -> None:
    from omnilive.engines.base import EngineUnavailable

    settings = MiniCPMoSettings(
        model_path=tiny.path, device="cpu", slots=slots, context_length=32768, warmup=False,
        memory_headroom_gb=headroom_gb,
    )  # fmt: skip
    engine = MiniCPMoEngine(settings, backend=TinyBackend(5.0))
    try:
        with pytest.raises(EngineUnavailable, match=refusal):
            engine.load(lambda stage, fraction: None)
    finally:
        engine.close()


def served(tiny: Tiny, slots: int, **overrides: Any) -> MiniCPMoSettings:
    """Settings for ``slots`` sessions of the tiny model, with room for them."""
    return MiniCPMoSettings(
        model_path=tiny.path, device="cpu", slots=slots, context_length=1024,
        duplex_window=ContextWindowSettings(high_tokens=600, low_tokens=450),
        default_voice=tiny.voice, force_listen_units=0, memory_headroom_gb=1.0, **overrides,
    )  # fmt: skip


@pytest.fixture
def one_slot(tiny: Tiny) -> Any:
    engine = MiniCPMoEngine(served(tiny, 1), backend=TinyBackend(64.0))
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


def lane_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("minicpmo-lanes")]


async def test_a_worker_of_many_slots_keeps_one_lane_thread(tiny: Tiny) -> None:
    """The slot views' work runs on the batch loop: the worker keeps one
    thread for its sessions' lanes (their closes), not an idle one per slot,
    and sessions in every slot still run side by side and close at once."""
    engine = MiniCPMoEngine(served(tiny, 3, warmup=False), backend=TinyBackend(64.0))
    runtime = WorkerRuntime(engine, "w0")
    try:
        assert (await runtime.load()).outcome is LoadOutcome.READY
        assert runtime.status().slots == 3
        for thread in lane_threads():  # the loading's own loop, closed, ends its thread
            await asyncio.to_thread(thread.join, 2)
        assert len(lane_threads()) == 1, [t.name for t in threading.enumerate()]

        async def one(session_id: str) -> int:
            async with runtime.session(session_id, "audio_duplex") as record:
                session = runtime.open_duplex(record)
                try:
                    await session.prepare(f"Assistant {session_id}.", DuplexOptions())
                    audio = np.zeros(16_000, np.float32)
                    for _ in range(2):
                        _, unit = await session.unit(UnitInput(audio, [], None, False))
                        await session.finalize()
                    return unit.kv_cache_length
                finally:
                    session.close()

        async with asyncio.timeout(120):
            lengths = await asyncio.gather(*(one(name) for name in "abc"))
            assert all(n > 0 for n in lengths), lengths
            await one("d")  # every slot came back
    finally:
        runtime.close()


async def test_one_slot_goes_on_past_its_context(one_slot: Any) -> None:
    """The path ``slots = 1`` used to be (the model's own code) failed once its
    context filled; on the slot path the one session's window slides as
    every slot's does: a duplex call, a half-duplex conversation and a chat
    each run past the 1,024 positions and answer on."""
    from tests.minicpmo.test_slot_conversation import opened
    from tests.minicpmo.test_slot_long_conversation import long_history, turn

    lengths = [unit.kv_cache_length for _, unit in await run_session(one_slot, 5, 80, omni=False)]
    assert max(lengths) <= 1024
    slid = [later < earlier for earlier, later in pairwise(lengths)]
    assert any(slid), f"the duplex window never slid: {lengths}"
    async with opened(one_slot) as view:
        said = []
        while view._session.window.dropped_turns < 2:
            said.append(await turn(view, f"Answer {len(said)}."))
            assert view._session.kv_length <= 1024
            assert len(said) < 200, "the conversation's window never slid"
        assert said == [f"Answer {index}." for index in range(len(said))]
    chat = one_slot.open_chat()
    try:
        options = ChatOptions(generation=GenerationOptions(max_new_tokens=4))
        assert await chat.prefill(long_history(), options) <= 1024
        assert chat._session.window.dropped_turns > 0
        assert any([piece.n_tokens async for piece in chat.generate()])
    finally:
        chat.close()
