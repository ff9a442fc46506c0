"""The minicpmo engine with slots (the batched path every GPU deployment
serves), on the CPU: concurrent duplex sessions in their slots, chats beside
them, the thread hand-offs of a unit, and refusals when the slots are full.
Each test runs on the tests' own tiny model (``tiny/``) and, where the
model's code is at hand (``model_code.py``), on a tiny random checkpoint
loaded with that code."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from omnilive.audio import wav_bytes
from omnilive.engine_settings import ContextWindowSettings, MiniCPMoSettings
from omnilive.engines.base import DuplexSession, EngineError
from omnilive.engines.messages import (
    ChatMessage,
    ChatOptions,
    DuplexOptions,
    GenerationOptions,
    TextPart,
    UnitInput,
    Voice,
)
from omnilive.engines.minicpmo import MiniCPMoEngine
from omnilive.engines.minicpmo.sessions.simplex.speech import FIRST_PIECE
from tests.minicpmo.conftest import voice, write_checkpoint
from tests.minicpmo.model_code import CpuBackend, needs_model_code
from tests.minicpmo.model_code import tiny_checkpoint as build_tiny
from tests.minicpmo.tiny.backend import TinyBackend


@dataclass(frozen=True)
class Tiny:
    """A tiny model for the slot engine: a checkpoint folder (the files the
    engine checks), a voice, and the backend that loads the model."""

    path: Path
    voice: Path
    backend: Callable[[float], Any]  # free "GPU memory" in GiB -> a backend


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("in-tree", id="in-tree"),
        pytest.param("model-code", id="model-code", marks=needs_model_code),
    ],
)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The tests' own tiny model (``tiny/``: no published code), and where
    the model's code is at hand a tiny random checkpoint loaded with it."""
    if request.param == "model-code":
        path = build_tiny(tmp_path_factory)
        return Tiny(path, path / "voice.wav", partial(CpuBackend, path))
    folder = tmp_path_factory.mktemp("tiny_in_tree")
    speaker = folder / "voice.wav"
    speaker.write_bytes(wav_bytes(voice(2.0, seed=7), 16000))
    return Tiny(write_checkpoint(folder / "ckpt"), speaker, lambda free: TinyBackend(free))


@pytest.fixture(scope="module")
def engine(tiny: Tiny) -> Any:
    settings = MiniCPMoSettings(
        model_path=tiny.path,
        device="cpu",
        slots=3,
        context_length=1024,
        duplex_window=ContextWindowSettings(high_tokens=600, low_tokens=450),
        default_voice=tiny.voice,
        force_listen_units=0,
        max_speak_tokens_per_unit=6,
        memory_headroom_gb=1.0,
    )
    engine = MiniCPMoEngine(settings, backend=tiny.backend(64.0))
    engine.load(lambda stage, fraction: None)  # warms a chat and a duplex unit up
    yield engine
    engine.close()


def same_values(a: Any, b: Any) -> bool:
    """Equal nested containers of tensors, arrays and plain values."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__"):
        return same_values(vars(a), vars(b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


async def run_session(engine: Any, seed: int, units: int, omni: bool) -> list[Any]:
    session = engine.open_duplex()
    try:
        await session.prepare(f"You are assistant number {seed}.", DuplexOptions(vision=omni))
        rng = np.random.default_rng(seed)
        results = []
        for k in range(units):
            audio = rng.normal(0, 0.05, 16_000).astype(np.float32)
            stats = await session.prefill(audio, [jpeg(seed * 100 + k)] if omni else [])
            unit = await session.generate(force_listen=k == 0)
            await session.finalize()
            results.append((stats, unit))
        return results
    finally:
        session.close()


async def test_a_unit_crosses_four_threads_speaking_and_three_listening(engine: Any) -> None:
    # The server's path (whole units): the encoders' lane, the batch loop,
    # the side lane (a speaking unit's voice), back to the event loop once;
    # a unit with frames first crosses to the CPU threads of its image processing.
    session = engine.open_duplex()
    assert type(session).unit is not DuplexSession.unit  # one request, not the default
    try:
        await session.prepare("You are a helpful assistant.", DuplexOptions(vision=True))
        rng = np.random.default_rng(7)
        seen = set()
        for k in range(10):
            before = dict(vars(session.handoffs))
            audio = rng.normal(0, 0.05, 16_000).astype(np.float32)
            framed = k % 2 == 1
            given = UnitInput(audio, [jpeg(k)] if framed else [], None, k % 3 == 0)
            stats, unit = await session.unit(given)
            assert stats.audio_tokens > 0 and stats.vision_slices == int(framed)
            crossed = {key: vars(session.handoffs)[key] - before[key] for key in before}
            kind = "listen" if unit.is_listen else "speak"
            assert crossed.pop(f"{kind}_units") == 1
            assert crossed.pop(kind) == (3 if unit.is_listen else 4) + framed
            assert set(crossed.values()) == {0}
            if not unit.is_listen:
                assert unit.audio is not None  # voiced on the side lane
            seen.add((unit.is_listen, framed))
            await session.finalize()
        assert {listen for listen, _ in seen} == {True, False}, "a listening and a speaking unit"
    finally:
        session.close()


async def test_a_spoken_unit_whose_voice_makes_no_audio_yet_ends_there(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The vocoder may hold a unit's few speech tokens back (no audio yet):
    # the unit ends with its voice leg all the same.
    from omnilive.engines.minicpmo.sessions.duplex import session as duplex

    monkeypatch.setattr(duplex, "voice_together", lambda runner, pushes: [None] * len(pushes))
    session = engine.open_duplex()
    try:
        await session.prepare("You are a helpful assistant.", DuplexOptions())
        audio = np.random.default_rng(5).normal(0, 0.05, 16_000).astype(np.float32)
        for _ in range(4):
            before = session.handoffs.speak
            _, unit = await session.unit(UnitInput(audio, [], None, False))
            await session.finalize()
            if not unit.is_listen:
                assert unit.audio is None and unit.n_tokens > 0
                assert session.handoffs.speak - before == 4
                break
        else:
            pytest.fail("no unit spoke")
    finally:
        session.close()


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.3])
async def test_a_unit_cancelled_in_any_leg_leaves_nothing_behind(
    engine: Any, after_s: float, caplog: pytest.LogCaptureFixture
):
    # Whichever thread holds the unit when its waiter leaves (the CPU threads,
    # the encoders' lane, the batch loop, the side lane), no later leg starts
    # and the session's close gives its slot back: every slot fits again.
    batch = engine._slots.batch
    session = engine.open_duplex()
    try:
        await session.prepare("You are a helpful assistant.", DuplexOptions(vision=True))
        audio = np.random.default_rng(3).normal(0, 0.05, 16_000).astype(np.float32)
        task = asyncio.create_task(session.unit(UnitInput(audio, [jpeg(1)], None, False)))
        await asyncio.sleep(after_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        session.close()
    sessions = [engine.open_duplex() for _ in range(3)]
    try:
        for session in sessions:
            await session.prepare("Again.", DuplexOptions())
        assert (await sessions[0].unit(UnitInput(audio, [], None, False)))[1].kv_cache_length > 0
    finally:
        for session in sessions:
            session.close()
    await batch.call(len, ())  # after the releases the closes queued
    assert batch.pending() == 0 and not any(len(lane.jobs) for lane in batch.lanes)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_the_slots_follow_the_settings(engine: Any) -> None:
    assert engine.capabilities.slots == 3
    assert engine.capabilities.context_length == 1024


async def test_concurrent_duplex_sessions_each_keep_their_own_context(engine: Any) -> None:
    sessions = [run_session(engine, seed, units=4, omni=seed == 2) for seed in range(3)]
    results = dict(enumerate(await asyncio.gather(*sessions)))
    for seed, units in results.items():
        lengths = [unit.kv_cache_length for _, unit in units]
        assert lengths == sorted(lengths) and lengths[0] > 0, (seed, lengths)
        assert units[0][1].is_listen  # forced
        audio_tokens = [stats.audio_tokens for stats, _ in units]
        assert all(n > 0 for n in audio_tokens), audio_tokens
        slices = [stats.vision_slices for stats, _ in units]
        assert slices == ([1] * 4 if seed == 2 else [0] * 4)
        for _, unit in units:
            if not unit.is_listen:
                assert unit.n_tokens > 0
    assert len(results) == 3


async def test_a_session_past_the_slots_is_refused_and_the_others_go_on(engine: Any) -> None:
    live = [engine.open_duplex() for _ in range(3)]
    try:
        for k, session in enumerate(live):
            await session.prepare(f"Prompt {k}.", DuplexOptions())
        extra = engine.open_duplex()
        with pytest.raises(EngineError, match="every session slot"):
            await extra.prepare("One too many.", DuplexOptions())
        extra.close()
        audio = np.zeros(16_000, np.float32)
        await live[0].prefill(audio, [])
        assert (await live[0].generate()).kv_cache_length > 0
    finally:
        for session in live:
            session.close()
    # Every slot is free again (a close gives it back without waiting, in
    # order before what comes next): three new sessions fit.
    again = [engine.open_duplex() for _ in range(3)]
    try:
        for session in again:
            await session.prepare("Again.", DuplexOptions())
    finally:
        for session in again:
            session.close()


async def test_sessions_in_one_voice_share_its_preparations(engine: Any) -> None:
    # The vocoder's preparation of a voice and its embeddings for the system
    # turn are made once per voice (by its samples), not once per session.
    shared = engine._slots.shared
    runner = shared.voice_runner()
    opened: list[str] = []
    real_open = runner.open
    runner.open = lambda prompt_wav: opened.append(prompt_wav) or real_open(prompt_wav)
    other = Voice(np.random.default_rng(5).normal(0, 0.1, 32_000).astype(np.float32))
    sessions = [engine.open_duplex() for _ in range(3)]
    try:
        for session in sessions[:2]:  # the default voice (prepared at the warm-up)
            await session.prepare("Same voice.", DuplexOptions())
        await sessions[2].prepare("Another.", DuplexOptions(llm_voice=other, tts_voice=other))
        voices = [session._session.voice for session in sessions]
        assert voices[0] is not voices[1] and voices[0].base is voices[1].base
        assert voices[2].base is not voices[0].base
        assert len(opened) == 1  # the other voice only
        assert len(shared.voices) == len(shared.voice_embeddings) == 2
        before = copy.deepcopy(voices[0].base)
        spoke = 0
        for k in range(4):  # the two in the default voice speak from their own streams
            for session in sessions[:2]:
                await session.prefill(np.random.default_rng(k).normal(0, 0.05, 16_000), [])
                unit = await session.generate(force_listen=False)
                spoke += unit.audio is not None
                await session.finalize()
        assert spoke > 0
        assert same_values(voices[0].base, before)  # the kept preparation is only read
    finally:
        runner.open = real_open
        for session in sessions:
            session.close()


async def test_a_chat_answers_while_a_duplex_session_runs(engine: Any) -> None:
    duplex_units: list[Any] = []
    chat_done = asyncio.Event()

    async def duplex() -> None:
        session = engine.open_duplex()
        try:
            await session.prepare("Keep listening.", DuplexOptions())
            while not chat_done.is_set() or len(duplex_units) < 2:
                await session.prefill(np.zeros(16_000, np.float32), [])
                duplex_units.append(await session.generate())
                await session.finalize()
        finally:
            session.close()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(duplex(), name="duplex")
        try:
            chat = engine.open_chat()
            try:
                options = ChatOptions(generation=GenerationOptions(max_new_tokens=6))
                length = await chat.prefill(
                    [ChatMessage("user", (TextPart("Hello there."),))], options
                )
                chunks = [chunk async for chunk in chat.generate()]
            finally:
                chat.close()
        finally:
            chat_done.set()
    assert length > 0
    assert sum(chunk.n_tokens for chunk in chunks) > 0
    assert len(duplex_units) >= 2


async def spoken_answer(engine: Any, max_new_tokens: int = 24) -> tuple[Any, Any]:
    """A chat (in the default voice) prefilled, and its answer."""
    chat = engine.open_chat()
    options = ChatOptions(generation=GenerationOptions(max_new_tokens=max_new_tokens))
    await chat.prefill([ChatMessage("user", (TextPart("Tell me a story."),))], options)
    return chat, chat.generate()


async def test_a_spoken_answer_s_first_audio_is_voiced_from_its_first_speech_tokens(engine: Any):
    """The first piece goes to the vocoder after FIRST_PIECE speech tokens,
    not a second's worth, and is not padded to a second; the pieces after it
    are whole seconds until the last."""
    chat, answer = await spoken_answer(engine)
    try:
        audio = [len(chunk.audio) async for chunk in answer if chunk.audio is not None]
    finally:
        chat.close()
    assert len(audio) >= 3
    assert 0 < audio[0] < 24_000
    assert audio[0] == FIRST_PIECE * 24_000 // 25  # three silent tokens in, three ahead out
    assert set(audio[1:-1]) == {24_000}


async def test_an_answer_left_early_stops_and_frees_its_slot(engine: Any) -> None:
    chat, answer = await spoken_answer(engine)
    try:
        whole = [chunk async for chunk in answer]
    finally:
        chat.close()
    chat, answer = await spoken_answer(engine)
    try:
        first = await anext(answer)
        await answer.aclose()  # what a reader leaving does: the answer stops at its next step
    finally:
        chat.close()
    assert len(whole) >= 10 and first.audio is not None
    # The slot is free again and the next answer is whole.
    chat, answer = await spoken_answer(engine)
    try:
        assert len([chunk async for chunk in answer]) >= 10
    finally:
        chat.close()


async def test_a_reader_cancelled_while_a_piece_is_decoded_leaves_the_program_to_the_loop(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that leaves while the next piece is being decoded cancels
    its reader's task inside ``await``: the answer's program is still on the
    batch loop's thread then, which closes it; the answer must not."""
    from omnilive.engines.minicpmo.sessions.simplex import session as simplex

    armed, inside, release = threading.Event(), threading.Event(), threading.Event()
    pieces_init = simplex._Pieces.__init__

    def gated(program: Any) -> Any:  # the program, held inside once armed
        value = None
        try:
            while True:
                if armed.is_set():
                    inside.set()
                    release.wait(10)
                try:
                    item = program.send(value)
                except StopIteration as stop:
                    return stop.value
                value = yield item
        finally:
            program.close()

    def init(self: Any, program: Any, stopped: Any) -> None:
        pieces_init(self, gated(program), stopped)

    monkeypatch.setattr(simplex._Pieces, "__init__", init)
    chat, answer = await spoken_answer(engine)
    try:
        await anext(answer)
        armed.set()
        reader = asyncio.create_task(anext(answer))
        assert await asyncio.to_thread(inside.wait, 10)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader  # not "ValueError: generator already executing"
    finally:
        release.set()
        armed.clear()
        chat.close()
    chat, answer = await spoken_answer(engine)  # the slot is free again
    try:
        assert len([chunk async for chunk in answer]) >= 10
    finally:
        chat.close()


async def test_sessions_in_a_kept_voice_start_while_the_side_lane_is_busy(engine: Any) -> None:
    """A kept voice is read without the side lane: a chat and a duplex
    session in the default voice (prepared at the warm-up) start while a
    long vocoder call holds that lane, where they waited for it to end."""
    loop = engine._slots.batch
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(timeout=60)

    holding = asyncio.create_task(loop.side_call(hold), name="hold-the-side-lane")
    chat, duplex = engine.open_chat(), engine.open_duplex()
    try:
        await asyncio.to_thread(held.wait, 10)
        options = ChatOptions(generation=GenerationOptions(max_new_tokens=6))
        message = [ChatMessage("user", (TextPart("Hello there."),))]
        started = asyncio.gather(
            chat.prefill(message, options), duplex.prepare("Same voice.", DuplexOptions())
        )
        lengths = await asyncio.wait_for(started, timeout=30)
        assert not holding.done()  # the lane was held all along
        assert all(length > 0 for length in lengths)
        assert chat._session.voice is not None and duplex._session.voice is not None
    finally:
        release.set()
        await holding
        chat.close()
        duplex.close()
